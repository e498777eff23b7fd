"""`kvtop`: one Typer app. Commands parse their options and hand off; heavy imports stay lazy.

Exit codes: 0 success; 1 the work ran but failed (a benchmark whose rooms
failed, a cluster that did not come up or does not answer); 2 bad usage
(unknown option, bad value). `kvtop check` uses Nagios codes instead: 0 OK,
1 WARNING, 2 CRITICAL, 3 UNKNOWN (bad arguments included).
"""

from __future__ import annotations

import os
import sys

import typer

from kvtop.cli import bench_cmds, local_cmds, top_cmd, views

app = typer.Typer(
    help="top for KV transfers: watch, triage and check prefill/decode disaggregated serving clusters.\n\n"
    "With no command, kvtop starts an embedded local cluster (prefill and decode agents on loopback, "
    "a workload and a few injected faults) and opens the dashboard on it.",
    invoke_without_command=True,
    no_args_is_help=False,
    add_completion=False,
    rich_markup_mode=None,
)
bench_app = typer.Typer(help="Measure kvtop against a baseline measured in the same run.", no_args_is_help=True)
cluster_app = typer.Typer(help="Run a local cluster of agents on loopback.", no_args_is_help=True)
app.add_typer(bench_app, name="bench")
app.add_typer(cluster_app, name="cluster")
local_cmds.register(app, cluster_app)
views.register(app)
top_cmd.register(app)
bench_cmds.register(bench_app)


def main() -> None:
    """Console entry point: usage errors exit 2, except for `kvtop check`, whose bad arguments are UNKNOWN (3)."""
    # kvtop does no linear algebra: idle OpenBLAS threads only compete for the cores that move KV.
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    try:
        app(prog_name="kvtop")
    except SystemExit as exit_:
        usage_error = exit_.code == 2 and sys.argv[1:2] == ["check"] and not views.check_ran.is_set()
        sys.exit(3 if usage_error else exit_.code)


if __name__ == "__main__":
    main()
