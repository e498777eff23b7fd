"""`kvtop top` (the dashboard on a live cluster) and the dashboard half of bare `kvtop`."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated

import typer

from kvtop.cli.dashboard_record import Record, RecordDir, RecordMaxBytes, record_choice
from kvtop.cli.export_cmd import Export, exporting
from kvtop.cli.options import (
    At,
    Bootstrap,
    Connect,
    CurveKeysDir,
    Relay,
    ReplayPath,
    SGLangLog,
    Wait,
    fail,
    not_a_terminal,
    open_sglang_logs,
)
from kvtop.cli.source import spec_of

if TYPE_CHECKING:
    from kvtop.cli.model_spec import LiveModel
    from kvtop.tui.frame_source import Source
    from kvtop.tui.model_client import ModelProcess
    from kvtop.tui.rewind import Rewind
    from kvtop.tui.themes import ThemeSet

Theme = Annotated[
    str,
    typer.Option(
        envvar="KVTOP_THEME",
        help="Dashboard theme: kvtop-dark (default), kvtop-light, kvtop-high-contrast, kvtop-colorblind, "
        "or one from ~/.config/kvtop/themes/ (see themes/README.md).",
    ),
]


def find_theme(theme: str) -> ThemeSet:
    """Every theme found, checked to hold `theme` (a usage error otherwise, before anything starts)."""
    from kvtop.tui.themes import load_themes

    themes = load_themes()
    if theme not in themes.themes:
        known = ", ".join(sorted(themes.themes))
        raise typer.BadParameter(f"no theme {theme!r} (found: {known})", param_hint="--theme")
    return themes


def run_dashboard(
    source: Source | ModelProcess,
    title: str,
    themes: ThemeSet,
    theme: str,
    quit_after: float | None = None,
    clock: Callable[[], float] = time.time,
    rewind: Rewind | None = None,
    warnings: tuple[str, ...] = (),
    alerts: Callable[[], list[str]] | None = None,
) -> None:
    """Open the dashboard on `source` until the user quits (q, Ctrl-C) or the terminal goes away (`alerts`:
    `KvtopApp`'s).

    A dashboard that failed (a frame that could not be built, or an exception in the app, whose traceback
    Textual prints first) exits 1 with one line naming the error. A character the terminal's encoding lacks is
    drawn as an ASCII stand-in as wide as it (`kvtop.tui.drawing`)."""
    from kvtop.tui.app import KvtopApp
    from kvtop.tui.drawing import drawable

    app = KvtopApp(source, title=title, themes=themes, theme=theme, quit_after=quit_after, clock=clock,
                   rewind=rewind, warnings=warnings, alerts=alerts)  # fmt: skip
    with drawable():  # a latin-1 or ASCII terminal: ASCII stand-ins for the box characters, not escapes
        app.run()
    if app.return_code:
        error = app.failure or app._exception  # Textual keeps what ended the app (no public accessor)
        what = f": {type(error).__name__}: {error}" if error is not None else ""  # a message, not a repr
        raise fail(f"the dashboard failed{what}")


def run_live_dashboard(
    spec: LiveModel,
    title: str,
    themes: ThemeSet,
    theme: str,
    quit_after: float | None = None,
    alerts: Callable[[], list[str]] | None = None,
) -> None:
    """The dashboard on a live source opened in the model process (collector, recorder, exporter), rewinding
    into the ring it records; exit with the source's own line and code when it cannot be opened."""
    from kvtop.tui.model_client import ModelProcess
    from kvtop.tui.model_server import ModelStartError
    from kvtop.tui.rewind import Rewind

    model = ModelProcess(spec)
    try:
        model.start()
    except ModelStartError as error:
        raise (fail(error.message, error.code) if error.message else typer.Exit(error.code)) from None
    try:
        folder = model.record_folder
        rewind = Rewind(folder, live=True, error=lambda: model.recorder_error) if folder else None
        run_dashboard(
            model, title, themes, theme, quit_after=quit_after, rewind=rewind, warnings=model.warnings, alerts=alerts
        )
    finally:
        model.close()


def top(
    bootstrap: Bootstrap = "",
    relay: Relay = "",
    connect: Connect = [],  # noqa: B006
    sglang_log: SGLangLog = [],  # noqa: B006
    theme: Theme = "kvtop-dark",
    wait: Wait = 2.0,
    export: Export = "",
    curve_keys: CurveKeysDir = "",
    replay: ReplayPath = "",
    at: At = "",
    record: Record = True,
    record_dir: RecordDir = "",
    record_max_bytes: RecordMaxBytes = "256MiB",
) -> None:
    """The dashboard on a live cluster, on SGLang server logs or on a recording: overview, rooms, failures
    (folded), events.

    `?` in the dashboard lists every key. With --sglang-log the files are read from their start and
    followed as they grow; "now" is the latest time they mention. With --replay, the model as it was at
    --at (default: the recording's end), "now" being that instant; the rewind keys move through it. With
    --export HOST:PORT the same model is also served as Prometheus metrics while the dashboard runs (see
    `kvtop export`).

    On a live cluster the dashboard records what it receives into a bounded ring (--record-dir,
    --record-max-bytes; --no-record keeps nothing), so the session can be rewound: , and . step 10 s,
    [ and ] jump to the previous and next failure origin, b jumps to a time, L goes back to live.
    """
    from kvtop.cli.model_spec import LiveModel

    source = spec_of(bootstrap, connect, sglang_log, replay, wait=wait, curve_keys=curve_keys, relay=relay)
    themes = find_theme(theme)
    choice = record_choice(record, record_dir, record_max_bytes)
    if lacking := not_a_terminal():  # Textual would draw into a file, or wait for keys that never come, until killed
        typer.echo(
            f"kvtop top: the dashboard needs a terminal on stdin and stdout ({lacking}: not one); for lines: "
            "kvtop status --follow (or events, failures, incidents --follow)",
            err=True,
        )
        raise typer.Exit(2)
    if replay:
        _top_on_recording(replay, at, themes, theme)
        return
    if sglang_log:
        _top_on_logs(sglang_log, _instant(at), themes, theme, export)
        return
    if at:
        raise typer.BadParameter("--at reads a recording or logs: give --replay DIR or --sglang-log FILE")
    spec = LiveModel(source.bootstrap, tuple(connect), wait, curve_keys, choice, export, source.kind, source.service)
    run_live_dashboard(spec, source.bootstrap or ", ".join(connect), themes, theme)


def _top_on_recording(replay: str, at: str, themes: ThemeSet, theme: str) -> None:
    """The dashboard on the model a recording held at `at` (its end by default), judged at that instant; the
    rewind keys move through the recording."""
    from kvtop.cli.source import reading
    from kvtop.source import SourceSpec
    from kvtop.source.recording import RecordingSource
    from kvtop.source.when import pick
    from kvtop.tui.rewind import Rewind

    try:
        spec = SourceSpec(replay=replay, when=pick(at, "", ""))
    except ValueError as error:
        raise typer.BadParameter(str(error)) from None
    with reading(spec, journal=True) as source:
        if source.damage:
            typer.echo(f"kvtop: {source.damage}", err=True)
        assert isinstance(source, RecordingSource)
        rewind = Rewind(replay, live=False, cursor=source.cursor)
        run_dashboard(rewind, f"recording {replay}", themes, theme, rewind=rewind)


def _instant(at: str) -> float | None:
    """`--at` as epoch seconds (None when not given); a usage error for a time that is none."""
    from kvtop.source.when import pick

    try:
        return pick(at, "", "").at
    except ValueError as error:
        raise typer.BadParameter(str(error)) from None


def _top_on_logs(sglang_log: list[str], at: float | None, themes: ThemeSet, theme: str, export: str) -> None:
    """The dashboard on SGLang logs followed as they grow; with `at`, on what they said up to that instant."""
    from kvtop.sources.sglang.follow import LogFollower

    logs = open_sglang_logs(sglang_log)
    logs.until = at
    follower = LogFollower(logs).start()
    try:

        def stopped() -> str:
            return follower.error if follower.died else ""

        with exporting(export, follower.model, follower.lock, "sglang-log", follower.now, stopped):
            run_dashboard(follower, "sglang logs: " + ", ".join(sglang_log), themes, theme, clock=follower.now)
    finally:
        follower.close()
    if follower.died is not None:
        raise fail(follower.error)


def register(app: typer.Typer) -> None:
    app.command("top")(top)
