"""Incidents in the model: suspects, kinds of failure, the quiet gap, aborts apart, echoes before origins,
liveness, bounds, keyframes (DOMAIN.md, "Origins, suspects and incidents")."""

from __future__ import annotations

import gzip
import itertools
import json
import threading
from pathlib import Path
from typing import TypeVar

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from kvtop.export.metrics import ModelMetrics
from kvtop.model.cluster import ClusterModel
from kvtop.model.fold import Observed, fold_room
from kvtop.model.incidents import QUIET_GAP_S, IncidentTracker, room_groups
from kvtop.model.shapes import STALE_S
from kvtop.model.suspects import _HELD, Suspect
from kvtop.record.keyframes import capture, restore
from kvtop.views.check import Thresholds
from kvtop.views.failures import render_groups
from kvtop.views.incidents import in_span, incident_json, render
from kvtop.views.tables import ranks_json, ranks_text, status_json
from transport.kv.reasons import pool_full
from transport.kvpoll import KVPoll
from transport.plane.events import EVENT_SCHEMA, Event, EventBatch, Failure, Heartbeat, RoomState, TransferDone
from transport.wire import AgentInfo

T0 = 1_800_000_000.0
_seq = itertools.count(1)


def deliver(model: ClusterModel, label: str, events: list[Event], now: float) -> None:
    instance, _, rank = label.rpartition("/TP")
    role = "prefill" if instance.startswith("prefill") else "decode"
    model.apply(label, EventBatch(EVENT_SCHEMA, role, instance, int(rank), 1, next(_seq), now, events), now)


def origin(ts: float, room: int, rank: str, reason: str, reason_class: str, suspect: str = "") -> Failure:
    level = "warning" if rank.startswith("prefill") else "error"
    return Failure(ts, room, rank, reason, reason_class, level, False, rank, suspect)


def echo(ts: float, room: int, rank: str, of: str, reason: str = "Aborted by decode peer x") -> Failure:
    return Failure(ts, room, rank, reason, "propagated", "debug", True, of)


def checksum(ts: float, room: int, decode: str = "decode-0/TP1", sender: str = "prefill-0/TP1") -> Failure:
    text = f"KV chunk 2 of room {room} from prefill rank {sender[-1]} failed its checksum (expected 1, got 2)"
    return origin(ts, room, decode, text, "checksum", sender)


def incidents(model: ClusterModel, now: float) -> list[tuple[str, str, int]]:
    """(suspect, kind, rooms) of every incident, oldest first, after a sweep at `now`."""
    model.sweep(now)
    return [
        (incident.suspect.text, incident.kind, incident.room_count)
        for incident in sorted(model.incidents.incidents.values(), key=lambda incident: incident.first_seen)
    ]


def test_a_corrupting_sender_is_one_incident_over_every_room_it_broke_with_the_noticing_ranks_counted():
    """Two decode ranks notice checksum mismatches of prefill-0/TP1's chunks; the prefill echoes them: one
    incident, suspect prefill-0/TP1, every room listed, the decode ranks as who noticed."""
    model = ClusterModel()
    for room in range(1, 11):
        decode = f"decode-{room % 2}/TP1"
        deliver(model, decode, [checksum(T0 + room, room, decode)], T0 + room)
        deliver(model, "prefill-0/TP1", [echo(T0 + room + 0.01, room, "prefill-0/TP1", decode)], T0 + room)

    assert incidents(model, T0 + 11) == [("prefill-0/TP1", "corrupt", 10)]
    incident = next(iter(model.incidents.incidents.values()))
    assert (sorted(incident.rooms), incident.origins, incident.echoes) == (list(range(1, 11)), 10, 10)
    assert incident.noticed_by == {"decode-0/TP1": 5, "decode-1/TP1": 5}
    assert incident.headline() == "prefill-0/TP1 sends corrupt KV (checksum)"


def test_a_quiet_gap_splits_an_incident_and_ends_the_first():
    """The same suspect and kind 10 minutes apart: two incidents, the first ended, the second ongoing."""
    model = ClusterModel()
    gap = model.incidents.quiet_gap_s
    for room, ts in ((1, T0), (2, T0 + 5), (3, T0 + 5 + gap + 1)):
        deliver(model, "decode-0/TP1", [checksum(ts, room)], ts)

    assert incidents(model, T0 + 6 + gap) == [("prefill-0/TP1", "corrupt", 2), ("prefill-0/TP1", "corrupt", 1)]
    first, second = sorted(model.incidents.incidents.values(), key=lambda incident: incident.first_seen)
    assert (first.ongoing(T0 + 6 + gap), second.ongoing(T0 + 6 + gap)) == (False, True)


def test_two_suspects_at_once_stay_two_incidents_and_two_kinds_of_one_suspect_too():
    """prefill-0/TP0 and prefill-0/TP1 corrupt in the same seconds while its TP2 sends whole KV (not every rank of it:
    no incident of the instance); prefill-0/TP1 also refuses: three."""
    model = ClusterModel()
    _beat(model, T0, "prefill-0/TP2")
    for room in range(1, 7):
        sender = f"prefill-0/TP{room % 2}"
        deliver(model, "decode-0/TP0", [checksum(T0 + room, room, "decode-0/TP0", sender)], T0 + room)
    refused = origin(T0 + 3.5, 99, "prefill-0/TP1", "Prefill rank 1 refused the transfer request of room 99",
                     "refused", "prefill-0/TP1")  # fmt: skip
    deliver(model, "prefill-0/TP1", [refused], T0 + 4)

    assert sorted(incidents(model, T0 + 8)) == [
        ("prefill-0/TP0", "corrupt", 3),
        ("prefill-0/TP1", "corrupt", 3),
        ("prefill-0/TP1", "refusing", 1),
    ]


def test_client_aborts_are_an_incident_of_the_client_apart_from_the_cluster():
    """Aborts on both sides of three rooms: one incident whose suspect is the client, flagged as such."""
    model = ClusterModel()
    for room in (1, 2, 3):
        for rank in ("decode-0/TP0", "prefill-0/TP0"):
            deliver(model, rank, [origin(T0 + room, room, rank, "Aborted by AbortReq.", "aborted", "client")], T0)

    assert incidents(model, T0 + 4) == [("the client", "aborted", 3)]
    assert next(iter(model.incidents.incidents.values())).client


def test_incidents_list_the_ongoing_by_start_then_the_ended_and_a_new_failure_moves_none():
    """Every view's order (`in_order`, `in_span`): the cluster's ongoing incidents, earliest start on top, then the
    client's aborts, then the ended; more failures of the later ongoing incident leave every row where it was."""
    model = ClusterModel()
    gap = model.incidents.quiet_gap_s
    refused = origin(T0 - gap - 30, 99, "prefill-1/TP0", "Prefill rank 0 refused the transfer request of room 99",
                     "refused", "prefill-1/TP0")  # fmt: skip
    deliver(model, "prefill-1/TP0", [refused], T0 - gap - 30)
    deliver(model, "decode-0/TP0", [checksum(T0 + 1, 1, "decode-0/TP0", "prefill-0/TP0")], T0 + 1)
    abort = origin(T0 + 2, 2, "decode-0/TP1", "Aborted by AbortReq.", "aborted", "client")
    deliver(model, "decode-0/TP1", [abort], T0 + 2)
    deliver(model, "decode-1/TP0", [checksum(T0 + 3, 3, "decode-1/TP0", "prefill-0/TP1")], T0 + 3)
    order = ["prefill-0/TP0", "prefill-0/TP1", "the client", "prefill-1/TP0"]

    model.sweep(T0 + 4)
    assert [incident.suspect.text for incident in model.incidents.in_order(T0 + 4)] == order
    for room in range(4, 10):  # the second incident grows, the first stays quiet
        deliver(model, "decode-1/TP0", [checksum(T0 + room, room, "decode-1/TP0", "prefill-0/TP1")], T0 + room)
        model.sweep(T0 + room + 0.5)
        assert [incident.suspect.text for incident in in_span(model, None, T0 + room + 0.5)] == order
    assert [incident.room_count for incident in model.incidents.in_order(T0 + 10)][:2] == [1, 7]


