"""The paint's own pieces: lines cut into strips, rows kept by key, side blocks,
the failure tree's rows made per index."""

from __future__ import annotations

import asyncio
import pickle
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rich.console import Console
from rich.style import Style
from rich.text import Span, Text
from textual.app import App, ComposeResult
from textual.strip import Strip
from tui_support import FIXED_NOW, build_model

from kvtop.model.fold import FailureGroup, Observed
from kvtop.tui.frame import Frame, FrameBuilder, IncidentRow, Options
from kvtop.tui.pages import Page, PageRequest
from kvtop.tui.rows import Palette, Pieces
from kvtop.tui.strips import line_strip
from kvtop.tui.themes import load_themes
from kvtop.tui.views.events import EventsView
from kvtop.tui.views.failures import TreeRow, TreeRows, group_key
from kvtop.tui.widgets.block import Block
from kvtop.tui.widgets.line import Line
from kvtop.tui.widgets.row_list import RowList, Same

RED, BOLD, DIM = Style(color="red"), Style(bold=True), Style(dim=True)
CONSOLE = Console(width=200, color_system="truecolor", force_terminal=True)


def cells(strip: Strip) -> list[tuple[str, Style | None]]:
    """Each cell's character and style (how the terminal will show it, whatever the segments' cuts; the null style
    and none show alike)."""
    return [(char, segment.style or None) for segment in strip for char in segment.text]


def rich_cells(text: Text) -> list[tuple[str, Style | None]]:
    """What Rich's own renderer gives each cell, the line's style under every span."""
    segments = list(text.render(CONSOLE))
    base = CONSOLE.get_style(text.style) if text.style else None
    return [(char, segment.style or base) for segment in segments for char in segment.text]


def appended() -> Text:
    text = Text("room 12  ")
    text.append("decode-0/TP1", style=RED)
    text.append(" checksum ")
    text.append("3 echoes", style="dim")
    text.append("", style=BOLD)
    text.append(" tail")
    return text


def test_a_line_becomes_the_cells_rich_would_draw():
    text = appended()
    assert cells(line_strip(text, CONSOLE)) == rich_cells(text)


def test_every_segment_has_a_style_plain_ones_the_null_style():
    """Textual's monochrome filter (on where `NO_COLOR` is set) reads every segment's style: None killed the
    dashboard."""
    for text in (appended(), Text("plain"), Text("abcdef", spans=[Span(0, 4, RED), Span(2, 6, BOLD)])):
        assert all(isinstance(segment.style, Style) for segment in line_strip(text, CONSOLE))


def test_a_lines_own_style_applies_where_no_span_is():
    """Rich's `Text.render` drops the style of a line without spans: the events tail's error lines were
    drawn unstyled."""
    assert cells(line_strip(Text("boom", style=RED), CONSOLE)) == [(char, RED) for char in "boom"]
    styled = Text("ab", style=RED)
    styled.append("cd", style=BOLD)
    assert cells(line_strip(styled, CONSOLE)) == [("a", RED), ("b", RED), ("c", RED + BOLD), ("d", RED + BOLD)]


def test_overlapping_spans_combine_as_rich_combines_them():
    text = Text("abcdef", spans=[Span(0, 4, RED), Span(2, 6, BOLD)])
    assert cells(line_strip(text, CONSOLE)) == [
        ("a", RED), ("b", RED), ("c", RED + BOLD), ("d", RED + BOLD), ("e", BOLD), ("f", BOLD),
    ]  # fmt: skip


def test_an_ascii_line_is_cut_at_the_width_and_knows_its_length():
    strip = line_strip(appended(), CONSOLE, width=14)
    assert strip.text == "room 12  decod"
    assert strip.cell_length == 14
    assert cells(strip)[-1] == ("d", RED)


def test_a_line_with_wide_characters_or_tabs_is_left_for_the_crop():
    """Only printable ASCII is a cell per character: a wide character is two, a tab none."""
    strip = line_strip(Text("▶ 漢字 room"), CONSOLE, width=3)
    assert strip.text == "▶ 漢字 room"
    assert strip.crop(0, 4).text == "▶ 漢"
    tabbed = line_strip(Text("a\tb c"), CONSOLE, width=3)
    assert tabbed.text == "a\tb c"
    assert tabbed.cell_length == 4


def test_pieces_build_the_same_text_as_appends():
    pieces = Pieces("room 12  ")
    pieces.add("decode-0/TP1", RED)
    pieces.add(" checksum ")
    pieces.add("3 echoes", DIM)
    text = pieces.text()
    assert text.plain == "room 12  decode-0/TP1 checksum 3 echoes"
    assert text.spans == [Span(9, 21, RED), Span(31, 39, DIM)]


def test_pieces_with_control_codes_are_stripped_and_keep_their_styles():
    """A label an agent sent may carry control codes: Rich strips them, and the styles must stay on their
    pieces."""
    pieces = Pieces("a\rb ")
    pieces.add("x\x07y", RED)
    pieces.add(" z")
    text = pieces.text()
    assert text.plain == "ab xy z"
    assert [(text.plain[span.start : span.end], span.style) for span in text.spans] == [("xy", RED)]


