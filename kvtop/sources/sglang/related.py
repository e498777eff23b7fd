"""Rooms a failure line leaves out, named by the lines around it (DOMAIN.md, "Related lines around a failure").

A backend's failure can reach the scheduler's failure line as a bare
RuntimeError with no `bootstrap_room=` field. Within one log file (one
instance), its room is then named by:

- the request id: every rank of an instance logs the same `rid` for a
  request, so another rank's line with that rid and a room names it;
- a preceding `Unexpected transfer worker error for room N` line (and its
  traceback) or `NIXL transport error for room N: CODE` within
  `WORKER_ERROR_S`: the backend failed the room, the scheduler's line is its
  record.

A line linked to a room that its instance already failed is the same failure
seen by another rank (an echo inside the instance); otherwise it is the
origin. A worker error that no failure line claims within `WORKER_ERROR_S`
of the file's own time (or by the end of a complete file, or once a followed
file went quiet) is itself the room's failure record, its reason the
traceback's last line. Given early because the file went quiet, it still
names its room for a roomless line within `WORKER_ERROR_S`: that line is its
echo.

Lines of a decode rank announce failures whose own lines come next
(`Announcement`): SGLang's hint `Some requests fail to receive KV Cache transfer
done signal` (once per process, just before the rank records a room's timeout
in WaitingForInput), its heartbeat checker's `Lost connection with prefill
instance (bootstrap_addr: X), N requests affected` (after it failed each
affected room), and a bootstrap server that did not answer (`Error fetching
prefill ... info from bootstrap: ...`, once per attempt, and the give-up after
the last: `Could not fetch prefill parallel info from X after N attempts`); a
prefill rank's hint `Some requests timed out when bootstrapping` likewise. A
failure line of the rank with that reason within `WORKER_ERROR_S` of it,
before or after, claims it; an unclaimed one (an excerpt cut after it, no room
affected, rooms SGLang aborted after it gave up) is itself the record of a
failure that names no room (`unclaimed_announcements`). A rank's bootstrap
errors at most `RETRY_S` apart are one failure, its attempts (twenty of them
were twenty failures).
"""

from __future__ import annotations

import re
from collections import deque
from dataclasses import dataclass

from kvtop.model.fold import ROOM_REUSE_S
from kvtop.model.suspects import (
    BOOTSTRAP_ERROR,
    BOOTSTRAP_TIMED_OUT,
    PREFILL_LOST,
    WAITING_TIMED_OUT,
    bootstrap_address,
)
from kvtop.sources.sglang.lines import BOOTSTRAP_HINT, ContextLine, FailureLine, holds_any, lost_prefill
from transport.wire import cut_text

WORKER_ERROR = re.compile(r"Unexpected transfer worker error for room (\d+)")
TRANSPORT_ERROR = re.compile(r"NIXL transport error for room (\d+)")
WORKER_ERROR_S = 5.0
"""A roomless failure line this soon after a worker error is that error's record; a worker error no line
claimed for this long is the failure record itself."""
GAVE_UP_S = 2.0
"""A room a decode rank aborts this soon after it gave up on a bootstrap server is one it gave up on."""
RETRY_S = 10.0
"""A rank's bootstrap error this soon after its previous one is another attempt of the same failure (SGLang 0.5.23
tries 15 times 1 s apart, 0.5.9 20 times 3 s apart, before it gives up)."""
RIDS_KEPT = 4096
RECENT_FAILURES_KEPT = 256
"""Failure lines remembered to claim an announcement that comes after them."""
BOOTSTRAPPING_CLAIM = "in KVPoll.Bootstrapping"
WAITING_CLAIM = "in KVPoll.WaitingForInput"
LOST_CLAIM = "connection with prefill instance (bootstrap_addr: "
FETCH_CLAIM = "Could not fetch "
CLAIMS = (BOOTSTRAPPING_CLAIM, WAITING_CLAIM, LOST_CLAIM, FETCH_CLAIM)
"""What every announcement's `claimed_by` starts with (`announcement`): a failure line whose reason holds none of
them claims none, and is not remembered for one."""


@dataclass(slots=True)
class Announcement:
    """A rank's line that says failures are being recorded (`kind`: the rank event it is unclaimed); a failure line
    of its rank whose reason holds `claimed_by` claims it."""

    ts: float
    """When it was said (the latest attempt of a bootstrap error)."""
    tp: int | None
    kind: str
    claimed_by: str
    text: str
    since: float = 0.0
    """When its failure began (the first attempt of a bootstrap error; else `ts`)."""
    pp: int | None = None
    """The rank's pipeline stage (None: its line named none)."""
    dp: int | None = None
    """The DP rank its line named (None: none)."""

    def __post_init__(self) -> None:
        self.since = self.since or self.ts

    def claimed(self, pp: int | None, tp: int, ts: float, reason: str) -> bool:
        return (
            self.claimed_by in reason and abs(ts - self.ts) <= WORKER_ERROR_S and _same_rank(self.pp, self.tp, pp, tp)
        )


