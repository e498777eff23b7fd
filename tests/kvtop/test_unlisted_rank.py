"""A rank whose refresh the bootstrap service refuses after it started (its entry expired, then taken by another
client) is alive but listed nowhere a peer looks: no peer resolves it (the service lists it apart, as taken, so new
views hear it). Its engine logged why; now its
heartbeat says it too: `kvtop ranks` and `kvtop status` show it beside the rank, and `kvtop check` is CRITICAL."""

from __future__ import annotations

import json
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import msgspec
import pytest
import zmq
from kvtop_cli import kvtop

from kvtop.sidecar.ranks import RankPublisher, sidecar_info
from kvtop.sources import live
from kvtop.sources.live import Collector
from tests.conftest import wait_for
from transport import BootstrapClient, BootstrapServer, KVManager, KVPool, Role
from transport.plane.events import Failure, Heartbeat
from transport.plane.publisher import EventPublisher
from transport.plane.registrar import Registrar
from transport.plane.relay import Relay
from transport.wire import AgentInfo, Register, encode

pytestmark = pytest.mark.processes

HEARD = "another client holds its entry: no peer finds it; new views hear it as taken"
"""Who misses a rank refused because another client holds its entry: the service (and a relay) lists it as taken."""
TAKEN = "prefill-0/TP0~taken"


@pytest.fixture
def short_lived() -> Iterator[BootstrapServer]:
    """A service whose entries expire 0.3 s after their last refresh (a rank refreshes every second)."""
    server = BootstrapServer(entry_ttl_s=0.3).start()
    yield server
    server.close()


@contextmanager
def taken_over(server: BootstrapServer, taker: AgentInfo, context: zmq.Context[zmq.Socket[bytes]]) -> Iterator[None]:
    """Another client (127.0.0.2) registering `taker` every 0.1 s until the block ends: it holds the rank's entry once
    the rank's own expires, and the rank's refreshes are refused."""
    stop = threading.Event()

    def take() -> None:
        dealer = context.socket(zmq.DEALER)
        dealer.linger = 0
        dealer.connect(f"tcp://127.0.0.2:0;{server.endpoint.removeprefix('tcp://')}")
        try:
            while not stop.wait(0.1):
                dealer.send(encode(Register(1, taker)))
        finally:
            dealer.close()

    taking = threading.Thread(target=take)
    taking.start()
    try:
        yield
    finally:
        stop.set()
        taking.join()


@pytest.fixture
def rank(short_lived: BootstrapServer) -> Iterator[KVManager]:
    """A prefill rank registered with `short_lived`."""
    manager = KVManager(role=Role.PREFILL, instance="prefill-0", rank=0, tp=1, pool=KVPool(16, 4096),
                        bootstrap=short_lived.endpoint)  # fmt: skip
    manager.start()
    yield manager
    manager.close()


def test_a_rank_whose_refresh_is_refused_says_why_in_ranks_and_status(short_lived, rank, zmq_context, wait_for):
    taker = msgspec.structs.replace(rank.info, data_endpoint="tcp://127.0.0.2:6666", incarnation=1)
    with taken_over(short_lived, taker, zmq_context):
        wait_for(lambda: rank._routes.refused, timeout=15, what="the rank's refresh refused")

        def said() -> str:
            ranks = kvtop("ranks", "--connect", rank.info.event_endpoint, "--wait", "2")
            return ranks.stdout if "unlisted:" in ranks.stdout else ""

        ranks = wait_for(said, timeout=30, what="ranks saying the rank is unlisted")
        status = kvtop("status", "--connect", rank.info.event_endpoint, "--wait", "2")
        check = kvtop("check", "--connect", rank.info.event_endpoint, "--wait", "2", "--json")

    why = "127.0.0.2 holds it live; it is taken only once that expires"
    row = next(line for line in ranks.splitlines() if line.startswith("prefill-0/TP0"))
    refused = f"bootstrap {short_lived.endpoint} refused: registration of prefill-0/TP0 refused"  # as a sidecar's
    assert "alive" in row and f"unlisted: {refused}" in row and why in row
    assert f"unlisted prefill-0/TP0 ({HEARD}): {refused}" in status.stdout
    assert why in status.stdout
    verdict = json.loads(check.stdout)
    assert (check.returncode, verdict["ranks_unlisted"]) == (2, ["prefill-0/TP0"])
    assert verdict["summary"].startswith(
        "ranks unlisted (another client holds their entry: no peer finds them; new views hear them as taken): "
        "prefill-0/TP0 (bootstrap tcp:"
    )


