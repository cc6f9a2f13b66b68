"""The single source of bitfold's version."""

__version__ = "0.1.0"
