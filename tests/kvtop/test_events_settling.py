"""The event tail waits for what other agents published at the same instant: an echo whose batch arrived before
its origin's is folded under it (debug), and lines go out in time order."""

from __future__ import annotations

import contextlib
import json
import queue
import threading
import time
from collections.abc import Iterator

import pytest
from kvtop_cli import kvtop_here

from kvtop.cli.source import spec_of
from kvtop.model.cluster import ClusterModel
from kvtop.source import Events, Source
from kvtop.source.base import Told
from kvtop.source.live import LiveSource
from kvtop.sources.live import Heard
from kvtop.views import settling
from kvtop.views.settling import Settling
from transport.plane.events import EVENT_SCHEMA, EventBatch, Failure

NOW = time.time()
ORIGIN = Failure(NOW - 1.001, 7, "decode-0/TP1", "Request 7 timed out", "timeout_transfer", "error", False,
                 "decode-0/TP1")  # fmt: skip
ECHO = Failure(NOW - 1.0, 7, "prefill-1/TP1", "Aborted by decode peer decode-0/TP1", "propagated", "warning", True,
               "decode-0/TP1")  # fmt: skip


class EchoFirst(Source):
    """A source whose tail tells the echo, then (another rank's later batch) its origin, as the model takes them."""

    def __init__(self) -> None:
        super().__init__(spec_of(connect=["tcp://127.0.0.1:9"]), ClusterModel())

    def now(self) -> float:
        return time.time()

    def tail(self, follow: bool) -> Iterator[list[Told]]:
        for seq, failure in enumerate((ECHO, ORIGIN), start=1):
            instance, _, rank = failure.rank.rpartition("/TP")
            batch = EventBatch(EVENT_SCHEMA, instance.partition("-")[0], instance, int(rank), 1, seq, NOW, [failure])
            with self.lock:
                self.model.apply(failure.rank, batch, time.time())
            yield [Events([(failure.rank, failure)])]


@pytest.fixture
def echo_first(monkeypatch: pytest.MonkeyPatch) -> None:
    """`kvtop events` reads `EchoFirst`; nothing it holds settles before the tail ends (no clock in the test)."""

    @contextlib.contextmanager
    def reading(*_: object, **__: object) -> Iterator[Source]:
        yield EchoFirst()

    monkeypatch.setattr("kvtop.cli.views.reading", reading)
    monkeypatch.setattr(settling, "HOLD_S", 3600.0)


def failure_lines(*args: str) -> list[tuple[str, str]]:
    done = kvtop_here("events", "--connect", "tcp://127.0.0.1:9", "--jsonl", *args)
    assert done.returncode == 0, done.stderr
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    return [(line["agent"], line["level"]) for line in lines if line["kind"] == "failure"]


@pytest.mark.usefixtures("echo_first")
def test_a_followed_tail_shows_an_echo_that_arrived_before_its_origin_at_debug():
    """At the default level, one line for the room: its origin's (the echo came first, from another rank)."""
    assert failure_lines("--follow") == [("decode-0/TP1", "error")]


@pytest.mark.usefixtures("echo_first")
def test_a_followed_tail_prints_an_origin_that_arrived_after_its_echo_first():
    """With --debug both, in time order: the origin, then its echo."""
    assert failure_lines("--follow", "--debug") == [("decode-0/TP1", "error"), ("prefill-1/TP1", "debug")]


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_held_events_leave_once_settled_with_every_earlier_one_held():
    """The echo settles first; its origin, which arrived later but happened before it, goes out with it,
    first; an event after both waits its own time."""
    clock = Clock()
    held = Settling(clock)
    later = Failure(NOW, 8, "decode-1/TP0", "x", "checksum", "error", False, "decode-1/TP0")
    held.add([("prefill-1/TP1", ECHO)])
    clock.now = 0.25
    held.add([("decode-0/TP1", ORIGIN), ("decode-1/TP0", later)])
    assert held.settled() == []

    clock.now = settling.HOLD_S
    assert held.settled() == [("decode-0/TP1", ORIGIN), ("prefill-1/TP1", ECHO)]
    clock.now = settling.HOLD_S + 0.25
    assert held.settled() == [("decode-1/TP0", later)]


class Arriving:
    """News as a collector queues it: `drained` already in when the tail is read, `late` arriving after."""

    def __init__(self, drained: list[Heard], late: list[Heard]) -> None:
        self.drained, self.late = drained, late

    def get_nowait(self) -> Heard:
        if not self.drained:
            raise queue.Empty
        return self.drained.pop(0)

    def get(self, timeout: float) -> Heard:
        if not self.late:
            raise queue.Empty
        return self.late.pop(0)


class Collecting:
    model = ClusterModel()
    lock = threading.Lock()


def test_a_tail_read_once_holds_what_happened_before_it_was_asked_and_arrived_just_after():
    """The echo was in when asked, its origin (earlier) came just after: both told; what happened after the
    tail was asked is left out."""
    after = Failure(time.time() + 60, 9, "decode-1/TP0", "x", "checksum", "error", False, "decode-1/TP0")
    news = Arriving(
        [Heard("prefill-1/TP1", [ECHO], False)],
        [Heard("decode-0/TP1", [ORIGIN], False), Heard("decode-1/TP0", [after], False)],
    )
    source = LiveSource(spec_of(connect=["tcp://127.0.0.1:9"]), Collecting(), news)  # type: ignore[arg-type]

    told = [item for chunk in source.tail(follow=False) for item in chunk]

    assert [event for item in told if isinstance(item, Events) for _, event in item.items] == [ECHO, ORIGIN]
