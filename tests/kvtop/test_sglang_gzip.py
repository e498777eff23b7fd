"""Damaged `.gz` logs (cut short, corrupt, not gzip): what came before the damage is used, the damage is named."""

from __future__ import annotations

import gzip
import json
import logging
import zlib
from pathlib import Path

import pytest
from kvtop_cli import kvtop, kvtop_here

from kvtop.model.cluster import ClusterModel
from kvtop.sources.sglang import SGLangLogs, load
from kvtop.sources.sglang.follow import LogFollower

pytestmark = pytest.mark.usefixtures("utc")

ABORTS = Path(__file__).parent / "fixtures" / "sglang" / "aborts"
TEXT = (ABORTS / "prefill.log").read_bytes()
HALF = TEXT.index(b"\n", TEXT.index(b"c103")) + 1
"""The fixture up to room 103's line: what a file cut short after it still gives."""


def cut_short(path: Path) -> Path:
    """The fixture gzipped with a full flush after room 103's line, then cut a few bytes past the flush."""
    compressor = zlib.compressobj(6, zlib.DEFLATED, 31)
    head = compressor.compress(TEXT[:HALF]) + compressor.flush(zlib.Z_FULL_FLUSH)
    whole = head + compressor.compress(TEXT[HALF:]) + compressor.flush()
    path.write_bytes(whole[: len(head) + 8])
    return path


