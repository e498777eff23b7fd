"""Followed logs missing from their paths: a tail that went silent because its file was removed looked like a
quiet server."""

from __future__ import annotations

import time
from pathlib import Path

GONE_SAID_S = 2.0
"""A followed log missing from its path this long is said (a rotation by rename puts the next one there at once)."""


class MissingPaths:
    """The followed logs' paths: one missing for `GONE_SAID_S` is said once, and again once a file is at its path."""

    def __init__(self, paths: list[Path]) -> None:
        self.paths = paths
        self.since: dict[Path, float] = {}
        self.said: set[Path] = set()

    def news(self) -> list[str]:
        """What changed since last asked, one line each (prefixed `kvtop: `, for stderr)."""
        now, lines = time.monotonic(), []
        for path in self.paths:
            if path.exists():
                self.since.pop(path, None)
                if path in self.said:
                    self.said.discard(path)
                    lines.append(f"kvtop: {path} is there again: followed from its start")
                continue
            if path not in self.said and now - self.since.setdefault(path, now) >= GONE_SAID_S:
                self.said.add(path)
                lines.append(f"kvtop: {gone(path)}")
        return lines

    def gone(self) -> str:
        """The paths said gone and not there again, as one line ("" when none)."""
        return "; ".join(gone(path) for path in self.paths if path in self.said)


def gone(path: Path) -> str:
    return f"{path} is gone from its path (removed or moved away): waiting for a log there"
