"""A peer's names and reasons and a log's lines reach the operator's terminal as text, never as its commands."""

from __future__ import annotations

from pathlib import Path

from kvtop_cli import kvtop_here
from rich.console import Console
from rich.text import Text

from kvtop.tui.strips import line_strip
from kvtop.views.check import CheckResult, Thresholds, Verdict
from kvtop.views.safe import in_place, one_line, terminal_safe

HOSTILE = "reason \x1b]0;PWNED-TITLE\x07\x1b[2J\x1b[31mRED\r"


def test_control_characters_are_shown_as_escapes_or_in_place_and_lines_stay_lines():
    assert terminal_safe(HOSTILE) == "reason \\x1b]0;PWNED-TITLE\\x07\\x1b[2J\\x1b[31mRED\\r"
    assert terminal_safe("a\nb\tc") == "a\nb\tc"
    assert one_line("a\nb") == "a\\nb"
    assert in_place(HOSTILE) == "reason ?]0;PWNED-TITLE??[2J?[31mRED?"
    assert in_place("\u0085x") == "?x"  # C1 too


def test_a_check_s_line_holds_no_line_break_and_no_perfdata_of_a_peer_s():
    """A suspect named `nothing | ranks_alive=64;;64 failure_rate=0\\nOK` forged perfdata and a second line."""
    forged = "incident: nothing | ranks_alive=64;;64 failure_rate=0\nOK"
    result = CheckResult(Verdict.CRITICAL, forged, 1, 1, [], [], 0, 0.0, 0, 0)

    line = result.nagios(Thresholds())

    assert "\n" not in line and line.count("|") == 1
    assert line.startswith("KVTOP CRITICAL - incident: nothing / ranks_alive=64;;64 failure_rate=0\\nOK | ")


def test_the_dashboard_draws_a_line_s_control_characters_as_text():
    strip = line_strip(Text(HOSTILE, style="bold"), Console(), 80)

    assert "\x1b" not in "".join(segment.text for segment in strip)


def test_a_log_line_s_escape_sequences_reach_no_line_view_raw(tmp_path: Path):
    log = tmp_path / "decode.log"
    log.write_text(
        "[2026-01-02 03:04:05 TP0] Decode transfer failed for request rank=0 decode_req.req.rid='r' "
        f"decode_req.req.bootstrap_room=7 with exception KVTransferError(bootstrap_room=7): {HOSTILE[:-1]}\n"
    )

    for view in ("failures", "events", "incidents", "check", "status"):
        shown = kvtop_here(view, "--sglang-log", str(log))
        assert "\x1b" not in shown.stdout + shown.stderr, view


def test_bidirectional_overrides_in_a_log_s_address_are_shown_as_escapes_not_obeyed(tmp_path: Path):
    """A decode line naming its prefill `h\\u202eost:8998` had `kvtop rooms` draw the rest of that line reversed (a
    name that shows as another's); the override is now its escape, in the views and on the dashboard."""
    from sglang_lines import decode_failure

    log = tmp_path / "decode.log"
    lost = "Lost connection with prefill instance (bootstrap_addr: h\u202eost:8998)"
    log.write_text(decode_failure("2026-07-10 22:03:12", 5, lost))

    table = kvtop_here("rooms", "--sglang-log", f"decode={log}").stdout

    assert "\u202e" not in table
    assert " h\\u202eost:8998->decode-0 " in table
    assert in_place("a\u2066b\u200fc") == "a?b?c"
