"""Which kind of server (prefill or decode) wrote a log file, from the first line only one kind writes."""

from __future__ import annotations

from pathlib import Path

from kvtop.sources.sglang.lines import ROLE_MARKERS
from kvtop.sources.sglang.reader import read_head

SNIFF_BYTES = 4 << 20


def sniff_role(path: Path) -> str:
    """The role the file's first role-telling line names ("" when none says)."""
    try:
        text = read_head(path, SNIFF_BYTES)
    except OSError:
        return ""
    found = [(pos, role) for marker, role in ROLE_MARKERS.items() if (pos := text.find(marker)) >= 0]
    return min(found)[1] if found else ""
