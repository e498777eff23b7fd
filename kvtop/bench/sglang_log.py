"""`kvtop bench sglang-log`: lines/s of the SGLang log source vs plain Python line iteration of the same file.

The generated log looks like a busy decode server's: access-log and request
lines, periodic batch lines from every rank, and about 1 % of lines about
transfers (the four failure lines with their reasons, instance echoes,
`Session ... failed.`, glog lines from the transfer engine). The baseline leg
iterates the file's lines in binary (`for line in file`), the least work that
touches every line; the kvtop leg reads it into a fresh `ClusterModel`
(prefilter, parse, infer, apply). Legs alternate so both see the same page
cache; figures are medians. Peak RSS growth is sampled during the kvtop legs.

With `failed_rooms`, the log is a hostile operator's instead: every line fails
a room of its own. Each run is `kvtop failures --sglang-log` on it, its own
process: its wall time and peak RSS (medians), and the count of failures it
says it did not keep.
"""

from __future__ import annotations

import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import ClassVar

import psutil

from kvtop.bench import BenchFailed
from kvtop.bench.report import Compare, Report, at_least
from kvtop.model.cluster import FAILURES_KEPT, ClusterModel
from kvtop.sources.sglang import LogSpec, SGLangLogs

LINES_PER_SECOND = 1000
"""Log lines per second of log time: one template of this many lines, stamped for each second."""
TRANSFER_EVERY = 100
"""One line in this many concerns transfers (about 1 %)."""

_TRANSFER = (
    "[%(stamp)s TP{tp}] Decode transfer failed for request rank={tp} decode_req.req.rid='%(rid)s' "
    "decode_req.req.bootstrap_room=%(room{n})d with exception KVTransferError(bootstrap_room=%(room{n})d): "
    "Request %(room{n})d timed out after 300.0s in KVPoll.WaitingForInput",
    "[%(stamp)s TP{tp}] Decode transfer failed for request rank={tp} decode_req.req.rid='%(rid)s' "
    "decode_req.req.bootstrap_room=%(room{n})d with exception KVTransferError(bootstrap_room=%(room{n})d): "
    "Failed due to an unknown reason from another rank",
    "[%(stamp)s TP{tp}] Decode handshake failed for request rank={tp} decode_req.req.rid='%(rid)s' "
    "decode_req.req.bootstrap_room=%(room{n})d with exception KVTransferError(bootstrap_room=%(room{n})d): "
    "Failed to get kvcache from prefill instance, it might be dead",
    "[%(stamp)s TP{tp}] Lost connection with prefill instance (bootstrap_addr: 10.0.0.5:8998), 3 requests affected",
    "E%(glog)s.123456  4242 worker_pool.cpp:294] Worker: Process failed for slice (opcode: 1, length: 65536, "
    "peer_nic: 10.0.0.7:15004@mlx5_7, retry_cnt: 0): local protection error",
)
_OTHER = (
    '[%(stamp)s] INFO:     10.0.0.{tp}:5{n:04d} - "POST /generate HTTP/1.1" 200 OK',
    "[%(stamp)s TP{tp}] Receive: obj=GenerateReqInput(rid='%(rid)s{n}', text=None, input_ids=[...], "
    "sampling_params={{'max_new_tokens': 256, 'temperature': 0.7}}, stream=False)",
    "[%(stamp)s TP{tp}] Cache flushed successfully! (rid %(rid)s{n})",
)
_BATCH = (
    "[%(stamp)s TP{tp}] Decode batch, #running-req: 12, #token: 8123, token usage: 0.31, "
    "pre-allocated usage: 0.04, #prealloc-req: 3, #transfer-req: {n}, #retracted-req: 0, cuda graph: True, "
    "gen throughput (token/s): 1432.11, #queue-req: 0, "
)
"""A batch line of every rank, every 50 lines (real schedulers log one per rank every few dozen steps)."""
_FAILED_ROOM = (
    "[{stamp} TP{tp}] Decode transfer failed for request rank={tp} decode_req.req.rid='{room:x}' "
    "decode_req.req.bootstrap_room={room} with exception KVTransferError(bootstrap_room={room}): "
    "Request {room} timed out after 300.0s in KVPoll.WaitingForInput\n"
)
FIRST_ROOM = 10_000_000
_NOT_KEPT = re.compile(r"\.\.\. and ([\d,]+) more failures")