def _same_rank(pp: int | None, tp: int | None, other_pp: int | None, other_tp: int) -> bool:
    """Whether a line of stage `pp` and TP rank `tp` (each None where it named none: any) is of another line's
    rank."""
    return (tp is None or tp == other_tp) and (pp is None or pp == other_pp)


def announcement(line: ContextLine, ts: float) -> Announcement | None:
    """What a context line announces: a timeout hint (a decode's, a prefill's), the loss of a prefill instance, a
    bootstrap server that did not answer; None for any other line."""
    if line.kind == "hint" and line.text.startswith(BOOTSTRAP_HINT):
        return Announcement(ts, line.tp, BOOTSTRAP_TIMED_OUT, BOOTSTRAPPING_CLAIM, line.text, pp=line.pp, dp=line.dp)
    if line.kind == "hint":
        return Announcement(ts, line.tp, WAITING_TIMED_OUT, WAITING_CLAIM, line.text, pp=line.pp, dp=line.dp)
    if line.kind == "lost_connection" and (address := lost_prefill(line.text)):
        return Announcement(ts, line.tp, PREFILL_LOST, f"{LOST_CLAIM}{address})",
                            line.text, pp=line.pp, dp=line.dp)  # fmt: skip
    if line.kind == BOOTSTRAP_ERROR:
        return Announcement(ts, line.tp, BOOTSTRAP_ERROR, FETCH_CLAIM, line.text, pp=line.pp, dp=line.dp)
    return None


@dataclass(slots=True)
class WorkerError:
    """A backend's error for a room (a worker error, a NIXL transport error) no failure line claimed yet."""

    ts: float
    tp: int | None
    room: int
    reason: str
    is_record: bool = True
    """Unclaimed, it is the room's failure record (a worker error; a transport error is only context)."""
    given: bool = False
    """Already given as the room's failure record (its file went quiet), kept to name the room for a line."""
    pp: int | None = None
    """The rank's pipeline stage (None: its line named none)."""
    dp: int | None = None
    """The DP rank its line named (None: none)."""


