"""Themes: the shipped four, a user's own, broken files skipped with a warning, a stylesheet without colours."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from kvtop_cli import kvtop_here
from textual.color import Color, ColorParseError
from tui_support import drive, lines, make_app, next_frame, text, wait_until

import kvtop.tui
from kvtop.tui.themes import DEFAULT_THEME, load_themes
from kvtop.tui.widgets.row_list import RowList

SHIPPED = ["kvtop-colorblind", "kvtop-dark", "kvtop-high-contrast", "kvtop-light"]
STYLESHEET = Path(kvtop.tui.__file__).parent / "kvtop.tcss"
REPO_THEMES = Path(__file__).resolve().parents[3] / "themes"


def user_themes(config_home: Path) -> Path:
    folder = config_home / "kvtop" / "themes"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def test_the_four_shipped_themes_load_without_warnings():
    """Dark (the default), light, high contrast and colour-blind safe, each with its signal colours set."""
    found = load_themes()

    assert sorted(found.themes) == SHIPPED
    assert found.warnings == []
    assert DEFAULT_THEME == "kvtop-dark"
    assert all(theme.error and theme.warning and theme.success for theme in found.themes.values())
    assert (found.themes["kvtop-dark"].dark, found.themes["kvtop-light"].dark) == (True, False)


def test_the_shipped_theme_files_are_the_themes_folder():
    """Each `themes/*.toml` is one theme named after its file."""
    found = load_themes([REPO_THEMES])

    assert sorted(found.themes) == sorted(path.stem for path in REPO_THEMES.glob("*.toml")) == SHIPPED


def test_a_theme_in_the_user_config_folder_is_picked_up(config_home: Path):
    """`$XDG_CONFIG_HOME/kvtop/themes/*.toml` adds themes to the shipped ones."""
    (user_themes(config_home) / "mine.toml").write_text('name = "mine"\ndark = true\nprimary = "#123456"\n')

    found = load_themes()

    assert sorted(found.themes) == sorted([*SHIPPED, "mine"])
    assert found.themes["mine"].primary == "#123456"
    assert found.warnings == []


def test_a_user_theme_replaces_a_shipped_one_of_the_same_name(config_home: Path):
    """The user's folder is read last: its `kvtop-dark` wins."""
    (user_themes(config_home) / "dark.toml").write_text('name = "kvtop-dark"\nprimary = "#abcdef"\n')

    assert load_themes().themes["kvtop-dark"].primary == "#abcdef"


@pytest.mark.parametrize(
    ("content", "complaint"),
    [
        ('name = "broken"\nprimary = "#123456', "broken.toml"),
        ('name = "broken"\nprimary = "#123456"\nsparkle = true\n', "unknown field(s) sparkle"),
        ('name = "broken"\nprimary = "#123456"\nerror = "reddish"\n', "error:"),
        ('name = "broken"\n', "a theme needs a name and a primary colour"),
        ('primary = "#123456"\n', "a theme needs a name and a primary colour"),
    ],
    ids=["bad toml", "unknown field", "bad colour", "no primary", "no name"],
)
def test_a_malformed_theme_file_is_skipped_with_a_warning(config_home: Path, content: str, complaint: str):
    """The broken file gives one warning naming it; every other theme still loads."""
    path = user_themes(config_home) / "broken.toml"
    path.write_text(content)

    found = load_themes()

    assert sorted(found.themes) == SHIPPED
    assert len(found.warnings) == 1
    assert str(path) in found.warnings[0] and complaint in found.warnings[0]


def test_the_dashboard_shows_a_broken_theme_file_as_a_warning(config_home: Path):
    """The warning of a file that did not load is a toast when the dashboard starts; the dashboard runs on."""
    path = user_themes(config_home) / "broken.toml"
    path.write_text('name = "broken"\nprimary = "#123456')
    app = make_app()
    seen = {}

    async def scenario(pilot):
        await wait_until(pilot, lambda: app.screen.query("Toast"), "a toast")
        seen["toasts"] = ["".join("".join(lines(toast)).split()) for toast in app.screen.query("Toast")]  # unwrapped
        seen["theme"] = app.theme

    drive(app, scenario, notifications=True)

    assert len(seen["toasts"]) == 1
    assert f"theme{path}:Unterminatedstring" in seen["toasts"][0]
    assert seen["theme"] == "kvtop-dark"


