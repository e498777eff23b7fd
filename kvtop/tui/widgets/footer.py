"""The key bar, recomposed only when the keys it shows change, and narrowed to fit 80 columns."""

from __future__ import annotations

from textual import events
from textual.screen import Screen
from textual.widgets import Footer

NARROW_BELOW = 100
"""Columns under which the keys sit closer and the command palette's key (`ctrl+p`, named in the help) leaves: at
80 a rewound rooms view's own keys (`x`, `s`) were cut."""


class KeyFooter(Footer):
    """Textual's footer rebuilds every key (a dozen widgets, then a layout pass) whenever the bindings are
    re-evaluated, which a view key does twice (its action, then the new view's focus): most of a view switch's
    time (`kvtop bench ui`). This one rebuilds only when the shown keys, their state or tooltips changed, or the
    terminal crossed `NARROW_BELOW`."""

    def __init__(self) -> None:
        super().__init__()
        self._shown: tuple[object, ...] | None = None

    def bindings_changed(self, screen: Screen[object]) -> None:
        shown = tuple(
            (binding.key, binding.action, binding.description, binding.group, enabled, tooltip)
            for _, binding, enabled, tooltip in screen.active_bindings.values()
            if binding.show
        )
        if shown == self._shown and self._bindings_ready:
            return
        self._shown = shown
        super().bindings_changed(screen)

    def on_resize(self, event: events.Resize) -> None:
        narrow = event.size.width < NARROW_BELOW
        if narrow != self.compact:
            self.compact = narrow
            self.show_command_palette = not narrow
            if self._bindings_ready:
                self.call_after_refresh(self.recompose)
