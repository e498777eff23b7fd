"""A sparkline drawn by the line API: Textual's look, a fraction of its cost per frame."""

from __future__ import annotations

from collections.abc import Sequence

from rich.color import Color as RichColor
from rich.segment import Segment
from rich.style import Style
from textual.strip import Strip
from textual.widget import Widget

BARS = "▁▂▃▄▅▆▇█"
Cells = list[tuple[str, RichColor | None]]
"""One line's cells: a character and its colour (None: blank)."""


class Sparkline(Widget):
    """Bars of `data` (the largest value of each column's share), coloured from `sparkline--min-color` to
    `sparkline--max-color`, as Textual's `Sparkline` draws them.

    Textual's widget renders a Rich renderable on every paint and blends a colour for every cell (~4 ms at
    160 x 3, every frame of the overview). Here the lines are drawn once per change of data or size, each
    column's colour blended once, and runs of equal cells are one segment.
    """

    COMPONENT_CLASSES = {"sparkline--max-color", "sparkline--min-color"}
    DEFAULT_CSS = """
    Sparkline { height: 1; }
    Sparkline > .sparkline--max-color { color: $primary; }
    Sparkline > .sparkline--min-color { color: $primary 30%; }
    """

    def __init__(self, *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes)
        self._data: list[float] = []
        self._lines: list[Strip] = []
        self._drawn_for: tuple[int, int] | None = None

    def show(self, data: Sequence[float]) -> None:
        """New data: repainted only when it differs."""
        data = list(data)
        if data != self._data:
            self._data = data
            self._drawn_for = None
            self.refresh()

    def notify_style_update(self) -> None:
        super().notify_style_update()
        self._drawn_for = None  # a new theme: new colours

    def render_line(self, y: int) -> Strip:
        width, height = self.size
        if self._drawn_for != (width, height):
            self._lines = self._draw(width, height)
            self._drawn_for = (width, height)
        return self._lines[y] if y < len(self._lines) else Strip.blank(width, self.rich_style)

    def _draw(self, width: int, height: int) -> list[Strip]:
        _, background = self.background_colors
        low = (background + self.get_component_styles("sparkline--min-color").color).rich_color
        high = (background + self.get_component_styles("sparkline--max-color").color).rich_color
        data, base = self._data, self.rich_style
        rows: list[Cells]
        if not data:  # a flat line at the bottom
            blank: Cells = [(" ", None)] * width
            rows = [blank] * (height - 1) + [[("▁", low)] * width]
        elif len(data) == 1:
            rows = [[("█", high)] * width] * height
        else:
            rows = _bars(data, width, height, low, high)
        return [_strip(row, base) for row in rows]


def _bars(data: list[float], width: int, height: int, low: RichColor, high: RichColor) -> list[Cells]:
    """Each line's cells, top line first: a column per share of `data` (the `_buckets` of Textual's sparkline),
    its height the share's largest value between the data's minimum and maximum."""
    columns = _columns(data, width)
    minimum, maximum = min(data), max(data)
    extent = maximum - minimum or 1
    levels = len(BARS) * height - 1
    ratios = [(value - minimum) / extent for value in columns]
    colours = {ratio: _blend(low, high, ratio) for ratio in set(ratios)}
    lines = []
    for line in reversed(range(height)):
        floor, ceiling = line * len(BARS), (line + 1) * len(BARS)
        cells: Cells = []
        for ratio in ratios:
            level = int(ratio * levels)
            if level < floor:
                cells.append((" ", None))
            else:
                cells.append(("█" if level >= ceiling else BARS[level % len(BARS)], colours[ratio]))
        lines.append(cells)
    return lines


def _blend(low: RichColor, high: RichColor, ratio: float) -> RichColor:
    """The colour `ratio` of the way from `low` to `high` in RGB, as Textual's sparkline blends it."""
    if low.triplet is None or high.triplet is None:
        return high
    (r1, g1, b1), (r2, g2, b2) = low.triplet, high.triplet
    return RichColor.from_rgb(r1 + (r2 - r1) * ratio, g1 + (g2 - g1) * ratio, b1 + (b2 - b1) * ratio)


def _columns(data: list[float], width: int) -> list[float]:
    """The value each of `width` columns shows: `data` cut into `width` shares (fewer when there are fewer
    values than columns), each share's largest value, the shares stretched over the columns."""
    shares = []
    for share in range(width):
        start, end = len(data) * share // width, len(data) * (share + 1) // width
        if end > start:
            shares.append(max(data[start:end]))
    step, at, columns = len(shares) / width, 0.0, []
    for _ in range(width):  # summed as Textual sums it: a product would round a column differently
        columns.append(shares[int(at)])
        at += step
    return columns


def _strip(cells: Cells, base: Style) -> Strip:
    """Runs of equal cells as one segment each, over the widget's own style."""
    segments: list[Segment] = []
    styles: dict[RichColor | None, Style] = {}
    run, colour = "", None
    for char, cell_colour in [*cells, ("", None)]:
        if run and (cell_colour is not colour or not char):
            style = styles.get(colour)
            if style is None:
                style = styles[colour] = base + Style.from_color(colour) if colour else base
            segments.append(Segment(run, style))
            run = ""
        run, colour = run + char, cell_colour
    return Strip(segments, len(cells))
