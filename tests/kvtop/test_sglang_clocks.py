"""SGLang logs whose servers' clocks disagree (one logs UTC, the other local time; a host whose NTP stopped):
estimated from the rooms both sides name, said, and corrected onto the first log's clock before the fold."""

from __future__ import annotations

import calendar
import gzip
import json
from pathlib import Path

import pytest
from kvtop_cli import kvtop_here
from sglang_lines import decode_failure, prefill_failure, shifted

from kvtop.model.cluster import ClusterModel
from kvtop.model.fold import FailureGroup
from kvtop.sources.sglang import SGLangLogs, load
from kvtop.sources.sglang.clocks import ClockOffset

pytestmark = pytest.mark.usefixtures("utc")

FIXTURES = Path(__file__).parent / "fixtures" / "sglang"
HOUR = 3600.0
ECHO = "Failed to get kvcache from prefill instance, it might be dead"


def shape(groups: list[FailureGroup]) -> list[tuple[int, str, str, list[str]]]:
    """Groups as (room, origin label, origin class, sorted echo ranks)."""
    return [
        (g.room, g.origin_label, g.origin.reason_class if g.origin else "", sorted(e.rank for e in g.echoes))
        for g in groups
    ]


def copied(fixture: Path, folder: Path, off_s: float = 0.0) -> Path:
    """A fixture's log copied into `folder`, its server's clock `off_s` off."""
    folder.mkdir(exist_ok=True)
    text = fixture.read_bytes().decode(errors="surrogateescape")
    copy = folder / fixture.name
    copy.write_bytes(shifted(text, off_s).encode(errors="surrogateescape"))
    return copy


def new_era(tmp_path: Path, decode_off_s: float) -> list[Path]:
    """The new-era fixture's prefill log, and its decode log with the decode's clock `decode_off_s` off."""
    era = FIXTURES / "new-era"
    return [copied(era / "prefill.log", tmp_path), copied(era / "decode.log", tmp_path, decode_off_s)]


def a_dead_peer(tmp_path: Path, decode_off_s: float, rooms: int = 6) -> list[str]:
    """A prefill whose sends to its decode fail, room after room, and the decode's echo of each half a second
    later, its clock `decode_off_s` off: `--sglang-log` arguments."""
    prefill, decode = tmp_path / "prefill.log", tmp_path / "decode.log"
    sends = [f"2026-03-04 12:00:{10 + 5 * n:02d}.000" for n in range(rooms)]
    prefill.write_text(
        "".join(
            prefill_failure(ts, 100 + n, f"Failed to send kv chunk of {100 + n} to 10.0.0.7:15004")
            for n, ts in enumerate(sends)
        )
    )
    echoes = [f"2026-03-04 12:00:{10 + 5 * n:02d}.500" for n in range(rooms)]
    decode.write_text(shifted("".join(decode_failure(ts, 100 + n, ECHO) for n, ts in enumerate(echoes)), decode_off_s))
    return ["--sglang-log", f"prefill={prefill}", "--sglang-log", f"decode={decode}"]


def test_a_decode_log_an_hour_behind_folds_its_echoes_under_the_prefill_origins_as_if_in_step(tmp_path: Path):
    """The new-era decode log written an hour behind (UTC against local time): the same groups as the logs in
    step, each decode echo under the prefill origin of its room, not under "origin unknown" an hour away."""
    in_step, behind = ClusterModel(), ClusterModel()
    in_step_logs = load(new_era(tmp_path / "in-step", 0.0), in_step)
    logs = load(new_era(tmp_path / "behind", -HOUR), behind)

    assert shape(behind.groups()) == shape(in_step.groups())
    assert logs.told_span == in_step_logs.told_span  # --since and --at cut the logs where they would in step
    assert logs.stats().clocks == {"decode-0": ClockOffset(-HOUR, "prefill-0", True)}


