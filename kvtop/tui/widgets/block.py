"""A few lines of Rich text drawn by the line API, cut at the widget's width."""

from __future__ import annotations

from rich.style import Style
from rich.text import Text
from textual.geometry import Region, Size
from textual.strip import Strip
from textual.widget import Widget

from kvtop.tui.strips import line_strip


class Block(Widget):
    """Side panels that change every frame (the link heat map, the top origins). A `Static` turns its text
    into Textual's content and measures it on every paint (~5 ms for the link map at 8 x 8); here each line
    is cut into a strip once per change. A line wider than the block is cut at its right edge. Its height is
    its line count (a new count asks for a layout pass, 15-50 ms of a frame), or `lines` when given (then no
    change asks for one)."""

    DEFAULT_CSS = "Block { height: auto; width: 1fr; }"

    def __init__(self, *, lines: int | None = None, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes)
        self._height = lines
        self._lines: list[Text] = []
        self._strips: dict[int, Strip] = {}
        self._width = 0
        self._style = Style()

    @property
    def plain(self) -> str:
        """What the block shows, as plain text."""
        return "\n".join(line.plain for line in self._lines)

    def set_lines(self, lines: int) -> None:
        """A new fixed height (a layout pass: call it when the layout changes, not per frame)."""
        if lines != self._height:
            self._height = lines
            self.refresh(layout=True)

    def show(self, lines: list[Text]) -> None:
        """Show `lines` (each one line: no newline in them)."""
        old = self._lines
        changed = [
            y
            for y, line in enumerate(lines)
            if y >= len(old) or (line.plain, line.spans) != (old[y].plain, old[y].spans)
        ]
        if not changed and len(lines) == len(old):
            return
        self._lines = lines
        if len(lines) != len(old):
            self._strips = {}
            self.refresh(layout=self._height is None)
            return
        width = self.size.width
        for y in changed:  # only the lines that changed are painted again (a chart moves a column at a time)
            self._strips.pop(y, None)
            self.refresh(Region(0, y, width, 1))

    def get_content_height(self, container: Size, viewport: Size, width: int) -> int:
        return len(self._lines) if self._height is None else self._height

    def render_lines(self, crop: Region) -> list[Strip]:
        """Read once per paint what every line needs (`rich_style` walks every ancestor)."""
        if self.size.width != self._width:
            self._width, self._strips = self.size.width, {}
        self._style = self.rich_style
        return super().render_lines(crop)

    def render_line(self, y: int) -> Strip:
        width, style = self._width, self._style
        if y >= len(self._lines):
            return Strip.blank(width, style)
        strip = self._strips.get(y)
        if strip is None:
            strip = line_strip(self._lines[y], self.app.console, width)
            strip = self._strips[y] = strip.crop_extend(0, width, style).apply_style(style)
        return strip
