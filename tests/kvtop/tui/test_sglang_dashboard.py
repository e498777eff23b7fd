"""`kvtop top --sglang-log`: the dashboard on SGLang server logs (no agents), fed by the log-following thread."""

from __future__ import annotations

from pathlib import Path

from tui_support import drive, next_frame, text, wait_until

from kvtop.sources.sglang import SGLangLogs
from kvtop.sources.sglang.follow import LogFollower
from kvtop.tui.app import KvtopApp
from kvtop.tui.themes import load_themes
from kvtop.views.times import stamp

FIXTURES = Path(__file__).parent.parent / "fixtures" / "sglang" / "new-era"


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
