"""Without CURVE, the bootstrap knows a client by its address only: a live entry stays its registering client's, and
an entry names only that client's own addresses, so whoever reaches the service cannot redirect a rank's data."""

from __future__ import annotations

import ipaddress
import itertools
import os
from collections.abc import Iterator

import msgspec
import pytest
from bootstrap_ask import ask

from transport import BootstrapClient, BootstrapServer
from transport.counters import Counters, rejection_names
from transport.errors import BootstrapError
from transport.kv.routes import RESOLVE_RETRY_S, RouteBook
from transport.plane.registrar import Registrar
from transport.registration import foreign_endpoint
from transport.wire import (
    AgentInfo,
    AgentList,
    Deregister,
    ListAgents,
    Refusal,
    Register,
    Registered,
)

GOOD = AgentInfo("prefill", "prefill-0", 0, 1, 4096, "tcp://127.0.0.1:5000", "", os.getpid(), "host", 7)
HIJACK = msgspec.structs.replace(GOOD, data_endpoint="tcp://127.0.0.2:6666", incarnation=GOOD.incarnation + 1)


@pytest.fixture
def short_lived() -> Iterator[BootstrapServer]:
    """A service whose entries expire 0.3 s after their last refresh."""
    server = BootstrapServer(entry_ttl_s=0.3).start()
    yield server
    server.close()


@pytest.mark.parametrize("claimed", [HIJACK, msgspec.structs.replace(HIJACK, incarnation=GOOD.incarnation)])
def test_a_live_entry_is_not_taken_by_a_registration_from_another_client(bootstrap, zmq_context, claimed):
    """Another address registering a live rank (a newer incarnation, or the listed one copied) is refused, counted
    and named with both clients; decode ranks still resolve the rank to its own data endpoint."""
    with BootstrapClient(bootstrap.endpoint) as client:
        client.register(GOOD)  # from 127.0.0.1
        reply = ask(zmq_context, bootstrap.endpoint, "127.0.0.2", Register(1, claimed))
        route = client.resolve(GOOD.instance)
        listing = client.listing()

    assert isinstance(reply, Refusal) and "127.0.0.1 holds it live" in reply.message
    assert route == [GOOD]
    assert listing.counters["refused_takeover"] == 1
    assert listing.refused == [
        f"prefill-0/TP0: registered from 127.0.0.2, but incarnation 7 ({GOOD.data_endpoint}) from 127.0.0.1 holds it "
        "live; it is taken only once that expires (from 127.0.0.2)"
    ]
    assert listing.replaced == []


def test_a_deregistration_from_another_client_is_refused_and_the_entry_stays(bootstrap, zmq_context):
    """Dropping a live entry from elsewhere (its incarnation is in every listing) would free it for a takeover."""
    with BootstrapClient(bootstrap.endpoint) as client:
        client.register(GOOD)
        request = Deregister(1, GOOD.instance, GOOD.rank, GOOD.incarnation, GOOD.pp)
        reply = ask(zmq_context, bootstrap.endpoint, "127.0.0.2", request)
        listing = client.listing()

    assert isinstance(reply, Refusal) and "deregistered from 127.0.0.2" in reply.message
    assert listing.agents == [GOOD]
    assert listing.counters["refused_takeover"] == 1 and listing.counters["deregistered"] == 0


def test_a_rank_restarted_on_the_same_host_takes_its_entry_at_once_and_is_named(bootstrap):
    """A new incarnation from the entry's own client replaces it at once (a restart), counted and named."""
    restarted = msgspec.structs.replace(GOOD, data_endpoint="tcp://127.0.0.1:5001", incarnation=8)
    with BootstrapClient(bootstrap.endpoint) as client:
        client.register(GOOD)
        client.register(GOOD)  # a refresh: no new incarnation
        client.register(restarted)
        route = client.resolve(GOOD.instance)
        listing = client.listing()

    assert route == [restarted]
    assert listing.counters["replaced"] == 1
    assert listing.replaced == ["prefill-0/TP0: incarnation 7 replaced by 8 (from 127.0.0.1)"]


def test_a_replaced_incarnation_that_registers_again_is_refused_and_listed_as_taken(bootstrap):
    """Two live processes of one host claiming one rank (sidecars on two servers' logs that name no instance, both
    `prefill-0`): the later holds it; the earlier's refresh is no restart, and is refused, named and listed as taken,
    not handed the entry back (each refresh took it from the other, a view alternating between the two)."""
    other = msgspec.structs.replace(GOOD, event_endpoint="tcp://127.0.0.1:5002", incarnation=8)
    with BootstrapClient(bootstrap.endpoint) as client:
        client.register(GOOD)
        client.register(other)
        with pytest.raises(BootstrapError, match="refused") as refused:
            client.register(GOOD)  # its refresh
        client.register(other)
        listing = client.listing()

    assert "incarnation 8 (tcp://127.0.0.1:5000) took it from this one, which still runs" in str(refused.value)
    assert "need an --instance each" in str(refused.value)
    assert listing.agents == [other] and listing.taken == [GOOD]
    assert (listing.counters["replaced"], listing.counters["refused_takeover"]) == (1, 1)


