"""`kvtop top --sglang-log`: the dashboard on SGLang server logs (no agents), fed by the log-following thread."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
from textual.pilot import Pilot
from tui_support import drive, next_frame, text, wait_until

from kvtop.sources.sglang import SGLangLogs
from kvtop.sources.sglang.follow import LogFollower
from kvtop.tui.app import KvtopApp
from kvtop.tui.screens.detail import DetailScreen
from kvtop.tui.themes import load_themes
from kvtop.views.times import stamp

FIXTURES = Path(__file__).parent.parent / "fixtures" / "sglang" / "new-era"
ADDRESS = "sglang-deploy-glm-4-5-prefill:30089"


def on_logs(
    logs: list[Path], play: Callable[[KvtopApp, Pilot[None]], Awaitable[None]], size: tuple[int, int] = (200, 40)
) -> None:
    """The dashboard on `logs` as `kvtop top --sglang-log` wires it (200x40), `play` run on it."""
    follower = LogFollower(SGLangLogs(logs)).start()
    app = KvtopApp(follower, title="sglang logs", themes=load_themes(), clock=follower.now)

    async def scenario(pilot: Pilot[None]) -> None:
        await play(app, pilot)

    try:
        drive(app, scenario, size=size)
    finally:
        follower.close()


def test_the_dashboard_folds_the_failures_of_sglang_logs_and_names_the_ranks_as_from_logs():
    """Both files are read by the follower; the failures view leads with the model's incidents, the fold's groups
    under them."""
    logs = SGLangLogs([f"prefill={FIXTURES / 'prefill.log'}", f"decode={FIXTURES / 'decode.log'}"])
    follower = LogFollower(logs).start()
    app = KvtopApp(follower, title="sglang logs", themes=load_themes(), clock=follower.now)
    seen: dict[str, object] = {}

    async def scenario(pilot):
        await wait_until(pilot, lambda: follower.logs.stats().failures > 0, "the logs read")
        await pilot.press("f")
        await next_frame(pilot)
        seen["health"] = text(app, "#health")
        seen["title"] = text(app, "#failures-title")
        with follower.lock:
            seen["groups"] = follower.model.groups()
            seen["ranks"] = len(follower.model.ranks)
            seen["incidents"] = len(follower.model.incidents.incidents)

    try:
        drive(app, scenario)
    finally:
        follower.close()

    groups = seen["groups"]
    assert isinstance(groups, list) and groups
    assert f"{seen['ranks']} ranks from logs" in str(seen["health"])
    assert str(seen["title"]).startswith(f"{seen['incidents']} incidents (")
    first = min(group.first_ts for group in groups)
    assert f", {len(groups)} failure groups since {stamp(first)[:-4]} under them" in str(seen["title"])


CRASH = Path(__file__).parent.parent / "fixtures" / "sglang" / "scheduler-crash"


def test_the_dashboard_names_a_crashed_rank_in_the_health_line_its_row_and_its_history():
    """prefill-0/TP2's scheduler crashed (its log's traceback): `1 rank crashed` in the health line, `crashed` as
    its state in the rank grid (its peers stay `log`), and the crash in its history (enter on its row)."""
    seen: dict[str, str] = {}

    async def play(app: KvtopApp, pilot: Pilot[None]) -> None:
        await wait_until(pilot, lambda: "crashed" in text(app, "#ranks-list"), "the crashed rank in the grid")
        seen["health"], seen["ranks"] = text(app, "#health"), text(app, "#ranks-list")
        rows = [line for line in seen["ranks"].splitlines() if line.strip()]
        row = next(i for i, line in enumerate(rows) if line.startswith("prefill-0/TP2"))
        await pilot.press(*["down"] * row, "enter")
        await wait_until(pilot, lambda: isinstance(app.screen, DetailScreen), "the rank's history")
        seen["history"] = app.screen.body.plain

    on_logs([CRASH / "prefill.log", CRASH / "decode.log"], play)

    assert " 1 rank crashed " in seen["health"]
    rows = {line.split()[0]: line.split()[1:] for line in seen["ranks"].splitlines() if line.strip()}
    assert {label: "crashed" in cells for label, cells in rows.items()} == {
        "prefill-0/TP0": False, "prefill-0/TP2": True, "decode-0/TP0": False, "decode-0/TP1": False,
    }  # fmt: skip
    assert seen["history"].startswith("prefill-0/TP2  prefill")
    assert (
        "crashed prefill-0/TP2 at 22:03:02: Scheduler hit an exception: KeyError: 4793981895866140836"
        in (seen["history"])
    )


def test_the_dashboard_on_a_file_that_is_no_sglang_log_says_so_in_its_health_line(tmp_path: Path):
    """A wrong path given to `kvtop top --sglang-log` showed an empty cluster with nothing wrong."""
    passwd = tmp_path / "passwd"
    passwd.write_text("root:x:0:0:root:/root:/bin/bash\n")
    seen: dict[str, str] = {}

    async def play(app: KvtopApp, pilot: Pilot[None]) -> None:
        await wait_until(pilot, lambda: "source:" in text(app, "#health"), "the source's problem on the health line")
        seen["health"] = text(app, "#health")

    on_logs([passwd], play)

    assert f"source: nothing read from {passwd}: not an SGLang server log" in seen["health"]


@pytest.mark.usefixtures("utc")
def test_an_incident_with_failures_that_named_no_room_counts_them_on_the_dashboard():
    """A bootstrap server decode could not reach (3 failures naming no room), then 2 rooms lost at its address:
    the failures tree says both, the overview's incidents panel `2+3` (as `kvtop incidents`)."""
    fixture = Path(__file__).parent.parent / "fixtures" / "sglang" / "bootstrap-unreachable" / "decode.log"
    seen: dict[str, str] = {}

    async def play(app: KvtopApp, pilot: Pilot[None]) -> None:
        await wait_until(pilot, lambda: "bootstrap_error" in text(app, "#incidents"), "the incident on the overview")
        seen["panel"] = text(app, "#incidents")
        await pilot.press("f")
        await wait_until(pilot, lambda: "naming none" in text(app, "#failure-tree"), "the incident in the tree")
        seen["tree"] = text(app, "#failure-tree")

    on_logs([fixture], play)

    assert "  2+3  prefill at sglang-deploy-glm-4-5-prefill:30089" in seen["panel"]
    assert "stopped answering (bootstrap_error)  2 rooms and 3 failures naming none  since 11:56:51" in seen["tree"]


