"""The dashboard on log sidecars alone (`kvtop top --bootstrap`, every rank a sidecar's): live ranks, no rate."""

from __future__ import annotations

from textual.pilot import Pilot
from tui_support import FixtureSource, drive, make_app, next_frame, text

from kvtop.model.cluster import JOURNAL_EVENTS_KEPT, ClusterModel
from kvtop.sidecar.ranks import sidecar_info
from transport.plane.events import EVENT_SCHEMA, AgentHello, Event, EventBatch, Failure, Heartbeat, LogFollowed

T = 1_800_000_000.0


def _sidecars() -> ClusterModel:
    """Two sidecars' ranks, beating: the prefill one's log silent (idle), the decode one's growing, naming a room
    that failed."""
    model = ClusterModel(JOURNAL_EVENTS_KEPT)
    failure = Failure(T, 42, "decode-0/TP0", "Request 42 timed out after 300.0s in KVPoll.WaitingForInput",
                      "timeout_waiting", "error", False, "decode-0/TP0")  # fmt: skip
    for seq, role in enumerate(("prefill", "decode"), 1):
        label = f"{role}-0/TP0"
        log = LogFollowed(f"/var/log/{role}.log", True, 10, 10, 1, 0, 0, 0.5, role == "prefill")
        events: list[Event] = [AgentHello(T, sidecar_info(role, f"{role}-0", 0, 1, 7), "0", "", "")]
        events += [Heartbeat(T, {}, 0, 0, 1.0, 1, 1.0, log=log)] + [failure] * (role == "decode")
        model.apply(label, EventBatch(EVENT_SCHEMA, role, f"{role}-0", 0, 7, seq, T, events), T)
    model.update_incidents()
    return model


def test_the_dashboard_on_sidecars_alone_counts_their_idle_ranks_and_shows_no_rate_latency_or_throughput():
    """Sidecars publish a log's failures, never a transfer: the health line said `0.0 rooms/s  0 B/s  p99 0 ms
    0.0% failed`, the grid `0 B/s` per rank and the throughput chart a 0 B/s scale (a rate of nothing read as a
    measured zero), and `1/2 ranks alive` with the idle rank unnamed. As on log files, it now says the rooms that
    failed and that logs time no transfer, the ranks' liveness kept (sidecars beat), the idle counted, the banner
    live."""
    app = make_app(FixtureSource(_sidecars()), clock=lambda: T + 1)
    seen: dict[str, str] = {}

    async def play(pilot: Pilot[None]) -> None:
        await next_frame(pilot)
        for part in ("#health", "#banner", "#throughput-title", "#throughput-graph", "#ranks-list"):
            seen[part[1:]] = text(app, part)

    drive(app, play, size=(200, 40))

    assert "1/2 ranks alive, 1 idle" in seen["health"] and "1 room failed (1 origin) in the last 60 s" in seen["health"]
    assert not {"rooms/s", "B/s", "p99", "%"} & set(seen["health"].split()), seen["health"]
    assert "as of" in seen["banner"] and "logs as of" not in seen["banner"], "sidecars are live, not a file's time"
    assert seen["throughput-title"] == "Throughput  none: server logs time no transfer"
    assert seen["throughput-graph"].splitlines()[-1].strip() == "server logs tell no throughput"
    assert "B/s" not in seen["ranks-list"], seen["ranks-list"]


def test_the_links_panel_on_sidecars_alone_says_logs_time_no_transfer_not_that_transfers_are_to_come():
    """The Links panel said `no transfers yet` on sidecars alone, as if transfers were to come; their logs time
    none: it says so, as the throughput chart does."""
    app = make_app(FixtureSource(_sidecars()), clock=lambda: T + 1)
    seen: dict[str, str] = {}

    async def play(pilot: Pilot[None]) -> None:
        await next_frame(pilot)
        seen["links"], seen["throughput"] = text(app, "#links"), text(app, "#throughput-title")

    drive(app, play, size=(200, 40))

    assert seen["links"].strip() == "none: server logs time no transfer"
    assert seen["throughput"].endswith("none: server logs time no transfer")
