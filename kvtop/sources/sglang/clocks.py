"""The servers' clocks against each other, from the rooms both sides name (logs carry no send time).

Both sides of a room log its failure within moments of each other whatever their clocks say: a transfer's failure
and its echo on the other side, a client's abort on both. A timeout is left out: it waited out its time (a decode
times out 300 s after the prefill's abort, or after a prefill's failure it was never told of), and so are the
server's later lines of that room (its other ranks' `unknown reason from another rank`, the timeout's echoes in
the same tick). For each pair of servers, each room's first failure line on either
side gives one difference (the later server's time less the first's); the pair's offset is the median of those
of their first `SAMPLES_KEPT` rooms, taken with `SHARED_MIN` rooms or more of which more than half lie within
`AGREE_S` of it. Offsets chain through the pairs (a prefill against a decode against another prefill) onto each
group's first server in the order the logs were given. Within `AGREE_S` of a whole number of hours, up to
`ZONE_HOURS`, an offset is that number of hours (one server logs UTC, the other local time); under `DIFFER_S` it is
left alone, and so is one past `CORRECTED_MAX_S` (said, not corrected).

The estimate reads the logs once before anything is applied (`read_room_times`): a plain search for the room's
field in each block, only the lines that hold it split out and parsed; what is held is bounded (a block, and
`ROOMS_KEPT` per server), and reading stops once every server met is joined to the first by pairs of `SETTLED`
rooms or more.

A time a line tells is believed from `EARLIEST_TS` to `AHEAD_MAX_S` past this machine's clock (`believable`): one
outside is no log's (a garbled stamp, a line of 2099 or 1970), and never the logs' "now" or their span's start.
"""

from __future__ import annotations

import gzip
import re
import statistics
import time
from collections.abc import Generator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Generic, TypeVar

from kvtop.sources.sglang.lines import FailureLine, Garbled, classify
from kvtop.sources.sglang.prefix import has_prefix, parse_prefix, split_stream
from kvtop.sources.sglang.reader import GZIP_DAMAGE, MAX_LINE_BYTES, is_gzip, open_regular
from transport.sglang.reasons import reason_class

DIFFER_S = 120.0
"""Clocks this far apart have the later logs' times corrected; closer ones are left as written."""
AGREE_S = 60.0
"""How far a room's difference may lie from its pair's median and still agree; how far from whole hours an offset
may be and still be a timezone's."""
HOUR_S = 3600.0
ZONE_HOURS = 14
"""The furthest a local time is from UTC (UTC+14): whole hours past it are no timezone's."""
CORRECTED_MAX_S = 86400.0
"""The largest offset corrected. Past a day, the rooms both logs name are likelier ids a client numbered itself and
used again (another day, another cluster) than one clock: the offset is said, the times left as written."""
SHARED_MIN = 2
"""Rooms two servers must both name before their clocks are compared."""
STEP_BACK_S = 180.0
"""A log whose times go back by more than this had its clock set back (a few lines out of order never do)."""
AHEAD_MAX_S = 2 * 86400.0
"""How far past this machine's clock a line's time may be: a server's clock a day ahead, and the 26 hours between
the furthest timezones (SGLang writes local time with no zone, read here in this machine's). Past it no log's line
can be (a garbled or made-up stamp): it would be "now" for every view of the logs."""
EARLIEST_TS = 1577836800.0
"""2020-01-01 UTC: no SGLang server logged before (its first release was in 2024). A line dated earlier (1970: a
zeroed stamp) would be where the span of the logs starts."""
ROOMS_KEPT = 1 << 16
"""Rooms each server's first failure time is held for (the oldest go first)."""
SAMPLES_KEPT = 1024
"""Differences each pair of servers keeps: those of its first rooms."""
SETTLED = 16
"""Rooms a pair shares before the estimate stops reading."""
READ_BYTES = 8 << 20
"""Bytes of each file one round reads: the files are read side by side, as their lines will be."""
ROOM_MARK = b"bootstrap_room="
"""What every failure line that names its room holds."""

_ROOM = re.compile(r"bootstrap_room=(\d{1,19})\b")
TIMED_OUT = "timed out after "
"""What every timeout's reason holds (a known room's line that holds it is read: it may take the room's sample back)."""

Server = tuple[int, str]
"""A server's clock: the index of its log's first file (a rotated log's pieces are one), and the name a wrapper
gives it in a file that holds several servers ("" for the file's own lines)."""


Against = TypeVar("Against", Server, str)
"""What an offset is against: a server as the estimate keys it, or its name in the summary."""


