"""One SGLang 0.5.x PD rank's KV manager on the CPU: Mooncake over TCP, numpy arrays as its KV pools.

What `kvtop bench sglang-plugin` and the SGLang interop tier (`make test-sglang`) build; both need SGLang and
`mooncake-transfer-engine-non-cuda` installed (`.venv-sglang`). The recipe is SGLANG_INTEROP.md's: the
environment, a `ServerArgs` published into SGLang's runtime context as a scheduler of the rank, no pipeline
group, SGLang's plugins loaded by its own `load_plugins()` (so the kvtop plugin's hooks are what SGLang applies),
the shared transfer engine, then `KVArgs` over the arrays' addresses.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import numpy as np

CPU_ENVIRONMENT = {"SGLANG_HOST_IP": "127.0.0.1", "MC_FORCE_TCP": "1", "MOONCAKE_PROTOCOL": "tcp"}


@dataclass(frozen=True)
class Pools:
    """A rank's KV pools: K and V of each layer (`pages` pages of `page_bytes`), and one aux buffer."""

    buffers: list[np.ndarray[Any, np.dtype[np.uint8]]]
    aux: np.ndarray[Any, np.dtype[np.uint8]]
    page_bytes: int
    aux_bytes: int

    @classmethod
    def make(cls, layers: int, pages: int, page_bytes: int, aux_bytes: int) -> Pools:
        buffers = [np.zeros(pages * page_bytes, dtype=np.uint8) for _ in range(2 * layers)]
        return cls(buffers, np.zeros(pages * aux_bytes, dtype=np.uint8), page_bytes, aux_bytes)

    def page(self, buffer: int, page: int) -> np.ndarray[Any, np.dtype[np.uint8]]:
        return self.buffers[buffer][page * self.page_bytes : (page + 1) * self.page_bytes]


def start_rank(
    role: str,
    tp_rank: int,
    tp_size: int,
    bootstrap_port: int,
    http_port: int,
    plugins: bool,
    dp_size: int = 1,
    dp_rank: int | None = None,
    pp_size: int = 1,
    pp_rank: int = 0,
    dp_attention: bool = False,
) -> Any:
    """Make this process SGLang's scheduler of `role`/TP`tp_rank` of pipeline stage `pp_rank` (its `ServerArgs`,
    returned), with SGLang's plugins loaded when `plugins`; of DP rank `dp_rank` of a server of `--dp-size dp_size`
    (replicas, or attention-DP groups of its TP ranks with `dp_attention`), as SGLang's DP controller places it.
    Call before any KV manager is built; start the transfer engine after."""
    os.environ.update(CPU_ENVIRONMENT)
    from sglang.srt.runtime_context import SpawnRanks, get_parallel, publish
    from sglang.srt.server_args import ServerArgs

    server_args = ServerArgs(
        model_path="dummy",
        disaggregation_mode=role,
        disaggregation_transfer_backend="mooncake",
        disaggregation_bootstrap_port=bootstrap_port,
        host="127.0.0.1",
        port=http_port,
        device="cpu",
        tp_size=tp_size,
        dp_size=dp_size,
        pp_size=pp_size,
        enable_dp_attention=dp_attention,
    )
    world_rank = tp_size * pp_rank + tp_rank  # SGLang's `spawn_world_rank`
    publish(server_args, role="scheduler", ranks=SpawnRanks(world_rank=world_rank, dp_rank=dp_rank, gpu_id=0))
    get_parallel().override_permanently(pp_group=None)
    if plugins:
        from sglang.srt.plugins import load_plugins

        load_plugins()
    return server_args


def start_transfer_engine() -> None:
    """Mooncake's shared transfer engine on loopback (the KV managers pick it up)."""
    from sglang.srt.distributed.device_communicators.mooncake_transfer_engine import init_mooncake_transfer_engine

    init_mooncake_transfer_engine("127.0.0.1", gpu_id=0, ib_device=None)


def kv_manager(server_args: Any, pools: Pools, page_tokens: int, layers: int) -> Any:
    """A real `MooncakeKVManager` of this rank's role over `pools`, its ranks in `KVArgs` as SGLang's scheduler gives
    them (`engine_rank`: a prefill's TP rank, a decode's rank within its attention-TP group; `pp_rank`;
    `system_dp_rank`: its DP rank), from the runtime context `start_rank` published; the first rank of a prefill
    also serves SGLang's bootstrap server on the bootstrap port."""
    from sglang.srt.disaggregation.base.conn import KVArgs
    from sglang.srt.disaggregation.mooncake.conn import MooncakeKVBootstrapServer, MooncakeKVManager
    from sglang.srt.disaggregation.utils import DisaggregationMode
    from sglang.srt.runtime_context import get_parallel

    parallel = get_parallel()
    prefill = server_args.disaggregation_mode == "prefill"
    if prefill and parallel.tp_rank == 0 and parallel.pp_rank == 0 and not parallel.dp_rank:
        MooncakeKVBootstrapServer("127.0.0.1", server_args.disaggregation_bootstrap_port)
    args = KVArgs()
    args.engine_rank = parallel.tp_rank if prefill else parallel.tp_rank % parallel.attn_tp_size
    args.pp_rank = parallel.pp_rank
    args.system_dp_rank = parallel.dp_rank
    args.rust_http_port = None
    args.kv_cache_dtype_str = "bfloat16"
    args.kv_layout = None
    args.prefill_start_layer = 0
    args.prefill_end_layer = layers
    args.kv_data_ptrs = [buffer.ctypes.data for buffer in pools.buffers]
    args.kv_data_lens = [buffer.nbytes for buffer in pools.buffers]
    args.kv_item_lens = [pools.page_bytes] * len(pools.buffers)
    args.num_draft_entries = 0
    args.kv_layer_ids = []
    args.kv_head_num = 1
    args.total_kv_head_num = server_args.tp_size
    args.page_size = page_tokens
    args.aux_data_ptrs, args.aux_data_lens = [pools.aux.ctypes.data], [pools.aux.nbytes]
    args.aux_item_lens = [pools.aux_bytes]
    args.ib_device = None
    args.gpu_id = 0
    args.state_types = []
    args.state_data_ptrs = []
    args.state_data_lens = []
    args.state_item_lens = []
    args.state_dim_per_tensor = []
    args.state_slice_outer_counts = []
    args.state_layer_ids = []
    args.is_hybrid_mla_backend = False
    args.state_conv_shard_groups = []
    args.swa_kv_cache_layout = None
    args.mla_compression_ratios = None
    args.kv_buf_groups = 1
    args.hidden_kv_layers = layers
    args.draft_kv_layers = 0
    mode = DisaggregationMode.PREFILL if prefill else DisaggregationMode.DECODE
    return MooncakeKVManager(args, mode, server_args, False)
