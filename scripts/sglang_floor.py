"""The least work that reads the facts `kvtop bench sglang-log` reads, against the SGLang log source and plain line
iteration: CPU seconds of each on the bench's log, alternated.

The floor reads the file with kvtop's own reader (the same marked lines and line count: a marker scan is the least
that finds them without splitting every line) and gives each marked line one regex match and one record: each
failure's time, room, rank, reason, class and origin, each context line's time, kind and text, the rooms that
failed, one dict update per room and group. It knows only the bench's line shapes (no wrappers, pasted prefixes,
clocks, DP ranks...), keeps no model, folds no incident and shows nothing: a bound no code that reads the same
facts goes under. Before timing, its facts are checked against what `SGLangLogs.load` put in the model (exit 1
when they differ). `--size-mb` sets the log (50 MiB: 454k lines, 1 % about transfers). Not part of the tests.

    .venv/bin/python scripts/sglang_floor.py                # 5 rounds over a 50 MiB log
    .venv/bin/python scripts/sglang_floor.py --rounds 7 --size-mb 200
"""

from __future__ import annotations

import argparse
import re
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from kvtop.bench.sglang_log import generate
from kvtop.model.cluster import ClusterModel
from kvtop.sources.sglang import LogSpec, SGLangLogs
from kvtop.sources.sglang.prefix import stamp_seconds
from kvtop.sources.sglang.reader import LogReader
from transport.sglang.reasons import reason_class

_LINE = re.compile(
    r"\[(\d{4})(-\d\d-\d\d \d\d:\d\d:\d\d) TP(\d+)\] (?:\w+ \w+ failed for request rank=\d+ \S+ "
    r"\S+bootstrap_room=(\d+) with exception KVTransferError\(bootstrap_room=\d+\): (.*)"
    r"|(Lost connection with prefill instance .*)|\w+ batch, .*)"
)
_GLOG = re.compile(r"[EWIF](\d\d)(\d\d) (\d\d:\d\d:\d\d)(\.\d+) +\d+ \S+:\d+\] .*")
Facts = tuple[list[tuple[float, int, str, str, str, str]], list[tuple[float, str, str]], int, int]
"""(failures: time, room, rank, reason, class, origin; context lines: time, kind, text; rooms failed; lines)."""


def floor(path: Path) -> Facts:
    """The bench's facts by the least work (see the module doc)."""
    reader = LogReader(path)
    failures: list[tuple[float, int, str, str, str, str]] = []
    context: list[tuple[float, str, str]] = []
    rooms: dict[int, float] = {}
    groups: dict[tuple[str, str], int] = {}
    year = ""
    while True:
        for text in reader.read(final=True, max_bytes=8 << 20):
            line = _LINE.match(text)
            if line is None:
                glog = _GLOG.fullmatch(text)
                if glog is None:
                    raise SystemExit(f"not a line of the bench's shapes: {text[:120]}")
                ts = stamp_seconds(f"{year}-{glog[1]}-{glog[2]} {glog[3]}") + float(glog[4])
                context.append((ts, "glog", text))
                continue
            year = line[1]
            ts = stamp_seconds(line[1] + line[2])
            if line[5] is not None:
                rank, reason = f"decode-0/TP{line[3]}", line[5]
                name = reason_class(reason)
                failures.append((ts, int(line[4]), rank, reason, name, "" if name == "propagated" else rank))
                rooms[int(line[4])] = ts
                groups[(rank, name)] = groups.get((rank, name), 0) + 1
            elif line[6] is not None:
                context.append((ts, "lost_connection", line[6]))
        if reader.at_end():
            reader.close()
            return failures, context, len(rooms), reader.stats.lines


def kvtop_facts(path: Path) -> Facts:
    """What `SGLangLogs.load` read of the same facts."""
    model = ClusterModel()
    logs = SGLangLogs([LogSpec(path, "decode")])
    logs.load(model)
    logs.close()
    failures = [(f.ts, f.room, f.rank, f.reason, f.reason_class, f.origin) for f in model.failures]
    context = [(c.ts, c.kind, c.text) for c in logs.context]
    return failures, context, model.retired_outcomes["failed"], logs.stats().lines


def _plain(path: Path) -> float:
    started = time.process_time()
    with path.open("rb") as log:
        for _ in log:
            pass
    return time.process_time() - started


def _reader(path: Path) -> float:
    started = time.process_time()
    reader = LogReader(path)
    while reader.read(final=True, max_bytes=8 << 20) or not reader.at_end():
        pass
    reader.close()
    return time.process_time() - started


def _floor(path: Path) -> float:
    started = time.process_time()
    floor(path)
    return time.process_time() - started


def _load(path: Path) -> float:
    logs = SGLangLogs([LogSpec(path, "decode")])  # its head sniffed outside the timed load, as in the bench
    started = time.process_time()
    logs.load(ClusterModel())
    seconds = time.process_time() - started
    logs.close()
    return seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=5)
    options = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="kvtop-floor-"))
    try:
        path = folder / "decode.log"
        generate(path, options.size_mb << 20, lambda _: None)
        if floor(path) != kvtop_facts(path):
            print("the floor's facts differ from what kvtop read: its shapes are not this log's")
            return 1
        legs: dict[str, Callable[[Path], float]] = {
            "plain iteration": _plain, "kvtop's reader alone": _reader, "floor": _floor, "SGLangLogs.load": _load,
        }  # fmt: skip
        cpu: dict[str, list[float]] = {name: [] for name in legs}
        for _ in range(options.rounds):
            for name, leg in legs.items():
                cpu[name].append(leg(path))
        plain = statistics.median(cpu["plain iteration"])
        failures, context, rooms, lines = kvtop_facts(path)
        print(f"{lines:,} lines, {len(failures):,} failures, {len(context):,} context lines, {rooms:,} rooms failed")
        for name, seconds in cpu.items():
            median = statistics.median(seconds)
            print(f"{name:22s} {median:.4f} CPU s (median of {options.rounds}), {plain / median:.3f} x plain iteration")
        return 0
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
