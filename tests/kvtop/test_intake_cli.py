"""One bad bootstrap entry blinds nothing: it is refused or skipped, counted and named, and views carry on."""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import msgspec
import pytest
import zmq
from kvtop_cli import kvtop

from transport import BootstrapClient
from transport.errors import BootstrapError
from transport.harness.cluster import ClusterSpec, LocalCluster
from transport.sockets import bind_ephemeral
from transport.wire import (
    AgentList,
    BootstrapReply,
    BootstrapRequest,
    FrameDecoder,
    ListAgents,
    Refusal,
    Register,
    encode,
)


def not_an_endpoint(cluster: LocalCluster):
    """A copy of the cluster's decode entry, posing as another rank, whose event endpoint is not an endpoint."""
    decode = next(agent for agent in cluster.agents() if agent.role == "decode")
    return msgspec.structs.replace(decode, instance="decode-9", event_endpoint="not-an-endpoint")


class UncheckedBootstrap:
    """A bootstrap service that lists whatever it is given (an older or foreign one): the cluster's agents plus
    extra entries, never validated."""

    def __init__(self, context: zmq.Context[zmq.Socket[bytes]], cluster: LocalCluster, extra: list) -> None:
        self._socket = context.socket(zmq.ROUTER)
        self._socket.linger = 0
        self.endpoint = bind_ephemeral(self._socket, "127.0.0.1")
        self._cluster, self._extra = cluster, extra
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        decoder: FrameDecoder[BootstrapRequest] = FrameDecoder(BootstrapRequest)
        while not self._stop.is_set():
            if self._socket.poll(50):
                identity, frame = self._socket.recv_multipart()
                request = decoder.decode(frame)
                assert isinstance(request, ListAgents)
                agents = [*self._cluster.bootstrap.agents(), *self._extra]
                self._socket.send_multipart([identity, encode(AgentList(request.req_id, agents))])

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self._socket.close(linger=0)


@pytest.fixture
def unchecked(zmq_context) -> Iterator:
    servers: list[UncheckedBootstrap] = []

    def start(cluster: LocalCluster, extra: list) -> UncheckedBootstrap:
        servers.append(UncheckedBootstrap(zmq_context, cluster, extra))
        return servers[-1]

    yield start
    for server in servers:
        server.close()


def test_a_registration_that_is_not_an_endpoint_is_refused_and_views_still_work(make_cluster):
    """The bootstrap refuses the entry; ranks and check see the healthy cluster and status names the refusal."""
    cluster = make_cluster(ClusterSpec(num_pages=16, page_bytes=4096))
    with BootstrapClient(cluster.endpoint) as client, pytest.raises(BootstrapError, match="event_endpoint"):
        client.register(not_an_endpoint(cluster))

    ranks = kvtop("ranks", "--bootstrap", cluster.endpoint, "--json")
    status = json.loads(kvtop("status", "--bootstrap", cluster.endpoint, "--json").stdout)
    check = kvtop("check", "--bootstrap", cluster.endpoint)

    assert (ranks.returncode, ranks.stderr) == (0, "")
    assert [(r["label"], r["state"]) for r in json.loads(ranks.stdout)] == [
        ("decode-0/TP0", "alive"),
        ("prefill-0/TP0", "alive"),
    ]
    assert status["bootstrap"]["rejected"] == {"invalid": 1}
    assert len(status["bootstrap"]["refused"]) == 1 and "decode-9/TP0" in status["bootstrap"]["refused"][0]
    assert check.stdout.startswith("KVTOP OK"), check.stdout


def test_an_unusable_listed_entry_is_skipped_counted_and_named_by_every_view(make_cluster, unchecked):
    """A listing with a not-an-endpoint entry: views exit 0 without a traceback, and name and count the entry."""
    cluster = make_cluster(ClusterSpec(num_pages=16, page_bytes=4096))
    fake = unchecked(cluster, [not_an_endpoint(cluster)])

    ranks = kvtop("ranks", "--bootstrap", fake.endpoint)
    status = json.loads(kvtop("status", "--bootstrap", fake.endpoint, "--json").stdout)
    events = kvtop("events", "--bootstrap", fake.endpoint)
    check = kvtop("check", "--bootstrap", fake.endpoint)

    assert ranks.returncode == 0 and "Traceback" not in ranks.stderr
    assert "skipped 1 unusable entries: decode-9/TP0: event_endpoint" in ranks.stdout
    assert 2 == status["ranks"]["alive"] == status["ranks"]["total"]
    assert list(status["collector"]["bad_entries"]) == ["decode-9/TP0"]
    assert "not-an-endpoint" in status["collector"]["bad_entries"]["decode-9/TP0"]
    assert events.returncode == 0 and "skipped decode-9/TP0" in events.stderr
    assert check.stdout.startswith("KVTOP OK"), check.stdout


