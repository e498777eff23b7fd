"""SGLang's line prefix: `[YYYY-MM-DD HH:MM:SS(.mmm) <rank tags>] message`, and the wrappers around it.

SGLang prints no level. The rank tags are any subset, in any order, of
`DP{n}`, `PP{n}`, `ATTN_CP{n}`, `TP{n}`, `EP{n}` (older versions print them
without `ATTN_CP`); a scheduler without parallelism prints none. Log shippers
wrap the line (a service's name in brackets, a launcher's `[time] [tag]: `, a
container runtime's `2026-01-02T03:04:05.123456789+08:00 stderr F `, a
dashboard export's `Jan 2, 2026 @ 03:04:05.123    `, syslog's and
journalctl's `Mar  3 10:00:00 host python3[123]: `, `kubectl logs
--timestamps`' `2026-01-02T03:04:05.123456789Z `, Cloud Logging's `ERROR
2026-01-02T03:04:05.123Z [severity: ERROR] `); people paste lines with no
prefix at all, or with the time taken out of it (`[DP5 TP5 EP5 PP1] `).
Times are local, as SGLang writes them.

Some wrappers name the server a line is from, so one file holds several
servers' lines: `docker compose logs`' `prefill-0-1  | ` and `kubectl logs
--prefix`'s `[pod/prefill-0/sglang] ` (`split_stream`).
"""

from __future__ import annotations

import re
import time

import msgspec

_SGLANG = re.compile(r"\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)(?:[.,](\d{1,6}))?((?: +[A-Z_]+\d+)*) *\] ?")
_TAGS_ONLY = re.compile(r"\[((?:DP|PP|ATTN_CP|TP|EP)\d+(?: +(?:DP|PP|ATTN_CP|TP|EP)\d+)*) *\] ?")
"""SGLang's prefix with its time taken out (people paste `[DP5 TP5 EP5 PP1] Scheduler hit an exception`)."""
_TAG = re.compile(r"([A-Z_]+?)(\d+)")
_SOURCE_AND_LEVEL = re.compile(r"\[[\w.-]{1,128}\.py:\d{1,6}\]\[(DEBUG|INFO|WARNING|ERROR|CRITICAL)\]: ")
"""A logging configuration's source and level after SGLang's time (`[2026-03-12 14:27:52][prefill.py:290][ERROR]:
Prefill bootstrap failed ...`, sglang #20252): the message starts after it."""
_ISO = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)?"
_WRAPPERS = (
    re.compile(rf"{_ISO} (?:stdout|stderr) [FP] "),  # a container runtime's (containerd, CRI-O)
    re.compile(r"[A-Z][a-z]{2} \d{1,2}, \d{4} @ \d\d:\d\d:\d\d(?:\.\d+)? *\t* *"),  # a dashboard export's
    re.compile(rf"(?:{_ISO}|[A-Z][a-z]{{2}} [ \d]\d \d\d:\d\d:\d\d) \S+ [\w.@/-]+(?:\[\d+\])?: "),  # syslog, journalctl
    re.compile(rf"(?:[A-Z]+ +)?{_ISO} +(?:\[severity: \w+\] +)?"),  # `kubectl logs --timestamps`, Cloud Logging
)
_LAUNCHED = r"(?:/[^\]\s]{0,127}|[^\]\s]{1,128}@<\d+,\d+>)"
"""A launcher's tag of what it runs, on every line of it: the command's path (`/bin/sh`) or its process tag
(`/bin/sh@<0,0>`). A bare word is left alone: SGLang's own message may start with one in brackets."""
_BRACKETED = (
    re.compile(r"\[[^\[\]\s]{1,128}\](?=\[\d{4}-\d\d-\d\d )"),  # a service's name: `[svc][2026-03-12 14:27:49]...`
    re.compile(r"\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\] \[[^\]]{1,128}\]: (?=\[\d{4}-\d\d-\d\d )"),  # a launcher's
    re.compile(rf"\[\d{{4}}-\d\d-\d\d \d\d:\d\d:\d\d\] \[{_LAUNCHED}\]: "),  # its command or process tag: any line
)
"""Wrappers in brackets before SGLang's own: a service's name (sglang #20252), a launcher's time and tag
(`[2025-11-25 16:01:47] [/bin/sh@<0,0>]: [2025-11-25 08:01:47] Scheduler hit ...`, sglang #13912, or the command
alone, `[2026-06-29 17:44:04] [/bin/sh]: `, sglang #30158: the lines of a traceback under it carry the launcher's
wrapper alone, and are SGLang's record all the same)."""
_STREAMS = (
    re.compile(r"([A-Za-z0-9][\w.-]*) +\| "),
    re.compile(r"\[pod/([^\]/\s]+)(?:/[^\]\s]*)?\] "),
)
"""Wrappers that name the server (a container, a pod) a line is from: docker compose, `kubectl logs --prefix`."""
_ANY_WRAPPER = re.compile("|".join(f"(?:{wrapper.pattern})" for wrapper in _WRAPPERS + _STREAMS))
"""`_WRAPPERS` and `_STREAMS` in one match: an alternation tries them in order, as a loop of their matches would
(one call for a line that has none)."""
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
"""A terminal's colour and cursor codes (a log captured from a TTY, `docker compose logs` in colour)."""
UNKNOWN_WRAPPER_MAX = 256
"""How far into a line SGLang's prefix may start behind a wrapper kvtop does not know by name (Ray's `(pid=N) `,
stern's `pod container `, `srun --label`'s `0: `, a log service's time and stream): what precedes it is dropped."""
_STAMPS_KEPT = 65_536
RANK_TAG_MAX = 1023
"""The largest rank tag (`TP`, `DP`, `EP`, `PP`, `ATTN_CP`, a failure line's `rank=`) a line may carry: past it
the line is garbled (a `TP2000` made a sidecar announce 2,001 ranks, which every view refused)."""