def test_an_echo_heard_a_sweep_before_its_origin_waits_for_it_and_makes_no_incident_of_its_own():
    """The prefill's echo arrives a sweep before the decode's checksum origin: the sweep holds the echo's room
    once, and once the origin is in, the room is in the sender's incident alone (nothing counted its guess)."""
    model = ClusterModel()
    deliver(model, "prefill-0/TP1", [echo(T0, 7, "prefill-0/TP1", "decode-0/TP1")], T0)
    before = incidents(model, T0 + 0.5)
    deliver(model, "decode-0/TP1", [checksum(T0 - 0.01, 7)], T0 + 0.6)

    assert before == []
    assert incidents(model, T0 + 1) == [("prefill-0/TP1", "corrupt", 1)]
    assert model.incidents.started == {("corrupt", "rank"): 1}


def test_echoes_whose_origin_never_comes_are_an_incident_of_that_origin_a_sweep_later():
    """A rank that died before publishing its own record: its echoes wait one sweep, then name it."""
    model = ClusterModel()
    deliver(model, "prefill-0/TP1", [echo(T0, 7, "prefill-0/TP1", "decode-0/TP1")], T0)

    assert incidents(model, T0 + 0.5) == []
    assert incidents(model, T0 + 1.0) == [("decode-0/TP1", "failing", 1)]  # its own record never arrived


def test_an_echo_that_carries_its_origins_suspect_names_what_broke_not_the_rank_that_never_published():
    """A decode rank killed after its checksum records reached its instance's vote but not a view (a one-shot
    view after the kill): its peer's echoes carry what it named, prefill-0/TP1; rooms of an incident of that
    suspect under way join it, whatever its kind; with none under way they start one of their own. Before, each
    was `decode-0/TP1 fails transfers (propagated)`: the dead rank that only noticed."""
    model = ClusterModel()
    deliver(model, "decode-0/TP0", [checksum(T0, 1, "decode-0/TP0")], T0)
    carried = Failure(T0 + 1, 2, "decode-0/TP0", "Failed due to an unknown reason from another rank", "propagated",
                      "debug", True, "decode-0/TP1", "prefill-0/TP1")  # fmt: skip
    deliver(model, "decode-0/TP0", [carried], T0 + 1)
    alone = Failure(T0 + 1, 3, "decode-1/TP0", "Failed due to an unknown reason from another rank", "propagated",
                    "debug", True, "decode-1/TP1", "prefill-1/TP0")  # fmt: skip
    deliver(model, "decode-1/TP0", [alone], T0 + 1)
    model.sweep(T0 + 1.5)  # echoes of an origin not seen wait a sweep for it

    assert incidents(model, T0 + 2) == [("prefill-0/TP1", "corrupt", 2), ("prefill-1/TP0", "failing", 1)]


def test_an_echo_that_carries_a_suspect_with_two_kinds_of_incident_under_way_joins_neither():
    """The echo tells what its origin named, not which kind of failure it recorded: with prefill-0/TP1 both
    corrupting and stalling, a timeout's echo was filed as corrupt KV; it is `fails transfers`, no guess."""
    model = ClusterModel()
    deliver(model, "decode-0/TP0", [checksum(T0, 1, "decode-0/TP0")], T0)
    stalled = origin(T0, 2, "decode-0/TP0", "Request 2 timed out after 3.0s in KVPoll.Transferring",
                     "timeout_transfer", "prefill-0/TP1")  # fmt: skip
    deliver(model, "decode-0/TP0", [stalled], T0)
    carried = Failure(T0 + 1, 3, "decode-0/TP0", "Failed due to an unknown reason from another rank", "propagated",
                      "debug", True, "decode-0/TP1", "prefill-0/TP1")  # fmt: skip
    deliver(model, "decode-0/TP0", [carried], T0 + 1)
    model.sweep(T0 + 1.5)

    assert sorted(incidents(model, T0 + 2)) == [
        ("prefill-0/TP1", "corrupt", 1),
        ("prefill-0/TP1", "failing", 1),
        ("prefill-0/TP1", "unresponsive", 1),
    ]


def test_an_echo_that_carries_its_origins_class_too_joins_the_incident_of_that_kind():
    """An agent that carries the class its origin recorded makes the kind exact: with prefill-0/TP1 both
    corrupting and stalling, a timeout's echo (its origin's rank died before a view got its record) joins the
    stall, and a checksum's echo the corruption; neither is the vaguer `fails transfers`."""
    model = ClusterModel()
    deliver(model, "decode-0/TP0", [checksum(T0, 1, "decode-0/TP0")], T0)
    stalled = origin(T0, 2, "decode-0/TP0", "Request 2 timed out after 3.0s in KVPoll.Transferring",
                     "timeout_transfer", "prefill-0/TP1")  # fmt: skip
    deliver(model, "decode-0/TP0", [stalled], T0)
    carried = [
        Failure(T0 + 1, room, "decode-0/TP0", "Failed due to an unknown reason from another rank", "propagated",
                "debug", True, "decode-0/TP1", "prefill-0/TP1", origin_class)
        for room, origin_class in ((3, "timeout_transfer"), (4, "checksum"), (5, "timeout_transfer"))
    ]  # fmt: skip
    deliver(model, "decode-0/TP0", carried, T0 + 1)
    model.sweep(T0 + 1.5)

    assert sorted(incidents(model, T0 + 2)) == [("prefill-0/TP1", "corrupt", 2), ("prefill-0/TP1", "unresponsive", 3)]
    by_kind = {incident.kind: incident for incident in model.incidents.incidents.values()}
    assert by_kind["unresponsive"].classes == {"timeout_transfer": 3}
    assert by_kind["unresponsive"].noticed_by == {"decode-0/TP0": 1, "decode-0/TP1": 2}  # not the echoing rank
    table = render_groups(model.groups(), debug=False)
    assert "decode-0/TP1     checksum" in table and "an echo carried its class and suspect, prefill-0/TP1" in table


def test_an_origin_that_came_after_its_echo_moves_the_room_out_of_the_echoes_incident():
    """Read at once (a one-shot view folds what it has), the echo alone made an incident of its own guess; the
    origin that comes later takes the room out of it, and nothing is left of the guess."""
    model = ClusterModel()
    deliver(model, "prefill-0/TP1", [echo(T0, 7, "prefill-0/TP1", "decode-0/TP1")], T0)
    model.update_incidents()
    before = [(i.suspect.text, i.kind, i.room_count) for i in model.incidents.incidents.values()]
    deliver(model, "decode-0/TP1", [checksum(T0 - 0.01, 7)], T0 + 0.6)

    assert before == [("decode-0/TP1", "failing", 1)]
    assert incidents(model, T0 + 1) == [("prefill-0/TP1", "corrupt", 1)]
    assert model.incidents.started == {("failing", "rank"): 0, ("corrupt", "rank"): 1}


def test_a_rank_that_was_silent_itself_is_the_suspect_of_the_peers_it_then_judged_lost():
    """decode-0/TP0 says nothing for 20 s, then records its prefill peer lost: the model saw the silence, so the
    suspect is decode-0/TP0, not the peer it named."""
    model = ClusterModel()
    deliver(model, "decode-0/TP0", [Heartbeat(T0, {}, 0, 0, 0.0, 0, 0.0)], T0)
    lost = origin(T0 + 20.1, 5, "decode-0/TP0", "Lost connection with prefill instance (bootstrap_addr: x:1)",
                  "peer_lost", "prefill-0/TP0")  # fmt: skip
    deliver(model, "decode-0/TP0", [lost], T0 + 20)

    assert incidents(model, T0 + 21) == [("decode-0/TP0", "unresponsive", 1)]
    evidence = next(iter(model.incidents.incidents.values())).evidence
    assert list(evidence) == ["decode-0/TP0 was silent for 20.0 s itself, then recorded peer_lost"]


def _full_pool_then_silent_decode(model: ClusterModel, rooms: range) -> None:
    """Rooms of decode-0 waiting; prefill-0's full pool refuses room 9 (T0+1); decode-0/TP1 loses its TP0 (T0+5);
    the prefill, alive, times out the other rooms in Bootstrapping (T0+10)."""
    _full_pool_then_a_lost_rank(model, rooms)
    _prefill_times_out(model, rooms[1:])