def test_status_follow_keeps_its_collector_across_rediscoveries_of_a_bad_entry(make_cluster, unchecked):
    """`status --follow` on a listing with a bad entry reports every rank alive frame after frame."""
    cluster = make_cluster(ClusterSpec(num_pages=16, page_bytes=4096))
    fake = unchecked(cluster, [not_an_endpoint(cluster)])
    command = shutil.which("kvtop") or f"{sys.prefix}/bin/kvtop"
    follow = subprocess.Popen(
        [command, "status", "--bootstrap", fake.endpoint, "--follow", "--json", "--interval", "0.5"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        frames: list[dict] = []
        until = None  # 5 s of frames from the first one: past two rediscoveries (every 2 s)
        while until is None or time.monotonic() < until or len(frames) < 6:
            line = follow.stdout.readline()
            assert line, f"status --follow ended: {follow.stderr.read()}"
            frames.append(json.loads(line))
            until = until or time.monotonic() + 5.0
    finally:
        follow.terminate()
        follow.wait(10)

    assert len(frames) >= 6
    assert [(2, 0)] * len(frames) == [(f["ranks"]["alive"], f["ranks"]["gone"]) for f in frames]
    assert all("decode-9/TP0" in f["collector"]["bad_entries"] for f in frames)
    assert all(f["collector"]["error"] == "" for f in frames)


def test_a_rank_killed_before_kvtop_started_is_still_reported_gone_after_its_entry_expired(make_cluster, wait_for):
    """The bootstrap forgets a dead agent's entry but lists it as expired: a later `check` says it is gone."""
    cluster = make_cluster(ClusterSpec(num_pages=16, page_bytes=4096))
    cluster.bootstrap.entry_ttl_s = 3.0  # above the agents' refresh period (1 s), with room for a loaded machine
    cluster.kill("decode-0/TP0")
    wait_for(lambda: cluster.bootstrap.counters["expired"] >= 1, timeout=15, what="the entry expires")

    ranks = json.loads(kvtop("ranks", "--bootstrap", cluster.endpoint, "--json").stdout)
    check = kvtop("check", "--bootstrap", cluster.endpoint)

    assert [(r["label"], r["state"]) for r in ranks] == [("decode-0/TP0", "gone"), ("prefill-0/TP0", "alive")]
    assert check.returncode == 2
    assert check.stdout.startswith("KVTOP CRITICAL - ranks gone: decode-0/TP0"), check.stdout


def test_a_takeover_of_a_live_rank_from_another_address_is_refused_and_status_names_it(make_cluster, zmq_context):
    """Anyone reaching an insecure bootstrap registers the prefill rank with their own data endpoint: refused, so
    decode still sends to the real rank, and `status` counts and names it; a restart on the same host is named."""
    cluster = make_cluster(ClusterSpec(num_pages=16, page_bytes=4096))
    prefill = next(agent for agent in cluster.agents() if agent.role == "prefill")
    forged = msgspec.structs.replace(prefill, data_endpoint="tcp://127.0.0.2:6666", incarnation=prefill.incarnation + 1)
    dealer = zmq_context.socket(zmq.DEALER)
    dealer.linger = 0
    dealer.connect(f"tcp://127.0.0.2:0;{cluster.endpoint.removeprefix('tcp://')}")  # from another address
    dealer.send(encode(Register(1, forged)))
    assert dealer.poll(10_000), "the bootstrap did not answer"
    reply = FrameDecoder(BootstrapReply).decode(dealer.recv())
    dealer.close()

    with BootstrapClient(cluster.endpoint) as client:
        route = client.resolve(prefill.instance)
    status = kvtop("status", "--bootstrap", cluster.endpoint, "--json")
    text = kvtop("status", "--bootstrap", cluster.endpoint)

    assert isinstance(reply, Refusal)
    assert [rank.data_endpoint for rank in route] == [prefill.data_endpoint]
    bootstrap = json.loads(status.stdout)["bootstrap"]
    assert bootstrap["refused_takeover"] == 1 and bootstrap["replaced"] == 0
    assert bootstrap["refused"] == [
        f"prefill-0/TP0: registered from 127.0.0.2, but incarnation {prefill.incarnation} ({prefill.data_endpoint}) "
        "from 127.0.0.1 holds it live; it is taken only once that expires (from 127.0.0.2)"
    ]
    assert "bootstrap rejected: taking another client's live entry 1" in text.stdout


@contextlib.contextmanager
def _relay_before_a_refused_takeover(make_cluster, zmq_context) -> Iterator[str]:
    """A relay's address, before a bootstrap that refused a takeover of prefill-0/TP0 from 127.0.0.2; the relay has
    rejected a frame of its own (counted by the relay alone)."""
    from transport.plane.relay import Relay

    cluster = make_cluster(ClusterSpec(num_pages=16, page_bytes=4096))
    prefill = next(agent for agent in cluster.agents() if agent.role == "prefill")
    forged = msgspec.structs.replace(prefill, data_endpoint="tcp://127.0.0.2:6666", incarnation=prefill.incarnation + 1)
    dealer = zmq_context.socket(zmq.DEALER)
    dealer.linger = 0
    dealer.connect(f"tcp://127.0.0.2:0;{cluster.endpoint.removeprefix('tcp://')}")
    dealer.send(encode(Register(1, forged)))
    assert dealer.poll(10_000), "the bootstrap did not answer"
    dealer.close()
    relay = Relay(bootstrap=cluster.endpoint).start()
    bad = zmq_context.socket(zmq.DEALER)
    bad.linger = 0
    try:
        bad.connect(relay.address)
        bad.send(b"\xff not a request")
        yield relay.address
    finally:
        bad.close()
        relay.close()


@pytest.mark.processes
def test_status_through_a_relay_names_the_bootstraps_refusals_without_taking_the_relays_counters_for_its(
    make_cluster, zmq_context
):
    """Through a relay, `status` took the relay's own counters for the bootstrap's: a refused takeover read
    `bootstrap rejected: ` with nothing after it (the relay counts no refusal), and the relay's rejected frames would
    have read as the service's. The relay passes the refusals on, not the service's counts: said so."""
    with _relay_before_a_refused_takeover(make_cluster, zmq_context) as relay:
        text = kvtop("status", "--relay", relay)
        status = kvtop("status", "--relay", relay, "--json")

    line = next(line for line in text.stdout.splitlines() if line.startswith("bootstrap rejected"))
    assert line == "bootstrap rejected (named by the relay; the service's counts stay with it):", text.stdout
    assert "  refused prefill-0/TP0: registered from 127.0.0.2" in text.stdout
    bootstrap = json.loads(status.stdout)["bootstrap"]
    assert (bootstrap["rejected"], bootstrap["refused_takeover"]) == ({}, 0)
    assert [line.partition(":")[0] for line in bootstrap["refused"]] == ["prefill-0/TP0"]


@pytest.mark.processes
def test_a_recording_through_a_relay_says_the_refusals_are_the_relays_as_live_status_does(
    make_cluster, zmq_context, tmp_path
):
    """A recording made through a relay replays what live `status` through it says: the refusals named by the relay,
    the service's counts left with it (the relay's own counters, a frame it rejected, are not the service's).
    The collector keeps the listing's counters apart (f2e327e) before the recorder records them: a guard on that."""
    recording = tmp_path / "rec"
    with _relay_before_a_refused_takeover(make_cluster, zmq_context) as relay:
        live = kvtop("status", "--relay", relay)
        record = kvtop("record", "--relay", relay, "--out", str(recording), "--duration", "4")
    replayed = kvtop("status", "--replay", str(recording))
    as_json = json.loads(kvtop("status", "--replay", str(recording), "--json").stdout)

    assert record.returncode == 0, record.stderr
    said = [line for line in live.stdout.splitlines() if line.startswith("bootstrap rejected")]
    assert said == ["bootstrap rejected (named by the relay; the service's counts stay with it):"], live.stdout
    assert [line for line in replayed.stdout.splitlines() if line.startswith("bootstrap rejected")] == said
    assert "  refused prefill-0/TP0: registered from 127.0.0.2" in replayed.stdout
    assert (as_json["bootstrap"]["rejected"], as_json["bootstrap"]["refused_takeover"]) == ({}, 0)
