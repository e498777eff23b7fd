"""The time options of every view: how times are written, SGLang logs cut at --at and windowed by --since,
and what a view says of a damaged or foreign recording."""

from __future__ import annotations

import json
import os
import struct
import time
from pathlib import Path

import pytest

from kvtop.model.cluster import ClusterModel
from kvtop.record.format import FILE_HEADER, checksum
from kvtop.record.reader import Recording
from kvtop.record.synthetic import feed
from kvtop.record.writer import Recorder
from kvtop.source.when import parse_duration, parse_time, pick
from kvtop.sources.synthetic import SyntheticCluster
from kvtop.views.times import stamp
from tests.kvtop.kvtop_cli import kvtop, kvtop_here

FIXTURES = Path(__file__).parents[1] / "fixtures" / "sglang" / "old-era"
LOGS = ("--sglang-log", str(FIXTURES / "prefill.log"), "--sglang-log", f"decode={FIXTURES / 'decode.log'}")


@pytest.mark.parametrize(
    ("text", "offset"),
    [("now", 0.0), ("5 minutes ago", -300.0), ("90s ago", -90.0), ("2 hours ago", -7200.0), ("1 day ago", -86400.0)],
)
def test_relative_times_count_back_from_now(text: str, offset: float) -> None:
    """`N UNIT ago` and `now` are relative to the wall clock."""
    assert parse_time(text, now=1_800_000_000.0) == 1_800_000_000.0 + offset


def test_absolute_times_are_iso_epoch_or_a_time_of_day() -> None:
    """ISO with a zone, epoch seconds, and a time of day today (local)."""
    assert parse_time("2027-01-15T08:00:00Z") == 1_800_000_000.0
    assert parse_time("2027-01-15T09:00:00+01:00") == 1_800_000_000.0
    assert parse_time("1780000000.5") == 1_780_000_000.5
    today = time.localtime()
    assert time.localtime(parse_time("03:00"))[:5] == (*today[:3], 3, 0)


def test_bad_times_and_durations_name_the_forms_accepted() -> None:
    """A time or duration that is none: ValueError with examples; --since after --until is refused."""
    with pytest.raises(ValueError, match="is not a time"):
        parse_time("yesterday")
    with pytest.raises(ValueError, match="is not a duration"):
        parse_duration("forever")
    assert parse_duration("24h") == 86400.0
    with pytest.raises(ValueError, match=r"^--since is after --until \(--since 1780000010, --until 1780000000\)$"):
        pick("", "1780000010", "1780000000")
    with pytest.raises(ValueError, match=r"^--since is after --at \(--since 10:00, --at 09:00\)$"):
        pick("09:00", "10:00", "")  # it said --until, an option not given
    for at, since, until, option in [("x", "", "", "--at"), ("", "x", "", "--since"), ("", "", "x", "--until")]:
        with pytest.raises(ValueError, match=f"^{option}: 'x' is not a time"):
            pick(at, since, until)


def test_a_bad_time_option_is_named_in_the_usage_error() -> None:
    """A bad time said "Invalid value: 'next year' is not a time", not which of --since, --until and --at."""
    result = kvtop_here("failures", *LOGS, "--since", "03:00", "--until", "next year")
    assert result.returncode == 2
    assert "--until: 'next year' is not a time" in result.stderr, result.stderr


@pytest.mark.processes
def test_logs_read_up_to_at_and_list_failures_since(utc: None) -> None:
    """--until cuts the logs, --since starts the list; status judges at --at."""
    window = kvtop("failures", "--json", *LOGS, "--since", "1767323062", "--until", "1767323082")
    assert window.returncode == 0, window.stderr
    assert [group["room"] for group in json.loads(window.stdout)["groups"]] == [3333, 4444, 5555, 6666]
    status = kvtop("status", "--json", *LOGS, "--at", "2026-01-02T03:04:30Z")
    assert status.returncode == 0, status.stderr
    assert json.loads(status.stdout)["failures"] == 4


def test_time_options_without_a_recording_or_logs_are_a_usage_error() -> None:
    """--at on a live cluster means nothing: exit 2 saying what it needs."""
    result = kvtop_here("status", "--bootstrap", "tcp://127.0.0.1:9", "--at", "now")
    assert result.returncode == 2
    assert "read a recording (--replay) or logs" in result.stderr


def _recording(folder: Path) -> None:
    recorder = Recorder(folder, keyframe_events=1000, segment_bytes=20_000, flush_s=3600.0)
    feed(recorder, ClusterModel(), SyntheticCluster(spacing_s=0.001), passes=30, rooms_per_pass=20)
    recorder.close()


@pytest.mark.processes
def test_a_damaged_segment_is_said_on_stderr_and_the_view_answers(tmp_path: Path) -> None:
    """A segment with a garbage header: `recording damaged: 1 segments skipped`, and status still answers."""
    _recording(tmp_path / "rec")
    segments = sorted((tmp_path / "rec").glob("*.kvr"))
    assert len(segments) >= 3
    segments[1].write_bytes(b"garbage!" + segments[1].read_bytes()[8:])
    result = kvtop("status", "--replay", str(tmp_path / "rec"), "--json")
    assert result.returncode == 0, result.stderr
    assert "recording damaged: 1 segments skipped" in result.stderr
    assert json.loads(result.stdout)["ranks"]["total"] == 8
    check = kvtop("check", "--replay", str(tmp_path / "rec"))  # the damage on its line too, where monitoring reads
    assert check.returncode in (1, 2) and "recording damaged: 1 segments skipped" in check.stdout.partition(" | ")[0]