def _full_pool_then_a_lost_rank(model: ClusterModel, rooms: range) -> None:
    """Rooms of decode-0 waiting; prefill-0's full pool refuses room 9 (T0+1); decode-0/TP1 loses its TP0 (T0+5),
    swept at T0+5.5 while the prefill stays alive."""
    for room in rooms:
        deliver(model, "decode-0/TP0", [RoomState(T0, room, int(KVPoll.WaitingForInput), 1, "prefill-0")], T0)
    full = origin(T0 + 1, 9, "prefill-0/TP0", "Prefill rank 0 refused room 9: its KV pool is full", "refused",
                  "prefill-0/TP0")  # fmt: skip
    deliver(model, "prefill-0/TP0", [full], T0 + 1)
    lost = origin(T0 + 5, 1, "decode-0/TP1", "Lost connection with rank decode-0/TP0 of this instance",
                  "peer_lost", "decode-0/TP0")  # fmt: skip
    deliver(model, "decode-0/TP1", [lost], T0 + 5)
    for beat in (3.0, 5.0, 7.5):  # the prefill stays alive
        deliver(model, "prefill-0/TP0", [Heartbeat(T0 + beat, {}, 0, 0, 0.0, 0, 0.0)], T0 + beat)
    model.sweep(T0 + 5.5)


def _prefill_times_out(model: ClusterModel, rooms: range) -> None:
    """prefill-0/TP0 times these rooms out in Bootstrapping (T0+10)."""
    for room in rooms:
        timeout = origin(T0 + 10, room, "prefill-0/TP0", f"Request {room} timed out after 10.0s in "
                         "KVPoll.Bootstrapping", "timeout_bootstrap")  # fmt: skip
        deliver(model, "prefill-0/TP0", [timeout], T0 + 10)


def test_a_silent_ranks_instance_timeouts_and_full_pools_join_that_ranks_incident():
    """decode-0/TP0 goes silent: its TP1 loses it (suspect the rank); prefill times out rooms of decode-0 (suspect
    the instance) and refuses under a full pool (a symptom): all one incident of decode-0/TP0."""
    model = ClusterModel()
    _full_pool_then_silent_decode(model, range(1, 4))

    assert incidents(model, T0 + 11) == [("decode-0/TP0", "unresponsive", 4)]
    incident = next(iter(model.incidents.incidents.values()))
    assert set(incident.classes) == {"refused", "peer_lost", "timeout_bootstrap"}
    assert "the KV pool of prefill-0 is full" in incident.evidence  # it said `its KV pool is full`: whose?


def test_an_incident_is_titled_by_the_class_of_most_of_its_groups_not_by_its_first_failure():
    """A full pool refuses one room of decode-0 first, then its silent TP0's peers lose it and the prefill times out
    its rooms: one incident of decode-0/TP0 whose headline said `(refused)` (its earliest failure's class) over 6
    timeouts. Its class is now the class most of its groups have, in the headline, the table, the JSON (the first
    failure's under `first_class`), check's `--incident-class` and the exporter's gauge alike."""
    model = ClusterModel()
    _full_pool_then_silent_decode(model, range(1, 8))

    assert incidents(model, T0 + 11) == [("decode-0/TP0", "unresponsive", 8)]
    incident = next(iter(model.incidents.incidents.values()))
    shown = incident_json(incident, T0 + 11, QUIET_GAP_S)
    assert incident.classes == {"refused": 1, "peer_lost": 1, "timeout_bootstrap": 6}
    assert (shown["class"], shown["first_class"], shown["first_seen"]) == ("timeout_bootstrap", "refused", T0 + 1)
    assert shown["headline"] == "decode-0/TP0 stopped answering (timeout_bootstrap)"
    assert "stopped answering  timeout_bootstrap" in render([incident], T0 + 11, QUIET_GAP_S)
    limits = Thresholds(incident_classes=(("refused", None), ("timeout_bootstrap", 3)))
    assert limits.rooms_needed(incident) == 3  # judged as the timeouts it mostly is, not as the refusal
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ModelMetrics(model, threading.Lock(), lambda: T0 + 11))
    gauge = 'kvtop_incidents_ongoing{reason_class="timeout_bootstrap",suspect_kind="rank"} 1.0'
    assert gauge in generate_latest(registry).decode().splitlines()


def test_the_ongoing_gauge_shows_an_incident_under_its_class_of_now_alone_and_drops_it_once_it_ended():
    """decode-0/TP0's incident reads `refused` while its pool's refusal leads (a tie with the lost peer), then
    `timeout_bootstrap` as the prefill's timeouts come: each scrape shows it once, under its class of then (no series
    of its earlier class left at 1), and a scrape past the quiet gap shows no ongoing series at all."""
    model = ClusterModel()
    now = T0
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ModelMetrics(model, threading.Lock(), lambda: now))

    def ongoing() -> dict[tuple[str, str], float]:
        exposition = generate_latest(registry).decode()
        return {
            (sample.labels["reason_class"], sample.labels["suspect_kind"]): sample.value
            for family in text_string_to_metric_families(exposition)
            if family.name == "kvtop_incidents_ongoing"
            for sample in family.samples
        }

    _full_pool_then_a_lost_rank(model, range(1, 5))
    now = T0 + 5.5
    refused = ongoing()
    _prefill_times_out(model, range(2, 5))
    now = T0 + 10.5
    model.sweep(now)
    timed_out = ongoing()
    now = T0 + 10 + QUIET_GAP_S + 1
    model.sweep(now)
    ended = ongoing()

    assert [i.suspect.text for i in model.incidents.incidents.values()] == ["decode-0/TP0"]
    assert refused == {("refused", "rank"): 1.0}
    assert timed_out == {("timeout_bootstrap", "rank"): 1.0}
    assert ended == {}


def test_an_incident_s_class_tie_goes_to_the_class_it_started_with():
    """One timeout, then one lost peer: a tie, so the class of its earliest failure (DOMAIN's example reads the
    same as before)."""
    model = ClusterModel()
    _instance_timeout_then_its_rank_lost(model)
    model.sweep(T0 + 6)

    incident = next(iter(model.incidents.incidents.values()))
    assert incident.classes == {"timeout_bootstrap": 1, "peer_lost": 1}
    assert (incident.title_class, incident.reason_class) == ("timeout_bootstrap", "timeout_bootstrap")


def _instance_timeout_then_its_rank_lost(model: ClusterModel) -> tuple[list[tuple[str, str, int]], dict[str, int]]:
    """prefill-0/TP0 times out a room of decode-0 (suspect the instance, a sweep shows it), then decode-0/TP1 loses
    decode-0/TP0: what the first sweep showed (incidents, started by suspect kind)."""
    for room in (1, 2):
        deliver(model, "decode-0/TP0", [RoomState(T0, room, int(KVPoll.WaitingForInput), 1, "prefill-0")], T0)
    for beat in (0.5, 2.0, 3.0, 5.0):  # the prefill stays alive
        deliver(model, "prefill-0/TP0", [Heartbeat(T0 + beat, {}, 0, 0, 0.0, 0, 0.0)], T0 + beat)
    timeout = origin(T0 + 2, 2, "prefill-0/TP0", "Request 2 timed out after 10.0s in KVPoll.Bootstrapping",
                     "timeout_bootstrap")  # fmt: skip
    deliver(model, "prefill-0/TP0", [timeout], T0 + 2)
    first = incidents(model, T0 + 2.5)
    started = {suspect_kind: n for (_, suspect_kind), n in model.incidents.started.items() if n}
    lost = origin(T0 + 5, 1, "decode-0/TP1", "Lost connection with rank decode-0/TP0 of this instance",
                  "peer_lost", "decode-0/TP0")  # fmt: skip
    deliver(model, "decode-0/TP1", [lost], T0 + 5)
    return first, started


def test_a_rank_incident_that_takes_in_an_earlier_one_starts_at_its_start_with_its_class():
    """The instance's timeout came first: the rank's incident that takes it in started then, shown by its class
    (an incident's start is its earliest failure), in `kvtop incidents` and `status` alike."""
    model = ClusterModel()
    _instance_timeout_then_its_rank_lost(model)

    assert incidents(model, T0 + 6) == [("decode-0/TP0", "unresponsive", 2)]
    incident = next(iter(model.incidents.incidents.values()))
    shown = incident_json(incident, T0 + 6, QUIET_GAP_S)
    assert (shown["first_seen"], shown["class"]) == (T0 + 2, "timeout_bootstrap")
    assert shown["headline"] == "decode-0/TP0 stopped answering (timeout_bootstrap)"


