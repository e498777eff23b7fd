"""Dashboard themes: TOML data files shipped in `themes/` and found in the user's config folder."""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from textual.color import Color, ColorParseError
from textual.theme import Theme

DEFAULT_THEME = "kvtop-dark"
_FIELDS = set(Theme.__dataclass_fields__)
_COLOURS = ("primary", "secondary", "accent", "warning", "error", "success", "foreground", "background", "surface",
            "panel", "boost")  # fmt: skip


@dataclass
class ThemeSet:
    """Every theme found, in the order found, and a warning per file that could not be read."""

    themes: dict[str, Theme] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)


def theme_folders() -> list[Path]:
    """Where themes come from: the wheel's `kvtop/themes`, a source checkout's `themes/`, the user's folder."""
    package = Path(__file__).resolve().parent.parent
    config = Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config")
    return [package / "themes", package.parent / "themes", config / "kvtop" / "themes"]


def load_themes(folders: list[Path] | None = None) -> ThemeSet:
    """Read every `*.toml` theme of the folders; a later folder's theme replaces an earlier one's."""
    found = ThemeSet()
    for folder in theme_folders() if folders is None else folders:
        for path in sorted(folder.glob("*.toml")) if folder.is_dir() else []:
            try:
                theme = parse_theme(tomllib.loads(path.read_text(encoding="utf-8")))
            except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError, ValueError, TypeError) as error:
                found.warnings.append(f"theme {path}: {error}")
                continue
            found.themes[theme.name] = theme
    return found


def parse_theme(data: dict[str, Any]) -> Theme:
    """A Textual `Theme` from a theme file's table (unknown keys and a missing name or primary are errors)."""
    unknown = sorted(set(data) - _FIELDS)
    if unknown:
        raise ValueError(f"unknown field(s) {', '.join(unknown)}")
    if not isinstance(data.get("name"), str) or not isinstance(data.get("primary"), str):
        raise ValueError("a theme needs a name and a primary colour")
    for name in (name for name in _COLOURS if name in data):
        try:
            Color.parse(data[name])
        except ColorParseError as error:
            raise ValueError(f"{name}: {error}") from None
    return Theme(**data)
