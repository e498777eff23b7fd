"""`kvtop record` (a live cluster into a recording, headless) and `kvtop dump` (a recording as JSON Lines)."""

from __future__ import annotations

import json
import math
import os
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from kvtop.cli.options import (
    MAX_INTERVAL_S,
    MAX_SPAN_S,
    TIMES,
    Bootstrap,
    Connect,
    CurveKeysDir,
    Relay,
    Wait,
    fail,
)
from kvtop.cli.source import SilenceSaid, spec_of
from kvtop.cli.units import parse_size
from kvtop.source.when import parse_duration, pick
from kvtop.views.units import size

if TYPE_CHECKING:
    from kvtop.record.writer import Recorder
    from kvtop.source.live import LiveSource
    from transport.plane.events import Event, Snapshot

STATUS_EVERY_S = 10.0


def _folder(value: str) -> str:
    """--out: a path, never "" (which would record into the current folder)."""
    if not value.strip():
        raise typer.BadParameter("give a folder (an empty path would record into the current folder)")
    return value


def record(
    bootstrap: Bootstrap = "",
    relay: Relay = "",
    connect: Connect = [],  # noqa: B006
    curve_keys: CurveKeysDir = "",
    out: Annotated[
        str,
        typer.Option(
            "--out", envvar="KVTOP_RECORD_OUT", callback=_folder, help="Folder of the recording (made, mode 0750)."
        ),
    ] = "kvtop-recording",
    retain: Annotated[
        str,
        typer.Option(help="Delete segments older than this (24h, 90m, 2d; 'all' keeps everything)."),
    ] = "24h",
    max_bytes: Annotated[
        str,
        typer.Option(
            help="Keep the folder within this size: the oldest segments (an eighth of it each) are deleted to "
            "make room (1GiB, 512M; at least 1MiB; default: no cap)."
        ),
    ] = "",
    status: Annotated[
        bool, typer.Option("--status", help="A status line on stderr every --interval (events, bytes, ranks).")
    ] = False,
    interval: Annotated[
        float, typer.Option(min=0.5, max=MAX_INTERVAL_S, help="Seconds between status lines (at most an hour).")
    ] = STATUS_EVERY_S,
    duration: Annotated[
        float | None, typer.Option(min=0.1, max=MAX_SPAN_S, help="Stop after this many seconds.")
    ] = None,
    keyframe_events: Annotated[
        int,
        typer.Option(
            min=1000,
            help="A keyframe of the model after this many events (or a minute): a seek replays at most this "
            "many; fewer cost more CPU (a busy model's keyframe takes tens of ms to capture) and bytes.",
        ),
    ] = 50_000,
    wait: Wait = 2.0,
) -> None:
    """Record a live cluster for replay (`--replay DIR` on every view, `kvtop dump`): headless, for daemons.

    Records what kvtop's collector applies to its model (each agent's snapshot and event batches with
    their arrival times, agent and incarnation) and a keyframe of the model every --keyframe-events or minute,
    into zstd-compressed, checksummed segments with a time index (a folder re-used continues it; one
    recorder writes a folder at a time). SIGTERM, Ctrl-C or SIGHUP stops it cleanly (what was received is
    written and synced; a second one while it does is ignored). A cluster with no agent yet is recorded as its
    agents come (said on stderr), and so is one whose every agent goes quiet for longer than --wait (3 s at
    least) later on.
    Exit 0 when stopped (or after --duration); 1 when another kvtop records into the folder (its pid named), the
    cluster does not answer (its bootstrap at start, or every agent for the whole run, once it ran --wait), the
    collector stops, or a write fails (a full disk: what could not be written is counted).
    """
    from kvtop.record.lock import FolderInUse
    from kvtop.record.writer import MIN_MAX_BYTES, Recorder, unrelated_files
    from kvtop.source import SourceError
    from kvtop.source.live import LiveSource
    from kvtop.sources.live import tune_gc
    from transport.errors import BootstrapError, CallAbandoned
    from transport.signals import STOP_SIGNALS, stop_on

    spec = spec_of(bootstrap, connect, wait=wait, curve_keys=curve_keys, relay=relay)
    bootstrap = spec.bootstrap
    try:
        retain_s = None if retain.strip().lower() in ("all", "none", "") else parse_duration(retain)
    except ValueError as error:
        raise typer.BadParameter(str(error), param_hint="--retain") from None
    try:
        cap = parse_size(max_bytes, minimum=MIN_MAX_BYTES) if max_bytes else None
    except ValueError as error:
        raise typer.BadParameter(str(error), param_hint="--max-bytes") from None
    if os.path.exists(out) and not os.path.isdir(out):
        raise typer.BadParameter(f"{out!r} is a file: a recording is a folder (made if absent)", param_hint="--out")
    if others := unrelated_files(Path(out)):
        shown = ", ".join(others[:4]) + (", ..." if len(others) > 4 else "")
        raise typer.BadParameter(
            f"{out!r} holds other files ({shown}) and no recording: give an empty or new folder, or a recording's",
            param_hint="--out",
        )
    stop = threading.Event()
    with stop_on(stop, *STOP_SIGNALS):  # to the last flush: a second signal cannot cut the recording's end short
        try:
            recorder = Recorder(out, max_bytes=cap, retain_s=retain_s, keyframe_events=keyframe_events).start()
        except FolderInUse as error:
            raise fail(str(error)) from None
        except OSError as error:
            raise fail(f"cannot record to {out}: {error.strerror or error}") from None
        tune_gc()
        source: LiveSource | None = None
        began = time.monotonic()
        try:
            with LiveSource.opened(spec, synced=False, recorder=recorder, stop=stop) as source:
                typer.echo(f"kvtop record: recording {bootstrap or ', '.join(connect)} to {out}", err=True)
                began = time.monotonic()
                problem = _run(source, recorder, stop, status, interval, duration, wait)
        except CallAbandoned:  # stopped while the bootstrap kept it waiting
            problem = ""
        except BootstrapError as error:
            problem = str(error)
        except SourceError as error:  # a key folder that cannot be used: nothing was recorded
            raise fail(str(error), error.code) from None
        finally:
            if source is None:  # it never reached the cluster: nothing of it is left behind
                recorder.discard()
            else:
                recorder.close()
    problem = problem or recorder.error
    if source is None:
        typer.echo(f"kvtop record: stopped before it recorded; what it made in {out} is removed", err=True)
    else:
        typer.echo(f"kvtop record: stopped; {_status(source, recorder)}", err=True)
        waited_out = time.monotonic() - began >= wait  # stopped sooner, its agents had not had their --wait
        if not problem and not source.heard() and waited_out:  # the cluster never answered: no success
            where = ", ".join([*([f"listed by {bootstrap}"] if bootstrap else []), *connect])
            problem = f"no agent answered while it recorded ({where}): the recording holds none"
    if problem:
        raise fail(problem)


