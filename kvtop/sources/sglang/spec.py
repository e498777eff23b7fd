"""A log file as the user named it: `FILE`, `prefill=FILE` or `decode=FILE`."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

ROLES = ("prefill", "decode")


@dataclass(frozen=True)
class LogSpec:
    """A log file and, when the user said so, which kind of server wrote it."""

    path: Path
    role: str = ""

    @classmethod
    def parse(cls, text: str) -> LogSpec:
        """`FILE`, `prefill=FILE` or `decode=FILE`."""
        for role in ROLES:
            if text.startswith(f"{role}="):
                return cls(Path(text[len(role) + 1 :]), role)
        return cls(Path(text))
