"""`kvtop bench sidecar`: the log sidecar's CPU and line-to-event delay on a busy log, vs a bare tail loop.

A writer thread appends a busy decode server's log at `--lines-per-s` (access
lines, request lines, a batch line of each rank every 50 lines, and
`--failures-per-s` failure lines, each a new room whose write time is noted).
Two followers read the same file at once: the sidecar as users run it
(`kvtop agent --sglang-log FILE --bootstrap ADDR`, its own process), which
publishes each failure to a kvtop `Collector` in this process; and the
baseline, a bare Python tail loop in its own process (`readline` until the end,
sleep 50 ms like the sidecar, print the room of each failure line). Figures:
each follower's CPU (its process's user + system seconds over the timed
window), the sidecar's over the tail's, and the delay from a failure line's
write to its event in the collector (sidecar) or its line read (tail), median
and p99. Fails when the writer fell short of the rate, or a failure line never
reached the collector or the tail.
"""

from __future__ import annotations

import queue
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import ClassVar

import numpy as np
import psutil

from kvtop.bench import BenchFailed
from kvtop.bench.child import exit_quietly, interrupts_held
from kvtop.bench.cpu import cpu_seconds
from kvtop.bench.report import Compare, Report
from kvtop.sources.live import Collector, Heard, News
from transport.bootstrap import BootstrapServer
from transport.plane.events import Failure

TICK_S = 0.01
REGISTER_WAIT_S = 60.0
"""A loaded machine may take tens of seconds to start a Python process."""
_LINES = (
    '[{stamp}] INFO:     10.0.0.{tp}:5{n:04d} - "POST /generate HTTP/1.1" 200 OK',
    "[{stamp} TP{tp}] Receive: obj=GenerateReqInput(rid='r{n}', text=None, input_ids=[...], "
    "sampling_params={{'max_new_tokens': 256, 'temperature': 0.7}}, stream=False)",
    "[{stamp} TP{tp}] Cache flushed successfully! (rid r{n})",
)
_BATCH = (
    "[{stamp} TP{tp}] Decode batch, #running-req: 12, #token: 8123, token usage: 0.31, "
    "pre-allocated usage: 0.04, #prealloc-req: 3, #transfer-req: {n}, #retracted-req: 0, cuda graph: True, "
    "gen throughput (token/s): 1432.11, #queue-req: 0, "
)
_FAILURE = (
    "[{stamp} TP0] Decode transfer failed for request rank=0 decode_req.req.rid='f{room}' "
    "decode_req.req.bootstrap_room={room} with exception KVTransferError(bootstrap_room={room}): "
    "Request {room} timed out after 300.0s in KVPoll.WaitingForInput"
)
TAIL = r"""
import re, signal, sys, time
signal.signal(signal.SIGINT, lambda *_: sys.exit(130))  # started with SIGINT held (kvtop.bench.child)
signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
room = re.compile(rb"bootstrap_room=(\d+) ")
with open(sys.argv[1], "rb") as log:
    while True:
        line = log.readline()
        if not line:
            time.sleep(0.05)
            continue
        if b"failed for request" in line:
            sys.stdout.write(f"{time.time()} {int(room.search(line)[1])}\n")  # one write: no half line on Ctrl-C
            sys.stdout.flush()
"""
"""The baseline: the least a follower does to find failure lines (Python, like the sidecar); a Ctrl-C ends it
quietly (exit 130), as `kvtop.bench.child` does the bench's other children."""


@dataclass(frozen=True)
class SidecarResult:
    lines_per_s: float
    """The rate the writer reached over the timed window."""
    seconds: float
    failures: int
    sidecar_cpu_percent: float
    tail_cpu_percent: float
    cpu_ratio: float
    sidecar_delay_ms_p50: float
    sidecar_delay_ms_p99: float
    tail_delay_ms_p50: float
    tail_delay_ms_p99: float

    REPORT: ClassVar[Report] = Report(
        setting=("lines_per_s", "seconds"),
        compare=(Compare("sidecar_cpu_percent", "tail_cpu_percent", "cpu_ratio"),),
    )

    def as_dict(self) -> dict[str, float]:
        return asdict(self)


