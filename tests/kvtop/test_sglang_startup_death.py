"""A server that died at start-up, as SGLang's launcher tells it: `Rank N scheduler is dead` / `died during
initialization (exit code: C)`.

The shapes are public reports': sglang #23769 (2026-04, a two-node DeepSeek-V4 launch whose paste kept only an
exception's tail, then `Rank 0 scheduler is dead. Please check if there are relevant logs.` and `Exit code: -3`), an
operator's two-node PD prefill (2026-02, devopsrustem/slurmv4: `DP0 TP1 EP1` raised ImportError at start-up, then
the same two launcher lines) and sglang #25118 (2026-05, SGLang 0.5.11: `DP2 TP2` raised, then the launcher's
traceback ending `RuntimeError: Rank 0 scheduler died during initialization (exit code: -3). ...`). `check` said
`UNKNOWN - no rank named` on the first: the launcher's lines were none kvtop read. The lines below are made up in
the same shapes.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from kvtop_cli import kvtop_here

from kvtop.model.cluster import ClusterModel
from kvtop.sources.sglang import load

LAUNCHER_TRACEBACK = (
    "Traceback (most recent call last):\n"
    '  File "/sgl/python/sglang/srt/entrypoints/engine.py", line 1275, in _wait_for_scheduler_ready\n'
    "    data = scheduler_pipe_readers[i].recv()\n"
    "EOFError\n"
    "\n"
    "During handling of the above exception, another exception occurred:\n"
    "\n"
    "Traceback (most recent call last):\n"
    '  File "/sgl/python/sglang/srt/entrypoints/engine.py", line 1277, in _wait_for_scheduler_ready\n'
    "    raise _scheduler_died_error(i, scheduler_procs[i])\n"
    "RuntimeError: Rank {rank} scheduler died during initialization (exit code: {code}). If exit code is -9 "
    "(SIGKILL), a common cause is the OS OOM killer. Run `dmesg -T | grep -i oom` to check.\n"
)
CRASH = (
    "[2026-03-04 10:20:30 DP1 TP1 EP1] Scheduler hit an exception: Traceback (most recent call last):\n"
    '  File "/sgl/python/sglang/srt/managers/scheduler.py", line 2937, in run_scheduler_process\n'
    "    scheduler = Scheduler(\n"
    '  File "/sgl/python/sglang/srt/layers/moe/token_dispatcher/deepep.py", line 304, in __init__\n'
    "    raise ImportError(\n"
    "ImportError: DeepEP is not installed.\n"
    "\n"
)


def test_a_scheduler_the_launcher_says_is_dead_is_a_crash(tmp_path: Path):
    """The launcher's two lines are all that is left of a server that never started: its rank crashed."""
    log = tmp_path / "prefill.log"
    log.write_text(
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 512.00 MiB.\n"
        "\n"
        "[2026-03-04 10:20:31] Rank 0 scheduler is dead. Please check if there are relevant logs.\n"
        "[2026-03-04 10:20:31] Exit code: -3\n"
    )

    check = kvtop_here("check", "--sglang-log", str(log))

    assert check.returncode == 2
    assert "prefill-0/TP0 crashed at 10:20:31 (its scheduler died at start-up)" in check.stdout


@pytest.mark.parametrize(
    ("rank", "code", "how"),
    [
        (3, -9, "its scheduler died at start-up, killed by SIGKILL"),
        (
            0,
            -3,
            "its scheduler died at start-up, killed by SIGQUIT (its server was taken down after another of its "
            "processes failed)",
        ),
    ],
)
def test_the_launcher_s_runtime_error_names_the_rank_and_how_it_died(tmp_path: Path, rank: int, code: int, how: str):
    """Since 2026-03 the launcher raises instead, at the end of its traceback: the rank and its exit code."""
    log = tmp_path / "decode.log"
    log.write_text("[2026-03-04 10:20:29 TP0] Load weight begin. avail mem=77.48 GB\n")
    log.write_text(log.read_text() + LAUNCHER_TRACEBACK.format(rank=rank, code=code))

    check = kvtop_here("check", "--sglang-log", str(log))

    assert check.returncode == 2
    assert f"decode-0/TP{rank} crashed at 10:20:29 ({how})" in check.stdout


@pytest.mark.parametrize(
    "launcher",
    [
        "[2026-03-04 10:20:31] Rank 0 scheduler is dead. Please check if there are relevant logs.\n"
        "[2026-03-04 10:20:31] Exit code: -3\n",
        LAUNCHER_TRACEBACK.format(rank=0, code=-3),
    ],
)
def test_the_launcher_s_word_after_another_rank_s_crash_is_its_aftermath(tmp_path: Path, launcher: str):
    """TP1 raised and SGLang took the server down; the launcher then names rank 0, the first scheduler it found gone:
    TP1 is what broke, TP0 is no second crash."""
    log = tmp_path / "prefill.log"
    log.write_text(CRASH + launcher)
    model = ClusterModel()
    load([log], model).close()

    check = kvtop_here("check", "--sglang-log", str(log))

    assert sorted(model.crashes) == ["prefill-0/TP1"]
    assert check.returncode == 2
    assert "prefill-0/TP1 crashed at 10:20:30 (Scheduler hit an exception: ImportError: DeepEP" in check.stdout