def _side_timeout_and_a_lost_decode_rank(model: ClusterModel, side_first: bool, decode_0_served: str) -> None:
    """decode-0 served `decode_0_served`'s rooms (a room done), prefill-0 decode-1's ("" : neither served anyone yet);
    prefill-0/TP0 times out room 2 in Bootstrapping, no decode named ("the decode side of prefill-0"), and
    decode-0/TP1 loses decode-0/TP0, 3 s apart (the timeout first or the rank), each swept as it came."""
    if decode_0_served:
        deliver(model, "decode-0/TP0", [TransferDone(T0, 100, 1 << 20, 0.01, decode_0_served)], T0)
        deliver(model, "decode-1/TP0", [TransferDone(T0, 101, 1 << 20, 0.01, "prefill-0")], T0)
    for beat in (0.5, 2.0, 3.0, 5.0, 6.0):  # the prefill stays alive
        deliver(model, "prefill-0/TP0", [Heartbeat(T0 + beat, {}, 0, 0, 0.0, 0, 0.0)], T0 + beat)
    timeout = origin(0, 2, "prefill-0/TP0", "Request 2 timed out after 10.0s in KVPoll.Bootstrapping",
                     "timeout_bootstrap")  # fmt: skip
    lost = origin(0, 1, "decode-0/TP1", "Lost connection with rank decode-0/TP0 of this instance", "peer_lost",
                  "decode-0/TP0")  # fmt: skip
    for at, failure in enumerate((timeout, lost) if side_first else (lost, timeout)):
        ts = T0 + 2 + 3 * at
        deliver(model, failure.rank, [msgspec.structs.replace(failure, ts=ts)], ts)
        model.sweep(ts + 0.5)


@pytest.mark.parametrize("side_first", [True, False])
def test_a_decode_ranks_incident_leaves_the_decode_side_of_a_prefill_it_never_served_apart(side_first: bool):
    """decode-0 served prefill-1, prefill-0 decode-1: prefill-0's Bootstrapping timeout that names no decode is no
    doing of decode-0/TP0, which stopped answering 3 s later (or earlier). The rank's incident took it in (or it
    joined the rank's) for the side's role and time alone."""
    model = ClusterModel()
    _side_timeout_and_a_lost_decode_rank(model, side_first, decode_0_served="prefill-1")

    assert sorted(incidents(model, T0 + 6)) == [
        ("decode-0/TP0", "unresponsive", 1),
        ("the decode side of prefill-0", "unresponsive", 1),
    ]


@pytest.mark.parametrize("decode_0_served", ["prefill-0", ""])
@pytest.mark.parametrize("side_first", [True, False])
def test_a_decode_ranks_incident_takes_in_the_decode_side_of_a_prefill_it_could_have_served(
    side_first: bool, decode_0_served: str
):
    """decode-0 served prefill-0 (or no link is known either way): prefill-0's timeout naming no decode, 3 s before
    or after decode-0/TP0 stopped answering, is that rank's incident (the side became nameable)."""
    model = ClusterModel()
    _side_timeout_and_a_lost_decode_rank(model, side_first, decode_0_served)

    assert incidents(model, T0 + 6) == [("decode-0/TP0", "unresponsive", 2)]


def test_incidents_started_count_one_cause_once_and_never_go_down_when_one_takes_in_another():
    """A sweep counted the instance's incident started; the rank's incident that takes it in is that cause, not a
    second one: one start counted, where it was first counted (a Prometheus counter must not go down)."""
    model = ClusterModel()
    first, started = _instance_timeout_then_its_rank_lost(model)
    incidents(model, T0 + 6)

    assert (first, started) == ([("decode-0", "unresponsive", 1)], {"instance": 1})
    assert {key: n for key, n in model.incidents.started.items() if n} == {("unresponsive", "instance"): 1}
    assert sum(model.incidents.started.values()) == len(model.incidents.incidents)


def test_a_rank_incident_leaves_another_instances_full_pool_to_the_ranks_that_filled_it():
    """Both ranks of prefill-1 stop answering (one incident of the instance); its pool fills and refuses (its
    symptom); then decode-0/TP0 loses decode-0/TP1. That new incident took in prefill-1's refusals, rooms decode-0
    never touched; they stay prefill-1's."""
    model = ClusterModel()
    for room, rank in ((1, "prefill-1/TP0"), (2, "prefill-1/TP1")):
        timeout = origin(T0 + room, room, "decode-1/TP0", f"Request {room} timed out after 3.0s in "
                         "KVPoll.Transferring", "timeout_transfer", rank)  # fmt: skip
        deliver(model, "decode-1/TP0", [timeout], T0 + room)
    full = origin(T0 + 3, 9, "prefill-1/TP0", "Prefill rank 0 refused room 9: its KV pool is full", "refused",
                  "prefill-1/TP0")  # fmt: skip
    deliver(model, "prefill-1/TP0", [full], T0 + 3)
    model.sweep(T0 + 3.5)
    lost = origin(T0 + 5, 4, "decode-0/TP0", "Lost connection with rank decode-0/TP1 of this instance",
                  "peer_lost", "decode-0/TP1")  # fmt: skip
    deliver(model, "decode-0/TP0", [lost], T0 + 5)

    assert sorted(incidents(model, T0 + 6)) == [("decode-0/TP1", "unresponsive", 1), ("prefill-1", "unresponsive", 3)]


def test_incidents_and_silences_survive_a_keyframe():
    """A model restored from a keyframe holds the same incidents, and a later echo refolds its room in place."""
    model = ClusterModel()
    deliver(model, "decode-0/TP1", [checksum(T0, 1)], T0)
    deliver(model, "decode-0/TP0", [Heartbeat(T0, {}, 0, 0, 0.0, 0, 0.0)], T0)
    deliver(model, "decode-0/TP0", [Heartbeat(T0 + 9, {}, 0, 0, 0.0, 0, 0.0)], T0 + STALE_S + 6)
    model.sweep(T0 + 10)

    restored = restore(capture(model))
    deliver(restored, "prefill-0/TP1", [echo(T0 + 0.1, 1, "prefill-0/TP1", "decode-0/TP1")], T0 + 11)

    assert incidents(restored, T0 + 12) == [("prefill-0/TP1", "corrupt", 1)]
    incident = next(iter(restored.incidents.incidents.values()))
    assert (incident.origins, incident.echoes) == (1, 1)
    assert restored.ranks["decode-0/TP0"].silences == [(T0, T0 + STALE_S + 6)]


def test_the_sessions_a_multi_node_decodes_incident_remembers_survive_a_keyframe():
    """A room whose prefill ranks name decode sessions on two hosts is that decode instance's incident; restored
    from a keyframe, a later room that names one of those sessions alone joins it."""
    not_alive = "Decode instance could be dead, remote mooncake session {} is not alive"
    model = ClusterModel()
    for rank, session in (("prefill-0/TP1", "10.7.0.31:15097"), ("prefill-0/TP9", "10.7.0.12:15873")):
        deliver(model, rank, [origin(T0, 1, rank, not_alive.format(session), "peer_lost")], T0)
    model.sweep(T0 + 1)

    restored = restore(capture(model))
    later = origin(T0 + 2, 2, "prefill-0/TP1", not_alive.format("10.7.0.31:15097"), "peer_lost")
    deliver(restored, "prefill-0/TP1", [later], T0 + 2)

    assert incidents(restored, T0 + 3) == [("decode at 10.7.0.31, 10.7.0.12", "unresponsive", 2)]


def test_a_multi_node_decodes_incident_that_takes_in_one_sessions_counts_that_start_once():
    """A room named one session of a decode alone (an incident of that session, counted by a sweep); a room naming
    two hosts' sessions makes it the multi-node decode's incident, which started then: one start counted, under the
    incident it is (`decode at ...`: an instance), not the session it took in (the exporter keeps what a scrape read
    in between: a counter never goes down)."""
    not_alive = "Decode instance could be dead, remote mooncake session {} is not alive"
    model = ClusterModel()
    deliver(model, "prefill-0/TP1", [origin(T0, 1, "prefill-0/TP1", not_alive.format("10.7.0.31:15097"),
                                            "peer_lost")], T0)  # fmt: skip
    model.sweep(T0 + 0.5)
    for rank, session in (("prefill-0/TP1", "10.7.0.31:15097"), ("prefill-0/TP9", "10.7.0.12:15873")):
        deliver(model, rank, [origin(T0 + 3, 2, rank, not_alive.format(session), "peer_lost")], T0 + 3)

    assert incidents(model, T0 + 4) == [("decode at 10.7.0.31, 10.7.0.12", "unresponsive", 2)]
    assert next(iter(model.incidents.incidents.values())).first_seen == T0
    assert {key: n for key, n in model.incidents.started.items() if n} == {("unresponsive", "instance"): 1}