def test_a_view_started_after_the_takeover_hears_the_rank_the_bootstrap_refuses(
    short_lived, rank, zmq_context, wait_for
):
    """The taker's entry names endpoints of its own: a view given the bootstrap, started after the takeover, heard
    only of the taker (silent) and said `no agent answered`, though the rank ran on. The service lists the rank it
    refuses apart while it refreshes (`AgentList.taken`): the view hears it, alive and unlisted."""
    elsewhere = {name: f"tcp://127.0.0.2:{port}" for name, port in
                 (("data_endpoint", 6666), ("event_endpoint", 6667), ("snapshot_endpoint", 6668))}  # fmt: skip
    taker = msgspec.structs.replace(rank.info, incarnation=1, **elsewhere)
    with taken_over(short_lived, taker, zmq_context):
        wait_for(lambda: rank._routes.refused, timeout=15, what="the rank's refresh refused")
        ranks = kvtop("ranks", "--bootstrap", short_lived.endpoint, "--wait", "5")

    row = next((line for line in ranks.stdout.splitlines() if line.startswith("prefill-0/TP0~taken ")), "")
    assert " alive " in row and "unlisted: bootstrap " in row, ranks.stdout + ranks.stderr


def test_a_view_through_a_relay_hears_the_rank_the_bootstrap_refuses(short_lived, rank, zmq_context, wait_for):
    """The relay joined the bootstrap's listing without its `taken`, and subscribed only to the listed entries: a
    view through it, started after the takeover, heard only of the silent taker. It subscribes to the taken rank
    and lists it as taken, so the view hears it, alive and unlisted, as one given the bootstrap does."""
    elsewhere = {name: f"tcp://127.0.0.2:{port}" for name, port in
                 (("data_endpoint", 6666), ("event_endpoint", 6667), ("snapshot_endpoint", 6668))}  # fmt: skip
    taker = msgspec.structs.replace(rank.info, incarnation=1, **elsewhere)
    with taken_over(short_lived, taker, zmq_context):
        wait_for(lambda: rank._routes.refused, timeout=15, what="the rank's refresh refused")
        relay = Relay(bootstrap=short_lived.endpoint, discover_every_s=0.2).start()
        try:

            def listed_taken() -> list[AgentInfo]:
                with BootstrapClient(relay.address) as client:
                    return client.listing().taken

            [listed] = wait_for(listed_taken, timeout=15, what="the relay listing the rank as taken")
            ranks = kvtop("ranks", "--relay", relay.address, "--wait", "5")
            status = kvtop("status", "--relay", relay.address, "--wait", "5")
        finally:
            relay.close()

    assert (listed.label, listed.incarnation) == (rank.info.label, rank.info.incarnation)
    row = next((line for line in ranks.stdout.splitlines() if line.startswith("prefill-0/TP0~taken ")), "")
    assert " alive " in row and "unlisted: bootstrap " in row, ranks.stdout + ranks.stderr
    assert f"unlisted prefill-0/TP0~taken ({HEARD}): bootstrap " in status.stdout, status.stdout + status.stderr


@pytest.mark.parametrize("through_relay", [False, True])
def test_a_view_shows_the_taker_and_the_rank_it_took_from_apart(
    short_lived, rank, make_publisher, zmq_context, wait_for, through_relay
):
    """The taker publishes under the rank's label too, from another process at another address: a view heard both
    as one rank, which its batches made anew as each incarnation in turn. It hears the rank the service lists as
    taken under `prefill-0/TP0~taken`: two rows, both alive, the taken one unlisted and its snapshot its own."""
    publisher = make_publisher()
    taker = msgspec.structs.replace(
        publisher.info, data_endpoint="tcp://127.0.0.2:6666", host="taker-host", pid=4242, incarnation=1
    )
    publisher.info = taker
    stop = threading.Event()

    def beat() -> None:  # the taker runs: its heartbeats say so
        while not stop.wait(0.2):
            publisher.emit(Heartbeat(time.time(), {}, 0, 0, 1.0, 1 << 20, 10.0, publisher.snapshot_endpoint))

    beating = threading.Thread(target=beat)
    beating.start()
    try:
        with taken_over(short_lived, taker, zmq_context):
            wait_for(lambda: rank._routes.refused, timeout=15, what="the rank's refresh refused")
            ranks = ranks_listed(short_lived, through_relay)
    finally:
        stop.set()
        beating.join()

    rows = {row["label"]: row for row in json.loads(ranks.stdout)}
    assert rows.keys() == {"prefill-0/TP0", "prefill-0/TP0~taken"}, ranks.stdout + ranks.stderr
    listed, took = rows["prefill-0/TP0"], rows["prefill-0/TP0~taken"]
    assert (listed["state"], listed["host"], listed["unlisted"]) == ("alive", "taker-host", None)
    assert (took["state"], took["host"], took["rank"]) == ("alive", rank.info.host, 0)
    assert "holds it live" in took["unlisted"]