@dataclass(frozen=True)
class ClockOffset(Generic[Against]):
    """One server's clock against its group's first server's (`against`: that server, as the estimate keys it or
    by the name the summary gives it)."""

    offset_s: float
    """Its clock less `against`'s (negative: behind): take it off its times to put them on `against`'s clock."""
    against: Against
    whole_hours: bool
    """A whole number of hours: one server logs UTC, the other local time (`offset_s` is exact)."""
    corrected: bool = True
    """Within `CORRECTED_MAX_S`: its times are moved (else only said)."""

    def named(self, against: str) -> ClockOffset[str]:
        """The same offset against the server so named."""
        return ClockOffset(self.offset_s, against, self.whole_hours, self.corrected)

    def text(self: ClockOffset[str], name: str) -> str:
        way = "ahead of" if self.offset_s > 0 else "behind"
        if not self.corrected:
            return (
                f"{name} is {abs(self.offset_s):.0f} s {way} {self.against} (left as written: more than a day is "
                "no clock's; logs of other days, or room ids a client reused?)"
            )
        zone = "; whole hours: one logs UTC, the other local time?" if self.whole_hours else ""
        return f"{name} is {abs(self.offset_s):.0f} s {way} {self.against} (times corrected{zone})"


class RoomTimes:
    """The first failure time of each room each server names, and the differences of the rooms two servers share."""

    def __init__(self) -> None:
        self._rooms: dict[Server, dict[int, float]] = {}
        self._waited: dict[Server, dict[int, None]] = {}
        """Rooms each server timed out (the oldest go first past `ROOMS_KEPT`): their lines tell no clock."""
        self._differences: dict[tuple[Server, Server], dict[int, float]] = {}
        """Each pair's difference of each room both named (the first `SAMPLES_KEPT` rooms)."""

    def known(self, server: Server, room: int) -> bool:
        """Whether `server` named `room` already (its other ranks' lines of it need no parse, but for a timeout)."""
        return room in self._rooms.get(server, ()) or room in self._waited.get(server, ())

    def waited(self, server: Server, room: int) -> None:
        """`server` timed `room` out: none of its lines of the room is a sample, its other ranks' echoes of the
        timeout logged before it (the same tick, in any order) nor after it."""
        rooms = self._waited.setdefault(server, {})
        if len(rooms) >= ROOMS_KEPT:
            del rooms[next(iter(rooms))]
        rooms[room] = None
        if self._rooms.get(server, {}).pop(room, None) is not None:
            for pair, differences in self._differences.items():
                if server in pair:
                    differences.pop(room, None)

    def saw(self, server: Server, room: int, ts: float) -> None:
        """`server` logged a failure of `room` at `ts` (its clock): the first one of each room counts."""
        rooms = self._rooms.setdefault(server, {})
        if room in rooms or room in self._waited.get(server, ()):
            return
        if len(rooms) >= ROOMS_KEPT:
            del rooms[next(iter(rooms))]
        rooms[room] = ts
        for other, theirs in self._rooms.items():
            if other != server and (their_ts := theirs.get(room)) is not None:
                first, second, difference = (
                    (other, server, ts - their_ts) if other < server else (server, other, their_ts - ts)
                )
                differences = self._differences.setdefault((first, second), {})
                if len(differences) < SAMPLES_KEPT:
                    differences[room] = difference

    def settled(self) -> bool:
        """Every server met is joined to the first by pairs of `SETTLED` rooms or more (reading on changes
        nothing but the median)."""
        servers = sorted(self._rooms)
        joined = {pair: 0.0 for pair, differences in self._differences.items() if len(differences) >= SETTLED}
        groups = _groups(servers, joined)
        return len(servers) > 1 and all(groups.get(server, (0.0, None))[1] == servers[0] for server in servers)

    def offsets(self) -> dict[Server, ClockOffset[Server]]:
        """The servers whose clock is `DIFFER_S` or more off their group's first server's (those past
        `CORRECTED_MAX_S` not to be corrected)."""
        pairs = {
            pair: offset
            for pair, differences in self._differences.items()
            if (offset := _agreed(list(differences.values()))) is not None
        }
        found: dict[Server, ClockOffset[Server]] = {}
        for server, (seconds, reference) in _groups(sorted(self._rooms), pairs).items():
            hours = round(seconds / HOUR_S)
            whole = 0 < abs(hours) <= ZONE_HOURS and abs(seconds - hours * HOUR_S) <= AGREE_S
            if abs(seconds) >= DIFFER_S:
                corrected = abs(seconds) <= CORRECTED_MAX_S
                found[server] = ClockOffset(hours * HOUR_S if whole else seconds, reference, whole, corrected)
        return found