def test_a_room_stops_being_tracked_a_minute_after_the_newest_failure_and_keeps_its_incident():
    """A room whose last failure is more than `ROOM_REUSE_S` older than the newest one no longer changes: its
    failures are let go, its group keeps its incident."""
    model = ClusterModel()
    deliver(model, "decode-0/TP1", [checksum(T0, 1)], T0)
    deliver(model, "decode-0/TP1", [checksum(T0 + 30, 2)], T0 + 30)
    model.sweep(T0 + 30)
    tracked_then = model.incidents.tracking
    deliver(model, "decode-0/TP1", [checksum(T0 + 61, 3)], T0 + 61)
    model.sweep(T0 + 61)

    assert (tracked_then, model.incidents.tracking) == (2, 2)  # room 1 let go, rooms 2 and 3 held
    first = next(group for group in model.groups() if group.room == 1)
    assert model.incidents.incident_of(first).room_count == 3


def test_memory_stays_bounded_however_many_rooms_fail():
    """20,000 failed rooms from 16 senders in turn, over bounds of 500 tracked rooms, 2,000 listed rooms and 8
    incidents: every bound holds, and the counts stay whole."""
    model = ClusterModel()
    model.incidents = IncidentTracker(incidents_kept=8, rooms_tracked=500, rooms_listed=2000)
    for room in range(20_000):
        sender = f"prefill-{room // 1250}/TP0"
        deliver(model, "decode-0/TP0", [checksum(T0 + room * 0.01, room, "decode-0/TP0", sender)], T0)
        if room % 1000 == 999:
            model.sweep(T0 + room * 0.01)
    model.sweep(T0 + 300)

    tracker = model.incidents
    assert (len(tracker.incidents), tracker.tracking, len(tracker.by_lead)) == (8, 500, 20_000)
    assert tracker.listed == sum(len(incident.rooms) for incident in tracker.incidents.values()) <= 2000 + 500
    assert {incident.room_count for incident in tracker.incidents.values()} == {1250}
    assert sum(tracker.started.values()) == 16


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.floats(0, 90), st.booleans(), st.booleans()), min_size=1, max_size=6))
def test_the_trackers_shortcut_for_an_origin_and_its_named_echoes_is_the_fold(members):
    """One origin with echoes that name it is folded without the fold, to the same groups; anything else (two
    origins, an unnamed echo, a span past a room id's reuse, a failure twice) takes the fold."""
    failures = []
    for rank, offset, is_origin, names_it in members:
        label = f"decode-0/TP{rank}"
        origin = label if is_origin else "decode-0/TP0" if names_it else ""
        failures.append(Observed(T0 + offset, 7, label, "decode", "boom", "checksum", origin))
    failures += failures[:1] if members[0][3] else []  # sometimes the same failure twice

    assert room_groups(7, failures) == fold_room(failures)


def test_status_names_an_incident_still_under_way_whose_last_room_failed_before_its_window():
    """A group 90 s ago, none since: the incident is ongoing for 120 s of quiet, as the dashboard and `incidents`
    say, and status said `incidents none in 60s`."""
    model = ClusterModel()
    deliver(model, "decode-0/TP1", [checksum(T0, 1)], T0)
    model.update_incidents()

    status = status_json(model, T0 + 90, 60.0)

    assert (len(status["incidents"]), status["incidents_ongoing"]) == (1, 1)


def test_the_rank_an_ongoing_incident_suspects_reads_suspect_in_the_ranks_table_and_not_once_it_ended():
    """prefill-0/TP1 corrupts what it sends: decode-0/TP1 holds the origins, and the ranks table named no one
    else; prefill-0/TP1's STATE is `suspect` (and `suspected` in JSON) while the incident goes on, then alive."""
    model = ClusterModel()
    for label in ("prefill-0/TP1", "decode-0/TP1"):
        deliver(model, label, [Heartbeat(T0, {}, 0, 0, 0.0, 0, 0.0)], T0)
    deliver(model, "decode-0/TP1", [checksum(T0 + 1, 7)], T0 + 1)
    model.sweep(T0 + 2)

    states = {line.split()[0]: line.split()[3] for line in ranks_text(model, T0 + 2).splitlines()[1:]}
    suspected = {row["label"]: row["suspected"] for row in ranks_json(model, T0 + 2)}
    assert (states, suspected) == (
        {"decode-0/TP1": "alive", "prefill-0/TP1": "suspect"},
        {"decode-0/TP1": False, "prefill-0/TP1": True},
    )
    later = T0 + 1 + model.incidents.quiet_gap_s + 1
    for label in ("prefill-0/TP1", "decode-0/TP1"):
        deliver(model, label, [Heartbeat(later, {}, 0, 0, 0.0, 0, 0.0)], later)
    assert "suspect" not in ranks_text(model, later)


def test_a_pause_of_kvtop_itself_is_no_silence_of_the_ranks_it_then_hears_from():
    """kvtop's model process stopped 20 s (SIGSTOP): every rank's batches arrived at once, each was judged `silent
    for 20 s itself` and made the suspect of the peers it named lost. The rank sent on all along (its envelopes'
    `sent_at` show no gap): the suspect is the peer it named."""
    model = ClusterModel()
    deliver(model, "decode-0/TP0", [Heartbeat(T0, {}, 0, 0, 0.0, 0, 0.0)], T0)
    lost = origin(T0 + 20.1, 5, "decode-0/TP0", "Lost connection with prefill instance (bootstrap_addr: x:1)",
                  "peer_lost", "prefill-0/TP0")  # fmt: skip
    for second in range(1, 21):  # sent every second, all received once kvtop ran again
        events: list[Event] = [Heartbeat(T0 + second, {}, 0, 0, 0.0, 0, 0.0)] + ([lost] if second == 20 else [])
        batch = EventBatch(EVENT_SCHEMA, "decode", "decode-0", 0, 1, next(_seq), T0 + second, events)
        model.apply("decode-0/TP0", batch, T0 + 20.2)

    assert model.silent_at("decode-0/TP0", T0 + 20.1) is None
    assert incidents(model, T0 + 21) == [("prefill-0/TP0", "unresponsive", 1)]


def test_one_envelope_stamped_in_the_future_hides_no_later_silence_of_its_rank():
    """`sent_at` comes off the socket: a batch stamped a year on, then a rank that really went quiet for 20 s."""
    model = ClusterModel()
    deliver(model, "decode-0/TP0", [Heartbeat(T0, {}, 0, 0, 0.0, 0, 0.0)], T0)
    future = EventBatch(EVENT_SCHEMA, "decode", "decode-0", 0, 1, next(_seq), T0 + 3e7, [])
    model.apply("decode-0/TP0", future, T0 + 1)
    deliver(model, "decode-0/TP0", [Heartbeat(T0 + 2, {}, 0, 0, 0.0, 0, 0.0)], T0 + 2)
    deliver(model, "decode-0/TP0", [Heartbeat(T0 + 22, {}, 0, 0, 0.0, 0, 0.0)], T0 + 22)

    assert model.silent_at("decode-0/TP0", T0 + 21) == (T0 + 2, T0 + 22)


FAULTS_AND_KILLS = Path(__file__).parent / "fixtures" / "live" / "three-faults-two-kills.jsonl.gz"
"""What every agent's snapshot held 150 s into a live 2P2D TP2 cluster (`kvtop cluster up` with prefill-0/TP1
corrupting, prefill-1 stalling and prefill-0 dropping chunks, prefill-0/TP0 and decode-0/TP1 killed with -9), as a
one-shot `kvtop events --json` read it: per row the agent, then a failure's or a room state's fields."""


def _one_shot(order: list[str], held: bool) -> list[tuple[str, str, int, int]]:
    """A one-shot view's incidents from the snapshots delivered agent by agent in `order`, the collector sweeping
    between them (holding the incidents while they come in, or not)."""
    snapshots: dict[str, list[Event]] = {}
    for line in gzip.decompress(FAULTS_AND_KILLS.read_bytes()).splitlines():
        agent, kind, *fields = json.loads(line)
        snapshots.setdefault(agent, []).append(Failure(*fields) if kind == "f" else RoomState(*fields))
    model = ClusterModel()
    now = max(event.ts for events in snapshots.values() for event in events) + 1
    for label in order:
        deliver(model, label, snapshots[label], now)
        model.sweep(now, hold_incidents=held)
        now += 0.5
    model.update_incidents()
    return sorted(
        (incident.suspect.text, incident.kind, incident.room_count, incident.origins)
        for incident in model.incidents.incidents.values()
        if incident.room_count
    )


