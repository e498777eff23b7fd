"""What reading a dashboard's model raises, apart from the client (its socket, zstandard and frames), so a view
that catches them loads none of that unless `--model` asked for it."""

from __future__ import annotations


class ModelUnavailable(Exception):
    """No dashboard's model could be read (why, in one line)."""


class ModelAmbiguous(Exception):
    """Several dashboards' models run and the view did not say which (they are listed)."""
