"""`kvtop agent` turns its options into the rank's `AgentOptions` (run in this process, the rank replaced)."""

from __future__ import annotations

import pytest
from kvtop_cli import kvtop_here

from kvtop.cli import agent_cmd
from transport.config import Role, TransferConfig
from transport.harness.agent import AgentOptions, parse_args

BASE = ("--role", "prefill", "--instance", "prefill-0", "--bootstrap", "tcp://127.0.0.1:9")


@pytest.fixture
def ran(monkeypatch: pytest.MonkeyPatch) -> list[AgentOptions]:
    """The options each `kvtop agent` would have run a rank with."""
    seen: list[AgentOptions] = []
    monkeypatch.setattr(agent_cmd, "run_rank", lambda options: seen.append(options) or 0)
    return seen


def test_kvtop_agent_defaults_are_the_agents_own(ran: list[AgentOptions]) -> None:
    """With only the required options, the rank gets AgentOptions' defaults, as `python -m` gives it."""
    done = kvtop_here("agent", *BASE)

    assert done.returncode == 0, done.stderr
    assert ran == [AgentOptions(Role.PREFILL, "prefill-0", 0, 1, "tcp://127.0.0.1:9")] == [parse_args(list(BASE))]


def test_kvtop_agent_options_reach_the_rank(ran: list[AgentOptions]) -> None:
    """Each option lands in its field of AgentOptions or TransferConfig."""
    done = kvtop_here("agent", *BASE, "--rank", "1", "--tp", "2", "--chunk-bytes", "65536", "--no-checksums",
                      "--fault", "corrupt:0.5", "--fault-seed", "7", "--log-level", "debug")  # fmt: skip

    assert done.returncode == 0, done.stderr
    (options,) = ran
    assert (options.rank, options.tp, options.fault_seed, options.log_level) == (1, 2, 7, "DEBUG")
    assert options.transfer == TransferConfig(chunk_bytes=65536, checksums=False)
    assert [fault.kind for fault in options.faults] == ["corrupt"]


def test_kvtop_agent_refuses_a_fault_its_role_cannot_act_on(ran: list[AgentOptions]) -> None:
    """A decode rank acts only on die: exit 2 with one line, no rank started."""
    done = kvtop_here("agent", "--role", "decode", "--instance", "decode-0", "--bootstrap", "tcp://127.0.0.1:9",
                      "--fault", "corrupt")  # fmt: skip

    assert (done.returncode, ran) == (2, [])
    assert done.stderr.startswith("kvtop: ") and done.stderr.count("\n") == 1
