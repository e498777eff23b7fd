"""Text in a column of a given width, for the one-shot views and the dashboard alike."""

from __future__ import annotations


def fit_label(label: str, width: int) -> str:
    """`label` in `width` cells: a longer one keeps its start and its end (a rank's TP, an address's port), with `…`
    between (an SGLang instance named by host and port runs past a column)."""
    if len(label) <= width:
        return label
    tail = width // 2
    return f"{label[: width - tail - 1]}…{label[-tail:]}"
