"""Every live and recent room, one line each, virtualised (100k rooms scroll like 10)."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import Static

from kvtop.model.shapes import RoomView
from kvtop.tui.frame import Frame
from kvtop.tui.pages import row
from kvtop.tui.rows import ROOM_HEADER, Palette, room_line
from kvtop.tui.widgets.line import Line
from kvtop.tui.widgets.row_list import RowList


class RoomsView(Vertical):
    """Rooms newest first (or as `s` sorts them); enter opens a room's timeline across its ranks."""

    def __init__(self, *, name: str | None = None, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(name=name, id=id, classes=classes)
        self.frame: Frame | None = None

    def compose(self) -> ComposeResult:
        yield Line(id="rooms-title", classes="title")
        yield Static(ROOM_HEADER, classes="header")
        yield RowList(id="rooms-list")

    def show(self, frame: Frame, palette: Palette) -> None:
        self.frame = frame
        options, rooms = frame.options, frame.rooms
        shown = "failed or stuck room" if options.faults_only else "room"
        where = f" matching '{options.filter}'" if options.filter else ""
        self.query_one("#rooms-title", Line).show(
            f"{len(rooms):,} {shown}{'' if len(rooms) == 1 else 's'}{where}, by {options.sort}"
            "  (enter: timeline, s: sort, x: faults only, /: filter)"  # enter first: the footer names the rest
        )

        def line(index: int) -> Text | None:
            room = row(rooms, index)
            return None if room is None else room_line(room, frame, palette)

        self.query_one("#rooms-list", RowList).set_rows(len(rooms), line)

    def selected_room(self, index: int) -> int | None:
        room: RoomView | None = row(self.frame.rooms, index) if self.frame and index < len(self.frame.rooms) else None
        return None if room is None else room.room