class Prefix(msgspec.Struct, frozen=True):
    """What a line's prefix says: when (None: no prefix), the rank tags, and where the message starts."""

    ts: float | None
    tags: dict[str, int]
    message: str
    level: str = ""
    """The level the line states (a logging configuration's `[ERROR]`, lower case; `critical` is `error`), "" when it
    states none (SGLang's own format)."""

    @property
    def tp(self) -> int | None:
        return self.tags.get("TP")

    @property
    def pp(self) -> int | None:
        """The pipeline stage past the first (`PP1`); None for the first (`PP0`, which SGLang prints only when there
        are several stages, and people's pastes leave out) and for a line that names none: one rank with a line of
        no stages."""
        return self.tags.get("PP") or None


_stamps: dict[str, float] = {}
_minutes: dict[str, float] = {}
_tag_sets: dict[str, dict[str, int]] = {}
_STAMP = "%Y-%m-%d %H:%M:%S"


def stamp_seconds(stamp: str) -> float:
    """`YYYY-MM-DD HH:MM:SS` in local time as epoch seconds (cached: a log repeats each second many times)."""
    seconds = _stamps.get(stamp)
    if seconds is None:
        if len(_stamps) >= _STAMPS_KEPT:
            _stamps.clear()
            _minutes.clear()
        seconds = _stamps[stamp] = _local_seconds(stamp)
    return seconds


def _local_seconds(stamp: str) -> float:
    """`stamp_seconds` uncached: its minute's start read once (`strptime` takes ~10 us, a log's every new second
    asked it), its seconds added (no clock changes within a minute); a stamp of another layout, or a leap second
    (`:60`, which starts the next minute), read whole. Raises ValueError for a time that cannot be. (An hour a clock
    set back repeats is either of its two times, as `mktime` picks by what it was asked before, read whole or not.)"""
    second = stamp[17:]
    if len(stamp) != 19 or stamp[16] != ":" or not (second.isascii() and second.isdigit()) or second >= "60":
        return time.mktime(time.strptime(stamp, _STAMP))
    minute = stamp[:16]
    start = _minutes.get(minute)
    if start is None:
        start = _minutes[minute] = time.mktime(time.strptime(f"{minute}:00", _STAMP))
    return start + int(second)