def test_a_one_shot_view_folds_the_synced_snapshots_once_whatever_order_they_came_in():
    """Back-to-back one-shot views named different suspects (13, 11 and 11 incidents; a live decode rank
    `fails transfers` for 102 rooms in one): the sweeps between snapshots folded the rooms of the first ones in,
    each on part of its story. Held until every snapshot is in, any order gives the same incidents, each room's
    origin counted once."""
    labels = ["prefill-0/TP1", "prefill-1/TP0", "prefill-1/TP1", "decode-0/TP0", "decode-1/TP0", "decode-1/TP1"]

    forward, backward = _one_shot(labels, held=True), _one_shot(labels[::-1], held=True)

    assert forward == backward
    assert ("prefill-0/TP1", "corrupt", 7, 7) in forward
    both_refused = ("decode-0/TP1", "prefill-1")  # prefill-1's two ranks each refused some rooms: two origins a room
    assert all(origins == rooms for suspect, _, rooms, origins in forward if suspect not in both_refused)
    assert _one_shot(labels, held=False) != _one_shot(labels[::-1], held=False)  # what the hold is for


def test_a_suspect_is_said_with_its_role_only_when_an_address_names_it():
    """A pod's rank (`kubectl logs --prefix` names instances after their pods) read `prefill at sglang-prefill-0/TP2`,
    as if it were an address."""
    said = [
        Suspect("rank", "sglang-prefill-0/TP2", "prefill").text,
        Suspect("instance", "sglang-prefill-0", "prefill").text,
        Suspect("rank", "10.0.0.7:15004", "decode").text,
        Suspect("instance", "sglang-deploy-glm-4-5-prefill:30089", "prefill").text,
        Suspect("rank", "prefill-0/TP1", "prefill").text,
    ]

    assert said == [
        "sglang-prefill-0/TP2",
        "sglang-prefill-0",
        "decode at 10.0.0.7:15004",
        "prefill at sglang-deploy-glm-4-5-prefill:30089",
        "prefill-0/TP1",
    ]


K = TypeVar("K")
V = TypeVar("V")


class _Scans(dict[K, V]):
    """One of the tracker's dicts (its incidents, its tracked rooms, its groups' leads), counting the walks over it."""

    walks = 0

    def values(self):  # type: ignore[override]
        self.walks += 1
        return super().values()

    def items(self):  # type: ignore[override]
        self.walks += 1
        return super().items()

    def __iter__(self):  # type: ignore[override]
        self.walks += 1
        return super().__iter__()


def _rooms_naming_another_peer_each(shape: str, rooms: int) -> list[tuple[str, Failure]]:
    """(rank, failure) of `rooms` rooms, each naming a peer no other room names."""
    not_alive = "Decode instance could be dead, remote mooncake session {} is not alive"
    failures: list[tuple[str, Failure]] = []
    for room in range(1, rooms + 1):
        ts, peer = T0 + room * 0.001, f"decode-{room}/TP0"
        if shape == "send failed":  # a new rank incident each: it looks for the vaguer ones it explains
            text = f"Failed to send kv chunk of {room} to {peer}"
            failures.append(("prefill-0/TP0", origin(ts, room, "prefill-0/TP0", text, "send_failed", peer)))
        elif shape == "origin never came":  # it looks for the incident its origin is the suspect of, or noticed
            failures.append(("prefill-0/TP0", echo(ts, room, "prefill-0/TP0", peer)))
        elif shape == "side":  # a decode rank's own session's incident, then a timeout naming no peer: it looks for
            # the one prefill rank's incident under way that explains "the prefill side of decode-0"
            text = not_alive.format(f"10.{room // 256 % 256}.{room % 256}.1:15000")
            failures.append(("prefill-0/TP0", origin(ts, room, "prefill-0/TP0", text, "peer_lost")))
            text = f"Request {rooms + room} timed out after 300.0s in KVPoll.WaitingForInput"
            failures.append(("decode-0/TP0", origin(ts, rooms + room, "decode-0/TP0", text, "timeout_waiting")))
        elif shape == "echo carried the suspect":  # it looks for the one incident of that suspect under way
            carried = Failure(ts, room, "decode-0/TP0", "Failed due to an unknown reason from another rank",
                              "propagated", "debug", True, "decode-0/TP1", f"prefill-{room}/TP0")  # fmt: skip
            failures.append(("decode-0/TP0", carried))
        else:  # one host's session alone (an incident of that session), then sessions on two hosts (a multi-node
            # decode's incident: it takes the session's in, its rooms and groups), then that session alone again (it
            # looks for the incidents that remember that session)
            host = f"10.{room // 256 % 256}.{room % 256}"
            alone = not_alive.format(f"{host}.1:15000")
            failures.append(("prefill-0/TP0", origin(ts - 0.0005, rooms + room, "prefill-0/TP0", alone, "peer_lost")))
            for rank, session in (("prefill-0/TP0", f"{host}.1:15000"), ("prefill-0/TP1", f"{host}.2:15000")):
                failures.append((rank, origin(ts, room, rank, not_alive.format(session), "peer_lost")))
            failures.append(("prefill-0/TP0", origin(ts, 2 * rooms + room, "prefill-0/TP0", alone, "peer_lost")))
    return failures


@pytest.mark.parametrize("shape", ["send failed", "origin never came", "echo carried the suspect", "sessions", "side"])
def test_rooms_naming_another_peer_each_do_not_walk_every_incident_kept_per_room(shape: str):
    """3,000 rooms in one sweep, each naming a peer of its own (a hostile log, or a cluster of thousands of ranks):
    each room's group looks up the few incidents that may take it, not every incident made so far in the sweep, and
    an incident taken in hands on its own rooms and groups, not every one tracked (both were quadratic: 5,000 such
    rooms took 9.5 s); a timeout naming no peer ("the prefill side of decode-0") looks at the prefill ranks'
    incidents, not at every incident's key (5,000 took 21 s). The walks left are the bounds', one each per sweep."""
    rooms = 3000
    model = ClusterModel()
    tracker = model.incidents
    tracker.incidents, tracker.by_lead, tracker._tracked, tracker._latest = scans = (_Scans(), _Scans(), _Scans(),
                                                                                     _Scans())  # fmt: skip
    for rank, failure in _rooms_naming_another_peer_each(shape, rooms):
        deliver(model, rank, [failure], T0 + 3)
    model.sweep(T0 + 3.5)
    model.sweep(T0 + 4)  # echoes whose origin never came wait one sweep

    assert sum(tracker.started.values()) == rooms + (shape == "side")  # and the prefill side of decode-0
    assert len(tracker.incidents) == tracker.incidents_kept
    assert all(scan.walks <= 2 for scan in scans), [scan.walks for scan in scans]  # one per sweep


def test_a_sides_group_looks_only_at_the_ranks_incidents_that_may_still_explain_it(monkeypatch: pytest.MonkeyPatch):
    """A prefill log whose rooms each name a decode session of their own, one every 10 s over 5.5 hours, and its
    Bootstrapping timeouts naming no peer ("the decode side of prefill-0"), in one sweep: each timeout looks at the
    decode ranks' incidents whose latest failure is at most a quiet gap before it, not at every one ended before it
    (5,000 such rooms took 11.4 s: it walked them, oldest first, until two explained it)."""
    import kvtop.model.incidents as tracker_module

    explained = 0
    explains = tracker_module._explains

    def counted(cause: object, vague: object, quiet_gap_s: float, around: object) -> bool:
        nonlocal explained
        explained += 1
        return explains(cause, vague, quiet_gap_s, around)  # type: ignore[arg-type]

    monkeypatch.setattr(tracker_module, "_explains", counted)
    rooms, model = 2000, ClusterModel()
    not_alive = "Decode instance could be dead, remote mooncake session {} is not alive"
    for room in range(1, rooms + 1):
        ts, session = T0 + room * 10.0, f"10.{room // 256 % 256}.{room % 256}.1:15000"
        timeout = f"Request {rooms + room} timed out after 300.0s in KVPoll.Bootstrapping"
        deliver(model, "prefill-0/TP0", [origin(ts, room, "prefill-0/TP0", not_alive.format(session), "peer_lost"),
                                         origin(ts, rooms + room, "prefill-0/TP0", timeout, "timeout_bootstrap")],
                ts)  # fmt: skip
    model.sweep(T0 + rooms * 10.0 + 1)

    assert model.incidents.started[("unresponsive", "side")] >= 1  # the timeouts looked for a rank to explain them
    assert explained <= 20 * rooms  # the incidents of the last few minutes each (before: every one ended, ~1,000 each)


