"""The headless views (ranks, rooms, status) as plain text for people and dicts for `--json`."""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

from kvtop.model.cluster import STUCK_AFTER_S, ClusterModel
from kvtop.model.shapes import RATE_WINDOW_S, Liveness, RankView, RoomView
from kvtop.views.incidents import ago, duration, in_span, incident_json, incident_size, plural, suspected_ranks
from kvtop.views.known import KNOWN_METRICS, NO_DATA
from kvtop.views.times import seconds, spans_days, stamp
from kvtop.views.units import gbps, size
from transport.counters import REJECTION_REASONS
from transport.plane.events import LogContext, LogFollowed
from transport.registration import refused_as_taken

INCIDENTS_SHOWN = 3
"""Incidents the status text names (the newest); `kvtop incidents` lists them all."""
UNREACHABLE_NAMED = 10
"""Names a text line gives per reason a socket could not be opened (`--json` has every one)."""


def _nonzero(counts: dict[str, int]) -> dict[str, int]:
    return {key: value for key, value in counts.items() if value}


def _rejected(counters: dict[str, int]) -> dict[str, int]:
    """The non-zero `rejected_<reason>` counters, by reason."""
    return _nonzero({reason: counters.get(f"rejected_{reason}", 0) for reason in REJECTION_REASONS})


def ranks_json(model: ClusterModel, now: float) -> list[dict[str, Any]]:
    """Stable fields: role, instance, rank, label, source (`agent`, `sglang`: an SGLang rank through kvtop's plugin,
    `log`), host, pid, state, gbps (over the last `RATE_WINDOW_S`, as the dashboard's; 0 for a rank not heard
    from), inflight (the rooms it has not ended, as its last heartbeat said; null once it is gone), origins, echoes,
    cpu, rss, `rejected` (frames each socket of the rank refused: socket -> reason -> count, non-zero reasons only), and
    `unreachable` (why kvtop could not open a socket for the rank, null when it could), `unlisted` (why the
    bootstrap service does not list it now, as its own heartbeat says: its refresh refused; null while listed),
    `named_by` (the ranks whose log lines name it as their peer, where no log of its own was read; else empty),
    `suspected` (an ongoing incident suspects it, or its instance). A rank known from a log
    file has null pid, gbps, cpu and rss: a log tells none of them (never a made-up 0); a sidecar's, null gbps (its
    pid, cpu and rss are the sidecar's); one known only from its
    peers' lines (a prefill instance by its bootstrap address) has a null rank, inflight, origins and echoes too."""
    unreachable = model.intake.unreachable
    model.refold()  # its origin and echo counts follow the fold
    suspected = suspected_ranks(model, now)
    states = model.liveness(now)
    return [
        {
            "role": view.role,
            "instance": view.instance,
            "rank": view.rank,
            "label": view.label,
            "source": view.source,
            "host": view.host,
            "pid": view.pid,
            "state": str(states[view.label]),
            "last_seen_s": round(now - view.last_seen, 3) if view.last_seen else None,
            "clock_offset_s": round(view.clock.offset_s, 3),
            "gbps": None if view.inferred else round(view.gbps(now, RATE_WINDOW_S), 4),  # logs time no transfer
            "inflight": None if view.liveness(now) is Liveness.GONE else view.inflight,  # (as `status`' open rooms)
            "origins": view.origins,
            "echoes": view.echoes,
            "cpu_percent": view.cpu_percent,
            "rss_bytes": view.rss_bytes,
            "rejected": {socket: _nonzero(reasons) for socket, reasons in sorted(view.rejected.items())},
            "log": log_json(view.log) if view.log is not None else None,
            "unreachable": unreachable.get(view.label),
            "unlisted": view.registration or None,
            "named_by": view.named_by,
            "crashed": _crash_json(model, view.label),
            "suspected": view.label in suspected,
            **(_NOT_IN_LOGS if view.from_log else {}),
            **(_NOT_NAMED if view.named_by else {}),
        }
        for view in sorted(model.ranks.values(), key=lambda v: v.order)
    ]


