"""Values no command can work with are usage errors before anything opens: exit 2 with the option named (`kvtop
check`: UNKNOWN, exit 3), never a traceback."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import typing
from pathlib import Path

import pytest
import typer
from kvtop_cli import kvtop_here

DEAD = ("--bootstrap", "tcp://127.0.0.1:9")
LOG = "tests/kvtop/fixtures/sglang/lost-prefill/decode.log"


def _usage_error(done: subprocess.CompletedProcess[str], option: str) -> None:
    """Exit 2, the option named on Typer's error line, no traceback."""
    assert done.returncode == 2, done.stderr
    assert f"Invalid value for '{option}'" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("value", ["inf", "1e10", "nan", "86401"])
@pytest.mark.parametrize("view", ["status", "ranks", "rooms", "events", "failures", "incidents", "export", "top"])
def test_wait_beyond_a_day_or_not_a_number_is_refused(view: str, value: str) -> None:
    """--wait is bounded to a day: infinity, 1e10 and NaN reached the bootstrap client's poll (OverflowError)."""
    _usage_error(kvtop_here(view, *DEAD, "--wait", value), "--wait")


@pytest.mark.parametrize("value", ["inf", "nan"])
def test_check_calls_a_wait_beyond_a_day_unknown(value: str) -> None:
    """`check --wait inf` said 'UNKNOWN - internal error: OverflowError'; now its bad arguments are UNKNOWN."""
    done = kvtop_here("check", *DEAD, "--wait", value)

    assert done.returncode == 3
    assert done.stdout.startswith("KVTOP UNKNOWN - bad arguments: Invalid value for '--wait'")


@pytest.mark.parametrize("value", ["inf", "3601", "nan"])
def test_interval_beyond_an_hour_or_not_a_number_is_refused(value: str) -> None:
    """`status --follow --interval inf` slept forever past its first frame (OverflowError: timestamp out of range)."""
    _usage_error(kvtop_here("status", "--sglang-log", LOG, "--follow", "--interval", value), "--interval")


@pytest.mark.parametrize(
    "command",
    [
        ["relay", *DEAD, "--interval"],
        ["record", *DEAD, "--interval"],
        ["export", "--model", "--model-every"],
        ["agent", "--sglang-log", "/nonexistent/decode.log", "--metrics-interval"],
    ],
    ids=["relay", "record", "export", "sidecar"],
)
def test_other_pauses_beyond_an_hour_are_refused(command: list[str]) -> None:
    """Each pause a command waits in one go (status lines, asks) ended in OverflowError when infinite."""
    _usage_error(kvtop_here(*command, "inf"), command[-1])


def test_export_refuses_an_empty_listen_address() -> None:
    """`export --listen ''` ended in a bare AssertionError; '' is no address for it to serve on."""
    done = kvtop_here("export", "--sglang-log", LOG, "--listen", "")

    _usage_error(done, "--listen")
    assert "'' is not HOST:PORT" in done.stderr


@pytest.mark.parametrize("option", ["--bootstrap", "--connect"])
@pytest.mark.parametrize("port", ["99999", "65536", "0"])
def test_views_refuse_a_port_outside_1_to_65535(option: str, port: str) -> None:
    """libzmq connects to port 99999 as 34463: the address is refused as bad, not reported as silent."""
    done = kvtop_here("status", option, f"tcp://127.0.0.1:{port}")

    assert done.returncode == 2
    assert f"'tcp://127.0.0.1:{port}' has no valid port (1 to 65535)" in done.stderr


def test_check_calls_a_port_past_65535_unknown() -> None:
    """`check --bootstrap tcp://127.0.0.1:99999` said CRITICAL (did not answer): it is a bad argument."""
    done = kvtop_here("check", "--bootstrap", "tcp://127.0.0.1:99999")

    assert done.returncode == 3
    assert done.stdout.startswith("KVTOP UNKNOWN - bad arguments:")
    assert "'tcp://127.0.0.1:99999' has no valid port (1 to 65535)" in done.stdout


