"""One line of text per rank, room or event, in the theme's colours (Rich only, testable as strings)."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rich.control import strip_control_codes
from rich.style import Style
from rich.text import Span, Text

from kvtop.model.shapes import Liveness, RoomView
from kvtop.tui.frame import TREND_CELLS, Frame, RankRow
from kvtop.tui.renderables.chart import spark
from kvtop.views import units
from kvtop.views.event_lines import to_line
from kvtop.views.text import fit_label
from kvtop.views.times import stamp
from transport.kvpoll import KVPoll
from transport.plane.events import Event

if TYPE_CHECKING:
    from textual.theme import Theme  # the model process draws details with a Palette, and imports no Textual

RANK_COLUMNS = {"RANK": 18, "ROLE": 8, "SOURCE": 8, "STATE": 8, "RATE": 11, "RATE 5m": 2 + TREND_CELLS, "IN FLIGHT": 11,
                "ORIGINS": 9, "ECHOES": 8, "FAILED 5m": 2 + TREND_CELLS, "CPU %": 7, "REJECTED": 10}  # fmt: skip
"""The rank grid's columns and their widths, in order (the trends: two spaces, then a cell per share)."""
TRENDS = ("RATE 5m", "FAILED 5m")
"""Columns of sparklines: the rank's throughput and failures over the timeline's window."""
RANK_DROP_ORDER = ("REJECTED", "CPU %", "ECHOES", "SOURCE", "ROLE", "IN FLIGHT")
"""Where the grid is narrower than its columns, these leave first (a whole column, never a number cut)."""


def rank_columns(width: int, sources: bool = True) -> frozenset[str]:
    """The rank grid's columns that fit `width` cells (0: all), leaving by `RANK_DROP_ORDER`; SOURCE only with
    `sources` (some rank is not a kvtop agent: an SGLang rank, or a log's)."""
    shown = {name: cells for name, cells in RANK_COLUMNS.items() if sources or name != "SOURCE"}
    for name in RANK_DROP_ORDER:
        if not width or sum(shown.values()) <= width:
            break
        shown.pop(name, None)
    return frozenset(shown)


def rank_header(columns: frozenset[str]) -> str:
    """`RANK_HEADER` with only `columns`."""
    return "".join(
        (
            f"{name:<{width}}"
            if name in ("RANK", "ROLE", "SOURCE", "STATE")
            else f"  {name:<{width - 2}}"
            if name in TRENDS
            else f"{name:>{width}}"
        )
        for name, width in RANK_COLUMNS.items()
        if name in columns
    )


RANK_HEADER = rank_header(frozenset(RANK_COLUMNS))


ROOM_HEADER = f"{'ROOM':<21}{'AGE s':>7}{'IDLE s':>8}{'PROGRESS':>10}{'BYTES':>11}  {'FLAG':<8}LINK, EACH RANK'S STATE"
"""FLAG before LINK: a row of 80 columns shows whether the room failed or is stuck. The link names each instance
once, its ranks' states beside it, ranks in a row alike said once (`prefill-0 TP0,TP1=OK -> decode-0 TP0=FAIL
TP1=XFER`): a link column and a state per `instance/rank` label said every instance twice, and at 120 columns cut
the second instance's ranks."""
_STATE_SHORT = {
    KVPoll.Failed: "FAIL",
    KVPoll.Bootstrapping: "BOOT",
    KVPoll.WaitingForInput: "WAIT",
    KVPoll.Transferring: "XFER",
    KVPoll.Success: "OK",
}


@dataclass(frozen=True)
class Palette:
    """Rich styles from the current theme (the `.tcss` cannot reach inside a rendered line)."""

    error: Style
    warning: Style
    success: Style
    accent: Style
    dim: Style

    @classmethod
    def from_theme(cls, theme: Theme) -> Palette:
        def colour(value: str | None, fallback: str) -> Style:
            return Style(color=value or fallback)

        return cls(
            error=colour(theme.error, "red") + Style(bold=True),
            warning=colour(theme.warning, "yellow"),
            success=colour(theme.success, "green"),
            accent=colour(theme.accent, "cyan"),
            dim=Style(dim=True),
        )