_NOT_IN_LOGS = {"pid": None, "gbps": None, "cpu_percent": None, "rss_bytes": None}
"""What a rank's JSON holds where a server log read as a file tells nothing of it."""
_NOT_NAMED = {"rank": None, "inflight": None, "origins": None, "echoes": None}
"""What it holds besides where its peers' lines alone tell of it (its own log would say these)."""


def _crash_json(model: ClusterModel, label: str) -> dict[str, Any] | None:
    crash = model.crashes.get(label)
    if crash is None:
        return None
    return {"ts": crash.ts, "text": crash.text, "logged_again": model.logged_after_crash.get(label)}


def crash_line(model: ClusterModel, label: str, crash: LogContext, dated: bool = False) -> str:
    """`crashed prefill-0/TP2 at 22:03:02: Scheduler hit an exception: KeyError: ...`, and when the rank's log went
    on after it (a restarted server), `; logged again at 22:10:05`."""
    line = f"crashed {label} at {stamp(crash.ts, dated)[:-4]}: {crash.text}"
    again = model.logged_after_crash.get(label)
    return f"{line}; logged again at {stamp(again, dated)[:-4]}" if again is not None else line


def crash_lines(model: ClusterModel, since: float | None = None) -> list[str]:
    """`crash_line` per rank whose log said it crashed (from `since`; earliest first)."""
    crashes = sorted(
        ((label, crash) for label, crash in model.crashes.items() if since is None or crash.ts >= since),
        key=lambda item: item[1].ts,
    )
    dated = spans_days([crash.ts for _, crash in crashes])
    return [crash_line(model, label, crash, dated) for label, crash in crashes]


def log_json(log: LogFollowed) -> dict[str, Any]:
    """What a sidecar says of the log it follows; with metrics, each known one's value or "no data"."""
    fields = {name: getattr(log, name) for name in log.__struct_fields__ if name != "metrics"}
    fields["silent_s"] = round(log.silent_s, 3)
    if log.metrics_url:
        names = sorted({*KNOWN_METRICS, *log.metrics})
        fields["metrics"] = {name: log.metrics.get(name, NO_DATA) for name in names}
    else:
        fields["metrics"] = {}
    return fields


def _rejected_text(rejected: dict[str, dict[str, int]]) -> str:
    """`control 3, data 1` (sockets that rejected something), or `-`."""
    totals = [(socket, sum(reasons.values())) for socket, reasons in rejected.items()]
    return ", ".join(f"{socket} {total}" for socket, total in totals if total) or "-"


def _state(model: ClusterModel, row: dict[str, Any], now: float) -> str:
    """`crashed` (its log said so), else `suspect` for a live (or logged) rank an ongoing incident suspects, else
    its liveness."""
    if model.crash_of(row["label"], now) is not None:
        return "crashed"
    if row["suspected"] and row["state"] in ("alive", "log", "idle"):
        return "suspect"
    return str(row["state"])


def ranks_text(model: ClusterModel, now: float) -> str:
    """The ranks' table; STATE says `crashed` for a rank whose log said its scheduler crashed and nothing since,
    `suspect` for a rank an ongoing incident suspects."""
    ranks = ranks_json(model, now)
    width = max([16, *(len(r["label"]) for r in ranks if len(r["label"]) <= _RANK_WIDTH_MAX)])
    header = f"{'RANK':<{width}} {'ROLE':<8} {'SOURCE':<6} {'STATE':<7} {'HOST':<14} {'PID':>7} {'RATE':>10}"
    lines = [f"{header} {'INFLIGHT':>8} {'ORIGINS':>7} {'ECHOES':>6}  REJECTED"]
    lines += [
        f"{r['label']:<{width}} {r['role']:<8} {r['source']:<6} {_state(model, r, now):<7} {r['host'][:14]:<14} "
        f"{_dash(r['pid']):>7} "
        f"{_dash(r['gbps'] if r['gbps'] is None else gbps(r['gbps'])):>10} {_dash(r['inflight']):>8} "
        f"{_dash(r['origins']):>7} {_dash(r['echoes']):>6}  {_rejected_text(r['rejected'])}"
        + (f"  unreachable: {r['unreachable']}" if r["unreachable"] else "")
        + (f"  unlisted: {r['unlisted']}" if r["unlisted"] else "")
        + (f"  no log of its own: named by {', '.join(r['named_by'])}" if r["named_by"] else "")
        for r in ranks
    ]
    return "\n".join(lines + crash_lines(model) + clock_lines(model) + sidecar_lines(model) + intake_lines(model, now))