def damaged_files(tmp_path: Path) -> dict[str, Path]:
    """One file per kind of damage, by the words the summary uses for it."""
    corrupt = bytearray(gzip.compress(TEXT))
    corrupt[len(corrupt) // 2 : len(corrupt) // 2 + 8] = b"\xff" * 8
    (tmp_path / "corrupt.log.gz").write_bytes(bytes(corrupt))
    (tmp_path / "plain.log.gz").write_bytes(TEXT)
    return {
        "cut short": cut_short(tmp_path / "cut.log.gz"),
        "corrupt": tmp_path / "corrupt.log.gz",
        "not gzip": tmp_path / "plain.log.gz",
    }


def test_a_gzip_cut_short_gives_the_failures_before_the_cut_and_names_the_damage(tmp_path: Path):
    """Rooms 101-103 come from the readable part; stats name the file and say it was cut short."""
    model = ClusterModel()
    logs = load([f"prefill={cut_short(tmp_path / 'cut.log.gz')}"], model)

    stats = logs.stats()

    assert sorted({group.room for group in model.groups()}) == [101, 102, 103]
    assert len(stats.damaged) == 1 and stats.damaged[0].startswith(f"{tmp_path / 'cut.log.gz'}: cut short")
    assert "1 damaged" in stats.summary()


@pytest.mark.processes
@pytest.mark.parametrize("kind", ["cut short", "corrupt", "not gzip"])
def test_every_view_on_a_damaged_gzip_exits_as_on_garbled_input_and_names_the_file(tmp_path: Path, kind: str):
    """failures, events and status exit 0 and check gives its verdict (CRITICAL: the files hold failures); stderr
    names the file; no traceback."""
    path = damaged_files(tmp_path)[kind]
    logs = ("--sglang-log", f"prefill={path}", "--sglang-log", f"decode={ABORTS / 'decode.log'}")

    failures = kvtop("failures", "--json", *logs)
    events = kvtop("events", *logs)
    status = kvtop("status", "--json", *logs)
    check = kvtop("check", "--json", *logs)

    assert (failures.returncode, events.returncode, status.returncode, check.returncode) == (0, 0, 0, 2)
    for result in (failures, events, status):
        assert f"{path}: " in result.stderr and "Traceback" not in result.stderr and "Aborted!" not in result.stderr
    assert {102, 103} <= {group["room"] for group in json.loads(failures.stdout)["groups"]}, "the decode file is whole"
    assert json.loads(status.stdout)["logs"]["damaged"][0].startswith(f"{path}: {kind.split()[0]}")
    assert json.loads(check.stdout)["verdict"] == "CRITICAL"  # the readable rooms' incidents


def test_the_follower_survives_a_damaged_gzip_and_keeps_following_the_other_files(tmp_path: Path, wait_for):
    """A cut .gz beside a growing log: the follower names the damage and still applies the lines that come."""
    decode = tmp_path / "decode.log"
    decode.write_bytes((ABORTS / "decode.log").read_bytes())
    follower = LogFollower(SGLangLogs([f"prefill={cut_short(tmp_path / 'cut.log.gz')}", f"decode={decode}"])).start()
    try:
        wait_for(lambda: "cut short" in follower.error, timeout=10, what="the damage named")
        with decode.open("a") as grown:
            grown.write(
                "[2026-03-04 05:07:00.000 TP1] Decode transfer failed for request rank=1 decode_req.req.rid='d106' "
                "decode_req.req.bootstrap_room=106 with exception KVTransferError(bootstrap_room=106): "
                "Request 106 timed out after 300.0s in KVPoll.WaitingForInput\n"
            )

        def has_room_106() -> bool:
            with follower.lock:
                return any(group.room == 106 for group in follower.model.groups())

        wait_for(has_room_106, timeout=10, what="the line added after the damage")
    finally:
        follower.close()
    assert follower.died is None
    assert str(tmp_path / "cut.log.gz") in follower.error


def test_a_follower_thread_that_dies_anyway_is_loud(tmp_path: Path, wait_for, caplog: pytest.LogCaptureFixture):
    """A model that raises on apply kills the thread: the traceback is logged, `died` and `error` say so."""
    log = tmp_path / "decode.log"
    log.write_bytes((ABORTS / "decode.log").read_bytes())
    follower = LogFollower(SGLangLogs([f"decode={log}"]))

    def broken(*_: object) -> None:
        raise RuntimeError("model broke")

    follower.model.apply = broken  # type: ignore[method-assign]
    with caplog.at_level(logging.ERROR):
        follower.start()
        try:
            wait_for(lambda: follower.died is not None, timeout=10, what="the follower thread died")
        finally:
            follower.close()

    assert "follower died: RuntimeError('model broke')" in follower.error
    assert any(record.exc_info and "model broke" in str(record.exc_info[1]) for record in caplog.records)


def test_the_follower_says_when_its_lines_named_no_rank_rather_than_show_an_empty_healthy_cluster(
    tmp_path: Path, wait_for
):
    """Lines kvtop could not read (a failure line cut before its exception) showed `0/0 ranks alive` and nothing
    wrong; the health line now says no rank was named in what was read, and how much was garbled."""
    log = tmp_path / "decode.log"
    log.write_text("[2026-03-11 21:03:05 TP0] Decode transfer failed for request rank=0 rid='a' with\nplain text\n")
    follower = LogFollower(SGLangLogs([str(log)])).start()
    try:
        wait_for(lambda: "no rank named" in follower.error, timeout=10, what="the logs said to name no rank")
    finally:
        follower.close()

    assert follower.error == "no rank named in 2 lines read, 1 garbled"


def test_a_check_names_a_log_read_only_up_to_its_damage_on_its_line(tmp_path: Path):
    """A gzip cut short whose readable part held no failure was `KVTOP OK`, exit 0: what came after the cut is
    unknown, so the check is at least WARNING, the damage on its line (it was said on stderr only)."""
    text = b"[2026-03-04 05:06:00 TP0] Prefill batch, #new-seq: 1, #new-token: 4, #queue-req: 0\n" * 50
    compressor = zlib.compressobj(6, zlib.DEFLATED, 31)
    head = compressor.compress(text) + compressor.flush(zlib.Z_FULL_FLUSH)
    cut = tmp_path / "prefill.log.gz"
    cut.write_bytes(head + compressor.compress(text) + compressor.flush()[:4])

    check = kvtop_here("check", "--sglang-log", str(cut))

    assert check.returncode == 1, check.stdout
    assert check.stdout.startswith(f"KVTOP WARNING - 1 of the logs read only up to damage: {cut}: cut short")


def test_a_log_named_gz_that_is_no_gzip_is_called_so_not_empty(tmp_path: Path):
    """A plain text file named `.gz` (nothing decompressed from it) was `KVTOP UNKNOWN - ... plain.log.gz: empty`:
    the check and the views now name what is wrong with it."""
    plain = tmp_path / "plain.log.gz"
    plain.write_bytes(b"hello, not gzip\n")

    check = kvtop_here("check", "--sglang-log", str(plain))
    failures = kvtop_here("failures", "--sglang-log", str(plain))

    assert check.returncode == 3, check.stdout
    assert check.stdout.startswith(f"KVTOP UNKNOWN - nothing to read in the logs given: {plain}: not gzip or corrupt")
    assert failures.returncode == 2 and f"{plain}: not gzip or corrupt" in failures.stderr.splitlines()[-1]


def test_a_log_named_gz_that_is_no_gzip_beside_a_good_one_is_named_once(tmp_path: Path):
    """Beside a log that was read, it was `nothing read from ... plain.log.gz: empty; 1 of the logs read only up to
    damage: plain.log.gz: not gzip ...`: one file, two contradicting words; now one warning says what it is."""
    plain = tmp_path / "plain.log.gz"
    plain.write_bytes(b"hello, not gzip\n")

    check = kvtop_here("check", "--sglang-log", str(plain), "--sglang-log", str(ABORTS / "decode.log"))

    assert check.returncode == 2, check.stdout
    assert f"warning: nothing read from 1 of the 2 logs given: {plain}: not gzip or corrupt" in check.stdout
    assert check.stdout.count(str(plain)) == 1, check.stdout


def test_the_dashboards_follower_names_a_log_gone_from_its_path_until_one_is_there_again(tmp_path, wait_for):
    """A followed log removed under the dashboard left it as quiet as a healthy server's: its error names the path
    while nothing is there, and clears once a log is."""
    log = tmp_path / "prefill.log"
    log.write_bytes(TEXT)
    follower = LogFollower(SGLangLogs([f"prefill={log}"])).start()
    try:
        wait_for(lambda: follower.logs.stats().failures > 0, timeout=10, what="the log read")
        log.unlink()
        wait_for(lambda: "is gone from its path" in follower.error, timeout=10, what="the removal named")
        assert str(log) in follower.error
        log.write_bytes(TEXT)
        wait_for(lambda: "gone" not in follower.error, timeout=10, what="the new log followed")
    finally:
        follower.close()
    assert follower.died is None
