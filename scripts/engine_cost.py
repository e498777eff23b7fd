"""CPU per chunk of each thread of a whole transfer, kvtop's engines against the least work: the engine loop included.

`scripts/chunk_path.py` drives the sides' chunk functions directly; this script runs the legs of
`kvtop bench transfer` as they are (a prefill process and a decode rank, both engine threads, ZeroMQ's I/O
threads, the bench's schedulers; the least work with end-to-end page checksums, `run_floor(..., "page")`),
alternated, and splits each leg's CPU by process and thread: thread CPU us per chunk (1 MiB unless
`--chunk-bytes`; user and all) and voluntary context switches per chunk (each one a wake-up: the thread slept, in
a poll or a blocking receive). Figures are medians over the rounds. The CPU clock ticks at 10 ms: a 2 GiB run
resolves ~5 us a 1 MiB chunk.

    .venv/bin/python scripts/engine_cost.py               # 5 rounds of 32 rooms of 64 MiB
    .venv/bin/python scripts/engine_cost.py --rounds 3 --rooms 48
    .venv/bin/python scripts/engine_cost.py --chunk-bytes 65536   # 64 KiB chunks (of 64 KiB pages)
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Callable

import kvtop.bench.baselines as baselines
import kvtop.bench.transfer as transfer
from kvtop.bench.cpu import CpuMeter, Leg, thread_group, thread_times
from transport.kv.memory import keep_receive_buffers
from transport.sockets import data_frame_bound

ROOM = 64 << 20
Sample = tuple[str, float, float, int]
"""A thread's (group, CPU seconds, user seconds, voluntary context switches) so far."""


def _threads(pids: list[int]) -> dict[tuple[int, int], Sample]:
    return {
        (pid, tid): (thread_group(times.name, pid == tid), times.user_s + times.system_s, times.user_s, times.switches)
        for (pid, tid), times in thread_times(pids, switches=True).items()
    }


class _Meter(CpuMeter):
    """The bench's meter, keeping each thread's CPU and wake-ups by process (the first process measured is the
    receiving side, where the leg's timer runs)."""

    last: dict[str, tuple[float, float, int]] = {}

    def start(self) -> None:
        self._begun = _threads([process.pid for process in self._processes])
        super().start()

    def stop(self) -> float:
        spent = super().stop()
        receiver = self._processes[0].pid
        totals: dict[str, tuple[float, float, int]] = {}
        for key, (group, cpu, user, switches) in _threads([process.pid for process in self._processes]).items():
            _, cpu0, user0, switches0 = self._begun.get(key, (group, 0.0, 0.0, 0))
            name = f"{'decode' if key[0] == receiver else 'prefill'} {group}"
            was = totals.get(name, (0.0, 0.0, 0))
            totals[name] = (was[0] + cpu - cpu0, was[1] + user - user0, was[2] + switches - switches0)
        _Meter.last = totals
        return spent


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5, help="alternated rounds; figures are medians")
    parser.add_argument("--rooms", type=int, default=32, help="rooms of 64 MiB per run (the first warms up)")
    parser.add_argument("--chunk-bytes", type=int, default=1 << 20, help="bytes a chunk (a power of two)")
    args = parser.parse_args()
    chunk = args.chunk_bytes
    transfer.check_sizes(chunk, ROOM)
    transfer.CpuMeter = baselines.CpuMeter = _Meter  # type: ignore[attr-defined]  # the legs' timed windows
    total = ROOM * args.rooms
    window = transfer._config(chunk, True).window_bytes
    keep_receive_buffers(data_frame_bound(chunk, baselines.page_bytes(chunk)), window)
    pool = transfer.pool_bytes(chunk, ROOM)
    legs: dict[str, Callable[[], Leg]] = {
        "kvtop": lambda: transfer.run_kvtop(chunk, ROOM, args.rooms),
        "least work": lambda: baselines.run_floor(chunk, total, window, pool, "page"),
    }
    runs: dict[str, list[dict[str, tuple[float, float, int]]]] = {name: [] for name in legs}
    gbps: dict[str, list[float]] = {name: [] for name in legs}
    for _ in range(args.rounds):
        for name, leg in legs.items():
            gbps[name].append(total / leg().seconds / 1e9)
            runs[name].append(_Meter.last)
    chunks = total / chunk
    print(f"thread CPU us per {chunk >> 10} KiB chunk (user), wake-ups per chunk; medians of {args.rounds} rounds:")
    for name, samples in runs.items():
        print(f"  {name}: {statistics.median(gbps[name]):.2f} GB/s")
        for thread in sorted({thread for sample in samples for thread in sample}):
            figures = [sample.get(thread, (0.0, 0.0, 0)) for sample in samples]
            cpu, user, wakes = (statistics.median(f[i] for f in figures) for i in range(3))
            if cpu or wakes > 0.05 * chunks:
                print(f"    {thread:20s} {cpu / chunks * 1e6:6.1f} ({user / chunks * 1e6:5.1f})  {wakes / chunks:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