_RANK_WIDTH_MAX = 24
"""The widest the RANK column grows to fit a label (`prefill-0/PP1-TP3`); a longer one overflows it."""


def _dash(value: object) -> object:
    """`value`, or `-` where the source has none (null in the JSON: a log tells no pid and no transfer)."""
    return "-" if value is None else value


def clock_lines(model: ClusterModel) -> list[str]:
    """`clock   decode-0/TP0 is 3600.0 s ahead of this collector's (its times corrected)`, per skewed rank."""
    return [
        f"clock   {label} is {abs(offset):.1f} s {'ahead of' if offset > 0 else 'behind'} this collector's "
        "(its times corrected)"
        for label, offset in model.skewed_clocks().items()
    ]


def sidecar_lines(model: ClusterModel, label: str = "") -> list[str]:
    """One line per log a sidecar follows (of rank `label` only, when given): where it reads, what it skipped,
    how long the log is silent, the metrics."""
    lines: list[str] = []
    seen: set[tuple[str, str]] = set()
    for view in sorted(model.ranks.values(), key=lambda v: v.order):
        if label and view.label != label:
            continue
        log = view.log
        if log is None or (view.instance, log.path) in seen:
            continue
        seen.add((view.instance, log.path))
        where = f"at {log.position}/{log.size} B" if log.exists else "waiting for the file"
        text = f"log {view.instance}: {log.path} {where}, {log.lines} lines, {log.garbled} garbled, "
        text += f"{log.rotations} rotations, silent {log.silent_s:.0f}s{' (idle or server down)' if log.idle else ''}"
        if log.damaged:
            text += f", damaged: {log.damaged}"
        if log.metrics_url:
            values = [f"{name.removeprefix('sglang:')} {log.metrics[name]:g}" for name in sorted(log.metrics)]
            text += f"; metrics {log.metrics_error or ', '.join(values) or NO_DATA}"  # an error names the URL
        lines.append(text)
    return lines


def intake_json(model: ClusterModel, now: float) -> dict[str, Any]:
    """What kvtop could not take in: the collector's bad entries, rejected frames and records (`records_refused`:
    per rank, how many of its records failed their schema and why the latest did), the bootstrap's refusals
    (`refusals`: each of `refused` whose role and time the service gave, with its age at `now`)."""
    intake = model.intake
    counters, service = intake.counters, intake.bootstrap_counters
    return {
        "collector": {
            "bad_entries": dict(sorted(intake.bad_entries.items())),
            "unreachable": dict(sorted(intake.unreachable.items())),
            "rejected": _rejected(counters),
            "deliveries_failed": counters.get("deliveries_failed", 0),
            "snapshots_missed": counters.get("snapshots_missed", 0),
            "records_rejected": counters.get("records_rejected", 0),
            "records_refused": {
                label: {"count": count, "latest": why} for label, (count, why) in sorted(intake.records_refused.items())
            },
            "error": intake.error,
        },
        "bootstrap": {
            "rejected": _rejected(service),
            "expired": service.get("expired", 0),
            "deregistered": service.get("deregistered", 0),
            "refused_client_limit": service.get("refused_client_limit", 0),
            "refused_takeover": service.get("refused_takeover", 0),
            "refused": list(intake.bootstrap_refused),
            "refusals": [
                {"line": refused.line, "role": refused.role or None, "age_s": round(max(0.0, now - refused.at), 1)}
                for refused in intake.bootstrap_refusals
            ],
            "replaced": service.get("replaced", 0),
            "replaced_incarnations": list(intake.bootstrap_replaced),
        }
        if service or intake.bootstrap_refused
        else None,
    }


