"""Logs in the shapes operators hand them over (a helper transformed the fixtures into ~58 shapes real platforms
produce and compared every view with the plain file's): where the reading changed, `check` said OK or dated a
crash wrong. Each test names the shape; the lines are the fixtures' own.

- a byte that is not UTF-8 in a failure line (a latin-1 name in a request) cost the whole line: `check` OK on ten
  failure lines;
- one of the logs given empty: `check` judged the rest and said OK, naming nothing it could not read;
- a gzip saved under a `.log` name beside a readable log: read as no log at all;
- a crash line that tells no time of its own inside a shipper's wrapper (`kubectl logs --timestamps`): dated by
  the last line parsed, hours before, so `check --since` missed it;
- the NUL hole logrotate's `copytruncate` leaves at the head of a file: the first line lost its prefix.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from kvtop_cli import kvtop_here

pytestmark = pytest.mark.usefixtures("utc")

FIXTURES = Path(__file__).parent / "fixtures" / "sglang"
LOST_PREFILL = FIXTURES / "lost-prefill"


def check(*logs: Path, extra: tuple[str, ...] = ()) -> tuple[int, str]:
    args = [arg for log in logs for arg in ("--sglang-log", str(log))]
    result = kvtop_here("check", *args, *extra)
    return result.returncode, result.stdout


def failure_lines(path: Path) -> bytes:
    return b"".join(line for line in path.read_bytes().splitlines(keepends=True) if b"failed for request" in line)


def rooms_failed(log: Path) -> int:
    return len(json.loads(kvtop_here("failures", "--sglang-log", str(log), "--json").stdout)["groups"])


def test_a_byte_that_is_not_utf8_costs_its_character_not_the_failure_line(tmp_path: Path):
    decode = tmp_path / "decode.log"
    decode.write_bytes(failure_lines(LOST_PREFILL / "decode.log").replace(b"rid='", b"rid='\xe9"))

    code, said = check(decode)

    assert (code, rooms_failed(decode)) == (2, rooms_failed(LOST_PREFILL / "decode.log")), said
    assert "prefill at 10.0.0.5:8998 stopped answering (peer_lost)" in said


def test_a_log_given_that_held_nothing_is_a_warning_that_names_it(tmp_path: Path):
    empty = tmp_path / "decode.log"
    empty.write_text("")

    code, said = check(empty, LOST_PREFILL / "prefill.log")

    assert code == 1, said
    assert said.startswith(f"KVTOP WARNING - nothing read from 1 of the 2 logs given: {empty}: empty")


def test_a_gzip_under_a_log_name_is_read_as_gzip(tmp_path: Path):
    zipped = tmp_path / "decode.log"
    zipped.write_bytes(gzip.compress((LOST_PREFILL / "decode.log").read_bytes()))

    code, said = check(zipped, LOST_PREFILL / "prefill.log")

    assert code == 2, said
    assert "prefill-0/TP0 stopped answering (peer_lost)" in said or "10.0.0.5:8998" in said


def test_a_wrapped_crash_line_that_tells_no_time_takes_the_dated_line_before_it(tmp_path: Path):
    """`kubectl logs --timestamps`: the segfault, the file's last line, an hour after the last failure."""
    lines = (FIXTURES / "fatal-signal" / "prefill.log").read_text().splitlines(keepends=True)
    crash = next(i for i, line in enumerate(lines) if "Caught signal 11" in line)
    quiet = '[2026-05-01 10:59:00] INFO:     10.0.0.2:51240 - "GET /health HTTP/1.1" 200 OK\n'
    reshaped = [
        "[2026-05-01 08:00:05 TP0] Prefill batch, #new-seq: 1, #new-token: 12, #cached-token: 0, token usage: 0.00, "
        "#running-req: 0, #queue-req: 0, #bootstrap-req: 0, #inflight-req: 1\n",
        quiet,
        *lines[crash:],
    ]
    wrapped = tmp_path / "prefill.log"
    wrapped.write_text("".join(f"2026-05-01T10:59:00.000000000Z {line}" for line in reshaped))

    code, said = check(wrapped, extra=("--since", "2026-05-01 10:30"))

    assert code == 2, said
    assert said.startswith("KVTOP CRITICAL - prefill-0/TP0 crashed at 10:59:00 (Caught signal 11")


def test_the_nul_hole_of_a_copytruncate_rotation_does_not_hide_the_first_line(tmp_path: Path):
    plain, holed = tmp_path / "plain.log", tmp_path / "decode.log"
    first = failure_lines(LOST_PREFILL / "decode.log").splitlines(keepends=True)[0]
    plain.write_bytes(first)
    holed.write_bytes(b"\0" * 4096 + first)

    def origin_times(log: Path) -> list[float]:
        groups = json.loads(kvtop_here("failures", "--sglang-log", str(log), "--json").stdout)["groups"]
        return [group["origin"]["ts"] for group in groups]

    assert origin_times(holed) == origin_times(plain)  # its own time, not the file's


@pytest.mark.parametrize("coloured", ["whole-line", "prefix"])
def test_a_terminals_colour_codes_change_nothing(tmp_path: Path, coloured: str):
    """A log captured from a terminal: every failure was dated by the line before it that had no colour, the
    incident `ended` and its suspect changed; with the prefix coloured, the thread's death took an earlier time."""
    logs = sorted((FIXTURES / "thread-death").iterdir())
    for log in logs:
        lines = log.read_text().splitlines(keepends=True)
        if coloured == "whole-line":
            lines = [f"\x1b[31m{line.rstrip()}\x1b[0m\n" if line.startswith("[20") else line for line in lines]
        else:
            lines = [f"\x1b[32m{line[:21]}\x1b[0m{line[21:]}" if line.startswith("[20") else line for line in lines]
        (tmp_path / log.name).write_text("".join(lines))

    assert check(*(tmp_path / log.name for log in logs)) == check(*logs)


