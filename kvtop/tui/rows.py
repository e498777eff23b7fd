"""One line of text per rank, room or event, in the theme's colours (Rich only, testable as strings)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from rich.style import Style
from rich.text import Text

from kvtop.model.cluster import Liveness, RoomView
from kvtop.tui.frame import Frame, RankRow
from kvtop.views.event_lines import to_line
from kvtop.views.times import stamp
from transport.events import Event
from transport.kvpoll import KVPoll

if TYPE_CHECKING:
    from textual.theme import Theme  # the model process draws details with a Palette, and imports no Textual

RANK_HEADER = (
    f"{'RANK':<18}{'ROLE':<9}{'STATE':<7}{'RATE':>11}{'IN FLIGHT':>11}{'ORIGINS':>9}{'ECHOES':>8}{'CPU %':>7}"
    f"{'REJECTED':>10}"
)
ROOM_HEADER = (
    f"{'ROOM':<21}{'AGE s':>7}{'IDLE s':>8}{'PROGRESS':>10}{'BYTES':>11}  {'LINK':<22}{'FLAG':<8}STATE PER RANK"
)
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


def rank_line(row: RankRow, palette: Palette) -> Text:
    state_style = {
        Liveness.ALIVE: palette.success,
        Liveness.STALE: palette.warning,
        Liveness.GONE: palette.error,
        Liveness.LOG: palette.accent,
        Liveness.IDLE: palette.warning,
        Liveness.DOWN: palette.error,
    }
    text = Text(f"{row.label:<18}{row.role:<9}")
    text.append(f"{row.liveness:<7}", style=state_style[row.liveness])
    text.append(f"{rate(row.gbps):>11}{row.inflight:>11}")
    text.append(f"{row.origins:>9}", style=palette.error if row.origins else "")
    text.append(f"{row.echoes:>8}", style=palette.dim)
    text.append(f"{row.cpu_percent:>7.0f}")
    text.append(f"{row.rejected:>10}", style=palette.warning if row.rejected else palette.dim)
    return text


def room_line(view: RoomView, frame: Frame, palette: Palette) -> Text:
    now = frame.now
    progress = f"{view.bytes_done / view.bytes_total:.0%}" if view.bytes_total else "-"
    link = f"{view.link[0] or '?'}->{view.link[1] or '?'}" if any(view.link) else "-"
    text = Text(
        f"{view.room:<21}{now - view.first_seen:>7.1f}{now - view.last_progress:>8.1f}{progress:>10}"
        f"{_size(view.bytes_total):>11}  {link:<22}"
    )
    if frame.stuck(view):
        text.append(f"{'STUCK':<8}", style=palette.warning + Style(bold=True))
    elif frame.outcome(view) is False:
        text.append(f"{'FAILED':<8}", style=palette.error)
    else:
        text.append(" " * 8)
    for label, state in sorted(view.states.items()):
        style = palette.error if state is KVPoll.Failed else palette.success if state is KVPoll.Success else ""
        text.append(f"{label}=", style=palette.dim)
        text.append(_STATE_SHORT[state], style=style)
        text.append(" ")
    return text


def event_line(label: str, event: Event, level: str, palette: Palette) -> Text:
    """One event of the tail, styled by the level it shows at."""
    style = {"error": palette.error, "warning": palette.warning, "debug": palette.dim}.get(level, "")
    return Text(to_line(label, event, level), style=style)


def rate(gbps: float) -> str:
    """A transfer rate in the unit that keeps three digits: `1.23 GB/s`, `45.6 MB/s`, `512 KB/s`."""
    if round(gbps * 1000, 1) >= 1000:
        return f"{gbps:.2f} GB/s"
    if round(gbps * 1e6) >= 1000:
        return f"{gbps * 1000:.1f} MB/s"
    return f"{gbps * 1e6:.0f} KB/s"


def clock(ts: float, dated: bool = False) -> str:
    """`HH:MM:SS.mmm` (with the date before it when `dated`)."""
    return stamp(ts, dated)


def _size(nbytes: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale:
            return f"{nbytes / scale:.1f} {unit}"
    return f"{nbytes} B"