def test_a_decode_in_utc_and_a_prefill_in_local_time_make_one_incident_and_status_and_check_say_so(tmp_path: Path):
    """A prefill whose sends fail logged at UTC+8, its decode's echoes logged in UTC: one incident (the echoes under
    their origins), and `status` and `check` (WARNING at least) say the decode's clock is 8 hours behind and its
    times corrected, in text and JSON."""
    logs = a_dead_peer(tmp_path, -8 * HOUR)

    found = json.loads(kvtop_here("incidents", "--json", *logs).stdout)["incidents"]
    status = kvtop_here("status", *logs)
    status_json = json.loads(kvtop_here("status", "--json", *logs).stdout)
    check = kvtop_here("check", "--json", *logs)
    verdict = json.loads(check.stdout)

    said = "decode-0 is 28800 s behind prefill-0 (times corrected; whole hours: one logs UTC, the other local time?)"
    assert [(i["room_count"], i["origins"], i["echoes"]) for i in found] == [(6, 6, 6)]
    assert f"clock   {said}" in status.stdout.splitlines()
    assert status_json["logs"]["clocks"] == {
        "decode-0": {"offset_s": -28800.0, "against": "prefill-0", "whole_hours": True, "corrected": True}
    }
    assert check.returncode >= 1
    assert f"clocks of the logs differ: {said}" in [p.removeprefix("warning: ") for p in verdict["problems"]]
    assert verdict["log_clocks"] == {"decode-0": -28800.0}


@pytest.mark.parametrize(
    ("off_s", "found"),
    [
        (437.0, {"decode-0": ClockOffset(437.5, "prefill-0", False)}),  # NTP stopped: the median, not whole hours
        (-HOUR - 20, {"decode-0": ClockOffset(-HOUR, "prefill-0", True)}),  # a timezone, each echo's lag its own
        (90.0, {}),  # under two minutes: left as written
        (20 * HOUR, {"decode-0": ClockOffset(20 * HOUR + 0.5, "prefill-0", False)}),  # whole hours past any zone's
    ],
)
def test_a_decode_clock_off_is_estimated_from_the_rooms_both_sides_name(
    tmp_path: Path, off_s: float, found: dict[str, ClockOffset]
):
    """Each room's echo half a second after its origin, on a decode clock `off_s` off: the offset is the median of
    the rooms' differences (the echoes' lag with it), whole hours where it is within a minute of them; under two
    minutes nothing is said and the times stay as written."""
    logs = a_dead_peer(tmp_path, off_s)
    read = SGLangLogs(logs[1::2])
    model = ClusterModel()
    read.load(model)

    assert read.stats().clocks == found
    times = {f.rank.partition("-")[0]: f.ts for f in model.failures if f.room == 100}
    corrected = found["decode-0"].offset_s if found else 0.0
    assert times["decode"] - times["prefill"] == pytest.approx(0.5 + off_s - corrected)


def test_rooms_the_decode_timed_out_are_no_clock_difference(tmp_path: Path):
    """A client aborts rooms on the prefill, and the decode, told nothing, times each out 300 s later (SGLang PR
    #28651): a wait, not a clock. Nothing is said, nothing moved: the fold makes each timeout an echo of its abort."""
    prefill, decode = tmp_path / "prefill.log", tmp_path / "decode.log"
    prefill.write_text(
        "".join(prefill_failure(f"2026-03-04 12:00:{n:02d}", n, "Aborted by AbortReq.") for n in range(1, 6))
    )
    decode.write_text(
        "".join(
            decode_failure(
                f"2026-03-04 12:05:{n:02d}", n, f"Request {n} timed out after 300.0s in KVPoll.WaitingForInput"
            )
            for n in range(1, 6)
        )
    )
    model = ClusterModel()
    logs = load([f"prefill={prefill}", f"decode={decode}"], model)

    assert logs.stats().clocks == {}
    assert [(g.origin_label, g.echo_count) for g in model.groups()] == [("prefill-0/TP0", 1)] * 5


def test_one_node_of_a_multinode_decode_an_hour_ahead_is_named_by_its_log_and_corrected(tmp_path: Path):
    """DeepSeek-R1 over two nodes a side, the log of the decode's second node an hour ahead: that node alone is
    corrected (the others agree), named by its instance and its log, and each room is one failure again."""
    paths = [
        copied(path, tmp_path, HOUR if path.name == "decode-aihub6.log" else 0.0)
        for path in sorted((FIXTURES / "multinode").glob("*.log"))
    ]
    in_step, ahead = ClusterModel(), ClusterModel()
    load(sorted((FIXTURES / "multinode").glob("*.log")), in_step)
    logs = load(paths, ahead)

    assert logs.stats().clocks == {
        "decode-0 (decode-aihub6.log)": ClockOffset(HOUR, "decode-0 (decode-aihub3.log)", True)
    }
    assert shape(ahead.groups()) == shape(in_step.groups())