def intake_lines(model: ClusterModel, now: float) -> list[str]:
    """Lines for people, only when something was refused on the way in (or the collector stopped); a refusal
    ends with how long ago it was, where the service said."""
    intake = intake_json(model, now)
    collector, service = intake["collector"], intake["bootstrap"]
    lines = [f"collector stopped: {collector['error']}"] if collector["error"] else []
    if collector["bad_entries"]:
        named = "; ".join(f"{name}: {why}" for name, why in collector["bad_entries"].items())
        lines.append(f"skipped {len(collector['bad_entries'])} unusable entries: {named}")
    lines += unreachable_lines(collector["unreachable"])
    if collector["rejected"] or collector["deliveries_failed"]:
        reasons = ", ".join(f"{reason} {count}" for reason, count in collector["rejected"].items())
        failed = collector["deliveries_failed"]
        lines.append(
            f"collector rejected frames: {reasons or 'none'}" + (f"; {failed} deliveries failed" if failed else "")
        )
    if collector["records_rejected"]:
        named = "".join(
            f"\n  {label}: {refused['count']}, latest {refused['latest']}"
            for label, refused in collector["records_refused"].items()
        )
        lines.append(
            f"collector rejected {collector['records_rejected']} records outside their schema "
            f"(the rest of their batches and snapshots kept):{named}"
        )
    if service and (service["refused"] or service["rejected"]):
        counts = {
            **service["rejected"],
            "over a client's share": service["refused_client_limit"],
            "taking another client's live entry": service["refused_takeover"],
        }
        reasons = ", ".join(f"{reason} {count}" for reason, count in counts.items() if count)
        head = f": {reasons}" if reasons else " (named by the relay; the service's counts stay with it):"
        ages = {refusal["line"]: refusal["age_s"] for refusal in service["refusals"]}
        refused = "".join(f"\n  refused {refused_ago(line, ages.get(line))}" for line in service["refused"])
        lines.append(f"bootstrap rejected{head}{refused}")
    if service and service["replaced"]:
        named = "".join(f"\n  {line}" for line in service["replaced_incarnations"])
        lines.append(f"bootstrap: {service['replaced']} entries taken by a new incarnation{named}")
    return lines


def refused_ago(line: str, age_s: float | None) -> str:
    """A refused registration's line, `, 2s ago` after it where the service said when (every view says it so)."""
    return line if age_s is None else f"{line}, {duration(age_s)} ago"


def unlisted_lines(model: ClusterModel) -> list[str]:
    """`unlisted decode-0/TP0 (its registration fails: no peer or new view finds it): why`, per rank whose
    heartbeat says its registration fails (`unseen`: who misses it)."""
    return [unlisted_line(view) for view in sorted(model.ranks.values(), key=lambda v: v.order) if view.registration]


def unlisted_line(view: RankView) -> str:
    """`unlisted decode-0/TP0 (its registration fails: no peer or new view finds it): why`."""
    return f"unlisted {view.label} ({unseen(view)}): {view.registration}"


def unseen(view: RankView, it: str = "it", its: str = "its") -> str:
    """Who misses a rank whose registration fails, as its refusal tells: a kvtop agent's peers resolve it through the
    service (a sidecar's or plugin's rank pairs through SGLang's own bootstrap); the service lists a rank refused
    because another client holds its entry apart, as taken, so new views hear that one (not one refused otherwise:
    an endpoint no longer allowed). `it`, `its`: the pronouns (`them`, `their` for many)."""
    peers = view.source == "agent"
    if refused_as_taken(view.registration):
        heard = f"new views hear {it} as taken"
        return f"another client holds {its} entry: " + (f"no peer finds {it}; {heard}" if peers else heard)
    return f"{its} registration fails: no {'peer or ' if peers else ''}new view finds {it}"


def unreachable_lines(unreachable: dict[str, str]) -> list[str]:
    """One line per reason kvtop could not open a socket (its own limits, not the ranks'), naming whom."""
    by_why: dict[str, list[str]] = {}
    for name, why in unreachable.items():
        by_why.setdefault(why, []).append(name)
    lines = []
    for why, names in by_why.items():
        more = f" and {len(names) - UNREACHABLE_NAMED} more" if len(names) > UNREACHABLE_NAMED else ""
        lines.append(f"could not open a socket for {len(names)}: {why}: {', '.join(names[:UNREACHABLE_NAMED])}{more}")
    return lines


