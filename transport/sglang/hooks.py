"""The hooks on SGLang's KV managers, senders and receivers: room states, failures with their origin flag.

- a KV manager's `__init__` (AFTER) makes its process a rank (`PluginRank`), once per role: the plugin acts
  only in processes that hold KV managers;
- a sender's or receiver's `poll` (AFTER) publishes the room's state when it changed (the rank's own poll,
  before its instance's all-reduce), and on Success the transfer: its bytes (a sender's from SGLang's
  `get_transfer_metric()`, a receiver's as its pages times the manager's bytes per page) and seconds (the
  backend's transfer latency where it reports one, else since the plugin first saw the room); a decode rank's
  peer is the prefill instance's bootstrap address;
- a receiver's `send_metadata` (BEFORE) notes the pages its room will hold;
- `failure_exception` (AROUND) publishes SGLang's `KVTransferError` as a failure: its reason, class, level,
  and origin (the rank itself, unless `is_from_another_rank`: then an echo, joined to its origin by room and
  instance on the operator's side).

A hook that raises never breaks SGLang: it logs once per hook, counts `hook_errors_<hook>` in the rank's
heartbeats, and SGLang goes on with the result it had.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from dataclasses import dataclass, field
from typing import Any

from transport.curve import CurveKeys
from transport.kvpoll import TERMINAL, KVPoll
from transport.plane.events import Failure, Level, PluginHooks, RoomState, TransferDone
from transport.sglang.rank import PluginRank
from transport.sglang.reasons import reason_class
from transport.wire import cut_text

_log = logging.getLogger(__name__)
_STATE = "_kvtop_state"
"""The attribute a sender or receiver keeps its last published state in."""
_RANK = "_kvtop_rank"
"""The attribute a KV manager keeps its process's `PluginRank` in."""
_SINCE = "_kvtop_since"
"""The attribute a sender or receiver keeps the monotonic time the plugin first saw its room in."""
_BYTES = "_kvtop_bytes"
"""The attribute a receiver keeps the bytes its room's pages hold in (noted when it sends its metadata)."""


@dataclass
class Plugin:
    """What the plugin was configured with, and the ranks of this process (one per role)."""

    bootstrap: str
    hooks: PluginHooks
    curve_keys: str = ""
    instance: str = ""
    host: str = "127.0.0.1"
    """The address the ranks' event sockets bind and register (`KVTOP_HOST`)."""
    ranks: dict[str, PluginRank] = field(default_factory=dict)
    failed_hooks: set[str] = field(default_factory=set)

    def rank_for(self, manager: Any, args: Any, mode: Any, server_args: Any) -> PluginRank:
        role = str(getattr(mode, "value", mode))
        rank = self.ranks.get(role)
        if rank is None:
            port = server_args.disaggregation_bootstrap_port if role == "prefill" else server_args.port
            instance = self.instance or f"{role}-{socket.gethostname()}-{port}"
            curve = CurveKeys.load(self.curve_keys, serve=True) if self.curve_keys else None
            rank = PluginRank(role, instance, tp_rank_of(manager, args), int(server_args.tp_size), self.bootstrap,
                              self.hooks, curve, self.host, replica_of(args, server_args),
                              stage_of(args)).start()  # fmt: skip
            self.ranks[role] = rank
            _log.info("kvtop: %s publishes on %s, registers with %s (a refusal is logged)", rank.label,
                      rank.publisher.endpoint, self.bootstrap)  # fmt: skip
        return rank

    def hook_failed(self, rank: PluginRank | None, hook: str) -> None:
        """A hook raised (being handled now): log it the first time, count it every time."""
        if hook not in self.failed_hooks:
            self.failed_hooks.add(hook)
            _log.exception("kvtop: the %s hook raised; SGLang goes on (counted as hook_errors_%s)", hook, hook)
        if rank is not None:
            name = f"hook_errors_{hook}"
            rank.counters[name] = rank.counters.get(name, 0) + 1


PLUGIN: Plugin | None = None
"""Set by the plugin's entry point when a bootstrap is configured."""


def replica_of(args: Any, server_args: Any) -> int | None:
    """The DP replica a scheduler is of where the server's DP ranks are replicas (`dp_size` past 1 without
    `enable_dp_attention`: each replica its own TP group, so its ranks are `INSTANCE/DPd-TPn`): its KV args'
    `system_dp_rank`, as SGLang's KV manager takes it; None for a server without DP, or with DP attention (its TP
    ranks are unique across DP)."""
    if int(getattr(server_args, "dp_size", 1) or 1) < 2 or getattr(server_args, "enable_dp_attention", False):
        return None
    return int(getattr(args, "system_dp_rank", 0) or 0)


def tp_rank_of(manager: Any, args: Any) -> int:
    """The scheduler's TP rank as its log lines' `TP` tag names it (SGLang's `tp_rank`, unique across the server's
    attention-DP groups), from the attention ranks the KV manager took from SGLang's parallel context: `(attn_dp_rank
    * attn_cp_size + attn_cp_rank) * attn_tp_size + attn_tp_rank`, SGLang's own layout (a manager of a version
    before attention CP: none). Not its KV args' `engine_rank`: a decode scheduler's is its rank within its
    attention-TP group (`tp_rank % attn_tp_size`), so with DP attention each group's ranks had the same. A manager
    without attention ranks: its `engine_rank`."""
    try:
        dp, tp, tp_size = int(manager.attn_dp_rank), int(manager.attn_tp_rank), int(manager.attn_tp_size)
    except (AttributeError, TypeError, ValueError):
        return int(args.engine_rank)
    cp, cp_size = int(getattr(manager, "attn_cp_rank", 0) or 0), int(getattr(manager, "attn_cp_size", 1) or 1)
    return (dp * cp_size + cp) * tp_size + tp


