"""CURVE beyond the agents: `kvtop bootstrap`, a log sidecar and a relay serve the cluster's keys, and the
allowed view hears everything while a subscriber without an allowed key hears nothing; every command that
binds refuses a non-loopback address without keys or --insecure."""

from __future__ import annotations

import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from kvtop_cli import kvtop_here
from sidecar_support import KVTOP

from kvtop.sources.live import Collector
from tests.conftest import wait_for
from transport import BootstrapClient, BootstrapError
from transport.curve import CurveKeys, denied, generate
from transport.plane.events import EventBatch, Snapshot
from transport.plane.relay import Relay
from transport.plane.subscriber import Delivered, EventSubscriber
from transport.wire import AgentInfo

LABEL = "decode-7/TP0"
ROOM = 4242


def failure_line(room: int) -> str:
    stamp = time.strftime("%Y-%m-%d %H:%M:%S")
    return (
        f"[{stamp} TP0] Decode transfer failed for request rank=0 decode_req.req.rid='r{room}' "
        f"decode_req.req.bootstrap_room={room} with exception KVTransferError(bootstrap_room={room}): "
        f"Request {room} timed out after 300.0s in KVPoll.WaitingForInput\n"
    )


@dataclass
class Plane:
    bootstrap: str
    view: CurveKeys
    stranger: CurveKeys
    """Client keys that know the server's public key but are not on the allow-list."""
    relay: Relay


def _first_line(process: subprocess.Popen[str]) -> str:
    assert process.stdout is not None
    line = process.stdout.readline().strip()
    if not line:
        process.kill()
        raise AssertionError(process.communicate()[1])
    return line