def _run(
    source: LiveSource,
    recorder: Recorder,
    stop: threading.Event,
    status: bool,
    interval: float,
    duration: float | None,
    wait: float,
) -> str:
    """Until stopped (SIGTERM, Ctrl-C, --duration): returns why it stopped early ("" when it was asked to).

    A cluster with no agent yet (a bootstrap that lists none, an endpoint nobody serves) is recorded on, since a
    recorder may well start before its cluster; that no agent answered within `wait` is said, and so is the
    first that does; later, that every agent went quiet for longer than `wait` (3 s at least), and the first that
    answers again."""
    started = time.monotonic()
    next_status = started + interval
    silence = SilenceSaid(source, wait, "kvtop record", "recording on: agents are recorded as they answer")
    while not stop.wait(0.2):
        if stopped := source.stopped():
            return stopped
        silence.check()
        if recorder.error:
            return recorder.error
        if duration is not None and time.monotonic() - started >= duration:
            return ""
        if status and time.monotonic() >= next_status:
            next_status += interval
            typer.echo(f"kvtop record: {time.strftime('%H:%M:%S')} {_status(source, recorder)}", err=True)
    return ""


def _status(source: LiveSource | None, recorder: Recorder) -> str:
    """What was recorded, and how many ranks are alive (none when the source never opened)."""
    stats = recorder.stats()
    states: list[str] = []
    if source is not None:
        with source.lock:
            states = list(source.model.liveness(time.time()).values())
    alive = sum(state == "alive" for state in states)
    dropped = f", {stats.dropped_ops} ops dropped" if stats.dropped_ops else ""
    dropped += f", {stats.keyframes_failed} keyframes failed" if stats.keyframes_failed else ""
    return (
        f"{stats.events} events, {stats.keyframes} keyframes, {size(stats.bytes)} in {stats.segments} "
        f"segments ({stats.deleted_segments} deleted){dropped}; ranks {alive}/{len(states)} alive"
    )


