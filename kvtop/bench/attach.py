"""`kvtop bench attach`: `kvtop check --model` on a dashboard's model process, against Python's start.

The model process is `bench ui`'s (`BenchLoad`: `rooms` rooms over the ranks, fed `events_per_s`), started
as the dashboard starts it, advertised in a private runtime folder. Each run starts the installed `kvtop`
twice, as a probe would: `kvtop check --model-at` an endpoint where nothing answers (the baseline, in the
same run, its 0.1 s wait taken off: Python's start and every import of the check, all but the answer) and
`kvtop check --model-at PID` (the same, plus the ask, the model rebuilt, the verdict). Beside them, the
model is asked in this process: how long an answer takes, how long it held the model's lock (what the
dashboard's frames wait for), and the keyframe's size.
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import ClassVar

from kvtop.bench import BenchFailed
from kvtop.bench.report import Compare, Report, at_most

Progress = Callable[[str], None]
CHECK_WAIT_S = 30.0
"""The check's --wait: long enough that a slow answer is measured, not refused."""


@dataclass(frozen=True)
class AttachResult:
    rooms: int
    ranks: int
    events_per_s: float
    runs: int
    check_s: float
    """Median wall of `kvtop check --model-at PID`, Python's start included (target: <= 1 s)."""
    check_max_s: float
    start_s: float
    """Median wall of the baseline (the same check where nothing answers, less its 0.1 s wait), same runs."""
    ratio: float
    """check_s / start_s."""
    answer_s: float
    """Median time of one ask in this process (ask, answer, decompress, restore)."""
    lock_held_ms: float
    """Median time an answer held the model's lock."""
    lock_held_max_ms: float
    keyframe_mib: float
    verdict: str

    REPORT: ClassVar[Report] = Report(
        setting=("rooms", "ranks", "events_per_s", "runs"),
        compare=(Compare("check_s", "start_s", "ratio"),),
        targets=(at_most("check_s", 1.0),),
    )

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def _wall(command: list[str], env: dict[str, str]) -> tuple[float, subprocess.CompletedProcess[str]]:
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False, env=env)
    return time.perf_counter() - started, done


def measure_attach(
    rooms: int, instances: int, tp: int, events_per_s: float, runs: int, progress: Progress
) -> AttachResult:
    from kvtop.attach.client import fetch
    from kvtop.attach.runtime import RUNTIME_ENV
    from kvtop.bench.ui_load import BenchLoad
    from kvtop.tui.model_client import ModelProcess

    kvtop = shutil.which("kvtop") or f"{sys.prefix}/bin/kvtop"
    folder = tempfile.mkdtemp(prefix="kvtop-rt-")
    before = os.environ.get(RUNTIME_ENV)
    os.environ[RUNTIME_ENV] = folder
    env = dict(os.environ)
    try:
        progress(f"starting a model process on {rooms:,} rooms over {2 * instances * tp} ranks ...")
        with ModelProcess(BenchLoad(rooms, instances, tp, events_per_s)) as model:
            pid = str(model.pid)
            endpoint = f"ipc://{folder}/model-{pid}.sock"
            checks, starts, answers, held = [], [], [], []
            verdict, raw_len = "", 0
            for run in range(runs):
                progress(f"run {run + 1} of {runs}")
                idle_s, idle = _wall([kvtop, "check", "--model-at", f"ipc://{folder}/no.sock", "--wait", "0.1"], env)
                if "did not answer" not in idle.stdout:
                    raise BenchFailed(f"the baseline check answered: {(idle.stdout + idle.stderr).strip()[:200]}")
                start_s = idle_s - 0.1  # its wait for an answer that never comes
                check_s, done = _wall([kvtop, "check", "--model-at", pid, "--wait", str(CHECK_WAIT_S)], env)
                if done.returncode not in (0, 1, 2) or not done.stdout.startswith("KVTOP "):
                    raise BenchFailed(f"kvtop check --model gave no verdict (exit {done.returncode}): "
                                      f"{(done.stdout + done.stderr).strip()[:300]}")  # fmt: skip
                verdict = done.stdout.split(" - ", 1)[0]
                asked = time.perf_counter()
                attached = fetch(endpoint, CHECK_WAIT_S)
                answers.append(time.perf_counter() - asked)
                held.append(attached.state.lock_held_s)
                raw_len = attached.state.raw_len
                checks.append(check_s)
                starts.append(start_s)
            ranks = len(attached.model.ranks)
        fed = float(str(model.stats.get("events_per_s", 0.0)))
        if fed < events_per_s / 2:
            raise BenchFailed(f"the model process applied {fed:,.0f} events/s of the {events_per_s:,.0f} asked")
    finally:
        if before is None:
            os.environ.pop(RUNTIME_ENV, None)
        else:
            os.environ[RUNTIME_ENV] = before
        shutil.rmtree(folder, ignore_errors=True)
    check, start = statistics.median(checks), statistics.median(starts)
    return AttachResult(
        rooms, ranks, round(fed), runs, round(check, 3), round(max(checks), 3), round(start, 3),
        round(check / start, 2), round(statistics.median(answers), 3), round(statistics.median(held) * 1e3, 2),
        round(max(held) * 1e3, 2), round(raw_len / (1 << 20), 1), verdict,
    )  # fmt: skip
