"""The bootstrap service is a border post and forgets: bad registrations are refused, dead agents expire."""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time

import msgspec
import numpy as np
import pytest
import zmq

from transport import BootstrapClient, BootstrapServer, KVManager, KVPoll, KVPool, Role, reach
from transport.bootstrap import MAX_ENTRIES, MAX_PER_CLIENT
from transport.errors import BootstrapError
from transport.harness.cluster import ClusterSpec
from transport.registration import endpoint_problem
from transport.sockets import bind_ephemeral
from transport.wire import (
    LOG_SIDECAR,
    MAX_CONTROL_FRAME,
    AgentInfo,
    BootstrapReply,
    BootstrapRequest,
    FrameDecoder,
    Refusal,
    Register,
    Registered,
    Resolve,
    Route,
    encode,
)

GOOD = AgentInfo("prefill", "prefill-0", 0, 1, 4096, "tcp://127.0.0.1:5000", "", os.getpid(), "host", 7)


@pytest.mark.parametrize(
    "endpoint",
    ["tcp://127.0.0.1:5555", "tcp://node-7.example.com:1", "tcp://[::1]:65535", "ipc:///tmp/kvtop/agent-0"],
)
def test_endpoint_syntax_accepts_tcp_host_port_and_ipc_paths(endpoint):
    """A connectable tcp or ipc endpoint has no problem."""
    assert endpoint_problem(endpoint) == ""


@pytest.mark.parametrize(
    "endpoint",
    [
        "not-an-endpoint",
        "tcp://127.0.0.1",
        "tcp://127.0.0.1:0",
        "tcp://127.0.0.1:65536",
        "tcp://127.0.0.1:12ab",
        "tcp://*:5555",
        "tcp://:5555",
        "udp://127.0.0.1:5555",
        "ipc://",
        "ipc:///" + "x" * 200,
    ],
)
def test_endpoint_syntax_names_what_is_wrong(endpoint):
    """An endpoint libzmq would refuse (or one nobody can reach) is a problem, with a reason."""
    assert endpoint_problem(endpoint)


def test_a_bootstrap_host_that_does_not_resolve_is_said_not_blamed_on_curve_keys():
    """A mistyped host name (ZeroMQ retries its connect in silence) said `did not answer within 0.5s (if it serves
    CURVE, pass its --curve-keys)`: a hint away from the typo. It names the host that does not resolve."""
    with (
        BootstrapClient("tcp://no-such-host.invalid:5555", timeout_s=0.5) as client,
        pytest.raises(BootstrapError) as raised,
    ):
        client.list_agents()

    said = str(raised.value)
    assert said.startswith("bootstrap tcp://no-such-host.invalid:5555 did not answer within 0.5s (")
    assert "no-such-host.invalid does not resolve: " in said and "CURVE" not in said


@pytest.mark.parametrize(
    ("endpoint", "why"),
    [
        ("tcp://127.0.0.1:{port}", "(nothing listens on 127.0.0.1:{port}: the connection was refused)"),
        ("tcp://[::1]:{port}", "(::1 has only IPv6 addresses, and kvtop dials IPv4)"),
        ("ipc://{tmp}/nothing-here", "(no socket at {tmp}/nothing-here)"),
    ],
    ids=["refused", "ipv6", "no-socket"],
)
def test_an_address_nothing_can_answer_at_is_said_not_blamed_on_curve_keys(endpoint, why, tmp_path):
    """They said `(if it serves CURVE, pass its --curve-keys)`, as for a service that takes the connection: a port
    nobody listens on, an IPv6 address ZeroMQ does not dial here, a socket path that does not exist."""
    with socket.socket() as probe:  # a port free now: nobody listens on it
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    endpoint, why = (text.format(port=port, tmp=tmp_path) for text in (endpoint, why))
    with BootstrapClient(endpoint, timeout_s=0.2) as client, pytest.raises(BootstrapError) as raised:
        client.list_agents()

    assert str(raised.value) == f"bootstrap {endpoint} did not answer within 0.2s {why}"