@pytest.mark.parametrize("value", ["", " "])
def test_record_refuses_an_empty_out_folder(value: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`record --out ''` recorded into the current folder: refused, and nothing written there."""
    monkeypatch.chdir(tmp_path)
    done = kvtop_here("record", *DEAD, "--out", value)

    _usage_error(done, "--out")
    assert "give a folder" in done.stderr
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("command", [["record", *DEAD], ["status", *DEAD], ["relay", *DEAD]])
def test_a_key_folder_that_is_a_file_is_said_to_be_no_folder(command: list[str], tmp_path: Path) -> None:
    """--curve-keys naming a file said it 'does not exist': it says the path is not a folder."""
    file = tmp_path / "passwd"
    file.write_text("root:x:0:0::/root:/bin/sh\n")

    done = kvtop_here(*command, "--curve-keys", str(file))

    _usage_error(done, "--curve-keys")
    assert f"'{file}' is not a folder" in done.stderr


def test_check_calls_a_key_folder_that_is_a_file_unknown(tmp_path: Path) -> None:
    """The same for `check`: UNKNOWN, exit 3, the reason on stdout."""
    file = tmp_path / "keys"
    file.write_text("")

    done = kvtop_here("check", *DEAD, "--curve-keys", str(file))

    assert done.returncode == 3
    assert f"'{file}' is not a folder" in done.stdout


def test_log_sidecar_refuses_a_folder_at_start(tmp_path: Path) -> None:
    """`agent --sglang-log DIR` waited for DIR 'to appear', then said 'Is a directory' and kept running."""
    done = kvtop_here("agent", "--sglang-log", str(tmp_path))

    _usage_error(done, "--sglang-log")
    assert f"'{tmp_path}' is a folder" in done.stderr


def test_log_sidecar_refuses_a_device_or_a_pipe_at_start(tmp_path: Path) -> None:
    """/dev/zero was called UTF-16 text; a named pipe would block the open: neither is a log file to tail."""
    pipe = tmp_path / "decode.log"
    os.mkfifo(pipe)

    for path in (str(pipe), "/dev/zero"):
        done = kvtop_here("agent", "--sglang-log", path)

        _usage_error(done, "--sglang-log")
        assert f"'{path}' is not a regular file" in done.stderr


def test_a_source_given_to_bare_kvtop_hints_at_the_view_that_takes_it() -> None:
    """`kvtop --sglang-log FILE` (bare kvtop is the dashboard) said only `No such option`."""
    done = kvtop_here("--sglang-log", LOG)

    assert done.returncode == 2
    assert "Hint: --sglang-log is a view's: kvtop top --sglang-log ... opens the dashboard on it" in done.stderr


def test_several_files_after_one_sglang_log_hint_at_one_flag_each() -> None:
    """A shell glob after --sglang-log gave `Got unexpected extra argument(s)`, and nothing on what to type."""
    done = kvtop_here("status", "--sglang-log", LOG, LOG)

    assert done.returncode == 2
    assert "Hint: one file per --sglang-log: --sglang-log a.log --sglang-log b.log" in done.stderr


def test_kvtop_sidecar_names_the_command_the_sidecar_is() -> None:
    """The log sidecar is `kvtop agent --sglang-log`: `kvtop sidecar` said only `No such command`."""
    done = kvtop_here("sidecar", "--sglang-log", LOG)

    assert done.returncode == 2
    assert "Hint: the log sidecar is kvtop agent --sglang-log FILE" in done.stderr


def test_every_number_of_seconds_or_rate_an_option_takes_has_a_bound() -> None:
    """`status --window inf`, `rooms --recent inf`, `check --stuck-after inf` ended in an OverflowError traceback
    (a span said in hours): every float option has a largest value, so `inf` is a usage error."""
    from typer.models import OptionInfo

    from kvtop.cli.app import command_line

    def commands(group: typer.Typer, path: str):
        for command in group.registered_commands:
            yield f"{path} {command.name or command.callback.__name__}", command.callback
        for sub in group.registered_groups:
            yield from commands(sub.typer_instance, f"{path} {sub.name}")
        if group.registered_callback is not None:  # bare `kvtop`: the embedded cluster's options
            yield path, group.registered_callback.callback

    unbounded = []
    for name, callback in commands(command_line(), "kvtop"):
        for option, hint in typing.get_type_hints(callback, include_extras=True).items():
            if typing.get_origin(hint) is not typing.Annotated:
                continue
            base, *extras = typing.get_args(hint)
            info = next((extra for extra in extras if isinstance(extra, OptionInfo)), None)
            if info is not None and float in (typing.get_args(base) or (base,)) and info.max is None:
                unbounded.append(f"{name} --{option.replace('_', '-')}")
    assert unbounded == []


@pytest.mark.parametrize(("view", "option"), [("status", "--window"), ("rooms", "--recent"), ("check", "--window")])
def test_an_infinite_span_is_a_usage_error(view: str, option: str) -> None:
    done = kvtop_here(view, "--sglang-log", LOG, option, "inf")

    assert done.returncode == (3 if view == "check" else 2)
    assert "Traceback" not in done.stderr and "internal error" not in done.stdout


@pytest.mark.parametrize("value", ["99999999999999999999", "99999999 days ago"])
def test_a_time_past_what_a_clock_can_show_is_a_usage_error(value: str) -> None:
    """`status --at 99999999999999999999` ended in `OverflowError: timestamp out of range for platform time_t`."""
    done = kvtop_here("status", "--sglang-log", LOG, "--at", value)

    assert done.returncode == 2
    assert "is not a time between 1970 and 9999" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize(
    ("args", "option"),
    [
        (("status", *DEAD, "--wait", "nan"), "--wait"),
        (("status", "--sglang-log", LOG, "--follow", "--interval", "NaN"), "--interval"),
        (("check", *DEAD, "--max-failure-rate", "nan"), "--max-failure-rate"),
    ],
    ids=["wait", "interval", "check"],
)
def test_a_value_that_is_no_number_is_said_to_be_none(args: tuple[str, ...], option: str) -> None:
    """`--wait nan` said `Input should be less than or equal to 86400` (NaN fails every bound)."""
    done = kvtop_here(*args)

    said = done.stdout if args[0] == "check" else done.stderr
    assert f"Invalid value for '{option}': '{args[-1]}' is not a number" in said, said


@pytest.mark.parametrize(("option", "value"), [("--role", "middle"), ("--log-level", "LOUD")])
def test_a_value_outside_an_options_words_is_said_in_kvtops_words(option: str, value: str) -> None:
    """`kvtop agent --role middle` said `Invalid value for '--role': Value error, 'middle' is not one of ...`:
    pydantic's words before the validator's."""
    done = kvtop_here("agent", "--role", "prefill", "--instance", "p0", option, value, *DEAD)

    _usage_error(done, option)
    assert f"Invalid value for '{option}': '{value}' is not one of " in done.stderr, done.stderr


def test_check_names_each_class_of_failure_once() -> None:
    """`--incident-class foo=1` listed `bootstrap_error` twice among the classes it takes."""
    done = kvtop_here("check", *DEAD, "--incident-class", "foo=1")

    classes = done.stdout.partition("(one of: ")[2].rstrip().removesuffix(")").split(", ")
    assert done.returncode == 3
    assert "bootstrap_error" in classes and len(classes) == len(set(classes))


def test_a_record_size_that_is_no_size_is_refused_without_the_dashboard_too() -> None:
    """`kvtop --record-max-bytes 10 --no-dashboard` ran the cluster, its bad size unsaid (the dashboard: exit 2)."""
    done = kvtop_here("--record-max-bytes", "10", "--no-dashboard", "--duration", "0.1")

    assert done.returncode == 2
    assert "'10' is below 1MiB" in done.stderr


@pytest.mark.parametrize("value", ["10.0.0.0/33", "not-a-network", "10.0.0.0/8/8"])
def test_a_bootstrap_endpoint_network_that_is_none_is_refused(value: str) -> None:
    """`kvtop bootstrap --endpoint-network` takes CIDR networks: anything else is a usage error before it binds."""
    _usage_error(kvtop_here("bootstrap", "--endpoint-network", value), "--endpoint-network")


@pytest.mark.parametrize("link", ["loop", "dangling"])
def test_a_log_that_is_a_broken_symlink_is_said_to_be_one(link: str, tmp_path: Path) -> None:
    """`--sglang-log` on a symlink whose target was rotated away, or on a loop, said `does not exist` of a path
    that `ls` lists: now it says what the link is."""
    path = tmp_path / "decode.log"
    if link == "loop":
        (tmp_path / "other.log").symlink_to(path)
        path.symlink_to(tmp_path / "other.log")
        said = "is a symlink loop"
    else:
        path.symlink_to(tmp_path / "decode.log.1")
        said = f"is a symlink to {str(tmp_path / 'decode.log.1')!r}, which does not exist"

    done = kvtop_here("failures", "--sglang-log", str(path))

    assert done.returncode == 2
    assert f"Invalid value for --sglang-log: {str(path)!r} {said}" in done.stderr, done.stderr


@pytest.mark.processes
def test_keys_generate_says_why_a_folder_cannot_be_made_in_words(tmp_path: Path) -> None:
    """`keys generate` showed a raw `[Errno 2]` / `[Errno 17]` / `[Errno 20]`: each now names the path at fault and
    what is wrong with it, exit 2; an empty path would have written the keys into the current folder."""
    (tmp_path / "file").write_text("")
    (tmp_path / "dangling").symlink_to(tmp_path / "nothing")
    gone = tmp_path / "gone"
    gone.mkdir()
    command = shutil.which("kvtop") or f"{sys.prefix}/bin/kvtop"

    in_file = kvtop_here("keys", "generate", str(tmp_path / "file" / "keys"))
    on_link = kvtop_here("keys", "generate", str(tmp_path / "dangling" / "keys"))
    empty = kvtop_here("keys", "generate", "")
    from_gone = subprocess.run(["sh", "-c", f'cd "{gone}" && rmdir "{gone}" && exec "{command}" keys generate keys'],
                               capture_output=True, text=True, timeout=60, check=False)  # fmt: skip

    for done in (in_file, on_link, empty, from_gone):
        assert done.returncode == 2, done.stderr
        assert "Errno" not in done.stderr and done.stderr.startswith("kvtop: keys generate: "), done.stderr
    assert f"a part of {tmp_path / 'file' / 'keys'} is a file, not a folder" in in_file.stderr
    assert f"{tmp_path / 'dangling'} is a link to {tmp_path / 'nothing'}, which does not exist" in on_link.stderr
    assert "give a folder" in empty.stderr
    assert "keys cannot be made: a folder above it (or the current folder) is gone" in from_gone.stderr
    assert not (tmp_path / "nothing").exists()
