"""The failures as a tree: incidents (what broke) on top; each expands to its failure groups (one row per origin
with its echo count), each group to its echoes; `d` for the raw detail."""

from __future__ import annotations

import itertools
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import overload

import msgspec
from rich.style import Style
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.widgets import Static

from kvtop.model.fold import ROOM_REUSE_S, FailureGroup, Observed
from kvtop.tui.frame import GROUPS_SHOWN, Frame, IncidentRow
from kvtop.tui.rows import Palette, clock
from kvtop.tui.strips import shown_safely
from kvtop.tui.widgets.line import Line
from kvtop.tui.widgets.row_list import RowList, Same
from kvtop.views.incidents import plural
from kvtop.views.times import spans_days

GroupKey = tuple[int, str, float]
FailureNode = IncidentRow | FailureGroup | Observed


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


UNFILED = IncidentRow(0, "not in an incident the model keeps", "", "", "", 0, 0, 0, 0.0, 0.0, False, False, (), ())
"""Where the groups of no incident kept (too old, or not folded into one yet) are listed."""


@dataclass(frozen=True, slots=True)
class TreeRow:
    """One row of the tree: an incident, one of its failure groups (echo None), or one of a group's echoes."""

    incident: IncidentRow
    group: FailureGroup | None = None
    echo: Observed | None = None

    @property
    def node(self) -> FailureNode:
        return self.echo or self.group or self.incident

    @property
    def key(self) -> tuple[int, GroupKey | None, Observed | None]:
        """Which node it is, across frames."""
        return (self.incident.id, group_key(self.group) if self.group else None, self.echo)


class TreeRows(Sequence[TreeRow]):
    """The tree's rows: incidents, the ongoing first (`IncidentTracker.in_order`); an expanded incident's groups
    under it, by start, the earliest on top (a new one joins below: no row moves); an expanded group's echoes
    under it. Made per index: a frame builds only the index."""

    def __init__(
        self,
        incidents: list[IncidentRow],
        groups: dict[int, list[FailureGroup]],
        open_incidents: set[int],
        open_groups: set[GroupKey],
    ) -> None:
        self._incidents = incidents
        self._groups = groups
        self._index: list[tuple[int, int, int]] = []
        """(incident, group or -1, echo or -1) of each row."""
        for position, incident in enumerate(incidents):
            self._index.append((position, -1, -1))
            if incident.id not in open_incidents:
                continue
            for place, group in enumerate(groups.get(incident.id, [])):
                self._index.append((position, place, -1))
                if group.echoes and group_key(group) in open_groups:
                    self._index.extend((position, place, echo) for echo in range(len(group.echoes)))

    def __len__(self) -> int:
        return len(self._index)

    @overload
    def __getitem__(self, index: int) -> TreeRow: ...
    @overload
    def __getitem__(self, index: slice) -> list[TreeRow]: ...
    def __getitem__(self, index: int | slice) -> TreeRow | list[TreeRow]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        position, place, echo = self._index[index]
        incident = self._incidents[position]
        if place < 0:
            return TreeRow(incident)
        group = self._groups[incident.id][place]
        return TreeRow(incident, group, group.echoes[echo] if echo >= 0 else None)


def tree_of(frame: Frame) -> tuple[list[IncidentRow], dict[int, list[FailureGroup]]]:
    """The frame's incidents and each one's groups (by start, the earliest first, as the frame holds them);
    groups of none under `UNFILED`, last."""
    groups: dict[int, list[FailureGroup]] = {}
    for group, incident in zip(frame.groups, frame.group_incidents, strict=True):
        groups.setdefault(incident, []).append(group)
    incidents = [row for row in frame.incidents if row.id in groups or not frame.options.filter]
    if 0 in groups:
        incidents.append(UNFILED)
    return incidents, groups


