"""The folded failures: one row per origin with its echo count; expand for the echoes, `d` for raw detail."""

from __future__ import annotations

from dataclasses import asdict

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.widgets import Static, Tree
from textual.widgets.tree import TreeNode

from kvtop.fold import FailureGroup, Observed
from kvtop.tui.frame import Frame
from kvtop.tui.rows import Palette, clock

GroupKey = tuple[int, str, float]
FailureNode = FailureGroup | Observed


def group_key(group: FailureGroup) -> GroupKey:
    """Stable across refolds: the room, who the origin is and when it (or the first echo) happened."""
    return (group.room, group.origin_label, group.origin.ts if group.origin else group.first_ts)


class FailuresView(Vertical):
    """Newest origin on top. Enter expands an origin into its echoes; `d` shows the highlighted row's detail."""

    def __init__(self, *, name: str | None = None, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(name=name, id=id, classes=classes)
        self._group_nodes: dict[GroupKey, TreeNode[FailureNode]] = {}
        self._echoes: dict[GroupKey, int] = {}
        self._shape: list[tuple[GroupKey, int]] = []
        self._palette: Palette | None = None

    def compose(self) -> ComposeResult:
        yield Static(id="failures-title", classes="title")
        with Horizontal():
            tree: Tree[FailureNode] = Tree("failures", id="failure-tree")
            tree.show_root = False
            tree.guide_depth = 3
            yield tree
            with VerticalScroll(id="failure-detail"):
                yield Static(id="failure-detail-text")

    @property
    def failure_tree(self) -> Tree[FailureNode]:
        return self.query_one("#failure-tree", Tree)

    def show(self, frame: Frame, palette: Palette) -> None:
        self._palette = palette
        groups = frame.groups
        echoes = sum(group.echo_count for group in groups)
        where = f" matching '{frame.options.filter}'" if frame.options.filter else ""
        self.query_one("#failures-title", Static).update(
            f"{len(groups):,} failure origins{where}, {echoes:,} echoes folded under them  (enter: expand, d: detail)"
        )
        shape = [(group_key(group), group.echo_count) for group in groups]
        if shape == self._shape:
            return
        self._shape = shape
        self._sync(groups, palette)

    def forget(self) -> None:
        """Redraw every row on the next frame (the theme changed)."""
        self._shape = []
        self._echoes = dict.fromkeys(self._echoes, -1)

    def _sync(self, groups: list[FailureGroup], palette: Palette) -> None:
        """Add new origins on top, refresh those whose echoes changed, drop those gone; expansion survives."""
        tree = self.failure_tree
        cursor = tree.cursor_node
        wanted = {group_key(group): group for group in groups}
        for key in [key for key in self._group_nodes if key not in wanted]:
            self._group_nodes.pop(key).remove()
            del self._echoes[key]
        for key, group in wanted.items():
            node = self._group_nodes.get(key)
            if node is None:
                first = tree.root.children[0] if tree.root.children else None
                node = self._group_nodes[key] = tree.root.add(group_label(group, palette), data=group, before=first)
            elif self._echoes[key] == group.echo_count:
                continue
            self._echoes[key] = group.echo_count
            node.data = group
            node.set_label(group_label(group, palette))
            node.remove_children()
            for echo in group.echoes:
                node.add_leaf(echo_label(echo, palette), data=echo)
            node.allow_expand = bool(group.echoes)
        if cursor is not None and cursor.parent is not None:
            tree.move_cursor(cursor)  # new origins went in above: stay on the row the user was on
        elif tree.root.children:
            tree.cursor_line = 0

    def show_detail(self) -> None:
        """Fill the detail pane from the highlighted row."""
        node = self.failure_tree.cursor_node
        if self._palette is not None and node is not None and node.data is not None:
            self.query_one("#failure-detail-text", Static).update(detail(node.data, self._palette))

    def on_tree_node_highlighted(self) -> None:
        self.show_detail()


def group_label(group: FailureGroup, palette: Palette) -> Text:
    origin = group.origin
    text = Text(f"room {group.room:<20} ")
    text.append(f"{group.origin_label or 'origin unknown':<16} ", style=palette.error)
    text.append(f"{origin.reason_class if origin else '-':<18}")
    text.append(f"{group.echo_count:>3} echoes  ", style=palette.dim)
    text.append(f"{clock(group.first_ts)}  {origin.reason if origin else '(origin not seen)'}")
    return text


def echo_label(echo: Observed, palette: Palette) -> Text:
    text = Text("echo ", style=palette.dim)
    text.append(f"{echo.rank:<16} {echo.reason_class:<18} {clock(echo.ts)}  {echo.reason}")
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
    for name, value in asdict(failure).items():
        text.append(f"  {name:<13}", style=palette.dim)
        text.append(f"{value}\n")