def stage_of(args: Any) -> int | None:
    """The scheduler's pipeline stage past the first (its KV args' `pp_rank`, its log lines' `PP` tag); None for the
    first, named as a server's without stages."""
    return int(getattr(args, "pp_rank", 0) or 0) or None


def after_manager_init(result: None, manager: Any, args: Any, mode: Any, server_args: Any, *_: Any,
                       **__: Any) -> None:  # fmt: skip
    plugin = PLUGIN
    if plugin is None:
        return None
    try:
        setattr(manager, _RANK, plugin.rank_for(manager, args, mode, server_args))
    except Exception:
        plugin.hook_failed(None, "manager")
    return None


def after_poll(result: Any, poller: Any, *_: Any, **__: Any) -> None:
    """Publish the room's state when it changed (the common case, unchanged, costs a dict lookup)."""
    state = poller.__dict__.get(_STATE)
    if state == result:
        return None
    try:
        _publish_state(poller, int(result), state)
    except Exception:
        if PLUGIN is not None:
            PLUGIN.hook_failed(getattr(poller.kv_mgr, _RANK, None), "poll")
    return None


def _publish_state(poller: Any, state: int, previous: int | None) -> None:
    rank: PluginRank | None = getattr(poller.kv_mgr, _RANK, None)
    poller.__dict__[_STATE] = state
    since = poller.__dict__.setdefault(_SINCE, time.monotonic())
    if rank is None:
        return
    now, room = time.time(), int(poller.bootstrap_room)
    peer = _peer(poller, rank)
    rank.emit(RoomState(now, room, state, state if previous is None else previous, peer))
    if state in TERMINAL:
        rank.live.discard(room)
    else:
        rank.live.add(room)
    if state == KVPoll.Success and (done := _transfer(poller, since)) is not None:
        rank.emit(TransferDone(now, room, done[0], done[1], peer))


def _peer(poller: Any, rank: PluginRank) -> str:
    """A decode rank's peer: the bootstrap address of the prefill instance its room pulls from."""
    return str(getattr(poller, "bootstrap_addr", "")) if rank.publisher.info.role == "decode" else ""


def _transfer(poller: Any, since: float) -> tuple[int, float] | None:
    """(bytes, seconds) of a room that succeeded on this rank; None when SGLang did not say how many bytes."""
    metric = poller.get_transfer_metric() if hasattr(poller, "get_transfer_metric") else None
    nbytes = getattr(metric, "transfer_total_bytes", None) if metric is not None else poller.__dict__.get(_BYTES)
    if nbytes is None:
        return None
    latency = getattr(metric, "transfer_latency_s", None)
    return int(nbytes), float(latency) if latency is not None else time.monotonic() - since


def before_send_metadata(receiver: Any, kv_indices: Any = None, *args: Any, **kwargs: Any) -> None:
    """Note the bytes the receiver's room will hold: its pages times the manager's bytes per page."""
    try:
        receiver.__dict__[_BYTES] = len(kv_indices) * int(receiver.kv_mgr.kv_item_lens_sum)
    except Exception:
        if PLUGIN is not None:
            PLUGIN.hook_failed(getattr(receiver.kv_mgr, _RANK, None), "send_metadata")
    return None


def around_failure_exception(original: Any, poller: Any, *args: Any, **kwargs: Any) -> Any:
    """SGLang raises the room's `KVTransferError`: publish it as a failure, then let it go on up."""
    try:
        return original(poller, *args, **kwargs)
    except Exception as error:
        try:
            _publish_failure(poller, error)
        except Exception:
            if PLUGIN is not None:
                PLUGIN.hook_failed(getattr(poller.kv_mgr, _RANK, None), "failure_exception")
        raise


def _publish_failure(poller: Any, error: Exception) -> None:
    rank: PluginRank | None = getattr(poller.kv_mgr, _RANK, None)
    if rank is None:
        return
    now = time.time()
    room = int(getattr(error, "bootstrap_room", poller.bootstrap_room))
    reason = cut_text(str(getattr(error, "failure_reason", error)))
    echo = bool(getattr(error, "is_from_another_rank", False))
    previous = poller.__dict__.get(_STATE)
    poller.__dict__[_STATE] = int(KVPoll.Failed)
    rank.live.discard(room)
    label = rank.label
    role = rank.publisher.info.role
    level = Level.DEBUG if echo else Level.WARNING if role == "prefill" else Level.ERROR
    rank.emit(RoomState(now, room, int(KVPoll.Failed), int(KVPoll.Failed) if previous is None else previous))
    rank.emit(Failure(now, room, label, reason, reason_class(reason), str(level), echo, "" if echo else label))


def configure(environ: os._Environ[str] | dict[str, str], hooks: PluginHooks) -> Plugin:
    """The plugin of this process, from `KVTOP_BOOTSTRAP`, `KVTOP_CURVE_KEYS`, `KVTOP_INSTANCE` and `KVTOP_HOST`."""
    global PLUGIN
    PLUGIN = Plugin(environ["KVTOP_BOOTSTRAP"], hooks, environ.get("KVTOP_CURVE_KEYS", ""),
                    environ.get("KVTOP_INSTANCE", ""), environ.get("KVTOP_HOST", "") or "127.0.0.1")  # fmt: skip
    return PLUGIN