def test_another_client_takes_an_entry_once_it_expired_and_that_is_named(short_lived, zmq_context, wait_for):
    """A rank that moved hosts after it died registers from its new address once the old entry expired."""
    with BootstrapClient(short_lived.endpoint) as client:
        client.register(GOOD)
        wait_for(lambda: short_lived.counters["expired"] == 1, what="the entry expired")
        reply = ask(zmq_context, short_lived.endpoint, "127.0.0.2", Register(1, HIJACK))
        listing = ask(zmq_context, short_lived.endpoint, "127.0.0.2", ListAgents(2))

    assert isinstance(reply, Registered)
    assert isinstance(listing, AgentList) and listing.agents == [HIJACK]
    assert listing.replaced == ["prefill-0/TP0: expired incarnation 7 from 127.0.0.1 replaced by 8 from 127.0.0.2"]


@pytest.mark.parametrize(
    ("endpoint", "why"),
    [
        ("tcp://169.254.169.254:80", "link-local (where cloud metadata services answer)"),
        ("tcp://[fe80::1]:80", "link-local"),
        ("tcp://[fd00:ec2::254]:80", "a cloud metadata service"),
        ("tcp://[::ffff:169.254.169.254]:80", "link-local (where cloud metadata services answer)"),
        ("tcp://224.0.0.1:5000", "multicast"),
    ],
)
def test_an_endpoint_no_rank_listens_at_is_refused_from_any_client(bootstrap, endpoint, why):
    """A registration naming a metadata or multicast address (readers would dial it) is refused and counted."""
    with BootstrapClient(bootstrap.endpoint) as client:
        with pytest.raises(BootstrapError, match="refused"):
            client.register(msgspec.structs.replace(GOOD, event_endpoint=endpoint))
        listing = client.listing()

    assert listing.agents == []
    assert listing.counters["rejected_invalid"] == 1
    assert listing.refused == [
        f"prefill-0/TP0: event_endpoint: {endpoint!r} is {why}: no rank listens there (from 127.0.0.1)"
    ]


@pytest.mark.parametrize(
    ("endpoint", "client", "networks", "refused"),
    [
        ("tcp://10.0.0.5:5000", "10.0.0.5", (), False),
        ("tcp://10.0.0.6:5000", "10.0.0.5", (), True),
        ("tcp://10.1.0.6:5000", "10.0.0.5", (ipaddress.ip_network("10.1.0.0/16"),), False),
        ("tcp://127.0.0.1:5000", "10.0.0.5", (), True),
        ("tcp://localhost:5000", "10.0.0.5", (), True),
        ("tcp://10.0.0.6:5000", "127.0.0.2", (), False),  # this machine: any of its addresses
        ("tcp://10.0.0.6:5000", "localhost:0:0:4242", (), False),  # ipc: this machine
        ("tcp://node-7.example.com:5000", "10.0.0.5", (), False),  # a name is not resolved at the border
        ("tcp://[2001:db8::6]:5000", "2001:db8::5", (), True),
        ("ipc:///tmp/agent", "10.0.0.5", (), False),
    ],
)
def test_an_endpoint_must_be_the_registering_clients_own_address(endpoint, client, networks, refused):
    """An IP endpoint from a remote client is its own address, or in a configured network; loopback only locally."""
    assert bool(foreign_endpoint(endpoint, client, networks)) == refused


def test_a_remote_client_naming_another_hosts_endpoint_is_refused_and_named(bootstrap, zmq_context, own_address):
    """From a non-loopback address, an entry naming a different host's IP (or loopback) is refused, counted, named."""
    own = own_address
    other = str(ipaddress.ip_address(own) + 1)
    mine = msgspec.structs.replace(GOOD, data_endpoint=f"tcp://{own}:5000")
    theirs = msgspec.structs.replace(GOOD, instance="prefill-1", data_endpoint=f"tcp://{other}:5000")
    loopback = msgspec.structs.replace(GOOD, instance="prefill-2")

    replies = [ask(zmq_context, bootstrap.endpoint, own, Register(1, agent)) for agent in (mine, theirs, loopback)]
    with BootstrapClient(bootstrap.endpoint) as client:
        listing = client.listing()

    assert [type(reply) for reply in replies] == [Registered, Refusal, Refusal]
    assert listing.agents == [mine]
    assert listing.counters["rejected_invalid"] == 2
    assert "loopback address registered from" in listing.refused[0]
    assert f"not the registering client's address {own}" in replies[1].message  # type: ignore[union-attr]