def test_a_tracker_restored_from_a_keyframe_looks_incidents_up_as_the_live_one_does():
    """Restored from a keyframe, the tracker finds the incidents that may take a group as the live one would: a
    room naming one host's session joins the multi-node decode's incident, a room naming both hosts takes in the
    incident of a session that failed alone before the keyframe, an echo whose origin never came joins the incident
    that origin noticed, and a rank's new incident takes in its instance's that it explains."""
    not_alive = "Decode instance could be dead, remote mooncake session {} is not alive"
    timeout = "Request {} timed out after 300.0s in KVPoll.Transferring"
    model = ClusterModel()
    for rank, session in (("prefill-0/TP1", "10.7.0.31:15097"), ("prefill-0/TP9", "10.7.0.12:15873")):
        deliver(model, rank, [origin(T0, 1, rank, not_alive.format(session), "peer_lost")], T0)
    deliver(model, "prefill-1/TP0", [origin(T0, 2, "prefill-1/TP0", not_alive.format("10.8.0.5:15000"),
                                            "peer_lost")], T0)  # fmt: skip
    deliver(model, "decode-0/TP1", [checksum(T0, 3)], T0)
    deliver(model, "decode-1/TP0", [origin(T0, 4, "decode-1/TP0", timeout.format(4), "timeout_transfer",
                                           "prefill-2")], T0)  # fmt: skip
    model.sweep(T0 + 1)

    restored = restore(capture(model))
    assert restored.incidents._tagged == model.incidents._tagged
    assert restored.incidents._causes == model.incidents._causes
    assert restored.incidents._causes_of_role == model.incidents._causes_of_role
    deliver(restored, "prefill-0/TP1", [origin(T0 + 2, 5, "prefill-0/TP1", not_alive.format("10.7.0.31:15097"),
                                               "peer_lost")], T0 + 2)  # fmt: skip
    for rank, session in (("prefill-1/TP0", "10.8.0.5:15000"), ("prefill-1/TP1", "10.8.0.6:15000")):
        deliver(restored, rank, [origin(T0 + 2, 6, rank, not_alive.format(session), "peer_lost")], T0 + 2)
    deliver(restored, "decode-0/TP1", [Heartbeat(T0 + 2, {}, 0, 0, 0.0, 0, 0.0)], T0 + 2)  # alive, not silent
    deliver(restored, "prefill-0/TP1", [echo(T0 + 2, 7, "prefill-0/TP1", "decode-0/TP1")], T0 + 2)
    deliver(restored, "decode-1/TP0", [origin(T0 + 2, 8, "decode-1/TP0", timeout.format(8), "timeout_transfer",
                                              "prefill-2/TP3")], T0 + 2)  # fmt: skip
    restored.sweep(T0 + 3)

    assert sorted(incidents(restored, T0 + 4)) == [
        ("decode at 10.7.0.31, 10.7.0.12", "unresponsive", 2),
        ("decode at 10.8.0.5, 10.8.0.6", "unresponsive", 2),
        ("prefill-0/TP1", "corrupt", 2),
        ("prefill-2/TP3", "unresponsive", 2),
    ]


@settings(max_examples=100, deadline=None)
@given(st.data())
def test_a_reason_a_suspect_rule_names_a_peer_in_holds_the_text_looked_for_before_its_regex(data: st.DataObject):
    """The rules that name a suspect in a failure's reason (`_by_rules`, `room_peer`) search it with a rule's regex
    only where it holds that rule's text: every match of the regex holds it."""
    pattern = data.draw(st.sampled_from(list(_HELD)))
    reason = data.draw(st.from_regex(pattern))
    assert pattern.search(reason)
    assert _HELD[pattern] in reason


def test_a_full_pool_that_waited_on_a_silent_rank_says_whose_vote_and_how_long_it_waited():
    """decode-0/TP1 refuses room 9 under a full pool, its rooms waiting on TP0's vote, not heard for 1.3 s: the
    incident is decode-0/TP0 stopping answering, and its evidence says who waited on its vote and how long (it said
    only `the rooms it refused waited on it`, which on a loaded host read as a guess)."""
    model = ClusterModel()
    tp1 = AgentInfo("decode", "decode-0", 1, 2, 4096, "", "", 42, "host-a", 1)
    reason = pool_full(9, tp1, "decode-0/TP0", 1.34).text  # what our agent says
    deliver(model, "decode-0/TP1", [origin(T0, 9, "decode-0/TP1", reason, "refused", "decode-0/TP0")], T0)

    assert incidents(model, T0 + 1) == [("decode-0/TP0", "unresponsive", 1)]
    evidence = next(iter(model.incidents.incidents.values())).evidence
    assert list(evidence) == ["the rooms decode-0/TP1 refused waited on its vote, not heard for 1.3 s"]


def test_an_echo_before_its_origins_record_hangs_under_the_room_failure_that_record_joins_not_beside_it():
    """decode-0/TP1 refuses room 4 and is stopped before publishing; the prefill's echo (carrying TP1's class and
    suspect) comes first, then decode-0/TP0 refuses the room naming TP1, its vote not heard. The echo made a second
    incident `decode-0/TP1 refuses transfers` beside `stopped answering` for the same room; it is one incident, before
    TP1's own record comes and after."""
    model = ClusterModel()
    tp0 = AgentInfo("decode", "decode-0", 0, 2, 4096, "", "", 41, "host-a", 1)
    tp1 = AgentInfo("decode", "decode-0", 1, 2, 4096, "", "", 42, "host-a", 1)
    carried = Failure(T0 + 1.05, 4, "prefill-0/TP0", "Aborted by decode peer", "propagated", "debug", True,
                      "decode-0/TP1", "decode-0/TP1", "refused")  # fmt: skip
    deliver(model, "prefill-0/TP0", [carried], T0 + 1.1)
    model.sweep(T0 + 1.2)  # the echo waits a sweep for its origin
    refused = pool_full(4, tp0, "decode-0/TP1", 1.2)
    deliver(
        model, "decode-0/TP0", [origin(T0 + 1.5, 4, "decode-0/TP0", refused.text, "refused", refused.suspect)], T0 + 1.5
    )
    model.sweep(T0 + 1.6)

    assert incidents(model, T0 + 2) == [("decode-0/TP1", "unresponsive", 1)]
    own = pool_full(4, tp1)
    deliver(model, "decode-0/TP1", [origin(T0 + 1.0, 4, "decode-0/TP1", own.text, "refused", own.suspect)], T0 + 3)
    assert incidents(model, T0 + 3.5) == [("decode-0/TP1", "unresponsive", 1)]
    assert [group.origin_label for group in model.groups()] == ["decode-0/TP1"]


@pytest.mark.parametrize("echo_first", [True, False])
def test_a_room_only_an_echo_says_the_silent_rank_refused_joins_that_ranks_incident(echo_first: bool):
    """decode-0/TP1 refuses rooms 4 and 5 and is stopped before publishing; decode-0/TP0 refuses room 4 naming TP1,
    its vote not heard; of room 5 only the prefill's echo tells (carrying TP1's class and suspect, itself). Room 5
    read `decode-0/TP1 refuses transfers`, an incident beside `stopped answering`, whichever came first."""
    model = ClusterModel()
    tp0 = AgentInfo("decode", "decode-0", 0, 2, 4096, "", "", 41, "host-a", 1)
    carried = Failure(T0 + 1.05, 5, "prefill-0/TP0", "Aborted by decode peer", "propagated", "debug", True,
                      "decode-0/TP1", "decode-0/TP1", "refused")  # fmt: skip
    refused = pool_full(4, tp0, "decode-0/TP1", 1.2)
    tp0_refused = origin(T0 + 1.5, 4, "decode-0/TP0", refused.text, "refused", refused.suspect)
    deliveries = [("prefill-0/TP0", carried), ("decode-0/TP0", tp0_refused)]
    for sweep, (rank, failure) in enumerate(deliveries if echo_first else deliveries[::-1]):
        deliver(model, rank, [failure], T0 + 2 + sweep)
        model.sweep(T0 + 2.1 + sweep)
        model.sweep(T0 + 2.2 + sweep)  # an echo waits a sweep for its origin

    assert incidents(model, T0 + 4) == [("decode-0/TP1", "unresponsive", 2)]


def _stalled(ts: float, room: int, decode: str, prefill: str) -> Failure:
    """A decode rank's timeout in Transferring naming the prefill rank that stopped sending (as our agents say it)."""
    text = f"Request {room} timed out after 3.0s in KVPoll.Transferring"
    return origin(ts, room, decode, text, "timeout_transfer", prefill)