def test_a_rotated_log_given_in_pieces_is_one_server_and_a_log_given_twice_is_read_once(tmp_path: Path):
    """`--sglang-log decode.log.1 --sglang-log decode.log` read as two decode instances (a second incident of a
    prefill whose log was given); the same file twice doubled every rank's origins and echoes."""
    lines = (FIXTURES / "scheduler-crash" / "decode.log").read_text().splitlines(keepends=True)
    half = len(lines) // 2
    (tmp_path / "decode.log.1").write_text("".join(lines[:half]))
    (tmp_path / "decode.log").write_text("".join(lines[half:]))
    prefill = FIXTURES / "scheduler-crash" / "prefill.log"
    twice = FIXTURES / "lost-prefill" / "decode.log"

    rotated = check(tmp_path / "decode.log.1", tmp_path / "decode.log", prefill)
    repeated = kvtop_here("ranks", "--sglang-log", str(twice), "--sglang-log", str(twice), "--json")
    once = kvtop_here("ranks", "--sglang-log", str(twice), "--json")

    assert rotated == check(FIXTURES / "scheduler-crash" / "decode.log", prefill)
    assert json.loads(repeated.stdout) == json.loads(once.stdout)
    assert f"1 given again (read once): {twice}" in repeated.stderr


def test_a_file_that_holds_both_servers_lines_is_said_to(tmp_path: Path):
    """A single-node launch's `nohup.out` (a prefill and a decode server writing to one file), or logs
    concatenated: read as the server its first lines are, and `check` named that server for the other's crash
    without a word. Now the summary and `check` say what was read as one server's (WARNING at least)."""
    both = tmp_path / "nohup.out"
    both.write_text((LOST_PREFILL / "prefill.log").read_text() + (LOST_PREFILL / "decode.log").read_text())

    result = kvtop_here("check", "--sglang-log", str(both))
    summary = kvtop_here("status", "--sglang-log", str(both)).stderr

    assert result.returncode == 2, result.stdout
    assert f"a log holds both servers' lines: {both}: " in result.stdout
    assert "of its lines are decode's, read as prefill-0's (give each server's log apart)" in summary


def test_a_traceback_inside_two_wrappers_ends_at_its_servers_next_record(tmp_path: Path):
    """`docker compose logs -t` (a server's name, then the time the runtime stamped): a worker error's traceback
    took its server's next records as its own lines, and 5 of 7 failure lines were lost without a count."""
    logs = sorted((FIXTURES / "worker-errors").iterdir())
    wrapped = tmp_path / "all.log"
    wrapped.write_text(
        "".join(
            f"sglang-{log.stem}-1   | 2026-04-05T06:07:10.000000000Z {line}"
            for log in logs
            for line in log.read_text().splitlines(keepends=True)
        )
    )

    def failures(*files: Path) -> int:
        args = [arg for file in files for arg in ("--sglang-log", str(file))]
        return json.loads(kvtop_here("status", "--json", *args).stdout)["logs"]["failures"]

    assert failures(wrapped) == failures(*logs) == 7


@pytest.mark.parametrize(
    "wrapper", ["(pid=2961) ", "0: ", "sglang-decode-0 sglang ", "2026-03-05T09:00:00.000Z abc/12 "]
)
def test_a_wrapper_kvtop_does_not_know_by_name_leaves_the_lines_their_times(tmp_path: Path, wrapper: str):
    """Ray's `(pid=N) `, `srun --label`'s `0: `, stern's `pod container `, a log service's time and stream: every
    line was dated by the file's modification time (the incident's "since" was when the file was copied)."""
    log = LOST_PREFILL / "decode.log"
    wrapped = tmp_path / "decode.log"
    wrapped.write_text("".join(wrapper + line for line in log.read_text().splitlines(keepends=True)))

    def incidents(path: Path) -> list[tuple[str, float, int]]:
        found = json.loads(kvtop_here("incidents", "--sglang-log", str(path), "--json").stdout)["incidents"]
        return [(incident["headline"], incident["first_seen"], incident["room_count"]) for incident in found]

    assert incidents(wrapped) == incidents(log)


@pytest.mark.parametrize("name", ["lost-prefill", "peer-named"])
def test_logs_a_wrapper_names_the_pods_of_read_as_those_pods_alone(tmp_path: Path, name: str):
    """`kubectl logs --prefix` (`[pod/NAME/CONTAINER] ` on every line): besides its pods, each file counted as a
    server of the role its name says, with no line of its own, that the decode's lost bootstrap address could be;
    so the lost prefill read no rank `suspect`. A prefill with no log of its own keeps its row."""
    logs = sorted((FIXTURES / name).glob("*.log"))
    for log in logs:
        lines = log.read_text().splitlines(keepends=True)
        (tmp_path / log.name).write_text("".join(f"[pod/sglang-{log.stem}-0/sglang] {line}" for line in lines))

    def states(*files: Path) -> list[tuple[str, str, object]]:
        args = [arg for file in files for arg in ("--sglang-log", str(file))]
        ranks = json.loads(kvtop_here("ranks", "--json", *args).stdout)
        return sorted((rank["role"], rank["state"], str(rank["origins"])) for rank in ranks)

    assert states(*(tmp_path / log.name for log in logs)) == states(*logs)
