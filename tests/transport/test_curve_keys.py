"""Key folders are border posts: what `generate` writes loads, anything unusable is a one-line CurveError."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest
import zmq

from transport.curve import CurveKeys, exposure_problem, generate, is_loopback
from transport.errors import CurveError
from transport.harness.agent import parse_args


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_generate_writes_private_keys_that_load_for_serving_and_for_views(tmp_path: Path) -> None:
    """The folder is 0700, secrets 0600, the allow-list holds the client key; agents and views can load it."""
    keys = generate(tmp_path / "keys").folder

    served = CurveKeys.load(keys, serve=True)
    viewed = CurveKeys.load(keys, serve=False)
    assert (_mode(keys), _mode(keys / "server.key_secret"), _mode(keys / "client.key_secret")) == (0o700, 0o600, 0o600)
    assert served.allowed == frozenset({served.client.public})
    assert (viewed.server_pair, viewed.client.server_key) == (None, served.server.public)
    with pytest.raises(CurveError, match="cannot serve"):
        _ = viewed.server
    with pytest.raises(CurveError, match="never overwritten"):
        generate(keys)


def test_a_view_host_needs_only_the_server_public_key_and_the_client_pair(tmp_path: Path) -> None:
    """A folder with server.key, client.key and client.key_secret loads for a view, not for an agent."""
    keys = generate(tmp_path / "keys").folder
    (keys / "server.key_secret").unlink()

    assert CurveKeys.load(keys, serve=False).client.server_key
    with pytest.raises(CurveError, match=r"missing .*server\.key_secret"):
        CurveKeys.load(keys, serve=True)


def _open_folder(keys: Path) -> None:
    keys.chmod(0o755)


def _open_secret(keys: Path) -> None:
    (keys / "client.key_secret").chmod(0o644)


def _malformed(keys: Path) -> None:
    path = keys / "server.key"
    path.write_text(path.read_text().replace('public-key = "', 'public-key = "~~'))


def _mismatched(keys: Path) -> None:
    other = generate(keys.parent / "other").folder
    (keys / "server.key").write_bytes((other / "server.key").read_bytes())


def _empty_allow_list(keys: Path) -> None:
    (keys / "allowed" / "client.key").unlink()


@pytest.mark.parametrize(
    ("spoil", "message"),
    [
        (_open_folder, "open to group or others .*chmod 700"),
        (_open_secret, "client.key_secret is open to group or others .*chmod 600"),
        (_malformed, "server.key: the public key is not a 40-character Z85 CURVE key"),
        (_mismatched, "not one key pair"),
        (_empty_allow_list, "holds no <name>.key"),
    ],
)
def test_an_unusable_key_folder_is_refused_at_load(tmp_path: Path, spoil: object, message: str) -> None:
    """Open permissions, a malformed key, a mismatched pair or an empty allow-list: a CurveError naming it."""
    keys = generate(tmp_path / "keys").folder
    assert callable(spoil)
    spoil(keys)

    with pytest.raises(CurveError, match=message):
        CurveKeys.load(keys, serve=True)


def test_a_libzmq_without_curve_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Where zmq.has('curve') is false, loading and generating keys say so instead of failing later."""
    monkeypatch.setattr(zmq, "has", lambda capability: False)

    with pytest.raises(CurveError, match="built without CURVE"):
        generate(tmp_path / "keys")


def test_only_loopback_binds_go_without_keys_or_insecure() -> None:
    """127.x, ::1, localhost and ipc:// stay local; 0.0.0.0, *, an interface or a LAN address need keys or insecure."""
    local = ["127.0.0.1", "127.0.0.2", "::1", "[::1]", "localhost", "tcp://127.0.0.1:5555", "ipc:///tmp/x"]
    exposed = ["0.0.0.0", "*", "eth0", "10.1.2.3", "tcp://0.0.0.0:5555", "tcp://*:5555"]

    assert [is_loopback(host) for host in local] == [True] * len(local)
    assert [is_loopback(host) for host in exposed] == [False] * len(exposed)
    assert "--insecure" in exposure_problem(["127.0.0.1", "10.1.2.3"], curve=False, insecure=False)
    assert exposure_problem(["10.1.2.3"], curve=True, insecure=False) == ""
    assert exposure_problem(["10.1.2.3"], curve=False, insecure=True) == ""


def test_an_agent_refuses_a_bad_key_folder_at_start(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`python -m transport.harness.agent --curve-keys` with an unusable folder: a usage error (exit 2), no hang."""
    with pytest.raises(SystemExit) as exited:
        parse_args(["--role", "prefill", "--instance", "p", "--bootstrap", "tcp://127.0.0.1:9",
                    "--curve-keys", str(tmp_path / "missing")])  # fmt: skip

    assert exited.value.code == 2
    assert "does not exist" in capsys.readouterr().err