class _Writer:
    """Appends the log at a rate, one write per tick, for `seconds`; prints `f ROOM TIME` when a failure's
    write returned, and `n LINES SECONDS` at the end. Runs in a process of its own (`write_log`), so that
    the collector's thread never waits on it for the GIL."""

    def __init__(self, path: Path, lines_per_s: int, failures_per_s: int) -> None:
        self.path = path
        self.lines_per_s = lines_per_s
        self.failure_every = max(1, round(lines_per_s / max(1, failures_per_s)))
        self.lines = 0
        self._room = random.getrandbits(40)

    def run(self, seconds: float) -> None:
        """Every tick, the lines due by now (a writer the machine starved catches up in one bigger write)."""
        started = time.monotonic()
        with open(self.path, "a", encoding="utf-8") as log:
            while (elapsed := time.monotonic() - started) < seconds:
                due = int(elapsed * self.lines_per_s) - self.lines
                if due > 0:
                    chunk, rooms = self._chunk(time.strftime("%Y-%m-%d %H:%M:%S"), min(due, self.lines_per_s // 10))
                    log.write(chunk)
                    log.flush()
                    now = time.time()
                    print("".join(f"f {room} {now}\n" for room in rooms), end="", flush=True)
                time.sleep(TICK_S)
        print(f"n {self.lines} {time.monotonic() - started}", flush=True)

    def _chunk(self, stamp: str, count: int) -> tuple[str, list[int]]:
        lines: list[str] = []
        rooms: list[int] = []
        for _ in range(count):
            n = self.lines = self.lines + 1
            if n % self.failure_every == 0:
                self._room += 1
                rooms.append(self._room)
                lines.append(_FAILURE.format(stamp=stamp, room=self._room))
            elif n % 50 == 0:
                lines.append(_BATCH.format(stamp=stamp, tp=n // 50 % 2, n=n % 7))
            else:
                lines.append(_LINES[n % 3].format(stamp=stamp, tp=n % 2, n=n % 10_000))
        return "\n".join(lines) + "\n", rooms


def write_log(path: str, lines_per_s: int, failures_per_s: int, seconds: float) -> None:
    """The writer process's entry point (started with SIGINT held: a Ctrl-C ends it quietly, `exit_quietly`)."""
    with exit_quietly():
        _Writer(Path(path), lines_per_s, failures_per_s).run(seconds)


def _percentiles_ms(delays: list[float]) -> tuple[float, float]:
    values = np.array(delays) * 1000
    return float(np.percentile(values, 50)), float(np.percentile(values, 99))


def measure_sidecar(
    lines_per_s: int, failures_per_s: int, seconds: float, progress: Callable[[str], None]
) -> SidecarResult:
    folder = Path(tempfile.mkdtemp(prefix="kvtop-bench-sidecar-"))
    log = folder / "decode-0.log"
    log.touch()
    server = BootstrapServer().start()
    kvtop = shutil.which("kvtop") or f"{sys.prefix}/bin/kvtop"
    sidecar = subprocess.Popen([kvtop, "agent", "--sglang-log", str(log), "--bootstrap", server.endpoint,
                                "--tp", "2"], stderr=subprocess.PIPE, text=True)  # fmt: skip
    with interrupts_held():
        tail = subprocess.Popen([sys.executable, "-c", TAIL, str(log)], stdout=subprocess.PIPE, text=True)
    news: queue.SimpleQueue[News] = queue.SimpleQueue()
    collector: Collector | None = None
    seen: dict[int, float] = {}
    tailed: dict[int, float] = {}
    stop = threading.Event()
    try:
        deadline = time.monotonic() + REGISTER_WAIT_S
        while collector is None:
            try:
                candidate = Collector(server.endpoint, news=news).start()
            except Exception:
                candidate = None
            if candidate is not None and len(candidate.model.ranks) >= 2:
                collector = candidate
            elif candidate is not None:
                candidate.close()
            if collector is None:
                if time.monotonic() > deadline or sidecar.poll() is not None:
                    raise BenchFailed(
                        f"the sidecar's two ranks did not register with the bootstrap service in {REGISTER_WAIT_S:g} s"
                        + (f" (it exited {sidecar.returncode})" if sidecar.returncode is not None else "")
                    )
                time.sleep(0.2)
        watchers = [
            threading.Thread(target=_collect, args=(news, seen, stop), daemon=True),
            threading.Thread(target=_read_tail, args=(tail, tailed), daemon=True),
        ]
        for watcher in watchers:
            watcher.start()
        written: dict[int, float] = {}
        totals: list[float] = []
        arguments = f"{str(log)!r}, {lines_per_s}, {failures_per_s}, {seconds + 2}"
        command = f"from kvtop.bench.sidecar import write_log; write_log({arguments})"
        with interrupts_held():
            writer = subprocess.Popen([sys.executable, "-c", command], stdout=subprocess.PIPE, text=True)
        reading = threading.Thread(target=_read_writer, args=(writer, written, totals), daemon=True)
        reading.start()
        time.sleep(1.0)  # warm up: both followers caught up with a running writer
        processes = (psutil.Process(sidecar.pid), psutil.Process(tail.pid))
        cpu_before = [cpu_seconds(p) for p in processes]
        started = time.monotonic()
        progress(f"writing {lines_per_s:,} lines/s for {seconds:g} s ...")
        time.sleep(seconds)
        cpu_after = [cpu_seconds(p) for p in processes]
        wall = time.monotonic() - started
        writer.wait(seconds + 30)
        reading.join(10)
        time.sleep(1.0)  # the last failures reach both followers
    finally:
        stop.set()
        sidecar.terminate()
        tail.terminate()
        sidecar.wait(10)
        tail.wait(10)
        if collector is not None:
            collector.close()
        server.close()
        shutil.rmtree(folder, ignore_errors=True)
    if not totals:
        raise BenchFailed("the writer process did not finish")
    rate = totals[0] / totals[1]
    if rate < 0.9 * lines_per_s:
        raise BenchFailed(f"the writer reached {rate:,.0f} lines/s, under 90 % of {lines_per_s:,}")
    missing_sidecar = [room for room in written if room not in seen]
    missing_tail = [room for room in written if room not in tailed]
    if missing_sidecar or missing_tail or not written:
        raise BenchFailed(f"of {len(written)} failure lines, {len(missing_sidecar)} never reached the collector "
                          f"and {len(missing_tail)} never reached the tail")  # fmt: skip
    sidecar_p50, sidecar_p99 = _percentiles_ms([seen[room] - at for room, at in written.items()])
    tail_p50, tail_p99 = _percentiles_ms([tailed[room] - at for room, at in written.items()])
    sidecar_cpu = (cpu_after[0] - cpu_before[0]) / wall * 100
    tail_cpu = (cpu_after[1] - cpu_before[1]) / wall * 100
    return SidecarResult(rate, wall, len(written), sidecar_cpu, tail_cpu, sidecar_cpu / max(tail_cpu, 1e-9),
                         sidecar_p50, sidecar_p99, tail_p50, tail_p99)  # fmt: skip


def _collect(news: queue.SimpleQueue[News], seen: dict[int, float], stop: threading.Event) -> None:
    """When each failure's event reached the collector (the news of a delivery, as it is applied)."""
    while not stop.is_set():
        try:
            item = news.get(timeout=0.1)
        except queue.Empty:
            continue
        now = time.time()
        if isinstance(item, Heard):
            for event in item.events:
                if isinstance(event, Failure):
                    seen.setdefault(event.room, now)


def _read_tail(tail: subprocess.Popen[str], tailed: dict[int, float]) -> None:
    assert tail.stdout is not None
    for line in tail.stdout:
        at, room = line.split()
        tailed.setdefault(int(room), float(at))


def _read_writer(writer: subprocess.Popen[str], written: dict[int, float], totals: list[float]) -> None:
    assert writer.stdout is not None
    for line in writer.stdout:
        kind, first, second = line.split()
        if kind == "f":
            written[int(first)] = float(second)
        else:
            totals[:] = [float(first), float(second)]
