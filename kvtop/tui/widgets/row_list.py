"""A virtual list on Textual's line API: draws only the visible rows, each rendered once per refresh."""

from __future__ import annotations

from collections.abc import Callable, Hashable

from rich.segment import Segment
from rich.style import Style
from rich.text import Text
from textual.binding import Binding
from textual.events import Click
from textual.geometry import Region, Size
from textual.message import Message
from textual.reactive import reactive
from textual.scroll_view import ScrollView
from textual.scrollbar import ScrollBar, ScrollBarRender
from textual.strip import Strip

from kvtop.tui.strips import line_strip

RowRenderer = Callable[[int], Text | None]
"""Renders row `index` (0 <= index < count) as one line of text; None: the row is not at hand yet (a frame
from the model process carries a window of the rows: `kvtop.tui.pages`)."""
RowKey = Callable[[int], Hashable]
"""Row `index`'s identity: a row whose key is unchanged keeps the line drawn for it, across new data."""
PENDING = Text("…", style="dim")


WORD_CUT_BACK = 12
"""How far back a cut goes to fall between words rather than in one (a time, a count)."""


def cut(text: Text, width: int) -> Text:
    """`text`, or where it is wider than `width` cells its start with `…` in the last cell: a row cut at the edge
    told no cut (a reason's `10.0.0.5:8998` read `10.0.0.5:899`, a room id lost its last digits, `since 0`). A cut
    that would split a word, a time or a count (`since 07:18:…`, `216…` of `216 rooms`) falls before it where
    that is near, the `…` after the last whole column (two spaces), else the last whole word."""
    if not width or text.cell_len <= width:
        return text
    shown = text.copy()
    plain = text.plain
    if len(plain) == text.cell_len and width > 1 and plain[width - 1] != " " and plain[width - 2] != " ":
        start = max(0, width - 1 - WORD_CUT_BACK)
        gap = plain.rfind("  ", start, width - 1)  # between columns first: not `8 …` of `8 origins`
        space = gap + 1 if gap > 0 else plain.rfind(" ", start, width - 1)
        if space > 0:
            shown.truncate(space + 1)
            shown.append("…")
            return shown
    shown.truncate(width, overflow="ellipsis")
    return shown


class Same:
    """A key part that matches only the very object it holds (held: its id cannot be reused meanwhile), for
    rows drawn from objects that are replaced, never edited, when they change (the fold's failure groups)."""

    __slots__ = ("item",)

    def __init__(self, item: object) -> None:
        self.item = item

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Same) and other.item is self.item

    def __hash__(self) -> int:
        return id(self.item)


class RowMessage(Message):
    """Something happened to row `index` of `row_list`."""

    def __init__(self, row_list: RowList, index: int) -> None:
        super().__init__()
        self.row_list = row_list
        self.index = index

    @property
    def control(self) -> RowList:
        return self.row_list