def test_a_name_lookup_that_hangs_is_said_not_waited_out_after_the_deadline(monkeypatch):
    """The hint looked the host up after the call's deadline with no bound of its own: a name server that does
    not answer added its own timeouts (seconds) to the caller's."""
    release = threading.Event()

    def hanging(*_: object) -> None:
        release.wait(60)
        raise socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution")

    monkeypatch.setattr(reach.socket, "getaddrinfo", hanging)
    try:
        with BootstrapClient("tcp://slow.example:5555", timeout_s=0.2) as client, pytest.raises(BootstrapError) as e:
            client.list_agents()
    finally:
        release.set()

    assert str(e.value).endswith("(slow.example did not resolve or take a connection within 0.5s)")


def test_a_service_that_takes_the_connection_and_says_nothing_keeps_the_curve_hint(zmq_context):
    """A port that takes the connection and never answers (a CURVE service, to a client without its keys): the
    CURVE hint, the one cause left."""
    silent = zmq_context.socket(zmq.ROUTER)
    endpoint = f"tcp://127.0.0.1:{silent.bind_to_random_port('tcp://127.0.0.1')}"
    try:
        with BootstrapClient(endpoint, timeout_s=0.2) as client, pytest.raises(BootstrapError) as raised:
            client.list_agents()
    finally:
        silent.close(linger=0)

    assert str(raised.value).endswith("did not answer within 0.2s (if it serves CURVE, pass its --curve-keys)")


