"""The relay's border posts: relay entries in the bootstrap, and what its snapshot ROUTER refuses."""

from __future__ import annotations

import os
import threading
from collections import Counter

import msgspec
import pytest
import zmq

from transport import BootstrapClient, BootstrapServer
from transport.bootstrap import LIVE_BYTES
from transport.errors import BootstrapError
from transport.plane.events import SnapshotRequest
from transport.plane.relay import Relay
from transport.sockets import SUBSCRIPTION_FRAME, bind_ephemeral
from transport.wire import (
    LISTED_BY_RELAY,
    MAX_CONTROL_FRAME,
    AgentInfo,
    AgentList,
    BootstrapRequest,
    FrameDecoder,
    encode,
)

RANK = AgentInfo("prefill", "rack-1", 0, 1, 4096, "tcp://127.0.0.1:5000", "", os.getpid(), "host", 7)
RELAY = AgentInfo(
    "relay", "rack-1", 0, 1, 1, "", "", os.getpid(), "host", 9, "", "tcp://127.0.0.1:5001", "tcp://127.0.0.1:5002"
)


def test_the_bootstrap_lists_a_relay_apart_and_its_name_never_replaces_a_rank(bootstrap: BootstrapServer):
    """A relay named like an instance is listed in `relays`, the rank stays in `agents`, resolve skips it."""
    with BootstrapClient(bootstrap.endpoint, timeout_s=2.0) as client:
        client.register(RANK)
        client.register(RELAY)
        listing = client.listing()
        resolved = client.resolve("rack-1")
        client.deregister(RELAY)
        after = client.listing()

    assert (listing.agents, listing.relays) == ([RANK], [RELAY])
    assert resolved == [RANK]
    assert (after.agents, after.relays) == ([RANK], [])


def test_the_bootstrap_refuses_a_relay_without_its_two_endpoints(bootstrap: BootstrapServer):
    """A relay entry nobody could subscribe to, or ask for a snapshot, is refused with the reason."""
    with BootstrapClient(bootstrap.endpoint, timeout_s=2.0) as client, pytest.raises(BootstrapError) as refused:
        client.register(msgspec.structs.replace(RELAY, snapshot_endpoint=""))

    assert "a relay without an event and a snapshot endpoint" in str(refused.value)
    assert bootstrap.relays() == []


@pytest.fixture
def relay(bootstrap: BootstrapServer) -> Relay:
    server = Relay(bootstrap=bootstrap.endpoint).start()
    yield server
    server.close()
    assert not server.died, server.error


def test_the_relay_counts_a_snapshot_request_for_an_unknown_agent_and_a_malformed_frame(
    relay: Relay, zmq_context: zmq.Context[zmq.Socket[bytes]], wait_for
):
    """Neither gets an answer or ends a thread: one is `snapshots_unroutable`, the other `rejected_malformed`."""
    dealer = zmq_context.socket(zmq.DEALER)
    dealer.linger = 0
    dealer.connect(relay.address)
    try:
        dealer.send(encode(SnapshotRequest(1, "nobody/TP0")))
        dealer.send(b"\x01not msgpack")
        wait_for(lambda: relay.snapshot()["rejected_malformed"] == 1, 5.0, "the malformed frame counted")
        wait_for(lambda: relay.snapshot()["snapshots_unroutable"] == 1, 5.0, "the unroutable request counted")
        assert dealer.poll(100) == 0
        with BootstrapClient(relay.address, timeout_s=2.0) as client:  # still serving
            assert [entry.event_endpoint for entry in client.listing().relays] == [relay.endpoint]
    finally:
        dealer.close()


def test_a_relay_whose_bootstrap_does_not_answer_fails_to_start_with_the_address():
    """No upstream at start is one clear error (the command exits 1 with it), not a relay serving nothing."""
    relay = Relay(bootstrap="tcp://127.0.0.1:9")
    try:
        with pytest.raises(BootstrapError, match=r"tcp://127\.0\.0\.1:9 did not answer"):
            relay.start(discover_timeout_s=0.3)
    finally:
        relay.close()


def test_a_relay_bound_to_a_wildcard_lists_the_host_views_can_reach(bootstrap: BootstrapServer):
    """Bound to 0.0.0.0, the relay's listing names the advertised host: no view connects to 0.0.0.0."""
    relay = Relay(bootstrap=bootstrap.endpoint, listen="tcp://0.0.0.0:*", advertise="relay.example")
    try:
        assert relay.entry.event_endpoint.startswith("tcp://relay.example:")
        assert relay.address.startswith("tcp://127.0.0.1:")  # bound to the loopback default
    finally:
        relay.close()


def test_the_relay_takes_no_subscription_longer_than_a_short_topic(relay: Relay):
    """Its XPUB forwards subscriptions as they come (a proxy), so libzmq kept every distinct topic a peer sent:
    1,000 of 60 KB took a relay from 53 MiB to 4.5 GB and stalled its forwarding. kvtop's subscriptions are one
    byte; a frame past `SUBSCRIPTION_FRAME` drops the peer that sent it."""
    assert relay._xpub.getsockopt(zmq.MAXMSGSIZE) == SUBSCRIPTION_FRAME <= 1024


