"""`kvtop events --follow` as a real process: a line per lost run of batches, agents discovered later."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import zmq

from transport import Role
from transport.kvpoll import KVPoll
from transport.plane.events import EVENT_SCHEMA, EventBatch, Failure, RoomState
from transport.wire import encode

pytestmark = pytest.mark.processes

LOGS = Path(__file__).parent / "fixtures" / "sglang" / "lost-prefill"


class Follower:
    """`kvtop events --follow --jsonl ARGS` (or another view's `VIEW --follow --json ARGS`) running, its stdout
    lines collected by a reader thread."""

    def __init__(self, *args: str, view: str = "events") -> None:
        command = shutil.which("kvtop") or f"{sys.prefix}/bin/kvtop"
        self.process = subprocess.Popen(
            [command, view, "--follow", "--json", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        self.lines: list[dict[str, object]] = []
        self.said: list[str] = []
        """Its stderr lines."""
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        threading.Thread(target=self._read_stderr, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.append(json.loads(line))

    def _read_stderr(self) -> None:
        assert self.process.stderr is not None
        self.said.extend(self.process.stderr)

    def stop(self) -> int:
        """Ctrl-C, as a person would; the exit code."""
        self.process.send_signal(signal.SIGINT)
        code = self.process.wait(timeout=10)
        self._reader.join(timeout=5)
        return code


@pytest.fixture
def follow() -> Iterator[Callable[..., Follower]]:
    """Start `kvtop events --follow` processes; each is interrupted (if still running) at teardown."""
    started: list[Follower] = []

    def start(*args: str, view: str = "events") -> Follower:
        started.append(Follower(*args, view=view))
        return started[-1]

    yield start
    for follower in started:
        if follower.process.poll() is None:
            follower.stop()


def test_follow_prints_a_gap_line_for_each_run_of_lost_batches(zmq_context, follow, wait_for):
    """An agent whose seq skips two batches now and then: a warning `gap` line saying 2, and exit 0 on Ctrl-C."""
    pub = zmq_context.socket(zmq.PUB)
    pub.linger = 0
    endpoint = f"tcp://127.0.0.1:{pub.bind_to_random_port('tcp://127.0.0.1')}"
    follower = follow("--connect", endpoint)
    seq = 0

    def published_and_gap_seen() -> bool:
        nonlocal seq
        seq += 3 if seq % 10 == 9 else 1  # every tenth batch, two seqs are never sent
        now = time.time()
        state = RoomState(now, seq, int(KVPoll.Transferring), int(KVPoll.WaitingForInput))
        pub.send(encode(EventBatch(EVENT_SCHEMA, "decode", "decode-3", 0, 5, seq, now, [state])))
        return any(line["kind"] == "gap" for line in follower.lines)

    wait_for(published_and_gap_seen, timeout=20, what="a gap line")
    code = follower.stop()
    pub.close(linger=0)

    gaps = [line for line in follower.lines if line["kind"] == "gap"]
    assert code == 0
    assert {(line["agent"], line["level"], line["batches"]) for line in gaps} == {("decode-3/TP0", "warning", 2)}


def failure_of(manager, room: int) -> Failure:
    label = manager.info.label
    return Failure(time.time(), room, label, "test", "other", "error", False, label)


def test_follow_picks_up_an_agent_that_registers_after_it_started(make_manager, follow, wait_for, bootstrap):
    """An agent the bootstrap service lists only after the tail began is discovered: its failure shows up."""
    first = make_manager(Role.PREFILL, "prefill-0")
    follower = follow("--bootstrap", bootstrap.endpoint)

    def seen(manager, room: int) -> bool:
        manager.emit(failure_of(manager, room))
        return any(line["kind"] == "failure" and line["agent"] == manager.info.label for line in follower.lines)

    wait_for(lambda: seen(first, 1), timeout=20, what="the tail follows the first agent (it listed the agents)")
    later = make_manager(Role.DECODE, "decode-7")
    wait_for(lambda: seen(later, 2), timeout=20, what="the late agent's failure in the tail")

    assert follower.stop() == 0


def test_follow_says_when_every_agent_went_quiet_and_when_one_answers_again(zmq_context, follow, wait_for):
    """The agents killed under a followed tail left it silent, as a healthy quiet cluster's: it now says on stderr
    that no agent was heard, once, and that one answered again."""
    pub = zmq_context.socket(zmq.PUB)
    pub.linger = 0
    endpoint = f"tcp://127.0.0.1:{pub.bind_to_random_port('tcp://127.0.0.1')}"
    follower = follow("--connect", endpoint, "--debug")
    seq = 0

    def publish() -> None:
        nonlocal seq
        seq += 1
        now = time.time()
        state = RoomState(now, seq, int(KVPoll.Transferring), int(KVPoll.WaitingForInput))
        pub.send(encode(EventBatch(EVENT_SCHEMA, "decode", "decode-3", 0, 5, seq, now, [state])))

    def heard() -> bool:
        publish()
        return any(line.get("agent") == "decode-3/TP0" for line in follower.lines)

    wait_for(heard, timeout=20, what="the tail hears the agent")
    wait_for(lambda: any("no agent heard for" in line for line in follower.said), timeout=20, what="quiet said")
    wait_for(lambda: publish() or any("answered again" in line for line in follower.said), timeout=20,
             what="the agent heard again")  # fmt: skip
    code = follower.stop()
    pub.close(linger=0)

    assert code == 0
    assert sum("no agent heard for" in line for line in follower.said) == 1, follower.said


@pytest.mark.parametrize("view", ["events", "status", "failures"])
def test_follow_says_when_a_followed_log_is_removed_and_when_one_is_there_again(tmp_path, follow, wait_for, view):
    """A followed log removed under the tail (or under a view printed again every second) left it silent, as a
    quiet server's: now it says the file is gone from its path, once, and follows the next file there from its
    start."""
    log = tmp_path / "decode.log"
    lines = (LOGS / "decode.log").read_text().splitlines(keepends=True)
    log.write_text("".join(lines))
    follower = follow("--sglang-log", str(log), view=view)
    wait_for(lambda: follower.lines, timeout=30, what="the log's lines")

    log.unlink()
    wait_for(lambda: any("is gone from its path" in line for line in follower.said), timeout=20, what="gone said")
    log.write_text("".join(lines))
    wait_for(lambda: any("is there again" in line for line in follower.said), timeout=20, what="back said")
    code = follower.stop()

    assert code == 0
    assert sum("is gone from its path" in line for line in follower.said) == 1, follower.said
