"""Settings of one rank's transfer engine."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Literal, get_args

from transport.errors import ConfigError

LogLevel = Literal["DEBUG", "INFO", "WARNING", "ERROR"]
"""The lowest level a rank may log at (the `logging` levels a rank logs)."""
LOG_LEVELS: tuple[str, ...] = get_args(LogLevel)


class Role(StrEnum):
    """Which side of the disaggregation a rank serves."""

    PREFILL = "prefill"
    DECODE = "decode"


@dataclass(frozen=True, slots=True)
class Timeouts:
    """How long a room may stay in each waiting state (SGLang's defaults are 300 s)."""

    bootstrap_s: float = 300.0
    waiting_s: float = 300.0
    transfer_s: float = 60.0
    """Longest time without progress in Transferring (SGLang has no such limit)."""

    def __post_init__(self) -> None:
        for name in ("bootstrap_s", "waiting_s", "transfer_s"):
            if not 0 < getattr(self, name) < math.inf:  # NaN too: it compares false, and would never time out
                raise ConfigError(f"timeout {name} must be positive and finite, got {getattr(self, name)}")


@dataclass(frozen=True, slots=True)
class TransferConfig:
    """Chunking, flow control and liveness of the data links."""

    chunk_bytes: int = 1 << 20
    window_bytes: int = 16 << 20
    """Bytes a prefill rank may have unacknowledged on one link."""
    heartbeat_s: float = 0.5
    peer_timeout_s: float = 5.0
    """A peer silent for this long is lost: its unfinished rooms fail, once. Also the vote timeout: a rank
    of the instance that has not voted on a room this long after this rank took it fails the room."""
    timeouts: Timeouts = field(default_factory=Timeouts)
    retain_finished_s: float = 60.0
    """A finished room its scheduler never released is forgotten after this long, failed first where its instance
    never agreed on it (`timeout_consensus`, told to its peers as any failure this rank starts)."""
    checksums: bool = True
    """Verify what lands: each page its writer sealed against the digest taken when it was written
    (`KVPool.seal`: one pass, on the receiver), any other chunk against the sender's xxh3-64 of it (two
    passes). Off trusts the transport's own integrity checks (TCP, RDMA ICRC); receivers count
    `chunks_unverified`."""
    keep_receive_buffers: bool = True
    """A decode rank raises the process's allocator thresholds so the memory its links receive chunks into
    stays mapped (`transport.kv.memory`: about a third of the receiving I/O thread's CPU); off leaves the
    C library's defaults to a process that manages its own (the setting is process-wide)."""

    def __post_init__(self) -> None:
        if self.chunk_bytes <= 0:
            raise ConfigError(f"chunk_bytes must be positive, got {self.chunk_bytes}")
        if self.window_bytes < self.chunk_bytes:
            raise ConfigError(f"window_bytes={self.window_bytes} is below one chunk ({self.chunk_bytes})")
        if not 0 < self.heartbeat_s < self.peer_timeout_s < math.inf:
            raise ConfigError(
                f"heartbeat_s={self.heartbeat_s} must be positive and below peer_timeout_s={self.peer_timeout_s}, "
                "which must be finite"
            )
        if not 0 < self.retain_finished_s < math.inf:  # NaN too: it compares false
            raise ConfigError(f"retain_finished_s must be positive and finite, got {self.retain_finished_s}")