class RowList(ScrollView, can_focus=True):
    """Millions of rows cost what the visible ones cost: the owner gives a count and a row renderer.

    | Key | Action |
    | :- | :- |
    | up / down | Move the cursor. |
    | pageup / pagedown | Move a page. |
    | home / end | First / last row. |
    | enter | Select the cursor row (posts `RowList.Selected`). |
    """

    BINDINGS = [
        Binding("up", "cursor(-1)", "Up", show=False),
        Binding("down", "cursor(1)", "Down", show=False),
        Binding("pageup", "page(-1)", "Page up", show=False),
        Binding("pagedown", "page(1)", "Page down", show=False),
        Binding("home", "jump(0)", "First", show=False),
        Binding("end", "jump(-1)", "Last", show=False),
        Binding("enter", "select", "Detail", show=False),
    ]
    COMPONENT_CLASSES = {"row-list--cursor"}
    DEFAULT_CSS = """
    RowList { height: 1fr; }
    RowList > .row-list--cursor { background: $primary 30%; }
    RowList:focus > .row-list--cursor { background: $primary 55%; }
    """

    cursor: reactive[int] = reactive(0)
    """The highlighted row."""

    class Highlighted(RowMessage):
        """The cursor moved (or the rows under it changed)."""

    class Selected(RowMessage):
        """Enter (or a click on the highlighted row) on a row."""

    class Missing(RowMessage):
        """A visible row was not at hand (drawn as a placeholder): the owner should fetch rows around it."""

    def __init__(self, *, name: str | None = None, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(name=name, id=id, classes=classes)
        self._count = 0
        self._render_row: RowRenderer = lambda index: Text()
        self._width = 0
        self._top = self._left = 0
        self._style = self._cursor_style = Style()
        self._row_key: RowKey | None = None
        self._cache: dict[int, Strip] = {}
        """Rendered rows of the current data: scrolling does not render a row twice."""
        self._keyed: dict[Hashable, Strip] = {}
        self._keyed_before: dict[Hashable, Strip] = {}
        """With a row key: the lines drawn for the current data, and for the data before (kept until the next)."""
        self._shown_keys: list[Hashable] = []
        self._missing = False
        """A `Missing` was posted for the current data (once is enough: the next data moves the window)."""

    @property
    def count(self) -> int:
        return self._count

    def set_rows(self, count: int, render_row: RowRenderer, key: RowKey | None = None) -> None:
        """New data: `count` rows drawn by `render_row`. Only the visible rows are rendered; a row longer
        than the list is cut, `…` in its last cell (no sideways scrolling, so the list follows its own width when it
        narrows).
        With `key`, a row whose key was drawn before keeps its line, and the list is not repainted at all
        while its visible rows' keys stay the same (rows that come or go out of sight move the scrollbar only)."""
        unchanged = key is not None and bool(self._shown_keys) and self._visible_keys(key, count) == self._shown_keys
        self._count, self._render_row, self._row_key = count, render_row, key
        self._cache.clear()
        if self._keyed:  # else nothing was drawn for the data before: the lines before it still stand
            self._keyed_before, self._keyed = self._keyed, {}
        self._missing = False
        self._resize(Size(0, count))
        if self.cursor >= count:
            self.cursor = max(0, count - 1)
        if not unchanged:
            self.refresh()

    def _visible_keys(self, key: RowKey, count: int) -> list[Hashable]:
        top = self.scroll_offset.y
        return [key(index) for index in range(top, min(count, top + self.scrollable_content_region.height))]

    def _resize(self, size: Size) -> None:
        """A new row count. `virtual_size` asks for a layout pass of the whole screen (30-50 ms at 160x50)
        when it changes, which a growing list does every frame; while the scrollbar neither appears nor goes,
        nothing else moves: the scrollbar is updated in place instead, and repainted only when its thumb
        moves."""
        if size == self.virtual_size:
            return
        height = self.scrollable_content_region.height
        if self.is_mounted and height and (self.virtual_size.height > height) == (size.height > height):
            moved = self.show_vertical_scrollbar and self._thumb(self.virtual_size.height) != self._thumb(size.height)
            self.set_reactive(RowList.virtual_size, size)
            if moved:
                self._scroll_update(size)
                return
            if self.show_vertical_scrollbar:  # the thumb stays where it is drawn: no repaint
                self.vertical_scrollbar.set_reactive(ScrollBar.window_virtual_size, size.height)
            self.scroll_y = self.validate_scroll_y(self.scroll_y)
        else:
            self.virtual_size = size
            self.call_after_refresh(self._show_cursor)

    def _show_cursor(self) -> None:
        """Scroll to the cursor once a new row count is laid out: a scrollbar that appears with the rows shows
        only then, and until it does the list cannot scroll (a cursor moved to a row below meanwhile, the
        newest of a tail that then stops growing, would stay out of sight, its rows never fetched)."""
        self.scroll_to_region_of(self.cursor)

    def _thumb(self, rows: int) -> list[Segment]:
        """The scrollbar as Textual's own renderer draws it over `rows` rows (repainting a scrollbar costs ~2 ms
        a frame, and 100k rooms growing by a few each frame do not move its thumb by a cell)."""
        bar = self.vertical_scrollbar
        window = bar.window_size if bar.window_size < rows else 0
        return ScrollBarRender.render_bar(bar.size.height, rows, window, bar.position).segments

    def render_lines(self, crop: Region) -> list[Strip]:
        """Read once per paint what every line needs (none of it is free: `rich_style` walks every ancestor)."""
        if self.scrollable_content_region.width != self._width:  # lines are cut at the width
            self._width = self.scrollable_content_region.width
            self._cache.clear()
            self._keyed.clear()
            self._keyed_before.clear()
        self._left, self._top = self.scroll_offset
        self._style = self.rich_style
        self._cursor_style = self.get_component_rich_style("row-list--cursor")
        if self._row_key is not None:
            self._shown_keys = self._visible_keys(self._row_key, self._count)
        return super().render_lines(crop)

    def render_line(self, y: int) -> Strip:
        index = self._top + y
        width = self._width
        if index >= self._count:
            return Strip.blank(width, self._style)
        strip = self._cache.get(index)
        if strip is None:
            strip = self._draw(index)
        line = strip.crop_extend(self._left, self._left + width, self._style)
        return line.apply_style(self._cursor_style) if index == self.cursor else line

    def _draw(self, index: int) -> Strip:
        """Row `index`'s line: the one drawn before for its key (with a row key), else rendered now."""
        key = self._row_key(index) if self._row_key is not None else None
        strip = None
        if key is not None:
            strip = self._keyed.get(key)
            if strip is None:
                strip = self._keyed_before.get(key)
        if strip is None:
            text = self._render_row(index)
            if text is None:  # not at hand: drawn as a placeholder, not kept (the next data has it)
                if not self._missing:
                    self._missing = True
                    self.post_message(self.Missing(self, index))
                return line_strip(PENDING, self.app.console)
            strip = line_strip(cut(text, self._width), self.app.console, self._left + self._width)
        self._cache[index] = strip
        if key is not None:
            self._keyed[key] = strip
        return strip

    def watch_cursor(self, old: int, new: int) -> None:
        self.refresh_lines(old - self.scroll_offset.y)
        self.refresh_lines(new - self.scroll_offset.y)
        self.scroll_to_region_of(new)
        self.post_message(self.Highlighted(self, new))

    def scroll_to_region_of(self, index: int) -> None:
        top, height = self.scroll_offset.y, self.scrollable_content_region.height
        if index < top:
            self.scroll_to(y=index, animate=False)
        elif height and index >= top + height:
            self.scroll_to(y=index - height + 1, animate=False)

    def action_cursor(self, delta: int) -> None:
        self.cursor = min(max(0, self.cursor + delta), max(0, self._count - 1))

    def action_page(self, direction: int) -> None:
        self.action_cursor(direction * max(1, self.scrollable_content_region.height - 1))

    def action_jump(self, index: int) -> None:
        self.cursor = max(0, self._count - 1) if index < 0 else 0

    def action_select(self) -> None:
        if self._count:
            self.post_message(self.Selected(self, self.cursor))

    def on_click(self, event: Click) -> None:
        index = self.scroll_offset.y + event.y
        if index >= self._count:
            return
        if index == self.cursor:
            self.action_select()
        self.cursor = index