def test_no_color_draws_every_view_in_monochrome(monkeypatch: pytest.MonkeyPatch):
    """`NO_COLOR` set (Textual then draws through its monochrome filter): every view, the failures tree opened, a
    rank's panel and the help draw at 80x24, and the app runs on (its filter met lines whose plain spans had no
    style at all, and the dashboard died on its first frame)."""
    monkeypatch.setenv("NO_COLOR", "1")
    app = make_app()
    seen = {}

    async def scenario(pilot):
        seen["monochrome"] = [type(found).__name__ for found in app._filters]
        for key in ("r", "f", "enter", "e", "o", "enter", "escape", "question_mark", "escape"):
            await pilot.press(key)
            await next_frame(pilot)
        seen["running"] = app.is_running
        seen["ranks"] = text(app, "#ranks-list")

    drive(app, scenario, size=(80, 24))

    assert "Monochrome" in seen["monochrome"]
    assert seen["running"]
    assert "prefill-0/TP0" in seen["ranks"]


def declarations(css: str) -> list[tuple[str, str]]:
    """(property, value) of every declaration in a stylesheet, comments dropped."""
    css = re.sub(r"/\*.*?\*/", "", css, flags=re.S)
    return [(prop.strip(), value.strip()) for block in re.findall(r"\{([^}]*)\}", css) for prop, value in
            re.findall(r"([\w-]+)\s*:\s*([^;]+);", block)]  # fmt: skip


def literal_colours(value: str) -> list[str]:
    """Words of a declaration's value that are colours by themselves (not a `$variable`)."""
    found = []
    for word in re.findall(r"[#\w().,-]+", value):
        if word.startswith("$") or re.fullmatch(r"[\d.]+(%|fr)?", word) or word in {"transparent", "auto"}:
            continue
        try:
            Color.parse(word)
        except ColorParseError:
            continue
        found.append(word)
    return found


def test_the_stylesheet_uses_theme_variables_only():
    """No `#rrggbb`, `rgb()` or named colour in kvtop.tcss or the RowList's CSS: every theme reaches every view."""
    sheets = {"kvtop.tcss": STYLESHEET.read_text(), "RowList": RowList.DEFAULT_CSS}
    found = {
        (sheet, prop, value): literal_colours(value)
        for sheet, css in sheets.items()
        for prop, value in declarations(css)
    }

    assert {key: colours for key, colours in found.items() if colours} == {}
    assert any("$error" in value or "$warning" in value for _, _, value in found)
    assert len(found) > 30


def test_the_colour_check_sees_literal_colours():
    """The check above is not blind: hex, rgb() and named colours are each found."""
    assert [literal_colours(value) for value in ("#ff0000", "rgb(1,2,3)", "red 50%", "$primary 30%", "bold")] == [
        ["#ff0000"],
        ["rgb(1,2,3)"],
        ["red"],
        [],
        [],
    ]


@pytest.mark.parametrize("how", ["option", "environment"])
def test_an_unknown_theme_is_a_usage_error_naming_the_themes_found(tmp_path: Path, how: str):
    """`kvtop top --theme nope` (or KVTOP_THEME=nope) exits 2, naming the theme and every theme it found."""
    log = tmp_path / "empty.log"
    log.touch()
    args = ["top", "--sglang-log", str(log)] + (["--theme", "nope"] if how == "option" else [])
    env = {"COLUMNS": "200"} | ({"KVTOP_THEME": "nope"} if how == "environment" else {})

    done = kvtop_here(*args, env=env)

    assert done.returncode == 2
    assert f"no theme 'nope' (found: {', '.join(SHIPPED)})" in done.stderr


def test_an_unknown_theme_is_a_usage_error_before_anything_connects():
    """`kvtop top --theme nope` exits 2 naming the theme and the ones found, without waiting for a cluster."""
    done = kvtop_here("top", "--theme", "nope", "--bootstrap", "tcp://127.0.0.1:1", "--wait", "0.2")

    assert done.returncode == 2
    assert "no theme 'nope'" in done.stderr
    assert all(name in done.stderr for name in SHIPPED)
