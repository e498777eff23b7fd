"""Which kind of server (prefill or decode) wrote a log file, from the first line only one kind writes; and
whether a file kvtop read nothing from is an SGLang server log at all."""

from __future__ import annotations

import os
from pathlib import Path

from kvtop.sources.sglang.lines import ROLE_MARKERS
from kvtop.sources.sglang.prefix import has_prefix, parse_prefix
from kvtop.sources.sglang.reader import is_gzip, read_head

SNIFF_BYTES = 4 << 20


def sniff_role(path: Path) -> str:
    """The role the file's first role-telling line names ("" when none says)."""
    try:
        text = read_head(path, SNIFF_BYTES)
    except OSError:
        return ""
    found = [(pos, role) for marker, role in ROLE_MARKERS.items() if (pos := text.find(marker)) >= 0]
    return min(found)[1] if found else ""


PREFIX_SNIFF_BYTES = 64 << 10


def first_stamp(path: Path) -> float | None:
    """The time of the first line at the file's head that SGLang's prefix dates (None: none there, or unreadable):
    what a line with no time of its own before it is taken to be, and a glog line's year."""
    try:
        head = read_head(path, PREFIX_SNIFF_BYTES)
    except OSError:
        return None
    for line in head.decode("utf-8", "replace").splitlines():
        if has_prefix(line):
            try:
                return parse_prefix(line).ts
            except ValueError:  # a garbled stamp: the next one may do
                continue
    return None


def holds_sglang_lines(path: Path) -> bool:
    """Whether a line at the file's head or tail (a `.gz`'s head) begins with SGLang's prefix (False also when
    it cannot be read)."""
    try:
        text = read_head(path, PREFIX_SNIFF_BYTES)
        if not is_gzip(path):
            with open(path, "rb") as raw:
                raw.seek(max(0, raw.seek(0, os.SEEK_END) - PREFIX_SNIFF_BYTES))
                text += b"\n" + raw.read(PREFIX_SNIFF_BYTES)
    except OSError:
        return False
    return any(has_prefix(line) for line in text.decode("utf-8", "replace").splitlines())
