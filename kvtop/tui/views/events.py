"""The live event tail: every agent's events as log lines, debug (echoes, room traffic) hidden by default (`l`); the
date is left out while every line and the frame's now fall on one day, and under 100 columns a line's level is one
letter and its kind column leaves (the text says the kind)."""

from __future__ import annotations

from collections.abc import Hashable

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical

from kvtop.tui.frame import Frame
from kvtop.tui.pages import row
from kvtop.tui.rows import Palette, event_line
from kvtop.tui.widgets.line import Line
from kvtop.tui.widgets.row_list import RowList
from kvtop.views.event_lines import to_line
from kvtop.views.times import spans_days

NARROW_BELOW = 100
"""Columns under which a line's level is one letter and its kind column leaves: at 80 the columns left a failure 8
cells of its text (`room=... timeo…`), its class cut."""


class EventsView(Vertical):
    """Follows the newest event while the cursor is on the last line; move up to stop following."""

    def compose(self) -> ComposeResult:
        yield Line(id="events-title", classes="title")
        yield RowList(id="events-list")

    def show(self, frame: Frame, palette: Palette) -> None:
        options, events = frame.options, frame.events
        where = f" matching '{options.filter}'" if options.filter else ""
        debug = options.level == "debug"
        hidden = "" if debug else ", echoes hidden"
        if not frame.journaling:
            hidden += ", but this source keeps no event journal"
        self.query_one("#events-title", Line).show(
            f"{len(events):,} events at {options.level} and above{where}{hidden}"
            f"  (l: level{'' if debug else ', debug shows echoes'})"
        )
        tail = self.query_one("#events-list", RowList)
        following = tail.count == 0 or tail.cursor >= tail.count - 1
        ends = (row(events, 0), row(events, len(events) - 1)) if events else ()
        dated = spans_days([frame.now, *(shown[1].ts for shown in ends if shown is not None)])  # else 11 columns more
        narrow = 0 < tail.size.width < NARROW_BELOW

        def line(index: int) -> Text | None:
            shown = row(events, index)
            return None if shown is None else event_line(*shown, palette, dated, narrow)

        def key(index: int) -> Hashable:
            """What the row shows (its text and level, in the palette): a frame whose visible rows show what
            they showed repaints nothing (events come as copies from the model process: no identity to keep)."""
            shown = row(events, index)
            return None if shown is None else (to_line(*shown, dated=dated, narrow=narrow), shown[2], palette)

        tail.set_rows(len(events), line, key)
        if following:
            tail.action_jump(-1)
