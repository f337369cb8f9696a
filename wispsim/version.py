"""The package's version (one place: the face, provenance and results read it from here)."""

__version__ = "0.1.0"