@pytest.mark.parametrize(
    ("width", "who", "what"),
    [
        (160, "  2+3  prefill at sglang-depl…-glm-4-5-prefill:30089", "       stopped answering (bootstrap_error)"),
        (200, f"  2+3  prefill at {ADDRESS}", "       stopped answering (bootstrap_error)  since 11:56:51"),
        (220, f"  2+3  prefill at {ADDRESS}  since 11:56:51", "       stopped answering (bootstrap_error)"),
    ],
)
def test_a_suspect_wider_than_the_incidents_panel_keeps_its_port_and_since_moves_down(width: int, who: str, what: str):
    """At 160x45 (the README's screenshot size) the panel cut `prefill at sglang-deploy-glm-4-5-prefill:30089  since
    11:56:51` at its right edge, to `...-prefill:30`: the port, what tells one prefill server from another, and the
    start were lost, and at 200 the start was cut to `since 11`. The suspect keeps its start and its port; since when
    sits beside it where the panel has room, else on the line below where it fits there, whole or not at all."""
    fixture = Path(__file__).parent.parent / "fixtures" / "sglang" / "bootstrap-unreachable" / "decode.log"
    seen: list[str] = []

    async def play(app: KvtopApp, pilot: Pilot[None]) -> None:
        await wait_until(pilot, lambda: "bootstrap_error" in text(app, "#incidents"), "the incident on the overview")
        seen.extend(text(app, "#incidents").splitlines()[:2])

    on_logs([fixture], play, size=(width, 45))

    assert seen == [who, what]


def test_the_overview_of_logs_says_they_tell_no_throughput_instead_of_a_0_scale():
    """Server logs time no transfer: the throughput chart says so, and shows no `0 B/s` peak to read as idle."""
    lost = Path(__file__).parent.parent / "fixtures" / "sglang" / "lost-prefill"
    seen: dict[str, str] = {}

    async def play(app: KvtopApp, pilot: Pilot[None]) -> None:
        await wait_until(pilot, lambda: "ranks from logs" in text(app, "#health"), "the logs read")
        seen["title"], seen["graph"] = text(app, "#throughput-title"), text(app, "#throughput-graph")

    on_logs([lost / "decode.log", lost / "prefill.log"], play)

    assert seen["title"] == "Throughput  none: server logs time no transfer"
    assert seen["graph"].splitlines()[-1].strip() == "server logs tell no throughput"
    assert "B/s" not in seen["graph"]


def test_the_links_panel_on_logs_shows_the_failed_rooms_of_each_link_and_no_rate():
    """Both sides of rooms that failed name their link; logs time no transfer, so its cell is its failed rooms
    alone: no `0 B/s` that reads as a link measured idle."""
    seen: dict[str, str] = {}

    async def play(app: KvtopApp, pilot: Pilot[None]) -> None:
        await wait_until(pilot, lambda: "✗" in text(app, "#links"), "a link's failed rooms shown")
        seen["links"] = text(app, "#links")

    on_logs([FIXTURES / "prefill.log", FIXTURES / "decode.log"], play)

    header, *rows = seen["links"].splitlines()
    assert header.split() == ["10.0.0.7:15004", "10.0.0.9:15006", "decode-0"]  # sessions prefill-0 sent to
    assert [row.split() for row in rows] == [["10.0.0.5:8998", "-", "-", "✗1"], ["prefill-0", "✗1", "✗1", "✗4"]]
    assert "B/s" not in seen["links"]


def test_the_links_panel_names_the_prefill_a_decode_lost_by_its_bootstrap_address():
    """lost-prefill's rooms failed on decode-0 alone, whose lines name the prefill at 10.0.0.5:8998: the panel said
    `none: server logs time no transfer` (no link had both sides); now its row is the address, with 5 failed."""
    seen: dict[str, str] = {}

    async def play(app: KvtopApp, pilot: Pilot[None]) -> None:
        await wait_until(pilot, lambda: "✗" in text(app, "#links"), "a link's failed rooms shown")
        seen["links"] = text(app, "#links")

    lost = FIXTURES.parent / "lost-prefill"
    on_logs([lost / "decode.log", lost / "prefill.log"], play)

    header, row = seen["links"].splitlines()
    assert header.split() == ["decode-0"]
    assert row.split() == ["10.0.0.5:8998", "✗5"]