def split_stream(line: str) -> tuple[str, str]:
    """(the server a wrapper names, the line without it): ("", line) when no wrapper names one."""
    if " | " not in line and not line.startswith("[pod/"):  # what each of `_STREAMS`' matches holds
        return "", line
    for wrapper in _STREAMS:
        match = wrapper.match(line)
        if match:
            return match[1], line[match.end() :]
    return "", line


def unwrap(line: str) -> str:
    """The line without a log shipper's wrapper, a UTF-8 byte order mark, the NULs before it (the hole
    logrotate's `copytruncate` leaves at the head of a file still written to) or a terminal's colour codes,
    unchanged if it has none."""
    line = line.removeprefix("\ufeff").lstrip("\x00")
    if "\x1b" in line:
        line = _ANSI.sub("", line)
    if line.startswith("[") and not line.startswith("[pod/"):
        return _unbracketed(line)
    match = _ANY_WRAPPER.match(line)
    return line[match.end() :] if match else line


def _unbracketed(line: str) -> str:
    """A line that starts with a bracket without the wrapper in brackets before SGLang's (`_BRACKETED`)."""
    if "][" not in line and "]: " not in line:  # what each of their matches holds: SGLang's own lines hold neither
        return line
    for wrapper in _BRACKETED:
        match = wrapper.match(line)
        if match:
            return line[match.end() :]
    return line


def has_prefix(line: str) -> bool:
    """Whether the line begins with SGLang's prefix (once unwrapped)."""
    return _SGLANG.match(unwrap(line)) is not None


def parse_prefix(line: str) -> Prefix:
    """Split a line into its prefix (time, rank tags) and message; a line with no prefix is all message (a
    record of several lines, a traceback's, unwrapped line by line).

    Raises ValueError for a prefix whose date cannot be (a garbled stamp such as month 13) or whose rank tag
    is past `RANK_TAG_MAX`.
    """
    line = unwrap(line.rstrip("\r\n"))
    if "\n" in line:  # a record with its traceback: a shipper wraps every line of it
        line = "\n".join(unwrap(part) for part in line.split("\n"))
    match = _SGLANG.match(line)
    if match is None:
        tags_only = _TAGS_ONLY.match(line)
        if tags_only is not None:
            return Prefix(None, _tags(tags_only[1]), line[tags_only.end() :].rstrip())
        match = _SGLANG.search(line[:UNKNOWN_WRAPPER_MAX]) if "[20" in line[:UNKNOWN_WRAPPER_MAX] else None
        if match is None or "\n" in line[: match.start()]:
            return Prefix(None, {}, line.rstrip())
    ts = stamp_seconds(match[1])
    if match[2]:
        ts += int(match[2]) / 10 ** len(match[2])
    start, level = match.end(), ""
    if line.startswith("[", start) and (source := _SOURCE_AND_LEVEL.match(line, start)):
        start, level = source.end(), "error" if source[1] == "CRITICAL" else source[1].lower()
    return Prefix(ts, _tags(match[3]) if match[3] else {}, line[start:].rstrip(), level)


def _tags(text: str) -> dict[str, int]:
    """`DP1 TP1 EP1` as {"DP": 1, "TP": 1, "EP": 1}; ValueError for a tag past `RANK_TAG_MAX`. Read once per text
    (a log repeats a few), a copy of it handed out."""
    tags = _tag_sets.get(text)
    if tags is None:
        tags = {name: int(value) for name, value in _TAG.findall(text)}
        if any(value > RANK_TAG_MAX for value in tags.values()):
            raise ValueError(f"a rank tag past {RANK_TAG_MAX}: {text.strip()[:40]}")
        if len(_tag_sets) >= _STAMPS_KEPT:
            _tag_sets.clear()
        _tag_sets[text] = tags
    return dict(tags)