class RelatedLines:
    """One file's memory of rooms: request ids, rooms that failed, unclaimed worker errors."""

    def __init__(self) -> None:
        self._rooms_by_rid: dict[str, int] = {}
        self._failed: dict[int, float] = {}
        """Rooms the instance failed (a failure line with a room), with the time of the latest."""
        self._pending: list[WorkerError] = []
        self._announced: list[Announcement] = []
        """Announcements no failure line claimed yet."""
        self._claims: set[str] = set()
        """Their `claimed_by`: a failure line that holds none of them claims none (the list is not scanned)."""
        self._linked = 0
        """Failure lines seen (`link`)."""
        self._recent: dict[str, deque[tuple[int, float, int | None, int, str]]] = {
            claim: deque(maxlen=RECENT_FAILURES_KEPT) for claim in CLAIMS
        }
        """Of the latest `RECENT_FAILURES_KEPT` failure lines, those whose reason holds each of `CLAIMS`: (`_linked`
        at it, time, pipeline stage, TP rank, reason)."""
        self._gave_up: deque[tuple[float, int | None, int | None, str]] = deque(maxlen=RECENT_FAILURES_KEPT)
        """The latest give-ups of a bootstrap server: (time, pipeline stage, TP rank, text)."""

    def context(self, line: ContextLine, ts: float) -> None:
        """A context line: a worker error or an announcement waits for its failure line (an announcement's may have
        come already); a traceback right after a worker error gives its reason."""
        announced = announcement(line, ts)
        if announced is not None and announced.kind == BOOTSTRAP_ERROR and announced.claimed_by in line.text:
            self._gave_up.append((ts, line.pp, line.tp, line.text))
        if announced is not None:
            claim = announced.claimed_by  # looked for first: each walks the latest failure lines of its stem
            since = self._linked - RECENT_FAILURES_KEPT
            for stem in CLAIMS:  # a loop, not `next()` over a generator: on every announcement
                if claim.startswith(stem):
                    break
            remembered = self._recent[stem]
            recent = [line[1:] for line in remembered if line[0] > since and claim in line[4]] if remembered else []
            if not any(announced.claimed(pp, tp, when, reason) for when, pp, tp, reason in recent):
                self._announce(announced)
            return
        found = WORKER_ERROR.search(line.text) or TRANSPORT_ERROR.search(line.text)
        if found:
            reason = cut_text(line.text)
            self._pending.append(
                WorkerError(ts, line.tp, int(found[1]), reason, found.re is WORKER_ERROR, pp=line.pp, dp=line.dp)
            )
        elif line.kind == "traceback" and self._pending and self._pending[-1].reason.startswith("Unexpected"):
            last = self._pending[-1]
            if ts - last.ts <= 1.0:
                last.reason = cut_text(line.text.rstrip().splitlines()[-1].strip()) or last.reason

    def link(self, line: FailureLine, ts: float) -> tuple[int | None, bool]:
        """The room of a failure line (its own, else the one related lines name) and whether it is an echo
        inside its instance (the room already failed there). Remembers what the line says."""
        self._linked += 1
        for stem in CLAIMS:  # no regex, no frame: on every failure line
            if stem in line.reason:
                self._recent[stem].append((self._linked, ts, line.pp, line.tp, line.reason))
        if holds_any(line.reason, self._claims):
            unclaimed = [a for a in self._announced if not a.claimed(line.pp, line.tp, ts, line.reason)]
            if len(unclaimed) < len(self._announced):
                self._set_announced(unclaimed)
        room = line.room
        linked = room is None
        if room is None:
            room = self._rooms_by_rid.get(line.rid) if line.rid else None
        if room is None:
            room = self._claim(line.pp, line.tp, ts)
        if room is None:
            return None, False
        echo = linked and ts - self._failed.get(room, -ROOM_REUSE_S * 2) <= ROOM_REUSE_S
        self._remember_failed(room, ts)
        if self._pending:
            self._pending = [p for p in self._pending if p.room != room]
        if line.rid and line.rid not in self._rooms_by_rid:
            self._rooms_by_rid[line.rid] = room
            if len(self._rooms_by_rid) > RIDS_KEPT:
                del self._rooms_by_rid[next(iter(self._rooms_by_rid))]
        return room, echo

    def unclaimed(self, now: float | None, quiet: bool = False) -> list[WorkerError]:
        """Worker errors no failure line claimed by `now` (None: the file is complete, all of them), forgotten;
        with `quiet` (the followed file gained nothing for a while), every other one too, kept until `now` is
        past it to name its room for a roomless line that still comes (as an echo: the room failed here)."""
        due: list[WorkerError] = []
        waiting: list[WorkerError] = []
        for error in self._pending:
            (due if now is None or now - error.ts > WORKER_ERROR_S else waiting).append(error)
        self._pending = waiting
        records = [p for p in due if p.is_record and not p.given]
        if quiet:
            for error in self._pending:
                if error.is_record and not error.given:
                    error.given = True
                    self._remember_failed(error.room, error.ts)
                    records.append(error)
        return records

    def unclaimed_announcements(self, now: float | None, quiet: bool = False) -> list[Announcement]:
        """Announcements no failure line claimed by `now` (None: the file is complete; `quiet`: the followed file
        went quiet: all of them), forgotten: each a failure of its rank that names no room."""
        due: list[Announcement] = []
        waiting: list[Announcement] = []
        for said in self._announced:
            (due if now is None or quiet or now - said.ts > WORKER_ERROR_S else waiting).append(said)
        if due:
            self._set_announced(waiting)
        return due

    def gave_up(self, pp: int | None, tp: int, ts: float) -> str:
        """The give-up of a bootstrap server this rank logged at most `GAVE_UP_S` before `ts` (`Could not fetch prefill
        parallel info from X after 15 attempts`): what a room it aborts then failed of; "" when there is none."""
        return next(
            (
                text
                for when, on_pp, on_tp, text in reversed(self._gave_up)
                if _same_rank(on_pp, on_tp, pp, tp) and 0 <= ts - when <= GAVE_UP_S
            ),
            "",
        )

    def _announce(self, announced: Announcement) -> None:
        """Wait for the line that claims `announced`; another attempt of a bootstrap error waiting already is that
        one, later (with the text that names the address, when only one does)."""
        if announced.kind == BOOTSTRAP_ERROR:
            for earlier in self._announced:
                if (
                    earlier.kind == BOOTSTRAP_ERROR
                    and (earlier.pp, earlier.tp) == (announced.pp, announced.tp)
                    and 0 <= announced.ts - earlier.ts <= RETRY_S
                ):
                    earlier.ts = announced.ts
                    if bootstrap_address(announced.text) or not bootstrap_address(earlier.text):
                        earlier.text = announced.text
                    return
        self._announced.append(announced)
        self._claims.add(announced.claimed_by)

    def _set_announced(self, announced: list[Announcement]) -> None:
        self._announced = announced
        self._claims = {said.claimed_by for said in announced}

    def _remember_failed(self, room: int, ts: float) -> None:
        self._failed[room] = ts
        if len(self._failed) > RIDS_KEPT:
            del self._failed[next(iter(self._failed))]

    def _claim(self, pp: int | None, tp: int, ts: float) -> int | None:
        """The room of the latest worker error shortly before `ts`, on the same rank if one is."""
        near = [p for p in self._pending if 0 <= ts - p.ts <= WORKER_ERROR_S]
        if not near:
            return None
        same_rank = [p for p in near if (p.pp, p.tp) == (pp, tp)]
        return (same_rank or near)[-1].room
