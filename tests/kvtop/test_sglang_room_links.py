"""A room's link names a side whose log was not read as the other side's lines name it (a bootstrap address, a
session), never `?` where the logs name it; the instance its own log names takes over, its failed count moving."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest
from kvtop_cli import kvtop_here
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from sglang_lines import decode_failure, prefill_failure

from kvtop.export.metrics import ModelMetrics
from kvtop.model.cluster import JOURNAL_EVENTS_KEPT, LINKS_NAMED_KEPT, ClusterModel
from kvtop.model.shapes import LinkView
from kvtop.sources.sglang import load
from kvtop.sources.sglang.spec import LogSpec

pytestmark = pytest.mark.usefixtures("utc")

LOST = Path(__file__).parent / "fixtures" / "sglang" / "lost-prefill"
"""decode-0 (TP2) loses the prefill instance at 10.0.0.5:8998: five rooms fail on both ranks."""
ARGS = ["--sglang-log", str(LOST / "decode.log"), "--sglang-log", str(LOST / "prefill.log")]
ROOM = 7730001


def test_rooms_a_decode_lost_with_its_prefill_are_linked_to_the_bootstrap_address_in_every_view():
    """`kvtop rooms` said `?->decode-0` while `incidents` named the prefill at 10.0.0.5:8998; now the rooms, their
    JSON, the links `status` counts and the incident's suspect name the same address."""
    rooms = json.loads(kvtop_here("rooms", *ARGS, "--json").stdout)
    table = kvtop_here("rooms", *ARGS).stdout
    status = json.loads(kvtop_here("status", *ARGS, "--json").stdout)
    incidents = json.loads(kvtop_here("incidents", *ARGS, "--json").stdout)["incidents"]

    assert {(room["prefill"], room["decode"]) for room in rooms} == {("10.0.0.5:8998", "decode-0")}
    assert len(rooms) == 5
    assert table.count(" 10.0.0.5:8998->decode-0 ") == 5, table
    assert [(link["prefill"], link["decode"], link["failed_rooms"]) for link in status["links"]] == [
        ("10.0.0.5:8998", "decode-0", 5)
    ]
    assert [incident["suspect"]["name"] for incident in incidents] == ["10.0.0.5:8998"]


def test_a_prefill_alone_links_its_room_to_the_decode_session_it_gave_up_on(tmp_path: Path):
    """`remote mooncake session S is not alive` names the decode rank by its session: the room is `prefill-0->S`."""
    prefill = tmp_path / "prefill.log"
    not_alive = "Decode instance could be dead, remote mooncake session 10.0.3.17:15502 is not alive"
    prefill.write_text(prefill_failure("2026-07-10 22:03:12", ROOM, not_alive))

    rooms = json.loads(kvtop_here("rooms", "--sglang-log", f"prefill={prefill}", "--json").stdout)

    assert [(room["prefill"], room["decode"]) for room in rooms] == [("prefill-0", "10.0.3.17:15502")]


def _a_send_then_the_decodes_failure(tmp_path: Path) -> tuple[Path, Path]:
    """A prefill log whose send of ROOM to a decode session failed, and the decode log's own failure of it a second
    later."""
    prefill, decode = tmp_path / "prefill.log", tmp_path / "decode.log"
    prefill.write_text(
        prefill_failure("2026-07-10 22:03:11", ROOM, f"Failed to send kv chunk of {ROOM} to 10.0.3.17:41233")
    )
    decode.write_text(
        decode_failure("2026-07-10 22:03:12", ROOM, "Failed to get kvcache from prefill instance, it might be dead")
    )
    return prefill, decode


def test_the_decode_log_of_the_room_takes_the_sessions_place_and_its_failed_room_moves_with_it(tmp_path: Path):
    """The prefill's line names the session first; the decode's own line then names decode-0: the link is
    prefill-0->decode-0, counted once, and no link of the session is left."""
    prefill, decode = _a_send_then_the_decodes_failure(tmp_path)
    model = ClusterModel(JOURNAL_EVENTS_KEPT)
    load([LogSpec.parse(f"prefill={prefill}"), LogSpec.parse(f"decode={decode}")], model)

    assert model.link_of(ROOM) == ("prefill-0", "decode-0")
    assert {pair: link.failed_rooms for pair, link in model.links.items()} == {("prefill-0", "decode-0"): 1}