RECENT_S = 60.0
"""How long `kvtop rooms` lists a room after it ended (`--recent`)."""


def rooms_json(
    model: ClusterModel, now: float, ended: bool = False, recent_s: float = RECENT_S
) -> list[dict[str, Any]]:
    """Rooms still open on some rank, then those that ended in the last `recent_s` (with `ended`, every room that
    ended the model keeps), oldest first: per-rank states, bytes, age, link, `outcome` (open, succeeded,
    failed) and whether they are `stuck`."""
    gone = model.gone(now)
    stuck = {room.room for room in model.stuck(now, STUCK_AFTER_S)}
    since = -math.inf if ended else now - recent_s
    shown: list[tuple[RoomView, bool | None]] = [(room, None) for room in model.open_rooms(now)]
    shown += [(f.view, f.ok) for f in model.finished.values() if f.view is not None and f.ts >= since]
    shown += [(room, room.succeeded(gone)) for room in model.rooms.values()
              if room.finished(gone) and room.last_progress >= since]  # fmt: skip
    return [
        {
            "room": room.room,
            "outcome": "open" if ok is None else "succeeded" if ok else "failed",
            "states": {label: state.name for label, state in sorted(room.states.items())},
            "bytes_total": room.bytes_total,
            "bytes_done": room.bytes_done,
            "age_s": round(now - room.first_seen, 3),
            "idle_s": round(now - room.last_progress, 3),
            "prefill": room.link[0],
            "decode": room.link[1],
            "stuck": room.room in stuck,
        }
        for room, ok in sorted(shown, key=lambda item: (item[1] is not None, item[0].first_seen))
    ]


ROOMS_SHOWN = 50
"""How many rooms `kvtop rooms` lists for people by default (`--limit`); `--json` lists every one."""


def _attention(room: dict[str, Any]) -> tuple[int, float]:
    """Where a room goes in the table: stuck, failed, open, succeeded; open rooms slowest first, ended newest first."""
    outcome = room["outcome"]
    tier = 0 if room["stuck"] else 1 if outcome == "failed" else 2 if outcome == "open" else 3
    return tier, -room["age_s"] if outcome == "open" else room["age_s"]


def rooms_text(listed: list[dict[str, Any]], limit: int = ROOMS_SHOWN) -> str:
    """`rooms_json`'s rooms as a table for people, those that want a look first (`_attention`), STUCK in a column of
    its own; past `limit` (0: no limit), a last line counts the rooms left out by outcome."""
    rooms = sorted(listed, key=_attention)
    shown = rooms[:limit] if limit else rooms
    links = [f"{r['prefill'] or '?'}->{r['decode'] or '?'}" if r["prefill"] or r["decode"] else "-" for r in shown]
    wide = max([22, *map(len, links)])  # a side named by its address (`10.0.0.5:8998->decode-0`) widens it
    head = f"{'ROOM':<20} {'OUTCOME':<9} {'STUCK':<5} {'AGE s':>7} {'IDLE s':>7} {'BYTES':>9}"
    lines = [f"{head}  {'LINK':<{wide}} STATES"]
    for r, link in zip(shown, links, strict=True):
        states = " ".join(f"{label}={state}" for label, state in r["states"].items())
        flag = "STUCK" if r["stuck"] else "-"
        lines.append(
            f"{r['room']:<20} {r['outcome']:<9} {flag:<5} {r['age_s']:>7.1f} {r['idle_s']:>7.1f} "
            f"{size(r['bytes_total']):>9}  {link:<{wide}} {states}"
        )
    if left := rooms[len(shown) :]:
        outcomes = Counter(r["outcome"] for r in left)
        counts = ", ".join(f"{outcomes[o]:,} {o}" for o in ("failed", "open", "succeeded") if outcomes[o])
        lines.append(f"... and {len(left):,} more rooms ({counts}): --limit 0 lists all {len(rooms):,}, --json too")
    return "\n".join(lines)


