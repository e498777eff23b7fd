"""What a command reads, as its options named it: one frozen spec for every kind of source."""

from __future__ import annotations

from dataclasses import dataclass, field

from kvtop.source.stdin import names_stdin
from kvtop.source.when import When


@dataclass(frozen=True)
class ModelChoice:
    """`--model`/`--model-at`: read a running dashboard's model instead of opening a source of one's own."""

    which: str = ""
    """A model process's pid or endpoint; "" for the one that runs (of --bootstrap/--connect, when given)."""


@dataclass(frozen=True)
class SourceSpec:
    """A live cluster (`bootstrap`, a relay, `connect` endpoints), SGLang logs, a recording (`replay`) or a running
    dashboard's model (`dashboard`), read at `when`. A dashboard's model wins over everything, a recording over
    logs, logs over a live cluster."""

    bootstrap: str = ""
    connect: tuple[str, ...] = ()
    sglang_log: tuple[str, ...] = ()
    replay: str = ""
    when: When = field(default_factory=When)
    dashboard: ModelChoice | None = None
    wait: float = 2.0
    """Seconds to wait for every agent's snapshot (a dashboard's model: for its answer)."""
    curve_keys: str = ""
    """A CURVE key folder for a live cluster ("" for plain TCP)."""
    service: str = "bootstrap"
    """What `bootstrap` was given as, `bootstrap` or `relay` (--relay): what its errors call it."""

    @property
    def kind(self) -> str:
        """`model`, `replay`, `sglang-log`, `bootstrap` or `connect`: the source this spec opens."""
        if self.dashboard is not None:
            return "model"
        if self.replay:
            return "replay"
        if self.sglang_log:
            return "sglang-log"
        return "bootstrap" if self.bootstrap else "connect"

    def checked(self, follow: bool = False) -> SourceSpec:
        """This spec, when its options make sense together (`follow`: the view reads what arrives); raises
        ValueError naming the option at fault."""
        given_time = self.when != When()
        if given_time and not self.replay and not self.sglang_log:
            raise ValueError("--at, --since and --until read a recording (--replay) or logs (--sglang-log)")
        if follow and (self.replay or given_time):
            raise ValueError("--follow reads what arrives; a recording or --at/--since has no more to come")
        if follow and any(names_stdin(log) for log in self.sglang_log):
            raise ValueError("--follow follows a log file, and --sglang-log - is read to the end of what is piped "
                             "in: give the log's path to follow it")  # fmt: skip
        if self.dashboard is not None and (self.sglang_log or self.replay or given_time):
            raise ValueError("--model reads a running dashboard's model as it is now: not with --sglang-log, "
                             "--replay, --at, --since or --until")  # fmt: skip
        if not (self.bootstrap or self.connect or self.sglang_log or self.replay or self.dashboard):
            raise ValueError("give --bootstrap ADDR (or KVTOP_BOOTSTRAP), --relay ADDR, at least one --connect EP, "
                             "--sglang-log FILE, --replay DIR or --model")  # fmt: skip
        return self