class FullUpstream:
    """An upstream relay whose listing holds a bootstrap's full budget of the longest live entries, `prefix-N`."""

    def __init__(self, context: zmq.Context[zmq.Socket[bytes]], prefix: str) -> None:
        self._socket = context.socket(zmq.ROUTER)
        self._socket.linger = 0
        self.address = bind_ephemeral(self._socket, "127.0.0.1")
        endpoint = f"tcp://{'a' * 250}.b:65535"
        longest = msgspec.structs.replace(
            RANK, host="h" * 255, data_endpoint=endpoint, control_endpoint=endpoint, event_endpoint=endpoint,
            snapshot_endpoint=endpoint, consensus_endpoint=endpoint,
        )  # fmt: skip
        self.agents = []
        while sum(len(encode(agent)) for agent in self.agents) < LIVE_BYTES - 2000:
            self.agents.append(msgspec.structs.replace(longest, instance=f"{prefix}-{len(self.agents)}"))
        self._entry = msgspec.structs.replace(RELAY, instance=prefix, event_endpoint="tcp://127.0.0.1:9")
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        decoder: FrameDecoder[BootstrapRequest] = FrameDecoder(BootstrapRequest)
        while not self._stop.is_set():
            if self._socket.poll(50):
                identity, frame = self._socket.recv_multipart()
                request = decoder.decode(frame)
                listing = AgentList(request.req_id, self.agents, relays=[self._entry], lister=LISTED_BY_RELAY)
                self._socket.send_multipart([identity, encode(listing)])

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self._socket.close(linger=0)


def test_a_relay_joining_full_upstreams_still_answers_one_listing_and_says_what_it_left_out(zmq_context):
    """Three upstreams each at a bootstrap's budget joined to 5.9 MB, past the 4 MiB every reader takes, so no view
    could list through the relay: the relay keeps the budget, each upstream its share, counts the entries it left
    out and says so."""
    upstreams = [FullUpstream(zmq_context, f"rack-{index}") for index in range(3)]
    relay = Relay(relays=[upstream.address for upstream in upstreams])
    try:
        relay.start()
        with BootstrapClient(relay.address, timeout_s=5.0, service="relay") as client:
            listing = client.listing()
    finally:
        relay.close()
        for upstream in upstreams:
            upstream.close()

    total = sum(len(upstream.agents) for upstream in upstreams)
    assert len(encode(listing)) <= MAX_CONTROL_FRAME
    assert 0 < len(listing.agents) < total
    shares = Counter(agent.instance.rpartition("-")[0] for agent in listing.agents)
    assert set(shares) == {"rack-0", "rack-1", "rack-2"} and max(shares.values()) - min(shares.values()) <= 1
    assert listing.counters["listing_left_out"] == total - len(listing.agents)
    assert listing.refused == [
        f"{total - len(listing.agents)} live and 0 expired entries left out: the upstreams' listings joined take more "
        f"than one listing holds ({LIVE_BYTES} B of live entries, as many of expired)"
    ]


class BadEntryUpstream:
    """An upstream relay whose every listing holds one entry no reader may dial (a link-local endpoint)."""

    def __init__(self, context: zmq.Context[zmq.Socket[bytes]]) -> None:
        self._socket = context.socket(zmq.ROUTER)
        self._socket.linger = 0
        self.address = bind_ephemeral(self._socket, "127.0.0.1")
        self.bad = msgspec.structs.replace(RANK, instance="bad-0", data_endpoint="tcp://169.254.169.254:80")
        self.listed = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        decoder: FrameDecoder[BootstrapRequest] = FrameDecoder(BootstrapRequest)
        entry = msgspec.structs.replace(RELAY, event_endpoint="tcp://127.0.0.1:9")
        while not self._stop.is_set():
            if self._socket.poll(50):
                identity, frame = self._socket.recv_multipart()
                listing = AgentList(
                    decoder.decode(frame).req_id, [RANK, self.bad], relays=[entry], lister=LISTED_BY_RELAY
                )
                self._socket.send_multipart([identity, encode(listing)])
                self.listed += 1

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self._socket.close(linger=0)


def test_an_unusable_entry_listed_every_round_is_counted_once(zmq_context, wait_for):
    """`bad_entries` rose by one every listing round (every second) for the same entry, so a relay up a day said
    86,400 bad entries of one: it counts distinct entries, and the listing names it."""
    upstream = BadEntryUpstream(zmq_context)
    relay = Relay(relays=[upstream.address], discover_every_s=0.05)
    try:
        relay.start()
        wait_for(lambda: upstream.listed >= 6, 10.0, "several listing rounds")
        with BootstrapClient(relay.address, timeout_s=5.0, service="relay") as client:
            listing = client.listing()
    finally:
        relay.close()
        upstream.close()

    assert listing.counters["bad_entries"] == 1
    assert [line.partition(":")[0] for line in listing.refused] == ["bad-0/TP0"]


def test_a_view_through_the_relay_gets_the_bootstraps_refusals_with_their_role_and_age(bootstrap, relay, wait_for):
    """The relay listed its own unusable entries as `refused` and none of its bootstrap's refusals: a view through it
    never said why a rank was missing (`check` could name none). They pass on, their ages grown as they wait."""
    bad = msgspec.structs.replace(RANK, role="decode", instance="decode-0", data_endpoint="tcp://169.254.0.1:1")
    with BootstrapClient(bootstrap.endpoint, timeout_s=2.0) as client, pytest.raises(BootstrapError):
        client.register(bad)

    def listed() -> AgentList | None:
        with BootstrapClient(relay.address, timeout_s=2.0, service="relay") as client:
            listing = client.listing()
        return listing if listing.refusals else None

    listing = wait_for(listed, 10.0, "the bootstrap's refusal listed by the relay")
    (note,) = listing.refusals
    assert (note.role, note.line.partition(":")[0]) == ("decode", "decode-0/TP0") and 0 <= note.age_s < 60
    assert listing.refused == [note.line]