@pytest.mark.parametrize(
    ("greets", "why"),
    [
        (b"", "took the connection but sent no ZeroMQ greeting within"),
        (b"SSH-2.0-OpenSSH_9.6\r\n", "answers, but not in ZeroMQ (it opened with b'SSH-2.0-OpenSSH_9.6"),
    ],
    ids=["http-silent", "ssh-banner"],
)
def test_a_port_that_speaks_no_zeromq_is_said_so_not_blamed_on_curve_keys(greets: bytes, why: str):
    """A bootstrap address that is some other server's port (SGLang's own bootstrap port speaks HTTP and says
    nothing until asked; an SSH server greets first) said `(if it serves CURVE, pass its --curve-keys)`, sending
    the operator after keys; a ZeroMQ peer greets at once, so the look tells them apart."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        host, port = server.getsockname()
        taken: list[socket.socket] = []

        def accept() -> None:  # the client's own connections and the look's: each greeted, each held open
            with contextlib.suppress(OSError):
                while True:
                    connection, _ = server.accept()
                    connection.sendall(greets)
                    taken.append(connection)

        threading.Thread(target=accept, daemon=True).start()
        with BootstrapClient(f"tcp://{host}:{port}", timeout_s=0.2) as client, pytest.raises(BootstrapError) as e:
            client.list_agents()
        for connection in taken:
            connection.close()

    said = str(e.value)
    assert f"did not answer within 0.2s ({host}:{port} {why}" in said
    assert "CURVE" not in said


@pytest.mark.parametrize(
    ("changes", "why"),
    [
        ({"event_endpoint": "not-an-endpoint"}, "event_endpoint"),
        ({"data_endpoint": "tcp://127.0.0.1:99999"}, "data_endpoint"),
        ({"data_endpoint": ""}, "data endpoint"),
        ({"role": "router"}, "role"),
        ({"instance": "prefill/0"}, "instance"),
        ({"instance": ""}, "instance"),
        ({"rank": 2, "tp": 2}, "rank"),
        ({"tp": 0}, "rank"),
        ({"page_bytes": -1}, "page size"),
        ({"host": "h" * 300}, "host"),
        ({"host": "node-1\x1b]0;owned\x07\nfake line"}, "host name 'node-1"),
        ({"event_endpoint": "ipc:///tmp/\x1b[2Jagent"}, "event_endpoint: ipc path '/tmp/"),
        ({"kind": "router"}, "kind"),
    ],
)
def test_bootstrap_refuses_an_invalid_registration_counts_and_names_it(bootstrap, changes, why):
    """A registration with a bad endpoint, role, name, rank or size is refused, counted and named; the rest work."""
    bad = msgspec.structs.replace(GOOD, **changes)
    with BootstrapClient(bootstrap.endpoint) as client:
        with pytest.raises(BootstrapError, match=why):
            client.register(bad)
        client.register(GOOD)
        listing = client.listing()

    assert listing.agents == [GOOD]
    assert listing.counters["rejected_invalid"] == 1
    assert len(listing.refused) == 1 and why in listing.refused[0]


def test_a_log_sidecars_prefill_rank_registers_without_a_data_plane_and_is_never_a_route(bootstrap):
    """A sidecar's rank (kind log_sidecar) is listed for kvtop, but a decode rank resolving its instance
    gets only the ranks that move KV."""
    sidecar = msgspec.structs.replace(GOOD, kind=LOG_SIDECAR, data_endpoint="", control_endpoint="", page_bytes=0,
                                      instance="prefill-9")  # fmt: skip
    with BootstrapClient(bootstrap.endpoint) as client:
        client.register(sidecar)
        listing, route = client.listing(), client.resolve("prefill-9")

    assert (listing.agents, route) == ([sidecar], [])


def test_two_pipeline_stages_of_one_tp_rank_are_two_entries_each_deregistered_alone(bootstrap):
    """A sidecar of a PP2 server registers PP0's TP3 and PP1's TP3: keyed by instance and rank, the second replaced
    the first, and the collector heard one stage only."""
    first = msgspec.structs.replace(GOOD, kind=LOG_SIDECAR, data_endpoint="", page_bytes=0, rank=3, tp=4)
    second = msgspec.structs.replace(first, pp=1)
    with BootstrapClient(bootstrap.endpoint) as client:
        client.register(first)
        client.register(second)
        both = {agent.label for agent in client.list_agents()}
        client.deregister(second)
        left = {agent.label for agent in client.list_agents()}

    assert (both, left) == ({"prefill-0/TP3", "prefill-0/PP1-TP3"}, {"prefill-0/TP3"})


def test_a_first_stage_sent_as_stage_0_is_the_entry_of_its_label(bootstrap):
    """`pp` 0 and None both mean the first stage (one label, `prefill-0/TP3`): two keys made one label two entries."""
    first = msgspec.structs.replace(GOOD, kind=LOG_SIDECAR, data_endpoint="", page_bytes=0, rank=3, tp=4)
    with BootstrapClient(bootstrap.endpoint) as client:
        client.register(first)
        client.register(msgspec.structs.replace(first, pp=0, incarnation=first.incarnation + 1))
        labels = [agent.label for agent in client.list_agents()]

    assert labels == ["prefill-0/TP3"]


def listed(server: BootstrapServer) -> set[str]:
    with BootstrapClient(server.endpoint) as client:
        return {agent.label for agent in client.list_agents()}


def test_a_killed_agents_entry_expires_and_a_live_one_stays(make_cluster, wait_for):
    """SIGKILL leaves no goodbye: the entry expires within its TTL, while a live agent's refreshes keep its own."""
    cluster = make_cluster(ClusterSpec())
    ttl_s = cluster.bootstrap.entry_ttl_s = 3.0  # three refresh periods: a loaded machine's late refresh is fine
    cluster.kill("decode-0/TP0")
    killed_at = time.monotonic()

    wait_for(lambda: listed(cluster.bootstrap) == {"prefill-0/TP0"}, timeout=15.0, what="the killed entry expires")
    assert time.monotonic() - killed_at < ttl_s + 3.0
    deadline = time.monotonic() + 2 * cluster.bootstrap.entry_ttl_s
    while time.monotonic() < deadline:
        assert "prefill-0/TP0" in listed(cluster.bootstrap), "a live agent's entry expired"
        time.sleep(0.2)
    assert cluster.bootstrap.counters["expired"] == 1
    with BootstrapClient(cluster.endpoint) as client:
        assert [agent.label for agent in client.listing().expired] == ["decode-0/TP0"]