@pytest.mark.processes
def test_a_fifo_named_like_a_segment_or_an_index_is_skipped_not_waited_on(tmp_path: Path) -> None:
    """Opening a FIFO waits for a writer: a view of a folder holding one named like a segment (or an index)
    hung. It is skipped and counted like any segment that is none; given as the recording, a clear error."""
    _recording(tmp_path / "rec")
    os.mkfifo(tmp_path / "rec" / "seg-01780000009999999-000099.kvr")
    index = sorted((tmp_path / "rec").glob("*.kvr.idx"))[0]
    index.unlink()
    os.mkfifo(index)
    result = kvtop("status", "--replay", str(tmp_path / "rec"), "--json")
    assert result.returncode == 0, result.stderr
    assert "recording damaged: 1 segments skipped" in result.stderr
    assert json.loads(result.stdout)["ranks"]["total"] == 8
    alone = kvtop("status", "--replay", str(tmp_path / "rec" / "seg-01780000009999999-000099.kvr"))
    assert alone.returncode == 2
    assert "neither a folder nor a regular file" in alone.stderr


@pytest.mark.processes
def test_a_recording_of_another_schema_is_an_error_naming_both(tmp_path: Path) -> None:
    """Exit 2, one line: the schema found and the one this kvtop reads."""
    _recording(tmp_path / "rec")
    for segment in (tmp_path / "rec").glob("*.kvr"):
        data = bytearray(segment.read_bytes())
        struct.pack_into("<H", data, 8, 7)
        struct.pack_into("<I", data, FILE_HEADER.size - 4, checksum(bytes(data[: FILE_HEADER.size - 4])))
        segment.write_bytes(bytes(data))
    result = kvtop("failures", "--replay", str(tmp_path / "rec"))
    assert result.returncode == 2
    assert "recording schema 7, this kvtop reads schema 1" in result.stderr


@pytest.mark.parametrize(("option", "clock"), [("--at", "09:00:20"), ("--since", "09:00:35")])
def test_a_time_of_day_for_logs_of_another_day_is_refused_saying_the_time_to_give(
    utc: None, tmp_path: Path, option: str, clock: str
) -> None:
    """`--at 09:00:20` on logs of 2021-03-05 is today's 09:00:20: refused with the span the logs tell, and now the
    time meant, written to be typed again (an operator at 03:00 was left to work the date out from the span)."""
    lost = Path(__file__).parents[1] / "fixtures" / "sglang" / "lost-prefill" / "decode.log"
    log = tmp_path / "decode.log"
    log.write_text(lost.read_text().replace("[2026-03-05 ", "[2021-03-05 "))

    view = kvtop_here("incidents", "--sglang-log", str(log), option, clock)
    check = kvtop_here("check", "--sglang-log", str(log), option, clock)
    elsewhere = kvtop_here("incidents", "--sglang-log", str(log), option, "11:00")  # no instant of the logs

    hint = f"(a time of day is today's: {option} 2021-03-05T{clock} is within them)"
    assert (view.returncode, check.returncode) == (2, 3)
    assert view.stderr.rstrip().endswith(hint) and check.stdout.rstrip().endswith(hint)
    assert elsewhere.returncode == 2 and "a time of day is today's" not in elsewhere.stderr


@pytest.mark.processes
def test_a_time_of_day_outside_a_recording_of_another_day_says_the_time_to_give(utc: None, tmp_path: Path) -> None:
    """The same on a recording: `--at HH:MM:SS` of an instant it holds, on its own day."""
    _recording(tmp_path / "rec")
    recording = Recording(tmp_path / "rec")
    middle = time.gmtime((recording.start + recording.end) / 2)
    clock, day = time.strftime("%H:%M:%S", middle), time.strftime("%Y-%m-%d", middle)
    assert time.strftime("%Y-%m-%d", time.gmtime()) != day

    result = kvtop("status", "--replay", str(tmp_path / "rec"), "--at", clock)

    assert result.returncode == 2
    assert result.stderr.rstrip().endswith(f"(a time of day is today's: --at {day}T{clock} is within them)")


def test_dump_of_times_outside_the_recording_names_the_span_it_holds(tmp_path: Path) -> None:
    """`kvtop dump --since 17:00 --until 17:01` said only that they select nothing; the views say the recording's
    span (to type a time within it again), and so does dump now."""
    _recording(tmp_path / "rec")
    recording = Recording(tmp_path / "rec")

    result = kvtop_here("dump", "--replay", str(tmp_path / "rec"), "--since", "1000000000", "--until", "1000000060")

    span = f"{stamp(recording.start, dated=True)} to {stamp(recording.end, dated=True)}"
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr.strip() == f"kvtop: --since/--until select nothing of the recording: it runs from {span}"