def ranks_listed(server: BootstrapServer, through_relay: bool) -> subprocess.CompletedProcess[str]:
    """`kvtop ranks --json` of `server`'s cluster, directly or through a relay of it (started and closed here)."""
    if not through_relay:
        return kvtop("ranks", "--bootstrap", server.endpoint, "--wait", "5", "--json")
    relay = Relay(bootstrap=server.endpoint, discover_every_s=0.2).start()
    try:
        return kvtop("ranks", "--relay", relay.address, "--wait", "5", "--json")
    finally:
        relay.close()


@contextmanager
def two_claimants(
    server: BootstrapServer,
    make_publisher: Callable[[], EventPublisher],
    context: zmq.Context[zmq.Socket[bytes]],
    pp: int | None = None,
) -> Iterator[tuple[RankPublisher, EventPublisher]]:
    """A sidecar's rank (of stage `pp`) registered with `server` and another client's publisher taking its entry,
    both beating, until the block ends; yielded once the rank's refresh is refused (listed as taken)."""
    rank = RankPublisher(sidecar_info("prefill", "prefill-0", 0, 1, 77, pp=pp), "127.0.0.1", context)
    registrar = Registrar(server.endpoint, lambda: [rank.info], context).start()
    publisher = make_publisher()
    taker = msgspec.structs.replace(
        rank.info, event_endpoint=publisher.endpoint, snapshot_endpoint=publisher.snapshot_endpoint,
        host="taker-host", pid=4242, incarnation=1,
    )  # fmt: skip
    publisher.info = taker
    stop = threading.Event()

    def beat() -> None:  # both run: their heartbeats say so, the rank's with why it is unlisted
        while not stop.wait(0.2):
            publisher.emit(Heartbeat(time.time(), {}, 0, 0, 1.0, 1 << 20, 10.0, publisher.snapshot_endpoint))
            rank.emit(Heartbeat(time.time(), {}, 0, 0, 1.0, 1 << 20, 10.0, rank.publisher.snapshot_endpoint,
                                registration=registrar.problem))  # fmt: skip

    beating = threading.Thread(target=beat)
    beating.start()
    try:
        with taken_over(server, taker, context):
            wait_for(lambda: registrar.problem, timeout=15, what="the rank's refresh refused")
            yield rank, publisher
    finally:
        stop.set()
        beating.join()
        registrar.close()
        rank.close()


@pytest.mark.parametrize("through_relay", [False, True])
def test_a_later_pipeline_stage_s_rank_and_its_taker_are_shown_apart_under_its_stage_s_label(
    short_lived, make_publisher, zmq_context, through_relay
):
    """A sidecar's rank of pipeline stage 1, its entry taken by another client. Its batches named no stage, so a view
    heard it (and its taker) as `prefill-0/TP0`, a rank nobody registered, never as the rank the service lists as
    taken, `prefill-0/PP1-TP0`; a relay routed neither name's snapshots where they were asked. Its batches name the
    stage now: the taker and the rank it took from are two rows of the stage's label, as for the first stage."""
    with two_claimants(short_lived, make_publisher, zmq_context, pp=1) as (rank, _):
        ranks = ranks_listed(short_lived, through_relay)

    rows = {row["label"]: row for row in json.loads(ranks.stdout)}
    assert rows.keys() == {"prefill-0/PP1-TP0", "prefill-0/PP1-TP0~taken"}, ranks.stdout + ranks.stderr
    listed, took = rows["prefill-0/PP1-TP0"], rows["prefill-0/PP1-TP0~taken"]
    assert (listed["state"], listed["host"], listed["unlisted"]) == ("alive", "taker-host", None)
    assert (took["state"], took["host"], took["pid"]) == ("alive", rank.info.host, rank.info.pid)
    assert "holds it live" in took["unlisted"]


def test_the_incidents_of_a_taken_rank_and_its_taker_are_each_their_own(short_lived, make_publisher, zmq_context):
    """Both claimants refuse rooms, each recording `prefill-0/TP0` as the origin and suspect: one incident counted
    the taken process's rooms as the taker's. Its own failures are heard under its taken label."""
    with two_claimants(short_lived, make_publisher, zmq_context) as (rank, publisher):
        for claimant, rooms in ((rank, (1, 2)), (publisher, (3,))):
            for room in rooms:
                claimant.emit(Failure(time.time(), room, "prefill-0/TP0", f"Prefill rank 0 refused room {room}",
                                      "refused", "warning", False, "prefill-0/TP0", "prefill-0/TP0"))  # fmt: skip
        listed = kvtop("incidents", "--bootstrap", short_lived.endpoint, "--wait", "5", "--json")

    found = {
        i["suspect"]["name"]: (sorted(i["rooms"]), i["noticed_by"]) for i in json.loads(listed.stdout)["incidents"]
    }
    assert found == {
        "prefill-0/TP0~taken": ([1, 2], {"prefill-0/TP0~taken": 2}),
        "prefill-0/TP0": ([3], {"prefill-0/TP0": 1}),
    }, listed.stdout + listed.stderr