def test_an_agent_that_exits_cleanly_deregisters_at_once(make_cluster, wait_for):
    """SIGTERM: the agent takes its entry out on the way down, long before any TTL would."""
    cluster = make_cluster(ClusterSpec())
    cluster.bootstrap.entry_ttl_s = 300.0
    process = cluster.process("decode-0/TP0").process
    process.terminate()
    assert process.wait(10) == 0

    assert {"prefill-0/TP0"} == listed(cluster.bootstrap)
    assert cluster.bootstrap.counters["deregistered"] == 1
    assert cluster.bootstrap.counters["expired"] == 0


class UncheckedBootstrap:
    """A service that registers anyone and resolves every instance to one unusable prefill rank (an older or
    foreign service, which validates nothing)."""

    def __init__(self, context: zmq.Context[zmq.Socket[bytes]]) -> None:
        self.socket = context.socket(zmq.ROUTER)
        self.socket.linger = 0
        self.endpoint = bind_ephemeral(self.socket, "127.0.0.1")
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        decoder: FrameDecoder[BootstrapRequest] = FrameDecoder(BootstrapRequest)
        bad = msgspec.structs.replace(GOOD, data_endpoint="not-an-endpoint")
        while not self._stop.is_set():
            if self.socket.poll(50):
                identity, frame = self.socket.recv_multipart()
                request = decoder.decode(frame)
                reply = Route(request.req_id, request.instance, [bad]) if isinstance(request, Resolve) else None
                self.socket.send_multipart([identity, encode(reply or Registered(request.req_id))])

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self.socket.close(linger=0)


def test_a_resolved_rank_nobody_can_connect_to_is_counted_and_the_engine_keeps_running(zmq_context, wait_for):
    """A route listing a prefill rank whose data endpoint is not an endpoint: counted, skipped, no crash."""
    service = UncheckedBootstrap(zmq_context)
    decode = KVManager(role=Role.DECODE, instance="decode-0", rank=0, tp=1, pool=KVPool(16, 4096),
                       bootstrap=service.endpoint).start()  # fmt: skip
    try:
        receiver = decode.receiver(0x99, "prefill-0")
        receiver.init(np.arange(4, dtype=np.uint32))

        wait_for(lambda: decode.rejections()["bootstrap"]["invalid"] >= 2, what="the unusable rank is counted")
        assert decode._thread.is_alive()
        assert KVPoll.Bootstrapping == receiver.poll()
    finally:
        decode.close()
        service.close()


def flood(
    context: zmq.Context[zmq.Socket[bytes]],
    endpoint: str,
    count: int,
    source: str,
    first_name: int = 0,
    entry: AgentInfo = GOOD,
) -> tuple[int, int]:
    """Register `count` made-up prefill ranks (`entry` named `flood-N` from `first_name` on) from the address
    `source` (a loopback one: 127.0.0.2), as fast as the service answers; returns how many it accepted and
    refused."""
    dealer = context.socket(zmq.DEALER)
    dealer.linger = 0
    dealer.connect(f"tcp://{source}:0;{endpoint.removeprefix('tcp://')}")  # ZeroMQ's source;destination form
    decoder: FrameDecoder[BootstrapReply] = FrameDecoder(BootstrapReply)
    replies: list[BootstrapReply] = []
    try:
        for first in range(0, count, 500):  # a window at a time: past the HWM, a ROUTER drops replies
            window = range(first, min(first + 500, count))
            for index in window:
                named = msgspec.structs.replace(entry, instance=f"flood-{first_name + index}")
                dealer.send(encode(Register(index + 1, named)))
            for _ in window:
                assert dealer.poll(10_000), "the service stopped answering the flood"
                replies.append(decoder.decode(dealer.recv()))
    finally:
        dealer.close()
    return sum(isinstance(r, Registered) for r in replies), sum(isinstance(r, Refusal) for r in replies)


