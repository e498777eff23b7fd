"""A real SGLang PD pair on loopback: prefill TP2 and decode TP2, each rank a process of `rank.py`; or a prefill of
DP replicas."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import msgspec
from rank import Progress, RankSpec, Report, RoomReport

HERE = Path(__file__).resolve().parent
TP = 2


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Rank:
    spec: RankSpec
    process: subprocess.Popen[bytes]
    log: Path

    @property
    def label(self) -> str:
        spec = self.spec
        replica = "" if spec.dp_rank is None else f"DP{spec.dp_rank}-"
        stage = f"PP{spec.pp_rank}-" if spec.pp_size > 1 else ""
        return f"{spec.role}/{replica}{stage}TP{spec.tp_rank}"

    def reports(self) -> list[Report]:
        path = Path(self.spec.report)
        if not path.exists():
            return []
        decoder = msgspec.json.Decoder(Report)
        return [decoder.decode(line) for line in path.read_bytes().splitlines() if line.strip()]

    def rooms(self) -> dict[int, RoomReport]:
        return {report.room: report for report in self.reports() if isinstance(report, RoomReport)}

    def reached(self, what: str) -> bool:
        return any(isinstance(report, Progress) and report.what == what for report in self.reports())


@dataclass
class Pair:
    """The four ranks, and what SGLang said on each (its own exceptions, read from the reports)."""

    ranks: list[Rank] = field(default_factory=list)

    def of(self, role: str) -> list[Rank]:
        return [rank for rank in self.ranks if rank.spec.role == role]

    def wait(self, what: str, ranks: list[Rank] | None = None, timeout_s: float = 240.0) -> None:
        """Until every rank (of `ranks`) reported `what`; fails naming the ranks that did not, with their logs."""
        ranks = self.ranks if ranks is None else ranks
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if all(rank.reached(what) for rank in ranks):
                return
            time.sleep(0.2)
        late = [rank for rank in ranks if not rank.reached(what)]
        logs = "\n".join(f"--- {rank.label}\n{rank.log.read_text()[-3000:]}" for rank in late)
        raise AssertionError(f"{[rank.label for rank in late]} never reached {what!r}\n{logs}")


@contextmanager
def pair(
    tmp: Path,
    rooms: list[int],
    env: dict[str, str],
    prefill: dict[str, object] | None = None,
    decode: dict[str, object] | None = None,
    decode_tp1: dict[str, object] | None = None,
    start_decode: bool = True,
) -> Iterator[Pair]:
    """Start prefill TP2 (with SGLang's bootstrap server) and decode TP2; kill what is left on the way out."""
    bootstrap, http = free_port(), free_port()
    gloo = {"prefill": free_port(), "decode": free_port()}
    result = Pair()
    roles = ["prefill", "decode"] if start_decode else ["prefill"]
    try:
        for role in roles:
            for tp_rank in range(TP):
                extra = dict((prefill if role == "prefill" else decode) or {})
                if role == "decode" and tp_rank == 1:
                    extra.update(decode_tp1 or {})
                report = tmp / f"{role}-{tp_rank}.jsonl"
                spec = RankSpec(role, tp_rank, TP, bootstrap, gloo[role], http if role == "prefill" else http + 1,
                                rooms, str(report), **extra)  # type: ignore[arg-type]  # fmt: skip
                result.ranks.append(_start(tmp, f"{role}-{tp_rank}", spec, env))
        yield result
    finally:
        _stop(result)


@contextmanager
def replicas(tmp: Path, rooms: list[list[int]], env: dict[str, str], **extra: object) -> Iterator[Pair]:
    """A prefill of plain `--dp-size len(rooms)` (no DP attention), each replica its own scheduler of TP1 (SGLang's
    bootstrap server in DP0's), replica d holding `rooms[d]`; no decode. Kill what is left on the way out."""
    bootstrap, http = free_port(), free_port()
    result = Pair()
    try:
        for dp, held in enumerate(rooms):
            report = tmp / f"prefill-dp{dp}.jsonl"
            spec = RankSpec("prefill", 0, 1, bootstrap, free_port(), http, held, str(report), dp_size=len(rooms),
                            dp_rank=dp, **extra)  # type: ignore[arg-type]  # fmt: skip
            result.ranks.append(_start(tmp, f"prefill-dp{dp}", spec, env))
        yield result
    finally:
        _stop(result)


@contextmanager
def ranks(tmp: Path, specs: dict[str, RankSpec], env: dict[str, str]) -> Iterator[Pair]:
    """Each spec's rank as a process of its own (its log `tmp/NAME.log`); kill what is left on the way out."""
    result = Pair()
    try:
        for name, spec in specs.items():
            result.ranks.append(_start(tmp, name, spec, env))
        yield result
    finally:
        _stop(result)


def _start(tmp: Path, name: str, spec: RankSpec, env: dict[str, str]) -> Rank:
    spec_file = tmp / f"{name}.json"
    spec_file.write_bytes(msgspec.json.encode(spec))
    log = tmp / f"{name}.log"
    process = subprocess.Popen(
        [sys.executable, str(HERE / "rank.py"), str(spec_file)],
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
        env={**os.environ, **env},
        cwd=HERE,
    )
    return Rank(spec, process, log)


def _stop(result: Pair) -> None:
    for rank in result.ranks:
        if rank.process.poll() is None:
            rank.process.kill()
        rank.process.wait()