@dataclass(frozen=True)
class SGLangLogResult:
    lines_per_s: float
    baseline_lines_per_s: float
    ratio: float
    rss_growth_mb: float
    lines: int
    transfer_lines: int
    size_mb: float
    repeats: int
    failures_parsed: int
    garbled: int

    REPORT: ClassVar[Report] = Report(
        setting=("size_mb", "lines", "repeats"),
        compare=(Compare("lines_per_s", "baseline_lines_per_s", "ratio"),),
        targets=(at_least("ratio", 0.3),),
    )

    def as_dict(self) -> dict[str, float | int]:
        return asdict(self)


def _template() -> tuple[str, int]:
    """One second of log as a %-template, and how many of its lines concern transfers."""
    lines: list[str] = []
    transfer = 0
    for n in range(LINES_PER_SECOND):
        tp = n % 4
        if n % TRANSFER_EVERY == TRANSFER_EVERY // 2:
            lines.append(_TRANSFER[transfer % len(_TRANSFER)].format(tp=tp, n=transfer % 8))
            transfer += 1
        elif n % 50 == 0:
            lines.append(_BATCH.format(tp=tp, n=n % 7))
        else:
            lines.append(_OTHER[n % len(_OTHER)].format(tp=tp, n=n))
    return "\n".join(lines) + "\n", transfer


def generate(path: Path, size_bytes: int, progress: Callable[[str], None]) -> tuple[int, int]:
    """Write about `size_bytes` of log to `path`; returns (lines, transfer lines)."""
    template, transfer_per_second = _template()
    start = time.mktime(time.strptime("2026-01-02 00:00:00", "%Y-%m-%d %H:%M:%S"))
    written = seconds = 0
    with path.open("w") as log:
        while written < size_bytes:
            local = time.localtime(start + seconds)
            rooms = {f"room{k}": (seconds << 4) + k for k in range(8)}
            chunk = template % {
                "stamp": time.strftime("%Y-%m-%d %H:%M:%S", local),
                "glog": time.strftime("%m%d %H:%M:%S", local),
                "rid": f"{seconds:012x}",
                **rooms,
            }
            log.write(chunk)
            written += len(chunk)
            seconds += 1
            if seconds % 2000 == 0:
                progress(f"generated {written >> 20} of {size_bytes >> 20} MiB")
    return seconds * LINES_PER_SECOND, seconds * transfer_per_second