def test_a_stray_rank_of_another_tp_size_is_never_paired_as_a_missing_rank(bootstrap, zmq_context, wait_for):
    """A TP2 instance whose rank 1 has not registered yet, and a rank 2 of a TP8 registered from elsewhere: the
    decode's route counted two ranks, took the stray as rank 1 and sent it the room's requests. Now the instance
    stays unresolved (the stray counted invalid) until its own rank 1 registers."""
    rank_0 = msgspec.structs.replace(GOOD, tp=2)
    rank_1 = msgspec.structs.replace(rank_0, rank=1, data_endpoint="tcp://127.0.0.1:5001")
    stray = msgspec.structs.replace(GOOD, rank=2, tp=8, data_endpoint="tcp://127.0.0.2:6666")
    counters = Counters(("send_failures", *rejection_names()))
    routes = RouteBook(zmq_context, bootstrap.endpoint, counters)
    clock = itertools.count(step=RESOLVE_RETRY_S)

    def look() -> list[AgentInfo] | None:
        """The route's answer now, read after any reply waiting (each look may ask the service again)."""
        routes.handle()
        return routes.lookup(rank_0.instance, next(clock))

    try:
        with BootstrapClient(bootstrap.endpoint) as client:
            client.register(rank_0)
            assert isinstance(ask(zmq_context, bootstrap.endpoint, "127.0.0.2", Register(1, stray)), Registered)

            wait_for(lambda: look() is not None or counters["rejected_invalid"] > 0, what="a route answered")
            assert look() is None
            client.register(rank_1)
            wait_for(lambda: look() is not None, what="the instance resolved")
            assert look() == [rank_0, rank_1]
    finally:
        routes.close()


def test_a_rank_whose_refreshes_are_refused_logs_why(bootstrap, zmq_context, wait_for, caplog):
    """An engine's refresh answered with a refusal (its name held by another client) was dropped unread: now it is
    kept and logged (once per reason: refreshes come every second)."""
    squatted = ask(zmq_context, bootstrap.endpoint, "127.0.0.2", Register(1, HIJACK))
    routes = RouteBook(zmq_context, bootstrap.endpoint, Counters(("send_failures", *rejection_names())))
    try:
        routes.register(GOOD)
        wait_for(lambda: routes.handle() or routes.refused, what="the refresh answered")
    finally:
        routes.close()

    assert isinstance(squatted, Registered)
    assert routes.refused.startswith(f"bootstrap {bootstrap.endpoint} refused: registration of ")  # as a sidecar's
    assert "127.0.0.2 holds it live" in routes.refused
    logged = [record.getMessage() for record in caplog.records if record.name == "transport.kv.routes"]
    heard = "no peer finds this rank (new views hear it: listed as taken)"
    assert logged == [f"cannot register, so {heard}: {routes.refused}"]


def test_each_refusal_is_listed_with_its_ranks_role_and_age_and_a_hosts_roles_apart(bootstrap, zmq_context):
    """A host's refused decode rank stays named beside its refused prefill rank (one line per client hid one), and
    each line comes with the rank's role and how long ago it was refused, for a reader to judge what it explains."""
    with BootstrapClient(bootstrap.endpoint) as client:
        client.register(GOOD)
    decode = msgspec.structs.replace(GOOD, role="decode", instance="decode-0", data_endpoint="tcp://169.254.0.1:1")
    assert isinstance(ask(zmq_context, bootstrap.endpoint, "127.0.0.2", Register(1, HIJACK)), Refusal)
    assert isinstance(ask(zmq_context, bootstrap.endpoint, "127.0.0.2", Register(2, decode)), Refusal)
    with BootstrapClient(bootstrap.endpoint) as client:
        listing = client.listing()

    assert [(note.role, note.line.partition(":")[0]) for note in listing.refusals] == [
        ("prefill", "prefill-0/TP0"),
        ("decode", "decode-0/TP0"),
    ]
    assert listing.refused == [note.line for note in listing.refusals]
    assert all(0 <= note.age_s < 60 for note in listing.refusals)


def test_a_sidecars_refused_rank_holds_up_no_other_ranks_refresh(bootstrap, zmq_context, wait_for):
    """A registrar stopped at the first refusal: the ranks after a refused one were never refreshed and expired.
    Each rank's problem is its own (`problems`, by label), for its heartbeat to say."""
    bad = msgspec.structs.replace(GOOD, instance="bad-0", data_endpoint="tcp://169.254.0.1:1")
    registrar = Registrar(bootstrap.endpoint, lambda: [bad, GOOD], zmq_context).start()
    try:
        wait_for(lambda: registrar.registered, what="a registration accepted")
        with BootstrapClient(bootstrap.endpoint) as client:
            listed = client.list_agents()
        problems = dict(registrar.problems)
    finally:
        registrar.close()

    assert listed == [GOOD]
    assert list(problems) == ["bad-0/TP0"] and "is link-local" in problems["bad-0/TP0"]