class Pieces:
    """A line built from styled pieces in one go: `Text.append` costs ~3 µs a piece (it strips control codes
    from each), and a room's row has ~25 pieces, 45 rows a frame."""

    __slots__ = ("_length", "_parts", "_spans")

    def __init__(self, first: str = "") -> None:
        self._parts = [first]
        self._spans: list[Span] = []
        self._length = len(first)

    def add(self, piece: str, style: Style | None = None) -> None:
        if not piece:  # no cells; and no two pieces start at one place (the control-code path maps spans by start)
            return
        end = self._length + len(piece)
        if style:
            self._spans.append(Span(self._length, end, style))
        self._parts.append(piece)
        self._length = end

    def text(self) -> Text:
        plain = "".join(self._parts)
        if strip_control_codes(plain) == plain:
            return Text(plain, spans=self._spans)
        text = Text()  # a piece with control codes (a label an agent sent): stripped piece by piece, as Rich does
        spans = {span.start: span.style for span in self._spans}
        start = 0
        for part in self._parts:
            text.append(part, spans.get(start))
            start += len(part)
        return text


@dataclass(frozen=True)
class TrendPeaks:
    """The largest share of every rank's trends: each rank's line is drawn to the same scale."""

    gbps: float = 0.0
    failed: int = 0

    @classmethod
    def of(cls, rows: list[RankRow]) -> TrendPeaks:
        return cls(
            max((value for row in rows for value in row.trend.gbps), default=0.0),
            max((o + e for row in rows for o, e in zip(row.trend.origins, row.trend.echoes, strict=True)), default=0),
        )


_HEARD = frozenset((Liveness.ALIVE, Liveness.STALE, Liveness.IDLE))
"""States in which a rank's heartbeat saying it is unlisted is news (gone, down or unheard outrank it)."""


def rank_line(
    row: RankRow,
    palette: Palette,
    columns: frozenset[str] = frozenset(RANK_COLUMNS),
    peaks: TrendPeaks = TrendPeaks(),
) -> Text:
    """One rank's row, with only `columns` (those of its header); its trends to the scale of `peaks`."""
    state_style = {
        Liveness.ALIVE: palette.success,
        Liveness.STALE: palette.warning,
        Liveness.GONE: palette.error,
        Liveness.LOG: palette.accent,
        Liveness.IDLE: palette.warning,
        Liveness.DOWN: palette.error,
        Liveness.UNHEARD: palette.warning,
    }
    logged = row.liveness is Liveness.LOG  # a log file tells no CPU: `-`, never a made-up 0
    untimed = row.source == "log"  # a log (a file, a sidecar's) times no transfer: no rate, never a made-up 0
    unknown = row.named_by_peers  # known from its peers' lines alone: its own counts too
    state = "crashed" if row.crashed else str(row.liveness)  # its log's own word outranks what kvtop infers
    suspect = row.suspected and not row.crashed and row.liveness in (Liveness.ALIVE, Liveness.LOG, Liveness.IDLE)
    unlisted = bool(row.unlisted) and not row.crashed and row.liveness in _HEARD
    if unlisted:  # running, yet the bootstrap service lists it nowhere (no peer finds it: why it may be suspected)
        state = "unlisted"
    elif suspect:  # what broke, at a glance: its ORIGINS may be 0, the ranks that noticed hold them
        state = "suspect"
    cells: tuple[tuple[str, str, Style | None], ...] = (
        ("ROLE", f"{row.role:<8}", None),
        ("SOURCE", f"{row.source:<8}", palette.dim if row.source == "agent" else palette.accent),
        ("STATE", f"{state:<8}", palette.error if row.crashed or suspect or unlisted else state_style[row.liveness]),
        ("RATE", f"{'-' if untimed else units.gbps(row.gbps):>11}", None),
        ("IN FLIGHT", f"{'-' if unknown else row.inflight:>11}", None),
        ("ORIGINS", f"{'-' if unknown else row.origins:>9}", palette.error if row.origins else None),
        ("ECHOES", f"{'-' if unknown else row.echoes:>8}", palette.dim),
        ("CPU %", f"{'-':>7}" if logged else f"{row.cpu_percent:>7.0f}", None),
        ("REJECTED", f"{row.rejected:>10}", palette.warning if row.rejected else palette.dim),
    )
    line = Pieces(f"{fit_label(row.label, RANK_COLUMNS['RANK'] - 1):<18}")
    for name, cell, style in cells:
        if name in columns:
            line.add(cell, style)
        if name == "RATE" and "RATE 5m" in columns:
            line.add("  ")
            line.add("-" * TREND_CELLS if untimed else spark(row.trend.gbps, peaks.gbps), palette.accent)
        if name == "ECHOES" and "FAILED 5m" in columns:
            line.add("  ")
            if unknown:
                line.add("-" * TREND_CELLS)
            else:
                _failed_trend(line, row, peaks.failed, palette)
    return line.text()