def test_an_address_that_is_no_host_and_port_names_no_side(tmp_path: Path):
    decode = tmp_path / "decode.log"
    decode.write_text(
        decode_failure("2026-07-10 22:03:12", ROOM, "Lost connection with prefill instance (bootstrap_addr: a b:99999)")
    )

    rooms = json.loads(kvtop_here("rooms", "--sglang-log", f"decode={decode}", "--json").stdout)

    assert [(room["prefill"], room["decode"]) for room in rooms] == [("", "decode-0")]


def test_the_exported_failed_rooms_of_a_link_a_room_moved_from_never_go_down(tmp_path: Path):
    """A scrape between the prefill's line (the room on the session's link) and the decode's (the room moves to
    prefill-0->decode-0) saw the session's `kvtop_link_failed_rooms_total` go from 1 to no series: a counter reset
    to Prometheus. The series stays at 1 beside the instance's link."""
    prefill, decode = _a_send_then_the_decodes_failure(tmp_path)
    model = ClusterModel(JOURNAL_EVENTS_KEPT)
    metrics = ModelMetrics(model, threading.Lock())

    def failed_rooms() -> dict[tuple[str, str], float]:
        registry = CollectorRegistry(auto_describe=False)
        registry.register(metrics)
        families = text_string_to_metric_families(generate_latest(registry).decode())
        return {
            (sample.labels["prefill_instance"], sample.labels["decode_instance"]): sample.value
            for family in families
            for sample in family.samples
            if sample.name == "kvtop_link_failed_rooms_total"
        }

    load([LogSpec.parse(f"prefill={prefill}")], model)
    before = failed_rooms()
    load([LogSpec.parse(f"decode={decode}")], model)

    assert model.link_of(ROOM) == ("prefill-0", "decode-0")  # the room moved, as the views show it
    assert before == {("prefill-0", "10.0.3.17:41233"): 1}
    assert failed_rooms() == {("prefill-0", "10.0.3.17:41233"): 1, ("prefill-0", "decode-0"): 1}


def test_a_log_naming_an_address_per_room_links_no_more_than_the_model_keeps_and_counts_the_rest(tmp_path: Path):
    """A prefill log whose every room names another session made a link apiece (a 64 KiB ring each, an exported
    series apiece): 20,000 such lines held 1.1 GB. Past `LINKS_NAMED_KEPT` links a new address links nothing (the
    room's side `?`) and is counted, in the model and in `status`; an address already linked still links."""
    prefill = tmp_path / "prefill.log"
    over = 3
    sessions = [f"10.1.{i // 250}.{i % 250}:15502" for i in range(LINKS_NAMED_KEPT + over)]
    lines = [
        prefill_failure(f"2026-07-10 22:{i // 60 % 60:02d}:{i % 60:02d}", ROOM + i, f"remote session {s} is not alive")
        for i, s in enumerate([*sessions, sessions[0]])
    ]
    prefill.write_text("".join(lines))
    model = ClusterModel(JOURNAL_EVENTS_KEPT)

    load([LogSpec.parse(f"prefill={prefill}")], model)

    assert len(model.links) == LINKS_NAMED_KEPT
    assert model.peers_unlinked == over
    assert model.link_of(ROOM + LINKS_NAMED_KEPT) == ("prefill-0", "")
    assert model.links[("prefill-0", sessions[0])].failed_rooms == 2
    status = json.loads(kvtop_here("status", "--sglang-log", f"prefill={prefill}", "--json").stdout)
    assert status["peers_unlinked"] == over


def test_the_exported_links_a_room_moved_from_are_bounded_keeping_those_the_model_holds(monkeypatch):
    """Logs that move room after room from an address's link to its instance's would grow the exporter's memory of
    the links' counts without end: past `LINK_FAILED_KEPT` only the model's links stay."""
    monkeypatch.setattr("kvtop.export.metrics.LINK_FAILED_KEPT", 8)
    model = ClusterModel(JOURNAL_EVENTS_KEPT)
    metrics = ModelMetrics(model, threading.Lock())
    for address in range(20):
        model.links = {("prefill-0", f"10.0.0.{address}:15004"): LinkView(failed_rooms=1)}
        families = list(metrics.collect())

    failed = next(family for family in families if family.name == "kvtop_link_failed_rooms")
    assert len(failed.samples) <= 8
    assert ("prefill-0", "10.0.0.19:15004") in {
        (s.labels["prefill_instance"], s.labels["decode_instance"]) for s in failed.samples
    }
