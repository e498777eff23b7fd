"""A process's limits sized to the agents it talks to, and a socket it still cannot open named, never fatal.

Each case runs in a process of its own whose open-file limits the test sets (`in_process`), so the limits
of the test runner are never touched.
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import textwrap

import pytest

from transport.limits import MAX_SOCKETS, files_for

pytestmark = pytest.mark.processes


def in_process(code: str, soft: int, hard: int | None = None) -> dict[str, object]:
    """Run `code` in a new Python whose open files are capped at `soft` (and `hard`, when given); returns the
    JSON it prints last."""

    def cap() -> None:
        limit = resource.getrlimit(resource.RLIMIT_NOFILE)[1] if hard is None else hard
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, limit))

    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=60, preexec_fn=cap
    )
    assert done.returncode == 0, done.stderr
    result: dict[str, object] = json.loads(done.stdout.splitlines()[-1])
    return result


def hard_limit() -> float:
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    return float("inf") if hard == resource.RLIM_INFINITY else hard


def test_a_sized_context_opens_a_socket_per_agent_past_zeromqs_default_of_1023():
    """ZeroMQ's default context stops at 1023 sockets; one sized for 1,100 agents opens 1,100 (the soft limit of
    open files raised for them too)."""
    if hard_limit() < files_for(1100):
        pytest.skip(f"the hard limit of open files ({hard_limit():g}) is below what 1,100 agents need")
    result = in_process(
        """
        import json, resource, zmq
        from transport.limits import files_for, size_context

        def opened(context):
            sockets = []
            try:
                while len(sockets) < 1100:
                    sockets.append(context.socket(zmq.DEALER))
            except zmq.ZMQError as error:
                pass
            for sock in sockets:
                sock.close(linger=0)
            return len(sockets)

        plain = opened(zmq.Context())
        sized = zmq.Context()
        soft = size_context(sized, files_for(1100))
        print(json.dumps({"plain": plain, "sized": opened(sized), "soft": soft,
                          "max_sockets": sized.get(zmq.MAX_SOCKETS),
                          "limit": resource.getrlimit(resource.RLIMIT_NOFILE)[0]}))
        """,
        soft=4096,
    )
    assert result == {"plain": 1023, "sized": 1100, "soft": 4096, "max_sockets": MAX_SOCKETS, "limit": 4096}


def test_the_open_files_are_raised_to_what_is_asked_never_past_the_hard_limit_never_lowered():
    code = """
        import json, resource
        from transport.limits import raise_open_files
        print(json.dumps({"returned": raise_open_files({wanted}),
                          "soft": resource.getrlimit(resource.RLIMIT_NOFILE)[0]}))
        """
    assert in_process(code.replace("{wanted}", "900"), soft=256, hard=1024) == {"returned": 900, "soft": 900}
    assert in_process(code.replace("{wanted}", "5000"), soft=256, hard=1024) == {"returned": 1024, "soft": 1024}
    assert in_process(code.replace("{wanted}", "300"), soft=800, hard=1024) == {"returned": 800, "soft": 800}


def test_a_subscriber_raises_the_open_files_as_agents_come():
    """Connecting 200 agents (never answering) raises a 256-file soft limit to what 200 agents need."""
    if hard_limit() < files_for(256):
        pytest.skip("the hard limit of open files is too low")
    result = in_process(
        """
        import json, os, resource
        from transport.plane.subscriber import EventSubscriber
        from transport.wire import AgentInfo

        subscriber = EventSubscriber()
        for index in range(200):
            port = 20000 + index
            subscriber.connect(AgentInfo("decode", f"decode-{index}", 0, 1, 4096, "", "", os.getpid(), "h",
                                         index + 1, "", f"tcp://127.0.0.1:{port}", f"tcp://127.0.0.1:{port}"))
        print(json.dumps({"soft": resource.getrlimit(resource.RLIMIT_NOFILE)[0],
                          "unreachable": len(subscriber.unreachable)}))
        subscriber.close()
        """,
        soft=256,
    )
    assert result["unreachable"] == 0
    assert isinstance(result["soft"], int) and result["soft"] >= files_for(200)


def test_a_snapshot_socket_the_process_has_no_file_for_names_the_agent_and_opens_at_its_next_connect():
    """Out of files (the hard limit too): the agent is named in `unreachable` with the limit and what to raise,
    and counted; once files are free, its next `connect()` opens the socket and its snapshot arrives."""
    result = in_process(
        """
        import json, os, time
        import zmq
        from transport.plane.publisher import EventPublisher
        from transport.plane.subscriber import EventSubscriber
        from transport.wire import AgentInfo

        info = AgentInfo("decode", "decode-0", 0, 1, 4096, "", "", os.getpid(), "h", 7)
        publisher = EventPublisher(info, context=zmq.Context())
        info = publisher.info
        publisher.start()
        subscriber = EventSubscriber()
        hog = []
        try:
            while True:
                hog.append(os.open("/dev/null", os.O_RDONLY))
        except OSError:
            pass
        subscriber.connect(info)
        first = dict(subscriber.unreachable)
        for fd in hog:
            os.close(fd)
        subscriber.connect(info)
        deadline = time.monotonic() + 20
        while not subscriber.counters["snapshots"] and time.monotonic() < deadline:
            subscriber.poll(0.05)
        print(json.dumps({"first": first, "after": subscriber.unreachable,
                          "unopened": subscriber.counters["sockets_unopened"],
                          "snapshots": subscriber.counters["snapshots"]}))
        subscriber.close()
        publisher.close()
        """,
        soft=512,
        hard=512,
    )
    why = "snapshot socket: Too many open files (open files: 512, hard limit 512; raise `ulimit -n`)"
    assert result == {"first": {"decode-0/TP0": why}, "after": {}, "unopened": 1, "snapshots": 1}


def test_a_subscriber_whose_hard_limit_is_too_low_keeps_the_files_its_connections_need():
    """300 open files at most, 30 agents connected one by one: snapshot sockets take only the files left beside
    the spare and a connection per agent known then (14 of them); the other 16 agents are named unreachable,
    with why."""
    result = in_process(
        """
        import json, os
        from transport.plane.subscriber import EventSubscriber
        from transport.wire import AgentInfo

        subscriber = EventSubscriber()
        for index in range(30):
            port = 20000 + index
            subscriber.connect(AgentInfo("decode", f"decode-{index}", 0, 1, 4096, "", "", os.getpid(), "h",
                                         index + 1, "", f"tcp://127.0.0.1:{port}", f"tcp://127.0.0.1:{port}"))
        print(json.dumps({"unreachable": sorted(set(subscriber.unreachable.values())),
                          "named": len(subscriber.unreachable),
                          "unopened": subscriber.counters["sockets_unopened"]}))
        subscriber.close()
        """,
        soft=300,
        hard=300,
    )
    why = "no file left beside a connection per agent (open files: 300, hard limit 300; raise `ulimit -n`)"
    assert result == {"unreachable": [f"snapshot socket: {why}"], "named": 16, "unopened": 16}


def test_a_bootstrap_client_with_no_file_left_fails_as_a_bootstrap_error_naming_the_limit():
    """A collector's discovery goes on after a failed call: out of files is a `BootstrapError`, not a crash."""
    result = in_process(
        """
        import json, os
        import zmq
        from transport import BootstrapClient
        from transport.errors import BootstrapError

        zmq.Context.instance()
        hog = []
        try:
            while True:
                hog.append(os.open("/dev/null", os.O_RDONLY))
        except OSError:
            pass
        try:
            BootstrapClient("tcp://127.0.0.1:9")
            print(json.dumps({"error": ""}))
        except BootstrapError as error:
            print(json.dumps({"error": str(error)}))
        """,
        soft=64,
        hard=64,
    )
    assert result == {
        "error": "cannot open a socket to the bootstrap tcp://127.0.0.1:9: Too many open files "
        "(open files: 64, hard limit 64; raise `ulimit -n`)"
    }
