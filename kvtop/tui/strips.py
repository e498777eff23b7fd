"""One line of Rich text as a Textual strip, without Rich's general span machinery.

`Text.render` sorts and stacks every span of a line to combine overlapping styles: at 45 visible rows of
~25 spans each, a room list spent more time there than in building the lines. The lines the dashboard draws
are built by `Text.append`, so their spans follow one another and never overlap: `line_strip` cuts the
plain text at the spans' edges in one pass. A line whose spans do overlap takes Rich's own path.

Unlike `Text.render`, a line's own style applies where it has no span (Rich drops it from a line with no span
at all: the events tail's error lines were drawn unstyled).
"""

from __future__ import annotations

from rich.console import Console
from rich.segment import Segment
from rich.style import Style
from rich.text import Text
from textual.strip import Strip

from kvtop.views.safe import in_place

_NULL = Style.null()


def shown_safely(text: Text) -> Text:
    """`text` with its control characters as `?` (`kvtop.views.safe.in_place`): a peer's label or reason never
    reaches the terminal as a command (Rich lets ESC through)."""
    plain = text.plain
    safe = in_place(plain)
    if safe is plain:
        return text
    copy = text.copy()
    copy.plain = safe
    return copy


def line_strip(text: Text, console: Console, width: int | None = None) -> Strip:
    """`text` (one line, no newline) as a strip of segments, styled as `Text.render` styles them (control
    characters shown safely); a line of printable ASCII (a cell per character) cut at `width` cells, so that
    cropping it to the list's width costs nothing."""
    text = shown_safely(text)
    plain = text.plain
    narrow = plain.isascii() and plain.isprintable()  # a tab or a newline is no cell
    if narrow and width is not None:
        plain = plain[:width]
    base = _style(text.style, console)
    segments: list[Segment] = []
    position = 0
    for span in text.spans:
        start, end = span.start, min(span.end, len(plain))
        if start < position:  # overlapping spans: combine them as Rich does
            return Strip(segment for segment in text.render(console, end="") if segment.text)
        if start >= end:
            continue
        if start > position:
            segments.append(Segment(plain[position:start], base))
        style = _style(span.style, console)
        segments.append(Segment(plain[start:end], base + style if base and style else base or style))
        position = end
    if position < len(plain):
        segments.append(Segment(plain[position:], base))
    return Strip(segments, len(plain) if narrow else None)


def _style(style: str | Style, console: Console) -> Style:
    """A span's or a line's style as a `Style`; none is the null style, never None (Textual's monochrome filter,
    on where `NO_COLOR` is set, reads every segment's style)."""
    if not style:
        return _NULL
    if isinstance(style, str):
        style = console.get_style(style, default=_NULL)
    return style