def _beat(model: ClusterModel, ts: float, *labels: str) -> None:
    """Every rank named answers at `ts` (none is silent itself: the rank a decode rank names is the suspect)."""
    for label in labels:
        deliver(model, label, [Heartbeat(ts, {}, 0, 0, 0.0, 0, 0.0)], ts)


def test_an_instance_whose_every_rank_stopped_answering_is_one_incident_of_the_instance_naming_its_ranks():
    """prefill-1 stalls whole: the decode ranks time out rooms of its TP0 and of its TP1 in the same seconds, a sweep
    between them. One incident, `prefill-1 stopped answering`, its evidence naming both ranks, every room in it, one
    start counted (under the instance, as it is shown; the rank's first start taken back); its pool's refusals and the
    rooms that fail after join it, also in a model restored from a keyframe."""
    model = ClusterModel()
    ranks = ("prefill-1/TP0", "prefill-1/TP1", "decode-0/TP0", "decode-0/TP1")
    for room in range(1, 9):
        tp = room % 2
        _beat(model, T0 + room, *ranks)
        deliver(
            model, f"decode-0/TP{tp}", [_stalled(T0 + room, room, f"decode-0/TP{tp}", f"prefill-1/TP{tp}")], T0 + room
        )
        model.sweep(T0 + room)
    full = origin(T0 + 8.5, 9, "prefill-1/TP0", "Prefill rank 0 refused room 9: its KV pool is full", "refused",
                  "prefill-1/TP0")  # fmt: skip
    deliver(model, "prefill-1/TP0", [full], T0 + 8.5)

    assert incidents(model, T0 + 9) == [("prefill-1", "unresponsive", 9)]
    incident = next(iter(model.incidents.incidents.values()))
    assert incident.headline() == "prefill-1 stopped answering (timeout_transfer)"
    assert incident.evidence_lines()[0] == "its ranks prefill-1/TP1, prefill-1/TP0 failed together"  # as they failed
    assert incident.suspect.as_dict() == {"kind": "instance", "name": "prefill-1", "role": "prefill"}
    assert {key: n for key, n in model.incidents.started.items() if n} == {("unresponsive", "instance"): 1}
    restored = restore(capture(model))
    for beat in range(9, 13):
        _beat(restored, T0 + beat, *ranks)
    deliver(restored, "decode-0/TP0", [_stalled(T0 + 12, 12, "decode-0/TP0", "prefill-1/TP0")], T0 + 12)
    assert incidents(restored, T0 + 13) == [("prefill-1", "unresponsive", 10)]


@pytest.mark.parametrize(("stated", "expected"), [
    (4, [("prefill-1/TP0", "unresponsive", 3), ("prefill-1/TP1", "unresponsive", 3)]),
    (2, [("prefill-1", "unresponsive", 6)]),
], ids=["tp4-two-ranks-named", "tp2-every-rank-named"])  # fmt: skip
def test_the_tp_size_a_log_stated_says_whether_the_ranks_that_failed_are_the_whole_instance(
    stated: int, expected: list[tuple[str, str, int]]
):
    """Logs name prefill-1/TP0 and TP1 only and both stop answering: of a TP 4 instance (its `server_args` said so)
    two ranks failed while two unnamed ones may answer, two incidents (it read `prefill-1 stopped answering`, every
    rank seen being every rank); of a TP 2 instance, the instance's."""
    model = ClusterModel()
    model.tp_sizes["prefill-1"] = stated
    for room in range(1, 7):
        _beat(model, T0 + room, "prefill-1/TP0", "prefill-1/TP1", "decode-0/TP0")
        stalled = _stalled(T0 + room, room, "decode-0/TP0", f"prefill-1/TP{room % 2}")
        deliver(model, "decode-0/TP0", [stalled], T0 + room)
        model.sweep(T0 + room)

    assert sorted(incidents(model, T0 + 8)) == expected


def _refused(ts: float, room: int, prefill: str) -> Failure:
    """A prefill rank's refusal of a room's transfer request (the `refuse` fault: it names itself)."""
    text = f"Prefill rank {prefill[-1]} refused the transfer request of room {room}"
    return origin(ts, room, prefill, text, "refused", prefill)


@pytest.mark.parametrize(
    ("kind", "verb"), [("corrupt", "sends corrupt KV (checksum)"), ("refusing", "refuses transfers (refused)")]
)
def test_every_rank_of_an_instance_failing_the_same_way_is_one_incident_of_the_instance(kind: str, verb: str):
    """Both ranks of prefill-0 corrupt their sends (or refuse transfers) in the same seconds: what broke is the
    instance, one incident naming its ranks, one start counted under `instance` (it was two incidents of ranks)."""
    model = ClusterModel()
    for room in range(1, 9):
        sender = f"prefill-0/TP{room % 2}"
        _beat(model, T0 + room, "prefill-0/TP0", "prefill-0/TP1", "decode-0/TP0", "decode-0/TP1")
        decode = f"decode-0/TP{room % 2}"
        failure = checksum(T0 + room, room, decode, sender) if kind == "corrupt" else _refused(T0 + room, room, sender)
        deliver(model, failure.rank, [failure], T0 + room)
        model.sweep(T0 + room)

    assert incidents(model, T0 + 9) == [("prefill-0", kind, 8)]
    [incident] = model.incidents.incidents.values()
    assert incident.headline() == f"prefill-0 {verb}"
    assert incident.evidence_lines()[0] == "its ranks prefill-0/TP1, prefill-0/TP0 failed together"
    assert {key: n for key, n in model.incidents.started.items() if n} == {(kind, "instance"): 1}


def test_one_rank_of_an_instance_corrupting_its_sends_stays_the_ranks_incident():
    """prefill-0/TP1 corrupts while TP0 sends whole KV: its own incident, not the instance's."""
    model = ClusterModel()
    for room in range(1, 5):
        _beat(model, T0 + room, "prefill-0/TP0", "prefill-0/TP1", "decode-0/TP1")
        deliver(model, "decode-0/TP1", [checksum(T0 + room, room)], T0 + room)

    assert incidents(model, T0 + 6) == [("prefill-0/TP1", "corrupt", 4)]


@pytest.mark.parametrize("others", [(), ("prefill-1/TP2",)])
def test_a_rank_that_stopped_answering_alone_or_with_some_of_its_instance_stays_the_ranks(others: tuple[str, ...]):
    """prefill-1/TP0 stops answering while TP1 answers: its own incident. Of a prefill-1 of three ranks seen, TP0 and
    TP1 stopping while TP2 answers stay two incidents of ranks (not every rank of it failed)."""
    model = ClusterModel()
    failing = ("prefill-1/TP0", "prefill-1/TP1") if others else ("prefill-1/TP0",)
    for room in range(1, 7):
        _beat(model, T0 + room, "prefill-1/TP0", "prefill-1/TP1", *others, "decode-0/TP0")
        stalled = _stalled(T0 + room, room, "decode-0/TP0", failing[room % len(failing)])
        deliver(model, "decode-0/TP0", [stalled], T0 + room)

    expected = [("prefill-1/TP0", "unresponsive", 3), ("prefill-1/TP1", "unresponsive", 3)] if others else [
        ("prefill-1/TP0", "unresponsive", 6)]  # fmt: skip
    assert sorted(incidents(model, T0 + 8)) == expected


def test_a_model_that_keeps_no_series_judges_as_one_that_does_and_keeps_no_transfer():
    """`kvtop check` fills a model without the rings and histograms (`series=False`: no numpy loaded for them): the
    same deliveries give the same verdict and the same links, and nothing of the transfers is kept."""
    from kvtop.views.check import evaluate

    models = {series: ClusterModel(series=series) for series in (True, False)}
    for model in models.values():
        _side_timeout_and_a_lost_decode_rank(model, True, decode_0_served="prefill-0")
        deliver(model, "decode-0/TP1", [RoomState(T0 + 7, 5, KVPoll.Success, 0),
                                        TransferDone(T0 + 7, 5, 4096, 0.02, "prefill-1")], T0 + 7)  # fmt: skip
    judged = {series: evaluate(model, Thresholds(), T0 + 8) for series, model in models.items()}

    assert judged[False] == judged[True]
    kept, unkept = models[True], models[False]
    assert {key: (link.transfers, link.nbytes) for key, link in unkept.links.items()} == {
        key: (link.transfers, link.nbytes) for key, link in kept.links.items()
    }
    assert len(kept.transfers) == 3 and len(unkept.transfers) == 0  # decode-0 and decode-1 served one each, then room 5
    assert all(link.durations.count == 0 and len(link.recent) == 0 for link in unkept.links.values())