def _failed_trend(line: Pieces, row: RankRow, peak: int, palette: Palette) -> None:
    """A cell per share: its failures' height, red where the rank recorded an origin, dim where only echoes."""
    trend = row.trend
    if not trend.origins:
        line.add(" " * TREND_CELLS)
        return
    totals = [o + e for o, e in zip(trend.origins, trend.echoes, strict=True)]
    cells = spark(totals, peak)
    styles = [
        palette.error if o else palette.warning if total else palette.dim
        for o, total in zip(trend.origins, totals, strict=True)
    ]
    start = 0
    for end in range(1, TREND_CELLS + 1):  # a piece per run of one style
        if end == TREND_CELLS or styles[end] is not styles[start]:
            line.add(cells[start:end], styles[start])
            start = end


def room_line(view: RoomView, frame: Frame, palette: Palette) -> Text:
    now = frame.now
    progress = f"{view.bytes_done / view.bytes_total:.0%}" if view.bytes_total else "-"
    line = Pieces(
        f"{view.room:<21}{now - view.first_seen:>7.1f}{now - view.last_progress:>8.1f}{progress:>10}"
        f"{units.size(view.bytes_total):>11}  "
    )
    if frame.stuck(view):
        line.add(f"{'STUCK':<8}", palette.warning + Style(bold=True))
    elif frame.outcome(view) is False:
        line.add(f"{'FAILED':<8}", palette.error)
    else:
        line.add(" " * 8)
    ranks: dict[str, list[tuple[str, KVPoll]]] = {}
    for label, state in sorted(view.states.items()):
        instance, _, rank = label.rpartition("/")
        ranks.setdefault(instance or label, []).append((rank if instance else "", state))
    prefill, decode = view.link
    sides = [prefill or "?", decode or "?"] if any(view.link) else []
    for n, instance in enumerate([*sides, *sorted(ranks.keys() - set(sides))]):
        line.add(" -> " if n == 1 and sides else "  " if n else "")
        line.add(instance)
        for state, run in itertools.groupby(ranks.get(instance, ()), key=lambda rank_state: rank_state[1]):
            names = ",".join(rank for rank, _ in run)  # ranks in a row alike said once: `TP0,TP1=OK`
            line.add(f" {names}=" if names else "=", palette.dim)
            line.add(
                _STATE_SHORT[state],
                palette.error if state is KVPoll.Failed else palette.success if state is KVPoll.Success else None,
            )
    return line.text()


def event_line(
    label: str, event: Event, level: str, palette: Palette, dated: bool = True, narrow: bool = False
) -> Text:
    """One event of the tail, styled by the level it shows at (not `dated`: its time of day alone; `narrow`: the
    level one letter, no kind column)."""
    style = {"error": palette.error, "warning": palette.warning, "debug": palette.dim}.get(level, "")
    return Text(to_line(label, event, level, dated, narrow), style=style)


def clock(ts: float, dated: bool = False) -> str:
    """`HH:MM:SS.mmm` (with the date before it when `dated`)."""
    return stamp(ts, dated)
