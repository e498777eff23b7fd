"""The folded failures: one row per origin with its echo count; expand for the echoes, `d` for raw detail."""

from __future__ import annotations

import itertools
from bisect import bisect_right
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import overload

import msgspec
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.widgets import Static

from kvtop.model.fold import ROOM_REUSE_S, FailureGroup, Observed
from kvtop.tui.frame import Frame
from kvtop.tui.rows import Palette, clock
from kvtop.tui.widgets.line import Line
from kvtop.tui.widgets.row_list import RowList, Same
from kvtop.views.times import spans_days

GroupKey = tuple[int, str, float]
FailureNode = FailureGroup | Observed


def group_key(group: FailureGroup) -> GroupKey:
    """Stable across refolds: the room, who the origin is and when it (or the first echo) happened (an
    origin heard after its echo moves the time: `follow_keys`)."""
    return (group.room, group.origin_label, group.origin.ts if group.origin else group.first_ts)


def follow_keys(keys: set[GroupKey], groups: list[FailureGroup]) -> dict[GroupKey, GroupKey]:
    """Where each of `keys` that no group has now went: the group of the same room and origin within
    `ROOM_REUSE_S` (the fold's bound on one use of a room id) whose key moved, when its origin came after
    an echo (events of different ranks reach the collector in any order)."""
    if not keys:
        return {}
    now = {group_key(group) for group in groups}
    lost = keys - now
    if not lost:
        return {}
    by_origin: dict[tuple[int, str], list[GroupKey]] = {}
    for key in now - keys:
        by_origin.setdefault(key[:2], []).append(key)
    moved = {}
    for key in lost:
        near = [other for other in by_origin.get(key[:2], []) if _moved_to(key, other)]
        if near:
            moved[key] = min(near, key=lambda other: abs(other[2] - key[2]))
    return moved


@dataclass(frozen=True, slots=True)
class TreeRow:
    """One row of the folded tree: an origin (echo is None) or one of its echoes."""

    group: FailureGroup
    echo: Observed | None = None

    @property
    def node(self) -> FailureNode:
        return self.echo if self.echo is not None else self.group


class TreeRows(Sequence[TreeRow]):
    """The folded tree's rows, newest origin first, each expanded origin's echoes under it, made per index:
    building the list of ~2000 rows on every frame cost more than painting the visible ones."""

    def __init__(self, groups: list[FailureGroup], expanded: set[GroupKey]) -> None:
        self._groups = groups  # oldest first
        self._opened: list[tuple[int, int]] = []
        """Each expanded origin with echoes, top down: its row and the echo rows above it."""
        self._opened_rows: list[int] = []
        echoes = 0
        if expanded:
            for position, group in enumerate(reversed(groups)):
                if group.echoes and group_key(group) in expanded:
                    self._opened.append((position + echoes, echoes))
                    self._opened_rows.append(position + echoes)
                    echoes += len(group.echoes)
        self._count = len(groups) + echoes

    def __len__(self) -> int:
        return self._count

    @overload
    def __getitem__(self, index: int) -> TreeRow: ...
    @overload
    def __getitem__(self, index: slice) -> list[TreeRow]: ...
    def __getitem__(self, index: int | slice) -> TreeRow | list[TreeRow]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(self._count))]
        if not 0 <= index < self._count:
            raise IndexError(index)
        above = bisect_right(self._opened_rows, index) - 1  # the last expanded origin at or above this row
        if above < 0:
            return TreeRow(self._groups[-1 - index])
        row, echoes_above = self._opened[above]
        group = self._groups[-1 - (row - echoes_above)]
        if index - row <= len(group.echoes):
            return TreeRow(group, group.echoes[index - row - 1]) if index > row else TreeRow(group)
        return TreeRow(self._groups[-1 - (index - echoes_above - len(group.echoes))])


