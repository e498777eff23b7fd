"""The key bar, recomposed only when the keys it shows change."""

from __future__ import annotations

from textual.screen import Screen
from textual.widgets import Footer


class KeyFooter(Footer):
    """Textual's footer rebuilds every key (a dozen widgets, then a layout pass) whenever the bindings are
    re-evaluated, which a view key does twice (its action, then the new view's focus): most of a view switch's
    time (`kvtop bench ui`). This one rebuilds only when the shown keys, their state or tooltips changed."""

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
