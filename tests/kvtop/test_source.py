"""The one Source interface: a spec checked once, each kind opened the same way, and the options declared once."""

from __future__ import annotations

from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from kvtop.cli.app import command_line
from kvtop.cli.source import spec_of
from kvtop.source import Events, Gap, Said, SourceError, SourceSpec, open_source
from kvtop.source.logs import LogSource
from kvtop.source.when import When

FIXTURE = Path(__file__).parent / "fixtures" / "sglang" / "lost-prefill"
LOGS = (f"prefill={FIXTURE / 'prefill.log'}", f"decode={FIXTURE / 'decode.log'}")
VIEWS = ("status", "ranks", "rooms", "events", "failures", "incidents", "check")
SOURCE_OPTIONS = ("--bootstrap", "--connect", "--sglang-log", "--replay", "--at", "--since", "--until", "--model",
                  "--model-at", "--wait", "--curve-keys")  # fmt: skip


@pytest.mark.parametrize(
    ("spec", "follow", "complaint"),
    [
        (SourceSpec(), False, "give --bootstrap"),
        (SourceSpec(bootstrap="tcp://127.0.0.1:1", when=When(at=1.0)), False, "read a recording"),
        (SourceSpec(replay="rec"), True, "--follow reads what arrives"),
        (SourceSpec(sglang_log=("a.log",), when=When(since=1.0)), True, "--follow reads what arrives"),
        (SourceSpec(replay="rec", when=When(at=1.0, since=0.5)), False, ""),
    ],
)
def test_a_spec_whose_options_do_not_fit_together_names_the_one_at_fault(spec, follow, complaint):
    if not complaint:
        assert spec.checked(follow) is spec
        return
    with pytest.raises(ValueError, match=complaint):
        spec.checked(follow)


def test_a_dashboards_model_is_read_alone_and_wins_over_every_other_kind():
    with pytest.raises(typer.BadParameter, match="--model reads a running dashboard's model"):
        spec_of(sglang_log=list(LOGS), model=True)
    spec = spec_of(bootstrap="tcp://127.0.0.1:1", model_at="123")
    assert spec.kind == "model" and spec.dashboard is not None and spec.dashboard.which == "123"
    assert [SourceSpec(replay="r", sglang_log=("l",)).kind, SourceSpec(sglang_log=("l",), bootstrap="b").kind] == [
        "replay",
        "sglang-log",
    ]


def test_logs_open_as_a_source_judged_at_their_latest_time_with_their_events_as_one_tail():
    with open_source(SourceSpec(sglang_log=LOGS), tail=True) as source:
        assert isinstance(source, LogSource)
        assert source.heard() and source.span and source.rooms_named_once_ended
        assert source.start is not None and source.start < source.now()
        told = [item for chunk in source.tail(follow=False) for item in chunk]
        assert len(told) == 1 and isinstance(told[0], Events)
        labels = {label for label, _ in told[0].items}
        assert {"prefill", "decode"} <= {label.split("-")[0] for label in labels}
        latest = max(event.ts for _, event in told[0].items)
        assert latest <= source.now()
        assert source.notes() and source.notes()[0].startswith("sglang logs: ")
        line, fields = source.status_extra()
        assert line.startswith("logs ") and "logs" in fields
        assert source.model.groups() and source.context_for(source.model.groups())


def test_a_log_that_cannot_be_read_is_a_source_error_with_exit_code_2(tmp_path):
    with pytest.raises(SourceError) as error, open_source(SourceSpec(sglang_log=(str(tmp_path / "gone.log"),))):
        pass
    assert error.value.code == 2 and "cannot read an SGLang log" in str(error.value)


def test_a_recording_that_cannot_be_read_is_a_source_error_with_exit_code_2(tmp_path):
    (tmp_path / "junk.kvr").write_bytes(b"not a recording")
    with pytest.raises(SourceError) as error, open_source(SourceSpec(replay=str(tmp_path / "junk.kvr"))):
        pass
    assert error.value.code == 2 and "cannot read the recording" in str(error.value)


@pytest.mark.parametrize("view", VIEWS)
def test_every_view_declares_the_source_options_once(view):
    done = CliRunner().invoke(command_line(), [view, "--help"], terminal_width=200)

    assert done.exit_code == 0, done.output
    options_part = done.output.split("Options:", 1)[1]  # the description above may wrap to a line that starts `--x`
    declared = [line.strip().split("  ")[0] for line in options_part.splitlines() if line.strip().startswith("-")]
    options = [name.split()[0] for column in declared for name in column.split(", ")]
    for option in SOURCE_OPTIONS:
        assert options.count(option) == 1, (view, option)


def test_a_view_without_a_source_is_a_usage_error_naming_every_kind():
    done = CliRunner().invoke(command_line(), ["status"])

    assert done.exit_code == 2
    assert "give --bootstrap ADDR" in done.output and "--model" in done.output


def test_the_tail_news_kinds_are_distinct_values():
    assert Gap("prefill-0/TP0", 2, 1.0) != Gap("prefill-0/TP0", 3, 1.0)
    assert Said("x") == Said("x")
