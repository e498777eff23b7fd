"""One real SGLang PD rank on the CPU: SGLang 0.5.23's Mooncake KV manager with numpy pools, driven by a loop
that plays the scheduler (`poll_and_all_reduce` over a gloo group of its instance, as SGLang's scheduler does).

Run as `python tests/sglang/rank.py SPEC_JSON` (a `RankSpec`); it writes `RankReport` JSON lines to
`spec.report` as it goes (what SGLang's own polls and exceptions said, collected without kvtop).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

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
    os.environ.update({"SGLANG_HOST_IP": "127.0.0.1", "MC_FORCE_TCP": "1", "MOONCAKE_PROTOCOL": "tcp"})
    import numpy as np
    import torch.distributed as dist
    from sglang.srt.disaggregation.base.conn import KVArgs, KVPoll
    from sglang.srt.disaggregation.common.conn import KVTransferError
    from sglang.srt.disaggregation.utils import DisaggregationMode, poll_and_all_reduce
    from sglang.srt.distributed.device_communicators.mooncake_transfer_engine import init_mooncake_transfer_engine
    from sglang.srt.runtime_context import SpawnRanks, get_parallel, publish
    from sglang.srt.server_args import ServerArgs

    out = open(spec.report, "ab", buffering=0)  # noqa: SIM115 (lines until the process ends, or is killed)

    def say(report: Report) -> None:
        out.write(msgspec.json.encode(report) + b"\n")

    server_args = ServerArgs(
        model_path="dummy",
        disaggregation_mode=spec.role,
        disaggregation_transfer_backend="mooncake",
        disaggregation_bootstrap_port=spec.bootstrap_port,
        host="127.0.0.1",
        port=spec.http_port,
        device="cpu",
        tp_size=spec.tp_size,
    )
    publish(server_args, role="scheduler", ranks=SpawnRanks(world_rank=spec.tp_rank, gpu_id=0))
    get_parallel().override_permanently(pp_group=None)
    if spec.plugin:
        from sglang.srt.plugins import load_plugins

        load_plugins()
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{spec.gloo_port}", rank=spec.tp_rank, world_size=spec.tp_size
    )
    group = dist.group.WORLD
    init_mooncake_transfer_engine("127.0.0.1", gpu_id=0, ib_device=None)

    prefill = spec.role == "prefill"
    if prefill:
        from sglang.srt.disaggregation.mooncake.conn import MooncakeKVBootstrapServer, MooncakeKVManager
        from sglang.srt.disaggregation.mooncake.conn import MooncakeKVSender as Poller

        if spec.tp_rank == 0:
            MooncakeKVBootstrapServer("127.0.0.1", spec.bootstrap_port)
    else:
        from sglang.srt.disaggregation.mooncake.conn import MooncakeKVManager
        from sglang.srt.disaggregation.mooncake.conn import MooncakeKVReceiver as Poller  # type: ignore[assignment]

    buffers = [np.zeros(PAGES * page_bytes(), dtype=np.uint8) for _ in range(2 * LAYERS)]
    aux = np.zeros(PAGES * AUX_BYTES, dtype=np.uint8)
    kv_args = KVArgs()
    kv_args.engine_rank = spec.tp_rank
    kv_args.pp_rank = 0
    kv_args.system_dp_rank = 0
    kv_args.rust_http_port = None
    kv_args.kv_cache_dtype_str = "bfloat16"
    kv_args.kv_layout = None
    kv_args.prefill_start_layer = 0
    kv_args.prefill_end_layer = LAYERS
    kv_args.kv_data_ptrs = [b.ctypes.data for b in buffers]
    kv_args.kv_data_lens = [b.nbytes for b in buffers]
    kv_args.kv_item_lens = [page_bytes()] * len(buffers)
    kv_args.num_draft_entries = 0
    kv_args.kv_layer_ids = []
    kv_args.kv_head_num = 1
    kv_args.total_kv_head_num = spec.tp_size
    kv_args.page_size = PAGE_TOKENS
    kv_args.aux_data_ptrs, kv_args.aux_data_lens, kv_args.aux_item_lens = [aux.ctypes.data], [aux.nbytes], [AUX_BYTES]
    kv_args.ib_device = None
    kv_args.gpu_id = 0
    kv_args.state_types = []
    kv_args.state_data_ptrs = []
    kv_args.state_data_lens = []
    kv_args.state_item_lens = []
    kv_args.state_dim_per_tensor = []
    kv_args.state_slice_outer_counts = []
    kv_args.state_layer_ids = []
    kv_args.is_hybrid_mla_backend = False
    kv_args.state_conv_shard_groups = []
    kv_args.swa_kv_cache_layout = None
    kv_args.mla_compression_ratios = None
    kv_args.kv_buf_groups = 1
    kv_args.hidden_kv_layers = LAYERS
    kv_args.draft_kv_layers = 0
    mode = DisaggregationMode.PREFILL if prefill else DisaggregationMode.DECODE
    manager = MooncakeKVManager(kv_args, mode, server_args, False)
    say(Progress("manager"))

    bootstrap_addr = f"127.0.0.1:{spec.bootstrap_port}"
    slots = {room: i % (PAGES // ROOM_PAGES) for i, room in enumerate(spec.rooms)}
    pages = {room: np.arange(ROOM_PAGES, dtype=np.int32) + slots[room] * ROOM_PAGES for room in spec.rooms}
    if prefill:
        for room in spec.rooms:
            for b, buffer in enumerate(buffers):
                for page in pages[room]:
                    start = int(page) * page_bytes()
                    buffer[start : start + page_bytes()] = np.frombuffer(
                        pattern(room, spec.tp_rank, b, int(page)), dtype=np.uint8
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
                        bytes(buffer[int(p) * page_bytes() : (int(p) + 1) * page_bytes()])
                        == pattern(room, spec.tp_rank, b, int(p))
                        for b, buffer in enumerate(buffers)
                        for p in pages[room]
                    )
                    poller.clear()
                say(RoomReport(room, poll, pages_equal=equal))
                live.remove(room)
        time.sleep(0.02)
    say(Progress("done"))
    time.sleep(spec.linger_s)  # the plugin's last events leave, and kvtop can still ask for its snapshot
    os._exit(0)  # SGLang's threads (bootstrap server, transfer workers) are not daemons: do not wait for them


if __name__ == "__main__":
    sys.exit(main(msgspec.json.decode(Path(sys.argv[1]).read_bytes(), type=RankSpec)))