def test_one_client_flooding_registrations_locks_out_no_agent_registering_from_elsewhere(
    bootstrap, make_manager, zmq_context
):
    """More registrations than the service holds, from one address: it keeps its share, the rest are refused,
    counted and named with that address, and a real agent registering from another address is listed."""
    count = MAX_ENTRIES + 100
    accepted, refused = flood(zmq_context, bootstrap.endpoint, count, "127.0.0.2")
    agent = make_manager(Role.PREFILL, "prefill-real")  # registers from 127.0.0.1
    with BootstrapClient(bootstrap.endpoint) as client:
        listing = client.listing()

    assert (accepted, refused) == (MAX_PER_CLIENT, count - MAX_PER_CLIENT)
    assert agent.info.label in {entry.label for entry in listing.agents}
    assert len(listing.agents) == MAX_PER_CLIENT + 1
    assert listing.counters["refused_client_limit"] == refused
    assert listing.refused == [
        f"flood-{count - 1}/TP0: the client holds {MAX_PER_CLIENT} entries already, the most one client may "
        f"(from 127.0.0.2, {refused} of its prefill registrations refused)"
    ]


def test_a_clients_entries_that_expire_give_its_share_back_and_it_keeps_its_share_of_the_expired(zmq_context, wait_for):
    """A client at its share registers again once its entries expired; of its expired entries (listed as gone),
    the newest share is kept, so a flood pushes no other client's dead ranks out of the listing."""
    server = BootstrapServer(entry_ttl_s=0.3, max_per_client=8).start()
    try:
        with BootstrapClient(server.endpoint) as client:
            client.register(msgspec.structs.replace(GOOD, instance="dead-elsewhere"))
        assert flood(zmq_context, server.endpoint, 12, "127.0.0.2") == (8, 4)
        wait_for(lambda: server.counters["expired"] == 9, what="every entry expired")
        assert flood(zmq_context, server.endpoint, 20, "127.0.0.2", first_name=100) == (8, 12)
        wait_for(lambda: server.counters["expired"] == 17, what="the second flood's entries expired")
        with BootstrapClient(server.endpoint) as client:
            gone = sorted(entry.instance for entry in client.listing().expired)
    finally:
        server.close()

    assert gone == ["dead-elsewhere", *sorted(f"flood-{index}" for index in range(100, 108))]


def test_a_flood_of_the_longest_entries_leaves_a_listing_every_reader_takes(bootstrap, zmq_context):
    """Entries of 1.7 KB (every field as long as allowed) from three addresses: 3072 of them made a 5 MB listing,
    past the 4 MiB frame every reader takes, so every listing 'did not answer' and the cluster listed nobody.
    Past a client's share of the listing's bytes its registrations are refused, counted and named."""
    host = "a" * 250 + ".b"
    endpoint = f"tcp://{host}:65535"
    longest = msgspec.structs.replace(
        GOOD, host="h" * 255, data_endpoint=endpoint, control_endpoint=endpoint, event_endpoint=endpoint,
        snapshot_endpoint=endpoint, consensus_endpoint=endpoint,
    )  # fmt: skip
    refused = sum(
        flood(zmq_context, bootstrap.endpoint, 1024, f"127.0.0.{2 + i}", 2000 * i, longest)[1] for i in range(3)
    )

    with BootstrapClient(bootstrap.endpoint) as client:
        client.register(GOOD)  # a rank registering from elsewhere
        listing = client.listing()

    assert GOOD in listing.agents
    assert len(encode(listing)) <= MAX_CONTROL_FRAME
    assert listing.counters["refused_client_limit"] == refused > 0
    assert "B already, of " in listing.refused[-1]