def dump(
    replay: Annotated[
        str,
        typer.Option(
            "--replay",
            envvar="KVTOP_REPLAY",
            help="The recording to dump: the folder `kvtop record --out` wrote (or the dashboard's ring), or one "
            ".kvr segment.",
        ),
    ] = "",
    since: Annotated[
        str, typer.Option(help=f"Dump from this instant on ({TIMES}'5 minutes ago'; default: the recording's start).")
    ] = "",
    until: Annotated[str, typer.Option(help="Dump up to this instant (default: the recording's end).")] = "",
) -> None:
    """A recording's events as JSON Lines, oldest first, for scripts: one object per event with `arrived`
    (when the collector applied it), `agent`, `incarnation`, `seq` (0 for a snapshot's), `source` (batch or
    snapshot) and the event's own fields (`kind`: hello, heartbeat, room, progress, done, failure, abort).

    Exit 2 when the recording cannot be read or --since/--until lie outside it; damage is said on stderr.
    """
    from kvtop.record.format import RecordingError
    from kvtop.record.replay import Replay
    from kvtop.views.times import stamp
    from transport.plane.events import EventBatch

    if not replay:
        raise typer.BadParameter("give --replay DIR (a recording)")
    try:
        when = pick("", since, until)
        recording = Replay(replay)
    except ValueError as error:
        raise typer.BadParameter(str(error)) from None
    except (RecordingError, OSError) as error:
        raise fail(f"cannot read the recording: {error}", 2) from None
    start = max(recording.start, when.since if when.since is not None else recording.start)
    end = min(recording.end, when.at if when.at is not None else recording.end)
    if start > end:
        span = f"{stamp(recording.start, dated=True)} to {stamp(recording.end, dated=True)}"
        raise fail(f"--since/--until select nothing of the recording: it runs from {span}", 2)
    cursor = recording.at(math.nextafter(start, -math.inf))  # what arrived at `start` itself is dumped
    for op in cursor.deliveries(end):
        item = op.item
        batch = type(item) is EventBatch
        envelope = {"arrived": op.now, "agent": op.label, "incarnation": item.incarnation}
        envelope |= {"seq": item.seq if batch else 0, "source": "batch" if batch else "snapshot"}
        for event in item.events if isinstance(item, EventBatch) else _snapshot_events(item):
            typer.echo(json.dumps({**envelope, **_fields(event)}, separators=(",", ":"), allow_nan=False))
    damage = recording.recording.damage.summary()
    if damage:
        typer.echo(f"kvtop: {damage}", err=True)


def _snapshot_events(snapshot: Snapshot) -> list[Event]:
    """Everything a snapshot holds, as the model applies it."""
    first: list[Event] = [e for e in (snapshot.hello, snapshot.heartbeat) if e is not None]
    rooms: list[Event] = [*snapshot.finished_rooms, *snapshot.live_rooms, *snapshot.progress]
    return [*first, *rooms, *snapshot.failures, *snapshot.transfers]


def _fields(event: Event) -> dict[str, Any]:
    """`kind` (the event's tag) and its fields by name (`event_fields`)."""
    from kvtop.views.event_lines import event_fields

    return {"kind": event.__struct_config__.tag, **event_fields(event)}


def register(app: typer.Typer) -> None:
    app.command("record")(record)
    app.command("dump")(dump)
