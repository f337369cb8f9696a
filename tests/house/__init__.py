"""Checks of the whole house: layers, docs and notebooks, hostile inputs (issue 13)."""