@contextmanager
def collecting(address: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Collector]:
    """A view's collector (what `kvtop top` runs) on `address`, listing it every 0.2 s, until the block ends."""
    monkeypatch.setattr(live, "DISCOVER_EVERY_S", 0.2)
    collector = Collector(address).start(discover_timeout_s=5.0)
    try:
        yield collector
    finally:
        collector.close()


def heard_anew(collector: Collector, label: str, incarnation: int, what: str, timeout: float = 20.0) -> None:
    """Wait until the view hears `label`'s `incarnation` after now."""
    since = time.time()

    def heard() -> bool:
        with collector.lock:
            view = collector.model.ranks.get(label)
            return view is not None and view.incarnation == incarnation and view.last_seen > since

    wait_for(heard, timeout=timeout, what=what)


def test_a_rank_taken_at_an_address_a_listed_entry_names_is_heard_once_per_batch(
    short_lived, rank, zmq_context, wait_for, monkeypatch
):
    """The taker's entry names the rank's own event endpoint (the rank's address, another data endpoint): the rank
    is listed there and taken. A view given the bootstrap heard it on the agents' socket and on one it opened for the
    taken rank: each batch twice, every second one counted stale. It hears the address on one socket."""
    taker = msgspec.structs.replace(rank.info, data_endpoint="tcp://127.0.0.2:6666", incarnation=1)
    with taken_over(short_lived, taker, zmq_context):
        wait_for(lambda: rank._routes.refused, timeout=15, what="the rank's refresh refused")
        with collecting(short_lived.endpoint, monkeypatch) as collector:
            incarnation = rank.info.incarnation
            heard_anew(collector, TAKEN, incarnation, "the taken rank heard")
            wait_for(collector.synced, timeout=15, what="the view synced")
            with collector.lock:
                before = collector.model.intake.counters["batches"], collector.model.intake.counters["stale_batches"]

            def three_more() -> bool:
                with collector.lock:
                    return collector.model.intake.counters["batches"] >= before[0] + 3

            wait_for(three_more, timeout=15, what="three more of the rank's batches")  # a heartbeat a second
            with collector.lock:
                stale = collector.model.intake.counters["stale_batches"]

    assert stale == before[1]


@pytest.mark.parametrize("through_relay", [False, True])
def test_a_rank_taken_again_after_it_held_its_entry_counts_no_gap(
    short_lived, rank, zmq_context, wait_for, monkeypatch, through_relay
):
    """Taken, then holding its entry again (its batches heard under its own label), then taken again: through a
    relay, the view kept the first stream of its taken label, whose next seq was long past, and counted every batch
    the rank sent meanwhile as lost. A rank that leaves the listing's taken is forgotten under its taken label,
    through a relay as directly: taken again, it is heard anew."""
    elsewhere = {name: f"tcp://127.0.0.2:{port}" for name, port in
                 (("data_endpoint", 6666), ("event_endpoint", 6667), ("snapshot_endpoint", 6668))}  # fmt: skip
    taker = msgspec.structs.replace(rank.info, incarnation=1, **elsewhere)
    incarnation = rank.info.incarnation
    relay = Relay(bootstrap=short_lived.endpoint, discover_every_s=0.2).start() if through_relay else None
    try:
        address = relay.address if relay is not None else short_lived.endpoint
        with collecting(address, monkeypatch) as collector:
            for turn in ("first", "second"):
                with taken_over(short_lived, taker, zmq_context):
                    heard_anew(collector, TAKEN, incarnation, f"the rank heard as taken ({turn} takeover)")
                    wait_for(collector.synced, timeout=15, what="the view synced")
                # `short_lived` lists the rank about a third of each second (its 0.3 s entries, refreshed every
                # second): through a relay, on a loaded machine, hearing it again took up to 32 s (8 s directly)
                back = f"the rank heard as itself ({turn} time again)"
                heard_anew(collector, "prefill-0/TP0", incarnation, back, timeout=60)
            with collector.lock:
                gaps, runs = collector.model.gaps, dict(collector._subscriber.gaps)
    finally:
        if relay is not None:
            relay.close()

    assert gaps == 0, runs