class FailuresView(Vertical):
    """The failures as a tree on the line API: incidents (what broke) on top, the ongoing first; each expands to its
    failure groups (one per failure: its origin, who noticed), each group to its echoes.

    | Key | Action |
    | :- | :- |
    | enter / space / right | Expand (or collapse) the incident or group under the cursor. |
    | left | Collapse it (from a group or an echo: back up a level). |
    | d | The raw detail of the highlighted row, in a side pane (the app's `detail`: this view's alone). |
    """

    BINDINGS = [
        Binding(
            "space,right",
            "expand",
            "Expand or collapse",
            show=False,
            tooltip="Expand or collapse the incident or group under the cursor (as enter)",
        ),
        Binding(
            "left",
            "collapse",
            "Collapse",
            show=False,
            tooltip="Collapse; from an echo or a collapsed group, back up a level",
        ),
    ]

    def __init__(self, *, name: str | None = None, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(name=name, id=id, classes=classes)
        self.rows: Sequence[TreeRow] = []
        self.expanded: set[GroupKey] = set()
        """The groups whose echoes are shown."""
        self.open_incidents: set[int] = set()
        """The incidents whose groups are shown."""
        self._tree: tuple[list[IncidentRow], dict[int, list[FailureGroup]]] = ([], {})
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
        self._tree = tree_of(frame)
        incidents = self._tree[0]
        self._dated = spans_days([frame.groups[0].first_ts, frame.groups[-1].first_ts] if frame.groups else [])
        ongoing = sum(row.ongoing and not row.client for row in incidents)
        where = f" matching '{frame.options.filter}'" if frame.options.filter else ""
        older = f" (the newest {GROUPS_SHOWN:,})" if len(frame.groups) >= GROUPS_SHOWN else ""
        since = f" since {clock(frame.groups[0].first_ts, self._dated)[:-4]}" if frame.groups else ""
        self.query_one("#failures-title", Line).show(
            f"{plural(len(incidents) - (UNFILED in incidents), 'incident')}{where} ({ongoing} ongoing), "
            f"{plural(len(frame.groups), 'failure group')}{older}{since} under them  (enter: expand, d: detail)"
        )
        self._layout()

    def _layout(self, keep: TreeRow | None = None) -> None:
        """Flatten the tree as expanded; the cursor stays on its row (or goes to `keep`)."""
        tree, palette, dated, narrow = self.origin_list, self._palette, self._dated, self.detail_shown
        if palette is None:
            return
        current = keep or (self.rows[tree.cursor] if tree.cursor < len(self.rows) else None)
        if current is not None and current.group is not None:
            current = self._followed(current)
        self.rows = rows = TreeRows(*self._tree, self.open_incidents, self.expanded)
        opened, expanded = self.open_incidents, self.expanded

        def line(index: int) -> Text:
            row = rows[index]
            return tree_line(row, _is_open(row, opened, expanded), palette, dated, narrow)

        def key(index: int) -> Hashable:
            """Groups are replaced, never edited, when they change: a row of the same group draws the same."""
            row = rows[index]
            opens = _is_open(row, opened, expanded)
            return row.incident, Same(row.group), Same(row.echo), opens, dated, narrow, palette

        tree.set_rows(len(rows), line, key)
        if current is not None:
            tree.cursor = _find(rows, current, tree.cursor)
        self.show_detail()

    def _followed(self, row: TreeRow) -> TreeRow:
        """The cursor's group where it is now: in another incident (opened) when its refold moved it there, under
        its new key when its origin came after an echo (`follow_keys`)."""
        key = group_key(row.group) if row.group is not None else None
        incidents, groups = self._tree
        for incident in incidents:
            for group in groups.get(incident.id, []):
                if key is not None and (group_key(group) == key or _moved_to(key, group_key(group))):
                    self.open_incidents.add(incident.id)
                    echo = row.echo if row.echo is not None and row.echo in group.echoes else None
                    return TreeRow(incident, group, echo)
        return row

    def action_expand(self) -> None:
        row = self.highlighted
        if row is None:
            return
        if row.group is None:
            self.open_incidents ^= {row.incident.id}
            self._layout(keep=row)
        else:
            self.expanded ^= {group_key(row.group)}
            self._layout(keep=TreeRow(row.incident, row.group))

    def action_collapse(self) -> None:
        row = self.highlighted
        if row is None:
            return
        if row.group is not None and (row.echo is not None or group_key(row.group) in self.expanded):
            self.expanded.discard(group_key(row.group))
            self._layout(keep=TreeRow(row.incident, row.group))
        else:
            self.open_incidents.discard(row.incident.id)
            self._layout(keep=TreeRow(row.incident))

    @property
    def highlighted(self) -> TreeRow | None:
        cursor = self.origin_list.cursor
        return self.rows[cursor] if cursor < len(self.rows) else None

    def on_row_list_selected(self, event: RowList.Selected) -> None:
        event.stop()
        self.action_expand()

    def on_row_list_highlighted(self) -> None:
        self.show_detail()

    @property
    def detail_shown(self) -> bool:
        return bool(self.query_one("#failure-detail").display)

    def toggle_detail(self) -> None:
        """Open or close the detail pane; the rows take the form that fits beside it (`tree_line`'s `narrow`)."""
        self.query_one("#failure-detail").display = not self.detail_shown
        self._layout()

    def show_detail(self) -> None:
        """Fill the detail pane from the highlighted row (only while the pane is shown); with no row (a filter that
        matches nothing) it says so, never the detail of a row no longer listed."""
        row = self.highlighted
        if self._palette is None or not self.detail_shown:
            return
        text = detail(row.node, self._palette) if row is not None else Text("nothing highlighted", style="dim")
        self.query_one("#failure-detail-text", Static).update(shown_safely(text))


def _is_open(row: TreeRow, opened: set[int], expanded: set[GroupKey]) -> bool:
    if row.group is None:
        return row.incident.id in opened
    return row.echo is None and group_key(row.group) in expanded


def _find(rows: TreeRows, current: TreeRow, near: int) -> int:
    """Where `current`'s node is now, looked for from `near` down first (new ones come in above it), then up;
    else its incident's row; `near` when both are gone."""
    start = min(near, len(rows))
    order = list(itertools.chain(range(start, len(rows)), range(start - 1, -1, -1)))
    wanted = current.key
    found = next((i for i in order if rows[i].key == wanted), None)
    if found is None:
        found = next((i for i in order if rows[i].group is None and rows[i].incident.id == current.incident.id), None)
    return near if found is None else found


def _moved_to(key: GroupKey, other: GroupKey) -> bool:
    """`other` may be where `key` went: the same room and origin, within `ROOM_REUSE_S`."""
    return other[:2] == key[:2] and abs(other[2] - key[2]) <= ROOM_REUSE_S


def tree_line(row: TreeRow, expanded: bool, palette: Palette, dated: bool = False, narrow: bool = False) -> Text:
    """An incident's row, a group's (indented once) or an echo's (twice); times with their date when `dated`;
    `narrow` (beside the detail pane): the short form, what an operator scans for first (`narrow_line`)."""
    if narrow:
        return narrow_line(row, expanded, palette, dated)
    if row.echo is not None:
        return Text("        └ ", style=palette.dim) + echo_label(row.echo, palette, dated)
    if row.group is not None:
        marker = ("▼ " if expanded else "▶ ") if row.group.echoes else "  "
        return Text("    " + marker) + group_label(row.group, palette, dated)
    return Text("▼ " if expanded else "▶ ") + incident_label(row.incident, palette, dated)


def narrow_line(row: TreeRow, expanded: bool, palette: Palette, dated: bool = False) -> Text:
    """A row beside the detail pane (46 columns at 80, 57 at 100): its time first, then who and why, the room last
    (the first to be cut; the pane names it). `▼ ONGOING  10:02:11 prefill-0 sends corrupt KV (checksum)`,
    `  ▶ 10:02:11 prefill-0/TP1  checksum  3 echoes  room 17`, `    └ 10:02:11.042 decode-0/TP1  propagated`."""
    if row.echo is not None:
        echo = row.echo
        text = Text("    └ ", style=palette.dim)
        text.append(f"{clock(echo.ts, dated)} {echo.rank:<14} {echo.reason_class}")  # its reason: in the pane
        return text
    if row.group is not None:
        group, origin = row.group, row.group.origin
        text = Text("  " + (("▼ " if expanded else "▶ ") if group.echoes else "  "))
        text.append(f"{clock(group.first_ts, dated)[:-4]} ")
        text.append(f"{group.origin_label or 'origin unknown':<14} ", style=palette.error)
        text.append(f"{origin.reason_class if origin else '-'}  ")
        text.append(f"{plural(group.echo_count, 'echo', 'echoes')}  room {group.room}", style=palette.dim)
        return text
    incident = row.incident
    if not incident.id:
        return Text(("▼ " if expanded else "▶ ") + incident.headline, style=palette.dim)
    text = Text("▼ " if expanded else "▶ ")
    text.append(f"{_state(incident):<8} ", style=_state_style(incident, palette))
    text.append(f"{clock(incident.first_seen, dated)[:-4]} ")
    text.append(incident.headline, style=palette.accent if incident.client else palette.error)
    return text


def _state(incident: IncidentRow) -> str:
    return "aborts" if incident.client else "ONGOING" if incident.ongoing else "ended"  # aborts are no fault


def _state_style(incident: IncidentRow, palette: Palette) -> Style:
    return palette.error if incident.ongoing and not incident.client else palette.dim


def incident_label(incident: IncidentRow, palette: Palette, dated: bool = False) -> Text:
    """`ONGOING  prefill-0/TP1 sends corrupt KV (checksum)  31 rooms  since 10:02:11  31/96`."""
    if not incident.id:
        return Text(incident.headline, style=palette.dim)
    text = Text(f"{_state(incident):<8} ", style=_state_style(incident, palette))
    text.append(incident.headline, style=palette.accent if incident.client else palette.error)
    text.append(f"  {incident.size}  since ")
    text.append(f"{clock(incident.first_seen, dated)[:-4]}  ")
    text.append(
        f"{plural(incident.origins, 'origin')} / {plural(incident.echoes, 'echo', 'echoes')}", style=palette.dim
    )
    return text


def group_label(group: FailureGroup, palette: Palette, dated: bool = False) -> Text:
    origin = group.origin
    text = Text(f"room {group.room:<20} ")
    text.append(f"{group.origin_label or 'origin unknown':<16} ", style=palette.error)
    text.append(f"{origin.reason_class if origin else '-':<18}")
    text.append(f"{group.echo_count:>3} {'echo' if group.echo_count == 1 else 'echoes':<6}  ", style=palette.dim)
    text.append(f"{clock(group.first_ts, dated)}  {origin.reason if origin else '(origin not seen)'}")
    return text


def echo_label(echo: Observed, palette: Palette, dated: bool = False) -> Text:
    text = Text("echo ", style=palette.dim)
    text.append(f"{echo.rank:<16} {echo.reason_class:<18} {clock(echo.ts, dated)}  {echo.reason}")
    return text


def detail(node: FailureNode, palette: Palette) -> Text:
    """The debug detail: an incident's suspect and evidence; a group's reason and timeline; the raw fields."""
    if isinstance(node, IncidentRow):
        return _incident_detail(node, palette)
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
        text.append(f"{value if value != '' else '-'}\n")


def _incident_detail(incident: IncidentRow, palette: Palette) -> Text:
    text = Text(f"{incident.headline}\n", style="bold")
    if not incident.id:
        text.append("Groups too old to be in an incident the model keeps, or not folded into one yet.\n")
        return text
    span = f"{clock(incident.first_seen)} to {clock(incident.last_seen)}"
    text.append(f"{'ongoing' if incident.ongoing else 'ended'}, {span}, {incident.size}\n\n")
    text.append("Suspect\n", style="bold")
    text.append(f"  {incident.suspect}\n")
    for line in incident.evidence:
        text.append(f"  {line}\n", style=palette.dim)
    text.append("\nNoticed by\n", style="bold")
    text.append("  " + ", ".join(incident.noticed_by) + "\n")
    text.append(
        f"\n{plural(incident.origins, 'failure group')} (origins), {plural(incident.echoes, 'echo', 'echoes')}\n",
        style=palette.dim,
    )
    return text