class FailuresView(Vertical):
    """The folded tree on the line API: newest origin on top, each origin's echoes under it when expanded.

    | Key | Action |
    | :- | :- |
    | enter / space / right | Expand (or collapse) the origin under the cursor. |
    | left | Collapse it (from an echo: back to its origin). |
    | d | The raw detail of the highlighted row, in a side pane. |
    """

    BINDINGS = [
        Binding("space,right", "expand", "Expand or collapse", show=False),
        Binding("left", "collapse", "Collapse", show=False),
    ]

    def __init__(self, *, name: str | None = None, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(name=name, id=id, classes=classes)
        self.rows: Sequence[TreeRow] = []
        self.expanded: set[GroupKey] = set()
        self._groups: list[FailureGroup] = []
        self._palette: Palette | None = None
        self._dated = False
        """The groups fall on more than one day: their times show the date."""

    def compose(self) -> ComposeResult:
        yield Line(id="failures-title", classes="title")
        with Horizontal():
            yield RowList(id="failure-tree")
            with VerticalScroll(id="failure-detail"):
                yield Static(id="failure-detail-text")

    @property
    def origin_list(self) -> RowList:
        return self.query_one("#failure-tree", RowList)

    def show(self, frame: Frame, palette: Palette) -> None:
        self._palette = palette
        moved = follow_keys(self.expanded, frame.groups)  # nothing to do (and no pass) while none is expanded
        self.expanded = {moved.get(key, key) for key in self.expanded}
        self._groups = frame.groups
        self._dated = spans_days([frame.groups[0].first_ts, frame.groups[-1].first_ts] if frame.groups else [])
        echoes = sum(len(group.echoes) for group in frame.groups)
        where = f" matching '{frame.options.filter}'" if frame.options.filter else ""
        self.query_one("#failures-title", Line).show(
            f"{len(frame.groups):,} failure origins{where}, {echoes:,} echoes folded under them"
            "  (enter: expand, d: detail)"
        )
        self._layout()

    def _layout(self, keep: TreeRow | None = None) -> None:
        """Flatten the groups (newest first) and the expanded ones' echoes; the cursor stays on its row
        (or goes to `keep`)."""
        tree, palette, dated = self.origin_list, self._palette, self._dated
        if palette is None:
            return
        current = keep or (self.rows[tree.cursor] if tree.cursor < len(self.rows) else None)
        self.rows = rows = TreeRows(self._groups, self.expanded)
        expanded = self.expanded

        def line(index: int) -> Text:
            return tree_line(rows[index], group_key(rows[index].group) in expanded, palette, dated)

        def key(index: int) -> Hashable:
            """Groups are replaced, never edited, when they change: a row of the same group draws the same."""
            row = rows[index]
            return Same(row.group), Same(row.echo), group_key(row.group) in expanded, dated, palette

        tree.set_rows(len(rows), line, key)
        if current is not None:
            tree.cursor = _find(rows, group_key(current.group), current.echo, tree.cursor)
        self.show_detail()

    def action_expand(self) -> None:
        row = self.highlighted
        if row is not None:
            self.expanded ^= {group_key(row.group)}
            self._layout(keep=TreeRow(row.group))

    def action_collapse(self) -> None:
        row = self.highlighted
        if row is not None:
            self.expanded.discard(group_key(row.group))
            self._layout(keep=TreeRow(row.group))

    @property
    def highlighted(self) -> TreeRow | None:
        cursor = self.origin_list.cursor
        return self.rows[cursor] if cursor < len(self.rows) else None

    def on_row_list_selected(self, event: RowList.Selected) -> None:
        event.stop()
        self.action_expand()

    def on_row_list_highlighted(self) -> None:
        self.show_detail()

    def show_detail(self) -> None:
        """Fill the detail pane from the highlighted row (only while the pane is shown)."""
        row, pane = self.highlighted, self.query_one("#failure-detail")
        if self._palette is not None and row is not None and pane.display:
            self.query_one("#failure-detail-text", Static).update(detail(row.node, self._palette))


def _find(rows: TreeRows, key: GroupKey, echo: Observed | None, near: int) -> int:
    """Where the row of group `key` (its `echo`, or the origin's row) is now, looked for from `near` down
    first (new origins come in above it), then up; else the row of the group its key moved to (`follow_keys`);
    `near` when it is gone."""
    start = min(near, len(rows))

    def nearest(same: Callable[[GroupKey], bool]) -> int | None:
        order = itertools.chain(range(start, len(rows)), range(start - 1, -1, -1))
        return next((i for i in order if rows[i].echo == echo and same(group_key(rows[i].group))), None)

    found = nearest(key.__eq__)
    if found is None:
        found = nearest(lambda other: _moved_to(key, other))
    return near if found is None else found


def _moved_to(key: GroupKey, other: GroupKey) -> bool:
    """`other` may be where `key` went: the same room and origin, within `ROOM_REUSE_S`."""
    return other[:2] == key[:2] and abs(other[2] - key[2]) <= ROOM_REUSE_S


def tree_line(row: TreeRow, expanded: bool, palette: Palette, dated: bool = False) -> Text:
    """An origin's row (or an echo's, indented); times with their date when `dated`."""
    if row.echo is not None:
        return Text("    └ ", style=palette.dim) + echo_label(row.echo, palette, dated)
    marker = ("▼ " if expanded else "▶ ") if row.group.echoes else "  "
    return Text(marker) + group_label(row.group, palette, dated)


def group_label(group: FailureGroup, palette: Palette, dated: bool = False) -> Text:
    origin = group.origin
    text = Text(f"room {group.room:<20} ")
    text.append(f"{group.origin_label or 'origin unknown':<16} ", style=palette.error)
    text.append(f"{origin.reason_class if origin else '-':<18}")
    text.append(f"{group.echo_count:>3} echoes  ", style=palette.dim)
    text.append(f"{clock(group.first_ts, dated)}  {origin.reason if origin else '(origin not seen)'}")
    return text


def echo_label(echo: Observed, palette: Palette, dated: bool = False) -> Text:
    text = Text("echo ", style=palette.dim)
    text.append(f"{echo.rank:<16} {echo.reason_class:<18} {clock(echo.ts, dated)}  {echo.reason}")
    return text


def detail(node: FailureNode, palette: Palette) -> Text:
    """The debug detail: the full reason, the raw recorded fields and, for a group, its timeline."""
    if isinstance(node, Observed):
        text = Text("Echo\n", style="bold")
        text.append(f"{node.reason}\n\n")
        _fields(text, node, palette)
        return text
    text = Text(f"Room {node.room}: origin {node.origin_label or 'unknown'}\n", style="bold")
    text.append(f"{node.origin.reason if node.origin else 'the origin was not seen (its rank died?)'}\n\n")
    text.append("Timeline\n", style="bold")
    start = node.first_ts
    for failure in sorted([*([node.origin] if node.origin else []), *node.echoes]):
        role = "origin" if failure is node.origin else "echo  "
        text.append(f"  +{(failure.ts - start) * 1000:8.1f} ms  {role} {failure.rank:<16} {failure.reason_class}\n")
    if node.origin:
        text.append("\nRaw origin event\n", style="bold")
        _fields(text, node.origin, palette)
    return text


def _fields(text: Text, failure: Observed, palette: Palette) -> None:
    for name, value in msgspec.structs.asdict(failure).items():
        text.append(f"  {name:<19}", style=palette.dim)
        text.append(f"{value}\n")
