"""The version agents announce in their hello event."""

__version__ = "0.1.0"
