"""Instance consensus: the ranks of one instance agree on every room each tick.

SGLang all-reduces the per-room `KVPoll` with MIN across the ranks of an
instance, so one rank's Failed (0) becomes every rank's. Here every rank
publishes a `Vote` each engine tick (its rooms, and recently finished ones) on
a PUB socket, subscribes to the votes of the other ranks, and takes the MIN
itself; unlike SGLang the value carries the failure's origin and reason, so a
rank that learns of a failure this way knows exactly whose echo it is.

Every room ends: a rank that stops voting fails the rooms of its instance
(`peer_lost`), and a rank that keeps voting but never votes on a room (it
refused or never got the room) fails that room once the vote timeout has
passed since this rank took it (`timeout_consensus`). Votes are validated by
their schema (wire.py) and by who sent them; rejections are counted in the
consensus socket's own counters.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass

import zmq

from transport.counters import Counters
from transport.curve import CurveKeys, dialing, serving
from transport.kv import reasons
from transport.kv.rooms import RoomRecord
from transport.kv.routes import RouteBook
from transport.kvpoll import KVPoll
from transport.sockets import (
    LIST_FRAME,
    bind_ephemeral,
    decode_waiting,
    open_publisher,
    open_socket,
    serve_subscriptions,
)
from transport.wire import AgentInfo, FrameDecoder, Vote, VoteEntry, encode

REMEMBER_S = 10.0
"""A released room stays in this rank's votes this long, so slower peers still see how it ended."""


@dataclass(frozen=True, slots=True)
class Agreement:
    """The instance's view of a room: the MIN state, and the failure that set it (if any)."""

    state: KVPoll
    failure: VoteEntry | None


