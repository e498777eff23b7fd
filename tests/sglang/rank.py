"""One real SGLang PD rank on the CPU: SGLang 0.5.23's Mooncake KV manager with numpy pools, driven by a loop
that plays the scheduler (`poll_and_all_reduce` over a gloo group of its instance, as SGLang's scheduler does).

Run as `python tests/sglang/rank.py SPEC_JSON` (a `RankSpec`); it writes `RankReport` JSON lines to
`spec.report` as it goes (what SGLang's own polls and exceptions said, collected without kvtop).
"""

from __future__ import annotations

import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

import msgspec

PAGES = 16
"""Pages of each numpy pool."""
PAGE_TOKENS = 4
LAYERS = 2
HEAD_BYTES = 64
"""Bytes of one token of one head of one layer's K (or V)."""
ROOM_PAGES = 3
AUX_BYTES = 64


class RankSpec(msgspec.Struct, frozen=True):
    role: str
    tp_rank: int
    tp_size: int
    bootstrap_port: int
    """The prefill instance's SGLang bootstrap port (decode: the port of the instance it pulls from)."""
    gloo_port: int
    http_port: int
    rooms: list[int]
    report: str
    plugin: bool = True
    """Load plugins through SGLang's own `load_plugins()` (False: the kvtop plugin is not loaded)."""
    hold: bool = False
    """Prefill: never send (the rooms wait for their KV); decode: never create receivers."""
    release: str = ""
    """Prefill: once every room waits for its KV (reported as `waiting`), send only after this file exists (the
    test kills a decode rank in between: a decode rank that dies mid-room)."""
    deadline_s: float = 40.0
    linger_s: float = 1.0
    """Seconds the rank stays after its rooms ended (its plugin still answers kvtop), before it exits."""
    dp_size: int = 1
    """The server's `--dp-size`: replicas, each its own TP group of `tp_size` (without `dp_attention`)."""
    dp_rank: int | None = None
    """The DP rank of this rank's scheduler (None: a server without a DP controller)."""
    dp_attention: bool = False
    """`--enable-dp-attention`: the DP ranks are attention-DP groups of one TP group of `tp_size`, not replicas."""
    pp_size: int = 1
    pp_rank: int = 0
    """This rank's pipeline stage of `pp_size`."""
    scheduler_log: bool = False
    """Log as SGLang's scheduler process does (its `configure_scheduler_process`: the `[time DPd PPp TPn]` prefix)."""


class RoomReport(msgspec.Struct, frozen=True, tag="room"):
    room: int
    poll: int
    """The instance's agreed poll (`poll_and_all_reduce`) that ended the room."""
    reason: str = ""
    is_from_another_rank: bool = False
    pages_equal: bool | None = None
    """Decode, on success: the pages that landed equal what prefill wrote, byte for byte."""


class Progress(msgspec.Struct, frozen=True, tag="progress"):
    what: str


Report = RoomReport | Progress


def page_bytes() -> int:
    return PAGE_TOKENS * HEAD_BYTES


def pattern(room: int, tp_rank: int, buffer: int, page: int) -> bytes:
    """What prefill writes into a room's page (decode checks it landed as written)."""
    seed = (room * 131 + tp_rank * 17 + buffer * 7 + page) % 251
    return bytes((seed + i) % 256 for i in range(page_bytes()))


