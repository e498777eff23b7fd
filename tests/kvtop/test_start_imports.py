"""What a command loads before it answers: `kvtop check` (and the views' help) loads only what it uses, so a
scripted check starts fast (DESIGN.md: a check against a live cluster within 1 s, Python's start included).

Each case runs the console entry point in a fresh interpreter and lists `sys.modules` once the command ended;
no timing is asserted, only what was loaded.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from cluster_support import Running

pytestmark = pytest.mark.processes

SCRIPT = """
import json, sys
from kvtop.cli.entry import main
listed, sys.argv = sys.argv[1], ["kvtop", *sys.argv[2:]]
try:
    main()
except SystemExit as stop:
    with open(listed, "w") as out:
        json.dump({"code": stop.code, "modules": sorted(sys.modules)}, out)
"""
"""`kvtop ARGS`, then its exit code and every module loaded, as JSON in the file named first."""

NEVER_FOR_A_CHECK = (
    "textual",  # the dashboard
    "kvtop.tui",
    "kvtop.bench",
    "kvtop.record",  # the flight recorder
    "kvtop.sources.sglang",  # the SGLang log reader (its patterns)
    "kvtop.attach.client",  # a dashboard's model, read with --model
    "kvtop.cli.local_cmds",  # other commands: the local cluster, the agent, the exporter, the relay
    "kvtop.cli.agent_cmd",
    "kvtop.cli.export_cmd",
    "kvtop.cli.relay_cmd",
    "transport.kv",  # the KV transfer engine
    "numpy.ma",  # numpy's masked arrays (np.unique loads them)
    "pydantic",  # Typer's coercion of option values (kvtop.cli.coercion reads kvtop's plainly)
    "typer._adapters",
)
"""Modules (and the packages below them) a check of a live cluster never uses."""


def loaded(tmp_path: Path, *args: str) -> tuple[object, list[str]]:
    """`kvtop ARGS` run in a fresh interpreter: its exit code and the modules it had loaded when it ended."""
    listed = tmp_path / "modules.json"
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(listed), *args], capture_output=True, text=True, timeout=120, check=False
    )
    assert listed.exists(), done.stderr
    ended = json.loads(listed.read_text())
    return ended["code"], ended["modules"]


def among(modules: list[str], names: tuple[str, ...]) -> list[str]:
    """The modules of `modules` that are one of `names` or inside one of them."""
    return [module for module in modules if any(module == name or module.startswith(f"{name}.") for name in names)]


@pytest.mark.parametrize("view", ["check", "status", "ranks"])
def test_a_views_help_loads_no_model_numpy_zeromq_or_other_command(tmp_path: Path, view: str) -> None:
    """`kvtop check --help` builds only its own command: no model, numpy, ZeroMQ or msgspec, no other command's
    module."""
    code, modules = loaded(tmp_path, view, "--help")

    assert code == 0
    assert "kvtop.cli.views" in modules
    assert among(modules, (*NEVER_FOR_A_CHECK, "numpy", "zmq", "msgspec", "kvtop.model", "transport.wire")) == []


def test_a_check_status_or_ranks_of_a_live_cluster_loads_neither_dashboard_bench_recorder_log_reader_nor_engine(
    tmp_path: Path, cluster_up: type[Running]
) -> None:
    """A check judges a live cluster (its verdict's exit code) having loaded the model and the collector, and
    none of what other commands use, nor numpy (its model keeps no series: 0.1 of its 0.26 CPU seconds); `status`
    and `ranks` show it so (they read the rates numpy keeps)."""
    cluster = cluster_up("--fault", "none")
    cluster.wait_line(r"rooms ok [1-9]")

    code, modules = loaded(tmp_path, "check", "--bootstrap", cluster.bootstrap)
    views = {view: loaded(tmp_path, view, "--bootstrap", cluster.bootstrap) for view in ("status", "ranks")}

    assert code in (0, 1, 2)  # judged: OK, WARNING or CRITICAL, never UNKNOWN
    assert {"kvtop.model.cluster", "kvtop.sources.live", "zmq"} <= set(modules)
    assert among(modules, (*NEVER_FOR_A_CHECK, "numpy")) == []
    for view, (shown, its_modules) in views.items():
        assert (view, shown) == (view, 0)
        assert (view, among(its_modules, NEVER_FOR_A_CHECK)) == (view, [])
