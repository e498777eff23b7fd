"""Instance names for log files: our agents' own (`prefill-0.log`), else the next free `prefill-N`/`decode-N`."""

from __future__ import annotations

import re

AGENT_FILE = re.compile(r"((prefill|decode)-\d+)\.log(?:\.\d+)?(?:\.gz)?")
"""One of our agents' log files (rotated `prefill-0.log.1` and `.gz` too): it names its role and instance."""


def agent_file(name: str) -> tuple[str, str]:
    """(role, instance) an agent's file name gives ("", "" for any other name)."""
    match = AGENT_FILE.fullmatch(name)
    return (match[2], match[1]) if match else ("", "")


class InstanceNames:
    """Hands out instance names in argument order, never one an agent's file already took."""

    def __init__(self) -> None:
        self._taken: set[str] = set()

    def take(self, instance: str) -> None:
        self._taken.add(instance)

    def next(self, role: str) -> str:
        """The next free `role-N` ("" while the role is unknown)."""
        if not role:
            return ""
        index = 0
        while f"{role}-{index}" in self._taken:
            index += 1
        self._taken.add(f"{role}-{index}")
        return f"{role}-{index}"
