"""Whether a server's DP ranks are replicas: plain `--dp-size N` starts N schedulers, each with its own TP group
(`[... DP0 TP0]`, `[... DP1 TP0]`; `[... DP1]` alone where each replica has one GPU), so one TP number stands for
N ranks; with `--enable-dp-attention` the DP rank is part of the TP group (`DP1 TP1`: TP numbers unique across DP,
a DP rank never past its TP rank). Its `server_args` line says which; else the rank tags do, once a line shows what
DP attention never prints."""

from __future__ import annotations


class DpLayout:
    """What a server's lines said of its DP ranks so far: `replicas` True (replicas), False (not: no DP, or DP
    attention, as its `server_args` said), None (nothing told yet: named as ranks of no replica)."""

    def __init__(self) -> None:
        self.replicas: bool | None = None
        self._dp_of_tp: dict[int, int] = {}

    def said(self, replicas: bool | None) -> None:
        """Its `server_args` line's word (`ServerArgsLine.dp_replicas`; None: it gave no `dp_size`): it stands."""
        if replicas is not None:
            self.replicas = replicas

    def saw(self, tags: dict[str, int]) -> None:
        """A line's rank tags, while nothing told: a DP rank without a TP rank (a replica of one GPU: DP attention
        needs several), one past its TP rank, or a TP rank under two DP ranks, is what only replicas print."""
        dp = tags.get("DP")
        if dp is None or self.replicas is not None:
            return
        tp = tags.get("TP")
        if tp is None or tp < dp or self._dp_of_tp.setdefault(tp, dp) != dp:
            self.replicas = True

    def replica(self, dp: int | None) -> int | None:
        """The DP replica a line of DP rank `dp` is of (None: the server's DP ranks are no replicas, or it named
        none)."""
        return dp if self.replicas else None