def status_json(model: ClusterModel, now: float, window_s: float) -> dict[str, Any]:
    """Cluster health in one object: ranks, rates, failures, client aborts (apart: never in the failure
    rate), stuck rooms, gaps, links, top origins. Logs alone (files, sidecars) time no transfer: rooms/s, GB/s and
    the latencies are null, and the failure and abort rates too (logs name no room that succeeded), as they are
    when no room finished in the window."""
    liveness = [str(state) for state in model.liveness(now).values()]
    coverage = model.coverage(now, window_s)
    rates = model.rates(now, window_s)
    outcomes = model.outcomes(now, window_s)
    groups = model.groups(now, coverage.span_s)
    origins = Counter(group.title for group in groups)
    aborted = sum(group.aborted for group in groups)
    from_logs_only = all(view.inferred for view in model.ranks.values())  # files, sidecars (or no rank: no rate)
    no_transfers = bool(liveness) and from_logs_only  # logs alone (files, sidecars): no transfer timed
    no_rate = from_logs_only or not outcomes.finished  # a rate of no room is none, never 0 % (as `check` says)
    gap = model.incidents.quiet_gap_s
    incidents = [  # those of the window, and those still under way from before it (quiet less than the gap)
        incident
        for incident in in_span(model, None, now)
        if not incident.client and (incident.last_seen >= now - window_s or incident.ongoing(now, gap))
    ]
    older = [i for i in in_span(model, None, now) if not i.client and i not in incidents]
    return {
        "incidents": [incident_json(incident, now, gap) for incident in incidents],
        "incidents_ongoing": sum(not incident.client and incident.ongoing(now, gap) for incident in incidents),
        "incidents_older": {
            "count": len(older),
            "last_seen": max((incident.last_seen for incident in older), default=None),
        },
        "window_s": window_s,
        "span_s": round(coverage.span_s, 3),
        "span_limit": coverage.limit,
        "ranks": {
            "total": len(liveness),
            **{str(state): liveness.count(state) for state in Liveness},
            "unreachable": sum(label in model.intake.unreachable for label in model.ranks),
            "unlisted": sum(bool(view.registration) for view in model.ranks.values()),
            "named_by_peers": sum(bool(view.named_by) for view in model.ranks.values()),
        },
        "rooms_open": len(model.open_rooms(now)),
        "rooms_finished": outcomes.finished,
        "rooms_failed": model.rooms_failed(now, window_s),
        "rooms_per_s": None if no_transfers else round(rates.rooms_per_s, 2),
        "per_s_over": None if no_transfers else round(rates.per_s_over, 3),
        "rooms_over_s": None if no_transfers else round(rates.rooms_over, 3),
        "gbps": None if no_transfers else round(rates.gbps, 4),
        "latency_s": {
            p: None if no_transfers else value
            for p, value in (("p50", rates.latency_p50), ("p90", rates.latency_p90), ("p99", rates.latency_p99))
        },
        "failure_rate": None if no_rate else round(outcomes.failure_rate, 4),
        "failures": len(groups) - aborted,
        "aborted": aborted,
        "abort_rate": None if no_rate else round(outcomes.abort_rate, 4),
        "stuck": len(model.stuck(now, STUCK_AFTER_S)),
        "gaps": model.gaps,
        "rejected_events": model.rejected,
        "rejected_frames": model.rejected_frames,
        "rooms_lost": model.lost,
        "snapshot_entries_cut": model.snapshot_cut,
        "peers_unlinked": model.peers_unlinked,
        "transport_notes_dropped": model.transport_notes_dropped,
        "clocks_skewed": {label: round(offset, 3) for label, offset in model.skewed_clocks().items()},
        "ranks_crashed": {label: _crash_json(model, label) for label in model.crashes},
        **intake_json(model, now),
        **upstream_json(model),
        "top_origins": [list(item) for item in origins.most_common(5)],
        "links": _links_json(model),
    }


def _links_json(model: ClusterModel) -> list[dict[str, Any]]:
    """Per prefill x decode link: transfers, bytes, and failed rooms (those not yet retired included)."""
    failed = model.failed_rooms_by_link()
    links = []
    for pair in sorted(model.links.keys() | failed.keys()):
        link = model.links.get(pair)
        transfers, nbytes = (link.transfers, link.nbytes) if link is not None else (0, 0)
        links.append({"prefill": pair[0], "decode": pair[1], "transfers": transfers, "bytes": nbytes,
                      "failed_rooms": failed.get(pair, 0)})  # fmt: skip
    return links