class ListApp(App[None]):
    def compose(self) -> ComposeResult:
        yield RowList(id="list")


def test_a_row_whose_key_is_unchanged_keeps_its_line_and_the_list_is_not_repainted():
    drawn: list[int] = []
    groups = [object() for _ in range(30)]

    def line(index: int) -> Text:
        drawn.append(index)
        return Text(f"group {index}")

    async def scenario() -> None:
        app = ListApp()
        async with app.run_test(size=(40, 12)) as pilot:
            rows = app.query_one(RowList)
            rows.set_rows(30, line, key=lambda index: Same(groups[index]))
            await pilot.pause()
            first = len(drawn)
            assert first >= rows.size.height
            drawn.clear()
            rows.set_rows(30, line, key=lambda index: Same(groups[index]))
            assert not rows._repaint_required, "the same rows asked for a repaint"
            await pilot.pause()
            assert drawn == []
            groups[0] = object()  # the first group was replaced: only its row is drawn again
            rows.set_rows(30, line, key=lambda index: Same(groups[index]))
            rows.refresh()
            await pilot.pause()
            assert drawn == [0]
            assert rows.render_line(0).text.startswith("group 0")

    asyncio.run(scenario())


def test_rows_that_come_or_go_out_of_sight_repaint_nothing_but_a_changed_visible_row_does():
    """A tail that grows below the visible rows (the events view scrolled up) keeps the list as painted; a row
    added where the list had room, or a visible row that shows something else, repaints it."""
    shown = [f"event {index}" for index in range(30)]

    def key(index: int) -> str:
        return shown[index]

    async def scenario() -> None:
        app = ListApp()
        async with app.run_test(size=(40, 12)) as pilot:
            rows = app.query_one(RowList)
            rows.set_rows(30, lambda index: Text(shown[index]), key)
            await pilot.pause()
            shown.extend(f"event {index}" for index in range(30, 40))
            rows.set_rows(40, lambda index: Text(shown[index]), key)
            assert not rows._repaint_required, "rows below the visible ones asked for a repaint"
            rows.set_rows(25, lambda index: Text(shown[index]), key)
            assert not rows._repaint_required, "rows gone below the visible ones asked for a repaint"
            shown[1] = "event one, told again"
            rows.set_rows(25, lambda index: Text(shown[index]), key)
            assert rows._repaint_required
            await pilot.pause()
            assert rows.render_line(1).text.startswith("event one, told again")
            rows.set_rows(3, lambda index: Text(shown[index]), key)
            assert rows._repaint_required, "visible rows went and the list kept them"

    asyncio.run(scenario())


def test_same_matches_only_the_very_object():
    one, other = [1], [1]
    assert Same(one) == Same(one)
    assert Same(one) != Same(other)
    assert len({Same(one), Same(one), Same(other)}) == 2


class Blocks(App[None]):
    CSS = "Block { width: 12; }"

    def compose(self) -> ComposeResult:
        yield Block(id="block")
        yield Block(id="fixed", lines=3)


def test_a_block_is_as_high_as_its_lines_or_as_told_and_cuts_them_at_its_width():
    async def scenario() -> None:
        app = Blocks()
        async with app.run_test(size=(40, 10)) as pilot:
            block = app.query_one(Block)
            block.show([Text("short"), Text("a line wider than the block"), Text("✗ 3 failed rooms here")])
            await pilot.pause()
            assert block.size.height == 3
            assert [block.render_line(y).text for y in range(3)] == ["short       ", "a line wider", "✗ 3 failed r"]
            block.show([Text("one")])
            await pilot.pause()
            assert block.size.height == 1
            assert block.plain == "one"
            fixed = app.query_one("#fixed", Block)
            fixed.show([Text("one")])
            assert not fixed._layout_required, "a block of fixed height asked for a layout pass"
            await pilot.pause()
            assert fixed.size.height == 3
            assert [fixed.render_line(y).text.rstrip() for y in range(3)] == ["one", "", ""]
            fixed.show([Text("one"), Text("two"), Text("six")])
            await pilot.pause()
            drawn = [fixed.render_line(y) for y in range(3)]
            fixed.show([Text("one"), Text("TWO"), Text("six")])
            assert not fixed._layout_required
            again = [fixed.render_line(y) for y in range(3)]
            assert again[0] is drawn[0] and again[2] is drawn[2], "a line that did not change keeps its strip"
            assert again[1].text.rstrip() == "TWO"

    asyncio.run(scenario())