def write_failed_rooms(path: Path, rooms: int) -> None:
    """A decode server's log in which every line fails a room of its own (`FIRST_ROOM` on): `rooms` timeout lines,
    a thousand a second of log time over 8 ranks."""
    start = time.mktime(time.strptime("2026-01-02 00:00:00", "%Y-%m-%d %H:%M:%S"))
    with path.open("w") as log:
        for first in range(0, rooms, LINES_PER_SECOND):
            stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(start + first // LINES_PER_SECOND))
            last = min(rooms, first + LINES_PER_SECOND)
            log.write(
                "".join(_FAILED_ROOM.format(stamp=stamp, tp=n % 8, room=FIRST_ROOM + n) for n in range(first, last))
            )


@dataclass(frozen=True)
class FailedRoomsResult:
    rooms: int
    size_mb: float
    seconds: float
    peak_rss_mb: float
    not_kept: int
    """Failures `kvtop failures` said it did not keep (the rooms past the model's bound)."""
    repeats: int

    REPORT: ClassVar[Report] = Report(setting=("rooms", "size_mb", "repeats"))

    def as_dict(self) -> dict[str, float | int]:
        return asdict(self)


def measure_failed_rooms(rooms: int, repeats: int, progress: Callable[[str], None]) -> FailedRoomsResult:
    """Generate the log of `rooms` failed rooms in a temporary folder (removed afterwards), then time `kvtop
    failures` on it `repeats` times; fails when the command fails or does not say how many it did not keep."""
    folder = Path(tempfile.mkdtemp(prefix="kvtop-bench-rooms-"))
    try:
        path = folder / "decode.log"
        progress(f"generating a log of {rooms:,} failed rooms in {folder}")
        write_failed_rooms(path, rooms)
        seconds: list[float] = []
        peaks: list[int] = []
        not_kept = 0
        for run in range(1, repeats + 1):
            elapsed, peak, not_kept = _failures_process(path)
            seconds.append(elapsed)
            peaks.append(peak)
            progress(f"run {run}/{repeats}: {elapsed:.1f} s, peak RSS {peak / 2**20:.0f} MiB")
        beyond = max(0, rooms - FAILURES_KEPT)
        if not_kept != beyond:
            raise BenchFailed(f"kvtop failures said {not_kept:,} failures were not kept, not {beyond:,}")
        return FailedRoomsResult(
            rooms, round(path.stat().st_size / 2**20, 1), round(statistics.median(seconds), 2),
            round(statistics.median(peaks) / 2**20, 1), not_kept, repeats,
        )  # fmt: skip
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _failures_process(path: Path) -> tuple[float, int, int]:
    """(seconds, peak RSS in bytes, failures it did not keep) of `kvtop failures --sglang-log` on the file, its
    own process (reaped with `wait4` for its peak RSS)."""
    command = [sys.executable, "-m", "kvtop", "failures", "--sglang-log", f"decode={path}"]
    out, err = path.with_suffix(".out"), path.with_suffix(".err")
    with out.open("w") as stdout, err.open("w") as stderr:
        started = time.perf_counter()
        process = subprocess.Popen(command, stdout=stdout, stderr=stderr)
        _, status, usage = os.wait4(process.pid, 0)
        elapsed = time.perf_counter() - started
    process.returncode = os.waitstatus_to_exitcode(status)
    if process.returncode != 0:
        raise BenchFailed(f"kvtop failures exited {process.returncode}: {err.read_text().strip()[-300:]}")
    with out.open("rb") as listed:
        listed.seek(max(0, out.stat().st_size - 300))
        found = _NOT_KEPT.search(listed.read().decode())
    return elapsed, usage.ru_maxrss * 1024, int(found[1].replace(",", "")) if found else 0


def _baseline(path: Path) -> tuple[float, int]:
    started = time.perf_counter()
    count = 0
    with path.open("rb") as log:
        for _ in log:
            count += 1
    return time.perf_counter() - started, count


class _PeakRss:
    """Samples this process's RSS every 20 ms while it runs; `peak` is the highest seen."""

    def __init__(self) -> None:
        self._process = psutil.Process()
        self.start = self.peak = self._process.memory_info().rss
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> _PeakRss:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self._process.memory_info().rss)

    def _run(self) -> None:
        while not self._stop.wait(0.02):
            self.peak = max(self.peak, self._process.memory_info().rss)


def _kvtop(path: Path) -> tuple[float, int, int, int, int]:
    """(seconds, lines, failures parsed, garbled, RSS growth in bytes) of reading the file into a model."""
    model = ClusterModel()
    logs = SGLangLogs([LogSpec(path, "decode")])
    with _PeakRss() as rss:
        started = time.perf_counter()
        logs.load(model)
        elapsed = time.perf_counter() - started
    logs.close()
    stats = logs.stats()
    return elapsed, stats.lines, stats.failures, stats.garbled, rss.peak - rss.start


def measure_sglang_log(size_mb: int, repeats: int, progress: Callable[[str], None]) -> SGLangLogResult:
    """Generate the log in a temporary folder (removed afterwards), then alternate the two legs."""
    folder = Path(tempfile.mkdtemp(prefix="kvtop-bench-sglang-"))
    try:
        path = folder / "decode.log"
        progress(f"generating a {size_mb} MiB SGLang decode log in {folder}")
        lines, transfer_lines = generate(path, size_mb << 20, progress)
        base_rates: list[float] = []
        rates: list[float] = []
        growth: list[int] = []
        failures = garbled = 0
        for run in range(1, repeats + 1):
            seconds, counted = _baseline(path)
            base_rates.append(counted / seconds)
            seconds, parsed_lines, failures, garbled, grown = _kvtop(path)
            rates.append(parsed_lines / seconds)
            growth.append(grown)
            progress(
                f"run {run}/{repeats}: baseline {base_rates[-1]:,.0f} lines/s, kvtop {rates[-1]:,.0f} lines/s, "
                f"RSS +{grown / 2**20:.1f} MiB"
            )
        rate, base = statistics.median(rates), statistics.median(base_rates)
        return SGLangLogResult(
            round(rate), round(base), round(rate / base, 3), round(max(growth) / 2**20, 1), lines, transfer_lines,
            round(path.stat().st_size / 2**20, 1), repeats, failures, garbled,
        )  # fmt: skip
    finally:
        shutil.rmtree(folder, ignore_errors=True)
