"""A listing says what answered it, a relay or a bootstrap service (`AgentList.lister`), so a view given only the
bootstrap tells a relay's listing from the service's without reading counters; peers older than the field and newer
ones still read each other (a field past the end, wire version 1 both)."""

from __future__ import annotations

import msgspec

from transport import BootstrapClient, BootstrapServer
from transport.plane.relay import Relay, listed_by_relay
from transport.wire import (
    LISTED_BY_BOOTSTRAP,
    LISTED_BY_RELAY,
    WIRE_VERSION,
    AgentInfo,
    AgentList,
    BootstrapReply,
    FrameDecoder,
    RankLabel,
    ReasonText,
    encode,
)


class OlderAgentList(msgspec.Struct, tag="agents", array_like=True):
    """`AgentList` as peers before `lister` decode and send it."""

    req_id: int
    agents: list[AgentInfo]
    counters: dict[str, int] = {}
    refused: list[str] = []
    expired: list[AgentInfo] = []
    relays: list[AgentInfo] = []
    upstream_errors: list[ReasonText] = []
    kept: list[RankLabel] = []


def test_a_relay_and_the_bootstrap_service_it_registers_with_say_which_listed(bootstrap: BootstrapServer) -> None:
    """Only a relay's counters (`upstream_agents`) told its listing from the service's: a relay that reported
    none, or a service that came to count a like name, would be taken for the other. Each now says what it is."""
    relay = Relay(bootstrap=bootstrap.endpoint, register=True, name="rack").start()
    try:
        with BootstrapClient(relay.address, timeout_s=2.0, service="relay") as client:
            relayed = client.listing()
        with BootstrapClient(bootstrap.endpoint, timeout_s=2.0) as client:
            listed = client.listing()
    finally:
        relay.close()

    assert (relayed.lister, listed.lister) == (LISTED_BY_RELAY, LISTED_BY_BOOTSTRAP)
    assert [entry.instance for entry in listed.relays] == ["rack"]
    assert listed_by_relay(msgspec.structs.replace(relayed, counters={}))
    assert not listed_by_relay(msgspec.structs.replace(listed, counters={"upstream_agents": 0}))


def test_a_listing_crosses_peers_older_than_its_lister_both_ways() -> None:
    """An older reader takes a newer listing (the field past its end ignored); a newer reader takes an older one
    (`lister` empty) and tells a relay's by its counters, as before."""
    newer = AgentList(7, [], {"upstream_agents": 2}, upstream_errors=["relay tcp://rack:1 stopped"], lister="relay")
    older_relay = OlderAgentList(8, [], {"upstream_agents": 2}, upstream_errors=["relay tcp://rack:1 stopped"])
    older_service = OlderAgentList(9, [], {"requests": 3})

    read_by_older = msgspec.msgpack.decode(encode(newer)[1:], type=OlderAgentList)
    decoder: FrameDecoder[BootstrapReply] = FrameDecoder(BootstrapReply)
    read_relay, read_service = (decoder.decode(encode(old)) for old in (older_relay, older_service))

    assert encode(newer)[0] == WIRE_VERSION == 1
    assert read_by_older == OlderAgentList(7, [], {"upstream_agents": 2}, upstream_errors=newer.upstream_errors)
    assert isinstance(read_relay, AgentList) and isinstance(read_service, AgentList)
    assert (read_relay.lister, read_relay.upstream_errors) == ("", older_relay.upstream_errors)
    assert (listed_by_relay(read_relay), listed_by_relay(read_service)) == (True, False)