LINKS_SHOWN = 16
"""Links `status` lists, the most failed rooms first (logs naming an address per room can make 1024 of them)."""


def status_text(model: ClusterModel, now: float, window_s: float) -> str:
    s = status_json(model, now, window_s)
    ranks, lat = s["ranks"], s["latency_s"]
    from_logs = f", {ranks['log']} from logs" + _peer_named(ranks) if ranks["log"] else ""
    span = f"in {seconds(window_s)}" if not s["span_limit"] else f"in the last {s['span_s']:.0f}s ({s['span_limit']})"
    timed = s["gbps"] is not None
    if s["failure_rate"] is None:  # logs name a room only where it failed: the failed rooms, no rate
        why = "no rank" if not ranks["total"] else "no room finished" if timed else "logs name no room that succeeded"
        failed = f"{plural(s['rooms_failed'], 'room')} failed ({plural(s['failures'], 'failure')})"
        health = f"{failed} {span}, no failure rate ({why})"
    else:
        health = f"failure rate {s['failure_rate']:.1%} ({plural(s['failures'], 'failure')})"
    aborts = plural(s["aborted"], "client abort")
    if s["abort_rate"] is not None:
        aborts += f" ({s['abort_rate']:.1%})"
    lines = [_incidents_line(s, window_s, now)]
    live = ranks["total"] - ranks["log"]
    if ranks["unreachable"]:
        from_logs += f", {ranks['unreachable']} unreachable (kvtop could not open their sockets)"
    if ranks["unheard"]:
        behind = f"behind the relay at {model.intake.upstream_relay}, whose upstream stopped answering"
        from_logs = f", {ranks['unheard']} unheard ({behind})" + from_logs
    lines += [
        f"ranks   {ranks['alive']}/{live} alive, {ranks['stale']} stale, {ranks['gone']} gone"
        + _silent(ranks)
        + from_logs
        if live
        else f"ranks   {ranks['log']} from logs (logs tell no liveness)" + _peer_named(ranks),
        f"rooms   {s['rooms_open']} open, {s['rooms_finished']} finished {_finished_over(s, span)}, "
        f"{s['rooms_per_s']:.1f}/s, {gbps(s['gbps'])}{_heard_over(s)}"
        if timed
        else f"rooms   {s['rooms_open']} open (logs name a room where it failed; no transfers, no rate)",
        f"latency transfer p50 {lat['p50'] * 1000:.0f} ms, p90 {lat['p90'] * 1000:.0f} ms, "
        f"p99 {lat['p99'] * 1000:.0f} ms (a decode rank's, room taken to its KV in)"
        if timed
        else "latency - (logs time no transfer)",
        f"health  {health}, {aborts}, {s['stuck']} stuck, {s['gaps']} gaps" + _counted(s),
    ]
    if s["top_origins"]:
        origins = ", ".join(f"{name} x{count}" for name, count in s["top_origins"])
        lines.append(f"origins {origins} (in {s['span_s']:.0f}s)")
    links = sorted(s["links"], key=lambda link: (-link["failed_rooms"], -link["bytes"]))  # the failing first
    for link in links[:LINKS_SHOWN]:
        lines.append(
            f"link    {link['prefill']} -> {link['decode']}: {link['transfers']} transfers, "
            f"{size(link['bytes'])}, {link['failed_rooms']} failed"
        )
    if len(links) > LINKS_SHOWN:
        rest = links[LINKS_SHOWN:]
        lines.append(
            f"link    ... and {len(rest)} more ({sum(link['failed_rooms'] for link in rest)} failed rooms, "
            f"{size(sum(link['bytes'] for link in rest))}): --json lists every link"
        )
    lines += unlisted_lines(model)
    return "\n".join(lines + crash_lines(model) + clock_lines(model) + intake_lines(model, now) + upstream_lines(model))


