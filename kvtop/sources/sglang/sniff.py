"""Which kind of server (prefill or decode) wrote a log file, from the first line only one kind writes; which node
of a multi-node server it is, from its `server_args` lines; whether its DP ranks are replicas; and whether a file
kvtop read nothing from is an SGLang server log at all."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import ahocorasick_rs

from kvtop.sources.sglang.clocks import believable
from kvtop.sources.sglang.lines import ROLE_MARKERS, NodeOf, dp_replicas, node_of
from kvtop.sources.sglang.prefix import has_prefix, parse_prefix, split_stream
from kvtop.sources.sglang.reader import is_gzip, open_regular, read_head
from kvtop.sources.sglang.replicas import DpLayout

SNIFF_BYTES = 4 << 20
ROLE_PIECE_BYTES = 64 << 10
"""The head is searched for `ROLE_MARKERS` a piece of whole lines of about this many bytes at a time, up to the
first piece that holds one (most logs name their role in their first lines)."""
_ROLE_SCANNER = ahocorasick_rs.BytesAhoCorasick(list(ROLE_MARKERS), matchkind=ahocorasick_rs.MATCHKIND_LEFTMOST_FIRST)
"""Every role marker in one pass: a `bytes.find` of each of the 20 over a 4 MiB head that holds few of them cost
~15 ms of every command's start (a leftmost match is the earliest any marker starts)."""


def sniff_role(path: Path) -> str:
    """The role the file's first role-telling line names ("" when none says; of markers that start at one place,
    the role first in alphabetical order)."""
    try:
        text = read_head(path, SNIFF_BYTES)
    except OSError:
        return ""
    view = memoryview(text)
    start = 0
    while start < len(text):  # pieces end after a newline: no marker spans one
        end = text.find(b"\n", min(start + ROLE_PIECE_BYTES, len(text)) - 1) + 1 or len(text)
        found = _ROLE_SCANNER.find_matches_as_indexes(view[start:end])
        if found:
            at = start + found[0][1]
            return min(role for marker, role in ROLE_MARKERS.items() if text.startswith(marker, at))
        start = end
    return ""


def sniff_node(path: Path) -> NodeOf | None:
    """The node of a multi-node server the `server_args` lines at the file's head say it is (None: none does, they
    name different servers or nodes (a file of several servers), a wrapper names their servers, or it is unreadable)."""
    try:
        head = read_head(path, SNIFF_BYTES)
    except OSError:
        return None
    said: set[NodeOf | None] = set()
    at = head.find(b"server_args=")
    while at >= 0:
        end = head.find(b"\n", at)
        end = len(head) if end < 0 else end
        line = head[head.rfind(b"\n", 0, at) + 1 : end].decode("utf-8", "replace")
        at = head.find(b"server_args=", end)
        if split_stream(line)[0]:
            return None
        try:
            message = parse_prefix(line).message
        except ValueError:
            continue
        if message.startswith("server_args="):
            said.add(node_of(message))
    return said.pop() if len(said) == 1 else None


PREFIX_SNIFF_BYTES = 64 << 10


def first_stamp(path: Path) -> float | None:
    """The time of the first line at the file's head that SGLang's prefix dates believably (`clocks.believable`;
    None: none there, or unreadable): what a line with no time of its own before it is taken to be, and a glog
    line's year."""
    for line in _prefixed_head(path):
        try:
            ts = parse_prefix(line).ts
        except ValueError:  # a garbled stamp: the next one may do
            continue
        if ts is not None and believable(ts):
            return ts
    return None


def sniff_replicas(path: Path) -> DpLayout:
    """What the lines at the file's head say of its DP ranks (`replicas`): read before its first line is, so that
    each rank has one name from the start (an unreadable head tells nothing)."""
    layout = DpLayout()
    for line in _prefixed_head(path):
        if ("DP" not in line and "dp_size" not in line) or split_stream(line)[0]:  # a wrapper's: its server's own
            continue
        try:
            prefix = parse_prefix(line)
        except ValueError:
            continue
        if prefix.message.startswith("server_args="):
            layout.said(dp_replicas(prefix.message))
        layout.saw(prefix.tags)
    return layout


def sniff_server(path: Path) -> str | None:
    """The server a wrapper names on the first SGLang line at the file's head (`docker compose logs`' `NAME  | `;
    "": that line's wrapper names none; None: no SGLang line there yet, or unreadable)."""
    for line in _prefixed_head(path):
        name, rest = split_stream(line)
        return name if has_prefix(rest) else ""
    return None


def _prefixed_head(path: Path) -> Iterator[str]:
    """The lines at the file's head that begin with SGLang's prefix, a wrapper's or not (none when unreadable)."""
    try:
        head = read_head(path, PREFIX_SNIFF_BYTES)
    except OSError:
        return
    yield from (line for line in head.decode("utf-8", "replace").splitlines() if has_prefix(line))


def holds_sglang_lines(path: Path) -> bool:
    """Whether a line at the file's head or tail (a `.gz`'s head) begins with SGLang's prefix (False also when
    it cannot be read)."""
    try:
        text = read_head(path, PREFIX_SNIFF_BYTES)
        if not is_gzip(path):
            with open_regular(path) as raw:
                raw.seek(max(0, raw.seek(0, os.SEEK_END) - PREFIX_SNIFF_BYTES))
                text += b"\n" + raw.read(PREFIX_SNIFF_BYTES)
    except OSError:
        return False
    return any(has_prefix(line) for line in text.decode("utf-8", "replace").splitlines())
