"""A server that died at start-up, as SGLang's launcher tells it: `Rank N scheduler is dead` / `died during
initialization (exit code: C)`.

The shapes are public reports': sglang #23769 (2026-04, a two-node DeepSeek-V4 launch whose paste kept only an
exception's tail, then `Rank 0 scheduler is dead. Please check if there are relevant logs.` and `Exit code: -3`), an
operator's two-node PD prefill (2026-02, devopsrustem/slurmv4: `DP0 TP1 EP1` raised ImportError at start-up, then
the same two launcher lines) and sglang #25118 (2026-05, SGLang 0.5.11: `DP2 TP2` raised, then the launcher's
traceback ending `RuntimeError: Rank 0 scheduler died during initialization (exit code: -3). ...`). `check` said
`UNKNOWN - no rank named` on the first: the launcher's lines were none kvtop read. The lines below are made up in
the same shapes.

Two shapes were then read short of what they say. The exit code SGLang <= 0.5.9 logs on the launcher's next line
(`Exit code: -9`, its `_wait_for_scheduler_ready`: `logger.error(f"Exit code: {scheduler_procs[i].exitcode}")`) was
not read: the crash said only "died at start-up". And the rank: `Rank N` is the index of the scheduler among those the
launcher started on its node (its loop over `pp_rank_range`, then `tp_rank_range`), read as TP N: on node 1 of a TP16
server over two it is TP 8+N. `fixtures/sglang/launcher-death` is our own, made up in those shapes (the server and
hosts of `fixtures/sglang/multinode`): node 1's launcher says its third scheduler died, killed by SIGKILL.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from kvtop_cli import kvtop_here

from kvtop.model.cluster import ClusterModel
from kvtop.sources.sglang import SGLangLogs, load
from kvtop.sources.sglang.lines import launch_of

FIXTURE = Path(__file__).parent / "fixtures" / "sglang" / "launcher-death"
NODES = (FIXTURE / "prefill-node0.log", FIXTURE / "prefill-node1.log")

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


def test_a_scheduler_the_launcher_says_is_dead_is_a_crash_with_the_exit_code_of_its_next_line(tmp_path: Path):
    """The launcher's two lines are all that is left of a server that never started: its rank crashed, and the
    second says how."""
    log = tmp_path / "prefill.log"
    log.write_text(
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 512.00 MiB.\n"
        "\n"
        "[2026-03-04 10:20:31] Rank 0 scheduler is dead. Please check if there are relevant logs.\n"
        "[2026-03-04 10:20:31] Exit code: -3\n"
    )

    check = kvtop_here("check", "--sglang-log", str(log))

    assert check.returncode == 2
    assert (
        "prefill-0/TP0 crashed at 10:20:31 (its scheduler died at start-up, killed by SIGQUIT (its server was taken "
        "down after another of its processes failed))" in check.stdout
    )


def test_a_log_that_ends_before_the_exit_code_still_tells_the_crash(tmp_path: Path):
    """The exit code is waited for, never needed: a log cut after the first line says the scheduler died."""
    log = tmp_path / "prefill.log"
    log.write_text("[2026-03-04 10:20:31] Rank 1 scheduler is dead. Please check if there are relevant logs.\n")

    check = kvtop_here("check", "--sglang-log", str(log))

    assert check.returncode == 2
    assert "prefill-0/TP1 crashed at 10:20:31 (its scheduler died at start-up)" in check.stdout


def test_a_followed_log_s_exit_code_written_after_a_read_still_says_how(tmp_path: Path):
    """A sidecar reads the launcher's first line before its second is written (1-2 s later in public reports):
    the crash waits for the exit code."""
    log = tmp_path / "prefill.log"
    log.write_text("[2026-03-04 10:20:31] Rank 0 scheduler is dead. Please check if there are relevant logs.\n")
    logs = SGLangLogs([log])
    model = ClusterModel()
    logs.poll(model)
    with log.open("a") as out:
        out.write("[2026-03-04 10:20:33] Exit code: -9\n")

    logs.poll(model)
    logs.close()

    assert {label: crash.text for label, crash in model.crashes.items()} == {
        "prefill-0/TP0": "its scheduler died at start-up, killed by SIGKILL"
    }


def test_an_exit_code_line_no_death_waits_for_says_nothing(tmp_path: Path):
    log = tmp_path / "prefill.log"
    log.write_text(
        "[2026-03-04 10:20:29 TP0] Load weight begin. avail mem=77.48 GB\n[2026-03-04 10:20:33] Exit code: 1\n"
    )
    model = ClusterModel()

    logs = load([log], model)
    logs.close()

    assert model.crashes == {}
    assert logs.stats().garbled == 0


@pytest.mark.parametrize("nodes", [NODES, NODES[1:]], ids=["both nodes", "node 1 alone"])
def test_the_launcher_s_rank_on_node_1_is_its_node_s_scheduler(nodes: tuple[Path, ...]):
    """Node 1 of TP16 over two started TP8..TP15: its launcher's `Rank 2` is TP10 (its `server_args` line says
    which node it is), killed by SIGKILL (the OOM killer's, as its next line says)."""
    check = kvtop_here("check", *(f"--sglang-log={node}" for node in nodes))

    assert check.returncode == 2
    assert "prefill-0/TP10 crashed at 15:59:37 (its scheduler died at start-up, killed by SIGKILL)" in check.stdout


SERVER_ARGS = (
    "[2026-03-04 10:20:00] server_args=ServerArgs(model_path='/models/m', tp_size={tp}, pp_size={pp}, dp_size={dp}, "
    "dist_init_addr={address}, nnodes={nnodes}, node_rank={node}, disaggregation_mode='prefill')\n"
)


@pytest.mark.parametrize(
    ("layout", "rank", "label"),
    [
        (dict(tp=16, pp=1, dp=1, address="'10.0.0.1:5000'", nnodes=2, node=1), 2, "prefill-0/TP10"),
        (dict(tp=16, pp=1, dp=1, address="'10.0.0.1:5000'", nnodes=2, node=0), 2, "prefill-0/TP2"),
        (dict(tp=4, pp=2, dp=1, address="None", nnodes=1, node=0), 5, "prefill-0/PP1-TP1"),
        (dict(tp=4, pp=2, dp=1, address="'10.0.0.1:5000'", nnodes=2, node=1), 3, "prefill-0/PP1-TP3"),
        (dict(tp=8, pp=4, dp=1, address="'10.0.0.1:5000'", nnodes=2, node=1), 9, "prefill-0/PP3-TP1"),
        (dict(tp=16, pp=1, dp=1, address="'10.0.0.1:5000'", nnodes=4, node=3), 1, "prefill-0/TP13"),
        (dict(tp=8, pp=1, dp=2, address="None", nnodes=1, node=0), 0, "prefill-0/TP0"),
        (None, 3, "prefill-0/TP3"),
    ],
    ids=[
        "node 1 of TP16 over two",
        "node 0 of TP16 over two",
        "PP2 on one node",
        "node 1 of TP4 PP2 over two",
        "node 1 of TP8 PP4 over two",
        "node 3 of TP16 over four",
        "a DP controller: as today",
        "no server_args: as today",
    ],
)
def test_the_launcher_s_rank_is_read_as_its_loop_laid_the_node_out(
    tmp_path: Path, layout: dict[str, object] | None, rank: int, label: str
):
    """SGLang's launcher starts a node's schedulers looping over its stages, then its TP ranks, and names the Nth it
    started. Where its `server_args` line is not read, or the launcher started a DP controller (which `Rank 0`
    names, not a scheduler), the index is read as the TP rank, as before."""
    log = tmp_path / "prefill.log"
    head = SERVER_ARGS.format(**layout) if layout else ""
    log.write_text(head + LAUNCHER_TRACEBACK.format(rank=rank, code=-9))
    model = ClusterModel()

    load([log], model).close()

    assert list(model.crashes) == [label]


def test_a_rank_past_the_node_s_schedulers_is_garbled(tmp_path: Path):
    """Node 1 of TP16 over two started 8 schedulers: a `Rank 8` is no launch of that line's."""
    log = tmp_path / "prefill.log"
    layout = dict(tp=16, pp=1, dp=1, address="'10.0.0.1:5000'", nnodes=2, node=1)
    log.write_text(SERVER_ARGS.format(**layout) + LAUNCHER_TRACEBACK.format(rank=8, code=-9))
    model = ClusterModel()

    logs = load([log], model)
    logs.close()

    assert model.crashes == {}
    assert logs.stats().garbled == 1


def test_launch_of_bounds_the_sizes_a_line_gives():
    """A `tp_size` past the 1024 ranks a line may name lays out no node (its ranks would be garbled anyway)."""
    assert launch_of("server_args=ServerArgs(tp_size=2048, pp_size=1, nnodes=1, node_rank=0)") is None
    assert launch_of("server_args=ServerArgs(tp_size=1024, pp_size=1, nnodes=1, node_rank=0)") is not None


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