class InstanceConsensus:
    """One rank's part of the consensus; every method runs on the engine thread."""

    def __init__(
        self,
        context: zmq.Context[zmq.Socket[bytes]],
        host: str,
        counters: Counters,
        vote_timeout_s: float,
        curve: CurveKeys | None = None,
    ) -> None:
        self.publisher = open_publisher(context, serving(curve))
        """Where this rank's votes go out (what its subscribers send it is read by `serve_subscribers`)."""
        self.endpoint = bind_ephemeral(self.publisher, host)
        self.socket = open_socket(context, zmq.SUB, LIST_FRAME, dialing(curve))
        self.socket.setsockopt(zmq.SUBSCRIBE, b"")
        self._counters = counters
        self._vote_timeout_s = vote_timeout_s
        self._connected: dict[int, AgentInfo] = {}
        self._votes: dict[int, tuple[float, dict[int, VoteEntry]]] = {}
        self._released: dict[int, tuple[float, VoteEntry]] = {}
        self._decoder: FrameDecoder[Vote] = FrameDecoder(Vote)

    def join(self, me: AgentInfo, routes: RouteBook, now: float) -> None:
        """Connect to every other rank of this instance (and to a restarted one's new endpoint)."""
        if me.tp == 1:
            return
        ranks = routes.lookup(me.instance, now)
        if ranks is None:
            return
        stale = False
        for peer in ranks:
            known = self._connected.get(peer.rank)
            if peer.rank == me.rank or not peer.consensus_endpoint:
                continue
            if known == peer:
                # A silent rank may be back as a new process: ask the bootstrap service again.
                stale = stale or now - self._votes.get(peer.rank, (now, {}))[0] > self._vote_timeout_s
                continue
            if known is not None:
                self.socket.disconnect(known.consensus_endpoint)
            self.socket.connect(peer.consensus_endpoint)
            self._connected[peer.rank] = peer
            # Its silence counts from now (a restarted rank's afresh), so a rank that dies before its first
            # vote arrives is caught too.
            self._votes[peer.rank] = (now, {})
        if stale or len(self._connected) < me.tp - 1:
            routes.forget(me.instance)

    def remember_release(self, record: RoomRecord, now: float) -> None:
        """Keep a released room's final state in the votes for `REMEMBER_S`."""
        self._released[record.room] = (now, entry_of(record))

    def publish(self, me: AgentInfo, rooms: Iterable[RoomRecord], now: float) -> None:
        """Send this tick's vote: every room this rank has, and recently released ones."""
        for room, (released_at, _) in list(self._released.items()):
            if now - released_at > REMEMBER_S:
                del self._released[room]
        entries = [entry_of(record) for record in rooms]
        entries.extend(entry for _, entry in self._released.values())
        self.publisher.send(encode(Vote(me.rank, me.incarnation, entries)))

    def serve_subscribers(self) -> None:
        """Apply the other ranks' subscriptions to this rank's votes (anything else is counted)."""
        serve_subscriptions(self.publisher, self._counters)

    def handle(self) -> None:
        """Read the other ranks' votes (only the latest of each counts); a vote from no rank we joined is rejected."""
        for vote in decode_waiting(self.socket, self._decoder, self._counters):
            if vote.rank not in self._connected:
                self._counters.reject("unexpected")
                continue
            self._votes[vote.rank] = (time.monotonic(), {entry.room: entry for entry in vote.rooms})

    def agree(self, record: RoomRecord, me: AgentInfo, now: float) -> Agreement:
        """MIN over the ranks of the instance; a rank that has not voted on the room counts as Bootstrapping.

        Not for ever: the room fails here, this rank the origin, once a rank has gone on voting for the
        vote timeout since this rank took the room without ever voting on it (it never took the room), or
        has been silent that long (it died), or has not joined by then.
        """
        state = record.state
        failure = entry_of(record) if state is KVPoll.Failed else None
        waited = now - record.created_at
        if len(self._connected) < me.tp - 1:
            state = min(state, KVPoll.Bootstrapping)
            if waited > self._vote_timeout_s:
                joined = f"every rank of {me.instance} to join ({len(self._connected) + 1} of {me.tp} reachable)"
                reason = reasons.consensus_timeout(record.room, waited, joined, me.instance)
                failure = failure or _failed(record.room, me, reason)
        for rank, peer in self._connected.items():
            seen, rooms = self._votes.get(rank, (None, {}))
            entry = rooms.get(record.room)
            if seen is not None and now - seen > self._vote_timeout_s:
                entry = _failed(record.room, me, reasons.rank_silent(peer.label))
            elif entry is None and seen is not None and seen - record.created_at > self._vote_timeout_s:
                # it kept voting for a whole vote timeout after this rank took the room, never on the room
                waiting_for = f"the vote of rank {peer.label}"
                reason = reasons.consensus_timeout(record.room, waited, waiting_for, peer.label)
                entry = _failed(record.room, me, reason)
            peer_state = KVPoll(entry.state) if entry else KVPoll.Bootstrapping
            if peer_state is KVPoll.Failed and failure is None:
                failure = entry
            state = min(state, peer_state)
        return Agreement(KVPoll.Failed if failure else state, failure)

    def silent(self, now: float, after_s: float) -> tuple[str, float]:
        """The rank of the instance (or the instance, when several) that has not voted for `after_s`, and for how
        long (the shortest silence among them); ("", 0.0) when none.

        The votes waiting in the socket are read first: a rank whose own engine stood still (a starved process)
        has not read its peers' votes since, and judged without them it named a peer that voted all along."""
        self.handle()
        now = max(now, time.monotonic())  # the votes just read are stamped after `now`
        silences = {peer.label: now - self._votes.get(rank, (now, {}))[0] for rank, peer in self._connected.items()}
        silent = {label: span for label, span in silences.items() if span > after_s}
        suspect = reasons.common_suspect(set(silent))
        return (suspect, min(silent.values())) if suspect else ("", 0.0)

    def close(self) -> None:
        self.publisher.close(linger=0)
        self.socket.close(linger=0)


def entry_of(record: RoomRecord) -> VoteEntry:
    """A room as this rank votes it (a failure with its origin, reason and class): a room it finished but the
    instance failed since (an ABORT its decode peer sent) votes that failure."""
    failure, reason_class = record.failure, record.reason_class
    if record.state is not KVPoll.Failed and record.agreed is KVPoll.Failed:
        failure, reason_class = record.agreed_failure, record.agreed_reason_class
    if failure is not None and (record.state is KVPoll.Failed or record.agreed is KVPoll.Failed):
        origin = failure.origin or ""
        return VoteEntry(
            record.room, int(KVPoll.Failed), origin, failure.failure_reason, reason_class, failure.suspect,
            failure.origin_class,
        )  # fmt: skip
    return VoteEntry(record.room, int(record.state))


def _failed(room: int, me: AgentInfo, reason: reasons.Reason) -> VoteEntry:
    """A failure this rank observed in the consensus itself (this rank is its origin)."""
    return VoteEntry(
        room, int(KVPoll.Failed), me.label, reason.text, reason.reason_class, reason.suspect, reason.origin_class
    )