def _stop(process: subprocess.Popen[str]) -> int:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
    try:
        return process.wait(10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
        raise


@pytest.fixture(scope="module")
def plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Plane]:
    """`kvtop bootstrap --curve-keys`, a sidecar (`kvtop agent --sglang-log --curve-keys`) registered with it,
    and a CURVE relay on that bootstrap; the sidecar's log has one failure line."""
    root = tmp_path_factory.mktemp("curve-borders")
    keys = generate(root / "keys").folder
    stranger = generate(root / "stranger").folder
    shutil.copyfile(keys / "server.key", stranger / "server.key")
    log = root / "decode-7.log"
    log.write_text(failure_line(ROOM))
    registry = subprocess.Popen(
        [KVTOP, "bootstrap", "--curve-keys", str(keys)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    processes = [registry]
    relay: Relay | None = None
    try:
        address = _first_line(registry)
        sidecar_err = open(root / "sidecar.stderr", "w")  # noqa: SIM115
        sidecar = subprocess.Popen(
            [KVTOP, "agent", "--sglang-log", str(log), "--role", "decode", "--instance", "decode-7",
             "--bootstrap", address, "--curve-keys", str(keys)],
            stdout=subprocess.DEVNULL, stderr=sidecar_err, text=True,
        )  # fmt: skip
        sidecar_err.close()
        processes.append(sidecar)
        view = CurveKeys.load(keys, serve=False)

        def registered() -> bool:
            with BootstrapClient(address, timeout_s=1.0, curve=view) as client:
                return any(agent.label == LABEL for agent in client.list_agents())

        wait_for(registered, 30, f"the sidecar registered ({(root / 'sidecar.stderr').read_text()[-300:]})")
        relay = Relay(address, curve=CurveKeys.load(keys, serve=True), discover_every_s=0.2).start()
        yield Plane(address, view, CurveKeys.load(stranger, serve=False), relay)
    finally:
        if relay is not None:
            relay.close()
        codes = [_stop(process) for process in reversed(processes)]
        assert codes == [0] * len(processes), (codes, (root / "sidecar.stderr").read_text()[-500:])


def _heard(subscriber: EventSubscriber, out: list[Delivered], seconds: float) -> list[Delivered]:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        out.extend(subscriber.poll(0.05))
    return out


@pytest.mark.processes
def test_curve_relay_passes_events_and_snapshots_to_an_allowed_view_and_nothing_to_others(plane: Plane) -> None:
    """Through a CURVE relay the allowed view gets the sidecar rank's snapshot and batches; a subscriber with no
    key or with a key not on the allow-list gets nothing, and the relay counts the refused key."""
    relay = plane.relay
    wait_for(lambda: any(agent.label == LABEL for agent in relay.book().agents), 10, "the relay lists the rank")
    refused_before = denied()
    allowed = EventSubscriber(curve=plane.view)
    outsiders = [EventSubscriber(), EventSubscriber(curve=plane.stranger)]
    heard: list[Delivered] = []
    try:
        for subscriber in (allowed, *outsiders):
            assert subscriber.connect_relay(relay.entry, [LABEL]) == ""

        def allowed_got_snapshot_and_batches() -> bool:
            heard.extend(allowed.poll(0.05))
            kinds = {type(d.item) for d in heard if d.label == LABEL}
            return {Snapshot, EventBatch} <= kinds

        wait_for(allowed_got_snapshot_and_batches, 15, "the allowed view's snapshot and a batch via the relay")
        snapshot = next(d.item for d in heard if isinstance(d.item, Snapshot))
        assert isinstance(snapshot, Snapshot)
        assert ROOM in {failure.room for failure in snapshot.failures}
        assert relay.snapshot()["snapshots_passed"] >= 1
        for outsider in outsiders:
            assert _heard(outsider, [], 1.5) == []
            assert outsider.counters["batches"] == outsider.counters["snapshots"] == 0
        assert denied() > refused_before  # the stranger's key was refused by the relay's ZAP handler
    finally:
        for subscriber in (allowed, *outsiders):
            subscriber.close()


@pytest.mark.processes
def test_curve_sidecar_is_heard_by_an_allowed_view_only(plane: Plane) -> None:
    """A sidecar serving CURVE: an allowed collector sees its rank and the failure room; a stranger's key gets
    no listing from the CURVE bootstrap and nothing from the rank's sockets."""
    collector = Collector(plane.bootstrap, curve=plane.view).start()
    try:

        def failure_seen() -> bool:
            with collector.lock:
                return ROOM in {group.room for group in collector.model.groups()}

        wait_for(failure_seen, 15, "the allowed collector applied the sidecar's failure room")
        with collector.lock:
            assert LABEL in collector.model.ranks
    finally:
        collector.close()
    with pytest.raises(BootstrapError), BootstrapClient(plane.bootstrap, timeout_s=0.5, curve=plane.stranger) as c:
        c.list_agents()
    with BootstrapClient(plane.bootstrap, timeout_s=2.0, curve=plane.view) as client:
        rank: AgentInfo = next(agent for agent in client.list_agents() if agent.label == LABEL)
    outsider = EventSubscriber(curve=plane.stranger)
    try:
        assert outsider.connect(rank) == ""
        assert _heard(outsider, [], 1.5) == []
    finally:
        outsider.close()


@pytest.mark.processes
def test_a_refused_key_gets_an_error_on_every_call_never_a_hang(plane: Plane) -> None:
    """The first request queues on the connection the bootstrap then refuses, and libzmq drops that connection:
    a blocking send of the next would never return. Each call ends in BootstrapError, within its deadline."""
    errors: list[str] = []

    def calls() -> None:
        with BootstrapClient(plane.bootstrap, timeout_s=0.5, curve=plane.stranger) as client:
            for _ in range(3):
                try:
                    client.list_agents()
                except BootstrapError as error:
                    errors.append(str(error))
                time.sleep(0.2)  # the refusal reaches the client's connection meanwhile

    caller = threading.Thread(target=calls, daemon=True)
    caller.start()
    caller.join(30)
    assert not caller.is_alive(), "a call never returned"
    assert len(errors) == 3 and all("does it serve these keys?" in error for error in errors), errors


@pytest.mark.parametrize(
    "command",
    [
        ["bootstrap", "--listen", "tcp://0.0.0.0:0"],
        ["relay", "--bootstrap", "tcp://127.0.0.1:9", "--host", "0.0.0.0"],
        ["agent", "--sglang-log", "/nonexistent/decode.log", "--host", "0.0.0.0"],
    ],
    ids=["bootstrap", "relay", "sidecar"],
)
def test_non_loopback_bind_without_keys_or_insecure_is_refused_in_one_line(command: list[str]) -> None:
    """`kvtop bootstrap`, `kvtop relay` and `kvtop agent --sglang-log` refuse to bind beyond loopback without
    --curve-keys or --insecure: one line naming both, exit 2, before any socket opens."""
    done = kvtop_here(*command)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "not loopback" in lines[0] and "--curve-keys" in lines[0] and "--insecure" in lines[0]


@pytest.mark.processes
def test_bootstrap_binds_beyond_loopback_with_insecure() -> None:
    """--insecure is the explicit way out: `kvtop bootstrap --listen tcp://0.0.0.0:0 --insecure` serves."""
    process = subprocess.Popen(
        [KVTOP, "bootstrap", "--listen", "tcp://0.0.0.0:0", "--insecure"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert _first_line(process).startswith("tcp://0.0.0.0:")
    finally:
        assert _stop(process) == 0


def test_sidecar_refuses_a_key_folder_that_cannot_serve(tmp_path: Path) -> None:
    """A sidecar serves, so a view's folder (no server secret, no allow-list) is a one-line usage error."""
    keys = generate(tmp_path / "keys").folder
    (keys / "server.key_secret").unlink()
    done = kvtop_here("agent", "--sglang-log", str(tmp_path / "decode.log"), "--curve-keys", str(keys))
    assert done.returncode == 2, done.stderr
    assert "server.key_secret" in done.stderr and len(done.stderr.strip().splitlines()) == 1
