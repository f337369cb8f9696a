"""Figures. The only layer that imports matplotlib."""