def main(spec: RankSpec) -> int:
    import numpy as np

    from kvtop.bench.sglang_cpu import Pools, kv_manager, start_rank, start_transfer_engine

    server_args = start_rank(spec.role, spec.tp_rank, spec.tp_size, spec.bootstrap_port, spec.http_port, spec.plugin,
                             spec.dp_size, spec.dp_rank, spec.pp_size, spec.pp_rank, spec.dp_attention)  # fmt: skip
    if spec.scheduler_log:
        from sglang.srt.managers.scheduler import configure_scheduler_process

        configure_scheduler_process(server_args, gpu_id=0)
    from sglang.srt.disaggregation.base.conn import KVPoll
    from sglang.srt.disaggregation.common.conn import KVTransferError
    from sglang.srt.disaggregation.mooncake.conn import MooncakeKVReceiver, MooncakeKVSender
    from sglang.srt.disaggregation.utils import poll_and_all_reduce

    out = open(spec.report, "ab", buffering=0)  # noqa: SIM115 (lines until the process ends, or is killed)

    def say(report: Report) -> None:
        out.write(msgspec.json.encode(report) + b"\n")

    group = _groups(spec)
    start_transfer_engine()
    pools = Pools.make(LAYERS, PAGES, page_bytes(), AUX_BYTES)
    manager = kv_manager(server_args, pools, PAGE_TOKENS, LAYERS)
    logging.getLogger("sglang.srt.disaggregation").info("kvtop test: this rank's KV manager is up")
    say(Progress("manager"))
    prefill = spec.role == "prefill"
    Poller = MooncakeKVSender if prefill else MooncakeKVReceiver

    bootstrap_addr = f"127.0.0.1:{spec.bootstrap_port}"
    slots = {room: i % (PAGES // ROOM_PAGES) for i, room in enumerate(spec.rooms)}
    pages = {room: np.arange(ROOM_PAGES, dtype=np.int32) + slots[room] * ROOM_PAGES for room in spec.rooms}
    if prefill:
        for room in spec.rooms:
            for buffer in range(len(pools.buffers)):
                for page in pages[room]:
                    pools.page(buffer, int(page))[:] = np.frombuffer(
                        pattern(room, spec.tp_rank, buffer, int(page)), dtype=np.uint8
                    )
        pollers = {room: Poller(manager, bootstrap_addr, room) for room in spec.rooms}
    else:
        if spec.hold:
            pollers = {}
        else:
            deadline = time.monotonic() + 20
            while not manager.try_ensure_parallel_info(bootstrap_addr):
                if time.monotonic() > deadline:
                    raise SystemExit(f"no parallel info from {bootstrap_addr}")
                time.sleep(0.2)
            pollers = {room: Poller(manager, bootstrap_addr, room) for room in spec.rooms}
            for room, poller in pollers.items():
                poller.init(0)
                poller.send_metadata(pages[room], slots[room])
            say(Progress("metadata"))
    sent: set[int] = set()
    waiting = False
    live = list(pollers)
    deadline = time.monotonic() + spec.deadline_s
    while live and time.monotonic() < deadline:
        polls = poll_and_all_reduce([pollers[room] for room in live], group)
        if spec.release and not waiting and all(poll == KVPoll.WaitingForInput for poll in polls):
            waiting = True
            say(Progress("waiting"))
        released = not spec.release or (waiting and Path(spec.release).exists())
        for room, poll in zip(list(live), polls, strict=True):
            poller = pollers[room]
            if prefill and poll == KVPoll.WaitingForInput and room not in sent and not spec.hold and released:
                poller.init(ROOM_PAGES, slots[room])
                poller.send(pages[room])
                sent.add(room)
            if poll == KVPoll.Failed:
                try:
                    poller.failure_exception()
                except KVTransferError as error:
                    say(RoomReport(room, poll, error.failure_reason, error.is_from_another_rank))
                live.remove(room)
            elif poll == KVPoll.Success:
                equal = None
                if not prefill:
                    equal = all(
                        bytes(pools.page(buffer, int(page))) == pattern(room, spec.tp_rank, buffer, int(page))
                        for buffer in range(len(pools.buffers))
                        for page in pages[room]
                    )
                    poller.clear()
                say(RoomReport(room, poll, pages_equal=equal))
                live.remove(room)
        time.sleep(0.02)
    say(Progress("done"))
    time.sleep(spec.linger_s)  # the plugin's last events leave, and kvtop can still ask for its snapshot
    os._exit(0)  # SGLang's threads (bootstrap server, transfer workers) are not daemons: do not wait for them


def _groups(spec: RankSpec) -> Any:
    """This rank's TP group (its instance's consensus, over gloo); with pipeline stages, first SGLang's own pipeline
    group (a `GroupCoordinator` over gloo: a prefill's KV managers share their rooms' states over it), all ranks of
    the instance's stages in one gloo world, as SGLang's launcher places them."""
    import torch.distributed as dist

    tp, pp = spec.tp_size, spec.pp_size
    address = f"tcp://127.0.0.1:{spec.gloo_port}"
    dist.init_process_group("gloo", init_method=address, rank=tp * spec.pp_rank + spec.tp_rank, world_size=tp * pp)
    if pp == 1:
        return dist.group.WORLD
    from sglang.srt.distributed.parallel_state import GroupCoordinator
    from sglang.srt.runtime_context import get_parallel

    stages = [dist.new_group(list(range(stage * tp, (stage + 1) * tp))) for stage in range(pp)]  # every rank makes each
    pipelines = [[stage * tp + rank for stage in range(pp)] for rank in range(tp)]
    pipeline = GroupCoordinator(pipelines, 0, "gloo", False, False, False, False, False, False, group_name="pp")
    get_parallel().override_permanently(pp_group=pipeline)
    return stages[spec.pp_rank]


if __name__ == "__main__":
    sys.exit(main(msgspec.json.decode(Path(sys.argv[1]).read_bytes(), type=RankSpec)))
