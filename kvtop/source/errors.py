"""What opening a source can raise besides the backends' own errors (a bootstrap, a dashboard's model)."""

from __future__ import annotations


class SourceError(Exception):
    """A source that cannot be read as given (a log, a recording, a key folder, `--at` outside a recording):
    one line, and the exit code a command ends with (2: what was given cannot be used)."""

    def __init__(self, message: str, code: int = 2) -> None:
        super().__init__(message)
        self.code = code