def upstream_json(model: ClusterModel) -> dict[str, list[str]]:
    """What the relay a live source subscribes through said of its upstreams that stopped answering it: their errors
    (`upstream_errors`, each naming the upstream) and the ranks it lists from their last answer (`ranks_kept`)."""
    intake = model.intake
    return {"upstream_errors": list(intake.upstream_errors), "ranks_kept": sorted(intake.unheard_behind())}


def upstream_lines(model: ClusterModel) -> list[str]:
    """`source  upstream stopped answering the relay at ADDR: ...; ranks behind it unheard: ...`, while one does."""
    down = model.intake.upstream_down()
    if not down:
        return []
    kept = sorted(model.intake.unheard_behind())
    return [f"source  {down}" + (f"; ranks behind it unheard: {', '.join(kept)}" if kept else "")]


def _silent(ranks: dict[str, int]) -> str:
    """`, 2 idle (their log silent: the server idle, or dead), 1 down (log and metrics silent)`, or ""."""
    said = f", {ranks['idle']} idle (their log silent: the server idle, or dead)" if ranks["idle"] else ""
    return said + (f", {ranks['down']} down (log and metrics silent)" if ranks["down"] else "")


def _peer_named(ranks: dict[str, int]) -> str:
    """`, 1 known only from peers' lines (no log of its own read)`, or ""."""
    count = ranks["named_by_peers"]
    return f", {count} known only from peers' lines (no log of its own read)" if count else ""


def _finished_over(s: dict[str, Any], span: str) -> str:
    """`in 60s` (the window, or `span` as covered), or `in the 25s heard` when the first room heard to finish came
    later: the seconds the count covers, which rooms/s beside it divides by (one window for both)."""
    over = s["rooms_over_s"]
    return span if over is None or over >= s["span_s"] - 0.5 else f"in the {seconds(over)} heard"


def _heard_over(s: dict[str, Any]) -> str:
    """` (transfers per second over the 13s heard)` when GB/s divides by other seconds than the rooms beside it."""
    over, rooms_over = s["per_s_over"], s["rooms_over_s"]
    if over is None or abs(over - min(rooms_over, s["span_s"])) < 0.5:
        return ""
    return f" (transfers per second over the {seconds(over)} heard)"


def _incidents_line(s: dict[str, Any], window_s: float, now: float) -> str:
    """`incidents 1 ongoing in 60s: prefill-0/TP1 sends corrupt KV (checksum), 31 rooms since 10:02:11; ...`, and
    those that ended before the window named as older (a sidecar's log of March: none in the window, never none)."""
    incidents, older = s["incidents"], s["incidents_older"]
    before = (
        f"; {older['count']} older, the latest ended {stamp(older['last_seen'], dated=True)[:-4]} "
        f"({ago(now - older['last_seen'])} ago): kvtop incidents lists them"
        if older["count"]
        else ""
    )
    if not incidents:
        return f"incidents none in {seconds(window_s)}{before}"
    named = "; ".join(
        f"{item['headline']}, {incident_size(item['room_count'], item['roomless'])} "
        f"since {stamp(item['first_seen'])[:-4]}" + ("" if item["state"] == "ongoing" else " (ended)")
        for item in incidents[:INCIDENTS_SHOWN]
    )
    more = f"; {len(incidents) - INCIDENTS_SHOWN} more (kvtop incidents)" if len(incidents) > INCIDENTS_SHOWN else ""
    return f"incidents {len(incidents)} in {seconds(window_s)}, {s['incidents_ongoing']} ongoing: {named}{more}{before}"


def _counted(s: dict[str, Any]) -> str:
    """What was skipped or retired unseen, named only when it happened."""
    named = [(s["rejected_events"], "events rejected"), (s["rejected_frames"], "frames rejected"),
             (s["rooms_lost"], "rooms lost"), (s["snapshot_entries_cut"], "snapshot entries cut to fit"),
             (s["peers_unlinked"], "peer addresses left unlinked (links kept full)"),
             (s["transport_notes_dropped"],
              "transport faults and given-up sessions no longer kept (64 an instance)")]  # fmt: skip
    return "".join(f", {count} {what}" for count, what in named if count)