def test_a_log_whose_clock_steps_back_is_said_by_check_and_read_as_written(tmp_path: Path):
    """A decode whose clock is set back an hour mid-log (NTP stepping a clock that ran fast): `check` warns with
    when and how far; its lines keep the times they were written with."""
    decode = tmp_path / "decode.log"
    decode.write_text(
        decode_failure("2026-03-04 12:00:00.000", 1, ECHO)
        + decode_failure("2026-03-04 12:10:00.000", 2, ECHO)
        + decode_failure("2026-03-04 11:10:30.000", 3, ECHO)
        + decode_failure("2026-03-04 11:10:40.000", 4, ECHO)
    )
    model = ClusterModel()
    logs = load([decode], model)
    check = json.loads(kvtop_here("check", "--json", "--sglang-log", str(decode)).stdout)

    said = "decode-0's times step back 3570 s at 2026-03-04 11:10:30 (its clock was set back: read as written)"
    assert logs.stats().clock_lines() == [said]
    assert f"a log's clock stepped back: {said}" in [p.removeprefix("warning: ") for p in check["problems"]]
    noon = calendar.timegm((2026, 3, 4, 12, 0, 0))
    assert {f.room: f.ts - noon for f in model.failures} == {1: 0.0, 2: 600.0, 3: -2970.0, 4: -2960.0}


def test_a_gzipped_decode_log_behind_is_compared_and_corrected_too(tmp_path: Path):
    """A rotated decode log kept as `.gz`, an hour behind: its rooms are read for the comparison as its lines are."""
    prefill, decode = new_era(tmp_path, -HOUR)
    zipped = decode.with_name("decode.log.1.gz")
    zipped.write_bytes(gzip.compress(decode.read_bytes()))
    in_step, behind = ClusterModel(), ClusterModel()
    load(new_era(tmp_path / "in-step", 0.0), in_step)
    logs = load([prefill, f"decode={zipped}"], behind)

    assert logs.stats().clocks == {"decode-0": ClockOffset(-HOUR, "prefill-0", True)}
    assert shape(behind.groups()) == shape(in_step.groups())


def test_rooms_a_client_numbered_and_another_cluster_reused_days_later_move_no_clock(tmp_path: Path):
    """A benchmark that numbers its rooms 1..50 itself, run on one cluster and, three days later, on another whose
    decode fails the same rooms a little slower: the rooms agree on three days, which no clock explains. It is said
    (left as written, not corrected), `check` lists no corrected offset, and each log keeps its own times."""
    prefill, decode = tmp_path / "prefill.log", tmp_path / "decode.log"
    noon = calendar.timegm((2026, 3, 4, 12, 0, 0))

    def stamp(day: int, seconds: int) -> str:
        return f"2026-03-{day:02d} 12:{seconds // 60:02d}:{seconds % 60:02d}.000"

    prefill.write_text("".join(prefill_failure(stamp(4, 5 * n), n, "Failed to send kv chunk") for n in range(1, 51)))
    decode.write_text("".join(decode_failure(stamp(7, 6 * n), n, ECHO) for n in range(1, 51)))
    model = ClusterModel()
    logs = load([f"prefill={prefill}", f"decode={decode}"], model)
    check = json.loads(kvtop_here("check", "--json", "--sglang-log", str(prefill), "--sglang-log", str(decode)).stdout)

    offset = logs.stats().clocks["decode-0"]
    assert (offset.against, offset.whole_hours, offset.corrected) == ("prefill-0", False, False)
    assert offset.offset_s == pytest.approx(3 * 24 * HOUR + 25.5, abs=1.0)
    assert min(f.ts for f in model.failures if f.rank.startswith("decode")) == noon + 3 * 24 * HOUR + 6
    assert check["log_clocks"] == {}
    assert any("(left as written: more than a day is no clock's" in p for p in check["problems"])