def believable(ts: float) -> bool:
    """Whether a time a line tells can be a log's: from `EARLIEST_TS` to `AHEAD_MAX_S` past this machine's clock
    (a log of years ago reads as it did)."""
    return EARLIEST_TS <= ts <= time.time() + AHEAD_MAX_S


def _agreed(differences: list[float]) -> float | None:
    """The median of a pair's differences, where there are enough and most agree with it (None otherwise)."""
    if len(differences) < SHARED_MIN:
        return None
    middle = statistics.median(differences)
    agreeing = sum(abs(difference - middle) <= AGREE_S for difference in differences)
    return middle if 2 * agreeing > len(differences) else None


def _groups(servers: list[Server], pairs: dict[tuple[Server, Server], float]) -> dict[Server, tuple[float, Server]]:
    """Each server joined by `pairs` (the second's clock less the first's) to the first of its group: its clock
    less that one's, and that one. A server no pair joins is in no group."""
    near: dict[Server, list[tuple[Server, float]]] = {}
    for (first, second), offset in pairs.items():
        near.setdefault(first, []).append((second, offset))
        near.setdefault(second, []).append((first, -offset))
    found: dict[Server, tuple[float, Server]] = {}
    for root in servers:
        if root in found or root not in near:
            continue
        found[root], reach = (0.0, root), [root]
        while reach:
            server = reach.pop()
            for other, offset in near[server]:
                if other not in found:
                    found[other] = (found[server][0] + offset, root)
                    reach.append(other)
    return found


def read_room_times(logs: Sequence[tuple[int, Path]]) -> RoomTimes:
    """The rooms the failure lines of the logs (each its clock's index, its path) name, read side by side a round
    at a time until the estimate settles or the files end."""
    times = RoomTimes()
    reading = [(index, _room_lines(path)) for index, path in logs]
    year = time.localtime().tm_year
    try:
        while reading and not times.settled():
            for item in list(reading):
                index, blocks = item
                lines = next(blocks, None)
                if lines is None:
                    reading.remove(item)
                for text in lines or ():
                    _room_line(times, index, text, year)
    finally:
        for _, blocks in reading:
            blocks.close()
    return times


def _room_lines(path: Path) -> Generator[list[str]]:
    """The lines of a log that name a room, `READ_BYTES` of it at a time (the marked lines alone are split out and
    decoded: a few bytes in a thousand); a `.gz` up to its damage, a file that cannot be opened none."""
    try:
        raw = open_regular(path)  # closed with the generator
    except OSError:
        return
    with raw, gzip.GzipFile(fileobj=raw, mode="rb") if is_gzip(path) else raw as text:
        rest = b""
        while True:
            try:
                block = text.read(READ_BYTES)
            except GZIP_DAMAGE:
                block = b""
            if not block:
                break
            block = rest + block
            end = block.rfind(b"\n") + 1
            rest = block[end:] if len(block) - end <= MAX_LINE_BYTES else b""
            yield _marked(block, end)
        yield _marked(rest, len(rest))


def _marked(block: bytes, end: int) -> list[str]:
    """The lines of `block[:end]` that hold `ROOM_MARK`."""
    lines: list[str] = []
    at = block.find(ROOM_MARK, 0, end)
    while at >= 0:
        start = block.rfind(b"\n", 0, at) + 1
        stop = block.find(b"\n", at, end)
        stop = end if stop < 0 else stop
        lines.append(block[start:stop].decode(errors="replace"))
        at = block.find(ROOM_MARK, stop, end)
    return lines


def _room_line(times: RoomTimes, index: int, text: str, year: int) -> None:
    """Note the room a failure line names at its time, unless it is a timeout's (then its server waited it out)."""
    name, rest = split_stream(text)
    stream = bool(name) and (text.startswith("[pod/") or has_prefix(rest))
    room = _ROOM.search(text)
    if room is not None and times.known((index, name if stream else ""), int(room[1])) and TIMED_OUT not in text:
        return
    try:
        prefix = parse_prefix(rest if stream else text)
        record = classify(prefix, year)
    except (Garbled, ValueError):
        return
    if not isinstance(record, FailureLine) or record.room is None:
        return
    server = (index, name if stream else "")
    if reason_class(record.reason).startswith("timeout"):
        times.waited(server, record.room)
    elif prefix.ts is not None and believable(prefix.ts):
        times.saw(server, record.room, prefix.ts)
