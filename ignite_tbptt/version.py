"""The package version, recorded in every checkpoint a trainer writes."""

__version__ = "0.4.0"