def _group(room: int, echoes: int) -> FailureGroup:
    origin = Observed(float(room), room, "decode-0/TP0", "decode", "boom", "checksum")
    return FailureGroup(room, "decode-0/TP0", origin, [
        Observed(room + 0.1 * (i + 1), room, f"prefill-0/TP{i}", "prefill", "echo", "propagated") for i in range(echoes)
    ])  # fmt: skip


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2), st.booleans(), st.booleans()), max_size=12))
def test_tree_rows_made_per_index_are_the_rows_a_list_would_hold(shape):
    """Incidents in order; an open incident's groups right under it, an expanded group's echoes under that,
    whatever is open."""
    incidents = [_incident(number) for number in range(1, 4)]
    groups: dict[int, list[FailureGroup]] = {}
    for room, (echoes, _, _) in enumerate(shape):
        groups.setdefault(incidents[room % 3].id, []).append(_group(room, echoes))
    opened = {incidents[room % 3].id for room, (_, is_open, _) in enumerate(shape) if is_open}
    expanded = {group_key(groups[incidents[room % 3].id][room // 3]) for room, (*_, x) in enumerate(shape) if x}
    listed: list[TreeRow] = []
    for incident in incidents:
        listed.append(TreeRow(incident))
        if incident.id in opened:
            for group in groups.get(incident.id, []):
                listed.append(TreeRow(incident, group))
                if group_key(group) in expanded:
                    listed.extend(TreeRow(incident, group, echo) for echo in group.echoes)
    rows = TreeRows(incidents, groups, opened, expanded)
    assert len(rows) == len(listed)
    assert list(rows) == listed
    assert rows[1:4] == listed[1:4]
    with pytest.raises(IndexError):
        rows[len(listed)]


def _incident(number: int) -> IncidentRow:
    return IncidentRow(number, f"prefill-0/TP{number} sends corrupt KV (checksum)", f"prefill-0/TP{number}",
                       "corrupt", "checksum", 1, 1, 0, 0.0, 0.0, True, False, (), ())  # fmt: skip


def test_a_growing_list_repaints_its_scrollbar_only_when_the_thumb_moves():
    """100k rows growing by a few each frame leave the thumb where it is drawn (a scrollbar repaint cost ~2 ms
    a frame); the scrollbar still knows the new count, and a count that moves the thumb repaints it."""
    renders: list[int] = []

    async def scenario() -> None:
        app = ListApp()
        async with app.run_test(size=(40, 12)) as pilot:
            rows = app.query_one(RowList)
            rows.set_rows(100_000, lambda index: Text(f"row {index}"))
            await pilot.pause()
            bar = rows.vertical_scrollbar
            render = bar.render
            bar.render = lambda: renders.append(1) or render()  # type: ignore[method-assign]
            await pilot.pause()  # a loaded machine may paint the first count's scrollbar only now
            renders.clear()
            rows.set_rows(100_005, lambda index: Text(f"row {index}"))
            await pilot.pause()
            assert renders == []
            assert bar.window_virtual_size == 100_005
            rows.set_rows(30, lambda index: Text(f"row {index}"))
            await pilot.pause()
            assert renders, "the thumb grew and the scrollbar was not repainted"

    asyncio.run(scenario())


class EventsApp(App[None]):
    def compose(self) -> ComposeResult:
        yield EventsView()


def test_an_events_frame_that_adds_no_line_repaints_neither_the_tail_nor_its_title():
    """The tail and its title paint once; the next frame of the same events (copies, as the model process
    sends them) asks for no repaint, nor does one that follows with the cursor on the last line."""
    builder = FrameBuilder(build_model())
    palette = Palette.from_theme(load_themes().themes["kvtop-dark"])

    def frame() -> Frame:
        built = builder.build(Options(), FIXED_NOW)
        return replace(built, events=Page.of(pickle.loads(pickle.dumps(list(built.events))), PageRequest.tail(40)))

    async def scenario() -> None:
        app = EventsApp()
        async with app.run_test(size=(120, 20)) as pilot:
            view = app.query_one(EventsView)
            view.show(frame(), palette)
            await pilot.pause()
            tail, title = view.query_one(RowList), view.query_one("#events-title", Line)
            assert tail.count > 20 and tail.cursor == tail.count - 1, "the tail is followed: the cursor on its end"
            view.show(frame(), palette)
            assert not tail._repaint_required and not title._repaint_required

    asyncio.run(scenario())


def test_a_row_wider_than_the_list_ends_in_an_ellipsis_and_one_that_fits_is_whole():
    """A cut row read as whole: `bootstrap_addr: 10.0.0.5:8998` at the list's edge read `10.0.0.5:899`, a room id
    lost its last digits with nothing to tell them missing. The `…` comes after the last whole word (`since
    07:18:…` read as a time): a long word alone is cut within."""
    rows_drawn = [
        Text("room 4930731309258511343 peer_lost: bootstrap_addr: 10.0.0.5:8998"),
        Text("fits", style=RED),
        Text("ONGOING  prefill-0 sends corrupt KV  since 07:18:15"),
        Text("x" * 60),
    ]

    async def scenario() -> None:
        app = ListApp()
        async with app.run_test(size=(40, 12)) as pilot:
            rows = app.query_one(RowList)
            rows.set_rows(len(rows_drawn), lambda index: rows_drawn[index])
            await pilot.pause()
            width = rows.scrollable_content_region.width
            cut, whole, time, word = (rows.render_line(y).text for y in range(4))
            assert width == 40
            assert cut == "room 4930731309258511343 peer_lost: …".ljust(width)
            assert whole == "fits".ljust(width)
            assert time == "ONGOING  prefill-0 sends corrupt KV  …".ljust(width)
            assert word == "x" * (width - 1) + "…"

    asyncio.run(scenario())
