"""The line kinds kvtop understands in SGLang server logs, and what each one says.

`MARKERS` are the substrings that every understood line contains: the reader
looks for them in whole blocks of the file (C speed) and parses only the lines
that hold one, so the other 99 % of a busy log cost almost nothing.

Kinds (DOMAIN.md, "SGLang's log lines"):

- `FailureLine`: the scheduler's four failure lines (decode handshake and
  transfer, prefill transfer and bootstrap) with `KVTransferError(bootstrap_room=N):
  reason`, a bare backend code, or another exception's text; and a decode's
  metadata check, which aborts the request (HTTP 500) when the metadata that
  landed is another room's (`Context corruption detected: ...`) or missing;
- `BatchLine`: the periodic prefill and decode batch lines with queue depths
  (`#bootstrap-req`, `#inflight-req`, `#prealloc-req`, `#transfer-req`,
  `#retracted-req`, mid-2025 `#unbootstrapped-req`/`#transferring-req`);
- `ServerArgsLine`: the arguments a server prints as it starts (a prefill's bootstrap port; `node_of`: which node
  of a server that spans several it is; `launch_of`: how its launcher laid out the node's schedulers);
- `LauncherLine`: SGLang's launcher's word that a scheduler died at start-up (`Rank 0 scheduler is dead.`, its
  `Exit code: -3` on the next line; `... died during initialization (exit code: -3)`), of the scheduler's index on
  its node: the source reads it as its rank's crash (`startup_death`);
- `ContextLine`: everything else that explains failures: `Session X failed.`,
  `Lost connection with prefill instance (...), N requests affected`, NIXL
  transport errors, transfer worker errors and their tracebacks, one-time
  hints, bootstrap trouble, aborts carrying a KVTransferError, and transport libraries' own lines (glog, UCX); and a
  rank's crash, in a few words: its scheduler's (`Scheduler hit an exception:
  Traceback ...`: the rank's process ends, SGLang takes its server down, `crash_text`),
  a fatal signal (`Caught signal 11 (Segmentation fault ...`, `Fatal Python error:
  Segmentation fault`), or one of its KV transfer threads dying (`Exception in thread
  Thread-5 (transfer_worker):` and its traceback: the process goes on, the rooms that
  thread served never finish).
"""

from __future__ import annotations

import json
import re
import signal
import time
from collections.abc import Iterable
from dataclasses import dataclass

import msgspec

from kvtop.model.suspects import BOOTSTRAP_ERROR, CRASHED, REGISTRATION_FAILED, STARTUP_DEATH, THREAD_DIED
from kvtop.sources.sglang.prefix import RANK_TAG_MAX, Prefix, stamp_seconds
from transport.wire import cut_text

MARKERS: tuple[bytes, ...] = (
    b"server_args=",  # the arguments a server starts with (its bootstrap port, its node's layout)
    b"bootstrap",  # failure lines with a room, lost connections, bootstrap errors, hints, corruption, client aborts
    b"server info",  # bootstrap attempts that name no bootstrap (`Failed to get prefill server info: 503, ...`)
    b"parallel info from ",  # the give-up after them (`Could not fetch prefill parallel info from X after 15 attempts`)
    b" failed",  # failure lines without a room, `Session ... failed.`, transfer engines' glog failures
    b"for room ",  # NIXL transport errors, transfer worker errors
    b"UCX  ERROR",
    b".cpp:",  # transfer engines' glog lines (Mooncake's `tcp_transport.cpp:542] ... ASIO exception`,
    # `rdma_endpoint.cpp:70] Failed to create QP`; NIXL's `nixl_agent.cpp:866] createXferReq: ...`)
    b".cc:",
    b"Traceback (most recent call last)",
    b" hit an exception",  # a scheduler's (or its worker thread's) crash whose traceback's first line was cut
    b"crashed with exit code",  # SGLang's watchdog of its scheduler processes (`Subprocess scheduler_0 ...`)
    b"scheduler is dead",  # its launcher, of a scheduler that died at start-up (`Rank 0 scheduler is dead. ...`)
    b"scheduler died during initialization",  # the same since 2026-03 (`... (exit code: -3)`)
    b"Exit code: ",  # the launcher's next line after `... scheduler is dead.` (SGLang <= 0.5.9: `Exit code: -3`)
    b"Segfault encountered",
    b"Exception in thread ",  # a thread's death (Python's `threading.excepthook`), its traceback on the next lines
    b"Caught signal ",  # UCX's handler of a fatal signal (`Caught signal 11 (Segmentation fault: ...)`)
    b"Fatal Python error: ",  # Python's `faulthandler` (`Fatal Python error: Segmentation fault`)
    b"terminate called after throwing",  # C++ std::terminate (PyTorch NCCL watchdog exceptions): the process aborts
)
"""Every understood line but the batch lines contains one of these (the block scanner's prefilter, one
Aho-Corasick pass); a line that holds one but is of no kind kvtop knows costs one parse."""

SAMPLED_MARKERS: tuple[bytes, ...] = (b" batch",)
"""Batch lines: periodic gauges, so the scanner looks for them only at the end of each block it reads."""

ROLE_MARKERS: dict[bytes, str] = {
    b"disaggregation_mode='prefill'": "prefill",
    b"disaggregation_mode='decode'": "decode",
    b"'disaggregation_mode': 'prefill'": "prefill",  # SGLang 0.5.23 prints its arguments as a dict
    b"'disaggregation_mode': 'decode'": "decode",
    b"Prefill batch": "prefill",
    b"Prefill transfer failed": "prefill",
    b"Prefill bootstrap failed": "prefill",
    b"Prefill instance failed to register": "prefill",  # to its bootstrap server (`REGISTRATION_FAILED`)
    b"Prefill register attempt": "prefill",  # its retries before (SGLang since 2026-05)
    b"Decode batch": "decode",
    b"Decode transfer failed": "decode",
    b"Decode handshake failed": "decode",
    b"Lost connection with prefill instance": "decode",
    b"Losing connection with prefill instance": "decode",
    b"pre-allocated usage": "decode",
    b"KV checksum mismatch": "decode",
    b"_disagg_prefill": "prefill",  # a traceback's scheduler loop (`event_loop_overlap_disagg_prefill`)
    b"_disagg_decode": "decode",
    b"--disaggregation-mode prefill": "prefill",  # the launch command a log echoes
    b"--disaggregation-mode decode": "decode",
}
"""Text that only one kind of server writes: it tells which server a file is."""

_FAILURE = re.compile(r"(Decode handshake|Decode transfer|Prefill transfer|Prefill bootstrap) failed for request (.*)")
_FAILURE_KIND = re.compile(r"\b(?:Decode handshake|Decode transfer|Prefill transfer|Prefill bootstrap) failed\b")
_FAILURE_KINDS = ("transfer failed", "handshake failed", "bootstrap failed")
"""What each of `_FAILURE_KIND`'s matches holds: looked for first, as it runs on every marked line."""
_JSON_STRING_BODY = re.compile(r'(?:[^"\\]|\\.)*')
"""A JSON string's characters up to its closing quote (escapes kept)."""
OWN_RESTORE_FAILED = " (HiCache local restore failed on this rank)"
"""What SGLang (0.5.23) appends to a decode's failure line when the rank's own HiCache restore of the room failed: the
rank is the origin, whatever reason the exception before it gave (`... from another rank`, none at all)."""
NO_REASON = "KV transfer failed (no reason recorded)"
"""The reason of a failure line that ends at its room: the rank raised nothing (SGLang's `KV transfer failed`)."""
_RANK = re.compile(r"rank=(\d+)")
_RID = re.compile(r"rid='([^']*)'")
_ROOM_FIELD = re.compile(r"bootstrap_room=(\d+|None)")
"""A failure line's fields, each read where a word starts (`_word_search`)."""
_EXCEPTION = re.compile(r"KVTransferError\(bootstrap_room=(\d+|None)\): (.+)")
_BATCH = re.compile(r"(Prefill|Decode) batch[.,:]? ")
_QUEUE = re.compile(r"#([a-z-]+-req): (\d+)")
_PREALLOC_USAGE = re.compile(r"pre-allocated usage: ([\d.]+)")
_THROUGHPUT = re.compile(r"(gen|input) throughput \(token/s\): ([\d.]+)")
_SESSION = re.compile(r"Session (\S+) failed\.")
_LOST = re.compile(r"(?:Lost|Losing) connection with prefill instance \(bootstrap_addr: ([^)]*)\)")
CRASH = "Scheduler hit an exception"
CRASHES = (CRASH, "TpModelWorkerClient hit an exception")
"""How a scheduler process logs the exception that ends it: its own, or its overlap thread's (which sends the
server SIGQUIT)."""
_CHILD_FAILED = re.compile(r"Child process unexpectedly failed with (?:an exit code |exitcode=)(-?\d+)\. ?pid=(\d+)")
"""SGLang's watchdog of its child processes before early 2026 (sglang #6017: `Child process unexpectedly failed with
an exit code 9. pid=149`): one of the server's processes died, which names no rank; the server is taken down."""
_SUBPROCESS_CRASH = re.compile(r"Subprocess (?:scheduler_(\d+)|detokenizer) \(pid=\d+\) crashed with exit code (-?\d+)")
"""SGLang's watchdog of its scheduler processes (since early 2026): one died without a word of its own (a
signal, C++'s std::terminate); the server is taken down."""
_STARTUP_DEATH = re.compile(r"Rank (\d+) scheduler (?:is dead\.|died during initialization \(exit code: (-?\d{1,4})\))")
"""SGLang's launcher, of a scheduler process that died before it was ready: `Rank 0 scheduler is dead. Please check
if there are relevant logs.` (its exit code on the next line, `Exit code: -3`), since 2026-03 a RuntimeError at the end
of the launcher's traceback, `Rank 0 scheduler died during initialization (exit code: -3). ...`. The rank is the
index of the first scheduler the launcher found gone among those it started on its node (`NodeOf.scheduler`)."""
_EXIT_CODE = re.compile(r"Exit code: (-?\d{1,4})\s*")
"""The launcher's line after `Rank N scheduler is dead.` (SGLang <= 0.5.9): the dead scheduler's exit code, once it
joined its process (`logger.error(f"Exit code: {scheduler_procs[i].exitcode}")`)."""
ENGINE_INIT_FAILED = tuple(f"{engine} Transfer Engine initialization failed." for engine in ("Ascend", "Mooncake"))
"""What SGLang logs just before it raises it from its scheduler's start (its transfer engine did not start, so the
rank dies before it serves a room): the rank's crash, when its traceback is not read."""
THREAD_DEATH = "Exception in thread "
_THREAD = re.compile(r"Exception in thread (.+?)(?: \(([\w.]+)\))?:\s*$", re.MULTILINE)
"""`Exception in thread Thread-5 (transfer_worker):` (its target's name since Python 3.10)."""
_KV_THREAD = re.compile(r"transfer|bootstrap|heartbeat|kv", re.IGNORECASE)
"""A thread of the KV transfer by its target's name (or its frames are under `disaggregation/`)."""
_FATAL = re.compile(
    r"Caught signal \d+ \([^)]*\)?|Fatal Python error: \"?(?:Segmentation fault|Aborted|Bus error|Floating point "
    r"exception|Illegal instruction)|Segfault encountered|terminate called after throwing an instance of '[^']*'"
)
"""A fatal signal, as UCX's handler or Python's `faulthandler` report it, or C++'s `std::terminate`: the process
dies. Two processes' dumps written into one stream put another thread's `File "` into Python's words (Mooncake
issue #842: `...utils.pyFatal Python error: "Segmentation fault`): the stray quote is left out of what it says."""
_STRAY_QUOTE = 'Fatal Python error: "'
"""How SGLang's scheduler process logs the exception that ends it (then it signals its server to quit)."""
_FATAL_WORDS = ("Caught signal ", "Fatal Python error: ", "Segfault encountered", "terminate called after throwing ")
"""What each of `_FATAL`'s matches holds (looked for first)."""
_FRAME = re.compile(r'^\s*File "([^"]*)", line (\d+), in (\S+)')
_EXCEPTION_LINE = re.compile(r"[A-Za-z_][\w.]*: .*$|(?:[A-Za-z_]\w*\.)*[A-Z]\w*$")
"""A traceback's exception line: `KeyError: 42`, `torch.OutOfMemoryError: CUDA out of memory.`, `socket.gaierror:
...`, a bare `NIXL_ERR_NOT_FOUND` or `KeyboardInterrupt` (never a frame, a line of code, the `^~~~` marks under one,
or a bare lower-case word of another thread's dump interleaved with it: `transfer_worker791`)."""
_ROOM_CONTEXT = (
    re.compile(r"NIXL transport error for room (\d+)"),
    re.compile(r"Unexpected transfer worker error for room (\d+)"),
    re.compile(r"KVTransferError\(bootstrap_room=(\d+)\)"),
)
_METADATA_FAILURES = (
    re.compile(r"Context corruption detected: Request (\S*) \(bootstrap_room=(\d+)\) received metadata from "),
    re.compile(r"Metadata unexpectedly not ready after readiness gate: request (\S*), bootstrap_room=(\d+)"),
    re.compile(r"KV checksum mismatch (?:on a peer rank )?req=(\S*) bootstrap_room=(\d+)"),
)
"""A decode's check of what landed for a request, which aborts it: its rid, its room (the metadata; SGLang 0.5.23's
KV checksums, `expected=... got=...` on the rank that found it, `on a peer rank` on the others, its only record)."""
METADATA_CHECK = "Decode metadata"
"""The `FailureLine.what` of a failed check of what landed."""
BOOTSTRAP_HINT = "Some requests timed out when bootstrapping"
"""A prefill rank's hint, once per process, just before it records a room's timeout in Bootstrapping."""
_HINTS = ("Some requests fail to receive KV Cache transfer done signal", BOOTSTRAP_HINT)
_BOOTSTRAP_ERRORS = (
    "Error fetching prefill parallel info from bootstrap",
    "Error fetching prefill server info from bootstrap",  # SGLang 0.5.9, 0.5.23
    "Error fetching prefill info from bootstrap",  # 0.5.23 (its bootstrap query's exception)
    "Failed to get prefill server info: ",  # 0.5.23 (an answer that is no 200: `503, Prefill server not fully ...`)
    "Prefill server info not available from ",  # 0.5.9's attempts (`..., retrying (1/20)...`)
    "Could not fetch prefill parallel info from ",  # the give-up after the last attempt (then its rooms are aborted)
    "Error querying dp_ranks from bootstrap",
    REGISTRATION_FAILED,  # a prefill rank's own, once it gave up (its retries before are warnings, not failures)
)
"""A rank could not reach a prefill instance's bootstrap server (a decode asking where to send, a prefill rank
registering there): a failure that names no room."""
_GLOG = re.compile(r"([EWIF])(\d\d)(\d\d) (\d\d:\d\d:\d\d)(\.\d+)? +(?:\d+ +)?(\S+\.c(?:pp|c)?:\d+)\] (.*)")
"""`E0102 03:04:05.123456 4242 file.cpp:294] message` (the thread id left out in some pastes)."""
_GLOG_GLUED = re.compile(r"[EWIF](?<=\w[EWIF])\d{4} \d\d:\d\d:\d\d(?:\.\d+)? +(?:\d+ +)?\S+\.c(?:pp|c)?:\d+\] ")
"""A glog line glued to the end of another process's text in one stream (two crash dumps written at once:
`  File "/sgl/.../utils.pyE1206 03:41:24.558460  3307 transfer_engine.cpp:417] ...`): it starts where a word
ends, with no space, which a line that quotes glog's words never does. The word character is asked after the level's
letter (a lookbehind over both): a pattern that starts with a character set is searched by skipping to that set;
one that starts with a lookbehind is tried at every position (5.4 -> 0.7 us over a glog line of the bench's)."""
_GLOG_FILES = (".cpp:", ".cc:")
"""What every glog line holds (looked for before `_GLOG_GLUED` runs)."""
_TORCH_RANK = re.compile(r"\[rank(\d+)\]:\[(?=[EWIF]\d{4} )")
"""PyTorch's C++ log prefix before a glog-like line: `[rank3]:[E1117 21:22:11.441603074 ProcessGroupNCCL.cpp:2068] `
(the process's rank in its process group: on a server of one node and TP only, its TP rank)."""
_TORCH_FATAL = ("Process group watchdog thread terminated with exception",)
"""What PyTorch's NCCL watchdog logs as it takes its process down (a collective failed or hung: the rank dies)."""
_UCX = re.compile(r"\[(\d{9,}\.\d+)\] +\[[^\]]*\] +\S+ +UCX +(ERROR|WARN\w*|DIAG) +(.*)")
_MEMFABRIC = re.compile(
    r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)(\.\d{1,6}) (?:ERROR|FATAL|error|fatal) (?:\[\d+-\d+\]|\d+ pid\[\d+\] )"
    r"\[[A-Z]+ \S+\.c(?:pp|c)?:\d+[^\]]*\] "
)
"""Ascend MemFabric's error line (SGLang's `ascend` transfer backend; `mf_out_logger.h`'s console format):
`2026-06-11 10:00:05.123456 ERROR [737690-737712][SMEM smem_trans_entry.cpp:236 BatchSyncTransfer] session:(...) not
found.`; in 2025 `2025-09-22 20:20:40.102369 error 12789 pid[12789] [SMEM smem_trans.cpp:44] hybm core init failed: -3`
(SGLang issue #10748). Its levels below ERROR are left out, as glog's `I` lines are."""
_TRANSPORT_KEYWORDS = ("Session::", "writeBody", "peer_nic", "Process failed", "transfer", "Transfer")

ROOM_MAX = (1 << 63) - 1
"""The largest bootstrap room (SGLang draws them from 63 bits; the event plane carries no larger)."""
QUEUES = ("bootstrap", "inflight", "prealloc", "transfer", "retracted", "unbootstrapped", "transferring")
"""Queue depth fields of the batch lines, as counters `queue_<name>` (all eras)."""


class Garbled(ValueError):
    """A line that holds a marker but not the shape of its kind (truncated, cut, corrupted)."""


class FailureLine(msgspec.Struct, frozen=True):
    """One of the scheduler's four failure lines."""

    ts: float | None
    tp: int
    """The TP rank: from the prefix, else the line's `rank=` field."""
    what: str
    """`Decode handshake`, `Decode transfer`, `Prefill transfer`, `Prefill bootstrap` or `METADATA_CHECK`."""
    rid: str
    room: int | None
    reason: str
    """The KVTransferError's reason, or the whole exception text when it is something else."""
    is_kv_error: bool
    level: str = ""
    """The level the line states (`Prefix.level`), "" when it states none."""
    pp: int | None = None
    """The pipeline stage past the first (`Prefix.pp`); None for the first, and for a line that names none."""
    dp: int | None = None
    """The DP rank its prefix names (`DP1`; None: none): a replica's where the server's are (`replicas`)."""

    @property
    def role(self) -> str:
        return "prefill" if self.what.startswith("Prefill") else "decode"


class BatchLine(msgspec.Struct, frozen=True):
    """A periodic batch line: queue depths of one rank (`queue_<name>` counters)."""

    ts: float | None
    tp: int
    role: str
    queues: dict[str, int]
    pp: int | None = None
    """The pipeline stage past the first (`Prefix.pp`); None for the first, and for a line that names none."""
    dp: int | None = None
    """The DP rank its prefix names (`DP1`; None: none): a replica's where the server's are (`replicas`)."""


class ContextLine(msgspec.Struct, frozen=True):
    """A line that explains failures around it: about one room, or about a peer and a time."""

    ts: float | None
    tp: int | None
    kind: str
    """`session`, `lost_connection`, `room`, `hint`, `bootstrap_error`, `glog`, `ucx`, `traceback`, `crash` (the
    rank's process died) or `thread_died` (one of its KV transfer threads)."""
    room: int | None
    text: str
    pp: int | None = None
    """The pipeline stage past the first (`Prefix.pp`); None for the first, and for a line that names none."""
    dp: int | None = None
    """The DP rank its prefix names (`DP1`; None: none): a replica's where the server's are (`replicas`)."""


@dataclass(frozen=True, slots=True)
class ServerArgsLine:
    """The arguments a server prints as it starts (`server_args=ServerArgs(...)`)."""

    bootstrap_port: int | None
    """`disaggregation_bootstrap_port`: a prefill instance's bootstrap address ends with it."""
    launch: NodeOf | None = None
    """How the launcher laid out the schedulers of its node (`launch_of`)."""
    dp_replicas: bool | None = None
    """Whether its DP ranks are replicas, each its own TP group (`dp_size` past 1 without `enable_dp_attention`);
    None where the line gives no `dp_size`."""
    tp_size: int | None = None
    """The TP size its rooms' KV pairs ranks by (`pairing_tp_size`); None where the line does not tell it."""


class LauncherLine(msgspec.Struct, frozen=True):
    """SGLang's launcher, of a scheduler process that died before it was ready (`Rank 2 scheduler is dead. ...`, since
    2026-03 `Rank 2 scheduler died during initialization (exit code: -9)`), or the exit code it logs on the line after
    the first (`Exit code: -9`, SGLang <= 0.5.9)."""

    ts: float | None
    index: int | None
    """The scheduler's index among those the launcher started on its node (`NodeOf.scheduler`); None: an exit code's
    line."""
    code: int | None
    """The exit code (negative: the signal that killed it); None where the line gives none (its next line does)."""


@dataclass(frozen=True, slots=True)
class NodeOf:
    """A node of a server that spans several (`--nnodes N --node-rank R --dist-init-addr H:P`): each node logs to its
    own file, with the same arguments but its `node_rank` and host, and its own ranks (node 1 of TP16 over two:
    TP8..TP15; of TP8 PP2 over two: PP1 TP0..TP7); only node 0 runs the HTTP server and a prefill's bootstrap
    server."""

    mode: str
    """`disaggregation_mode`."""
    address: str
    """`dist_init_addr`: where the nodes meet."""
    nnodes: int
    tp_size: int
    rank: int
    """`node_rank`."""
    pp_size: int = 1

    @property
    def server(self) -> tuple[str, str, int, int, int]:
        """What every node of the server prints alike."""
        return (self.mode, self.address, self.nnodes, self.tp_size, self.pp_size)

    @property
    def _nodes_per_stage(self) -> int:
        return max(self.nnodes // self.pp_size, 1)

    @property
    def tp_ranks(self) -> range:
        """The TP ranks of the server on this node (of each of its pipeline stages), laid out as SGLang's launcher
        does."""
        width = self.tp_size // self._nodes_per_stage
        return range(width * (self.rank % self._nodes_per_stage), width * (self.rank % self._nodes_per_stage + 1))

    @property
    def pp_ranks(self) -> range:
        """The pipeline stages of the server on this node (`range(1)` without stages)."""
        width = max(self.pp_size // self.nnodes, 1)
        return range(width * (self.rank // self._nodes_per_stage), width * (self.rank // self._nodes_per_stage + 1))

    def scheduler(self, index: int) -> tuple[int | None, int] | None:
        """The rank (pipeline stage past the first or None, TP rank) of the scheduler SGLang's launcher started
        `index`th on this node, looping over `pp_ranks`, then `tp_ranks` (the index its `Rank N scheduler ...` lines
        name: TP 8+N on node 1 of a TP16 server over two); None past the node's schedulers."""
        width = len(self.tp_ranks)
        if index >= width * len(self.pp_ranks):
            return None
        return self.pp_ranks[index // width] or None, self.tp_ranks[index % width]


def server_arg(message: str, name: str) -> str | None:
    """The value a `server_args` line gives an argument, unquoted: `name=V` in `ServerArgs(...)`, `'name': V` in
    SGLang 0.5.23's dict; None when the line gives none."""
    found = re.search(rf"(?:\b{name}=|'{name}': )('[^']*'|[^,)}}\s]+)", message)
    return found[1].strip("'") if found else None


def server_count(message: str, name: str) -> int | None:
    """An argument of a `server_args` line that counts something (a size, a rank, a port): None when the line gives
    none, or more than 6 digits (a log's text: `int()` of thousands of digits raised, and no count is that large)."""
    value = server_arg(message, name) or ""
    return int(value) if re.fullmatch(r"\d{1,6}", value) else None


def node_of(message: str) -> NodeOf | None:
    """The node of a multi-node server a `server_args` line says it is; None for a server on one node, one that
    names no rendezvous address, and one whose nodes' ranks SGLang's launcher would not lay out evenly. Pipeline
    stages over the nodes are told apart by their `PP` tags (node 1 of TP8 PP2 over two logs `PP1 TP0`..)."""
    node = _layout(message)
    if node is None or node.nnodes < 2 or server_count(message, "node_rank") is None or node.address == "None":
        return None
    return node


def dp_replicas(message: str) -> bool | None:
    """Whether a `server_args` line's DP ranks are replicas (`dp_size=2` and `enable_dp_attention=False`, SGLang
    0.5.23's `'dp_size': 2, 'enable_dp_attention': False`): each its own scheduler and TP group; None where it gives
    no `dp_size`."""
    dp_size = server_count(message, "dp_size")
    if dp_size is None:
        return None
    return dp_size > 1 and server_arg(message, "enable_dp_attention") != "True"


def pairing_tp_size(message: str) -> int | None:
    """The TP size a `server_args` line gives, by which the ranks of the two sides of a room pair (DOMAIN.md's rank
    mapping): `tp_size`, of each pipeline stage and each DP replica alike; None where it gives none, one past
    `RANK_TAG_MAX` ranks, or a server with DP attention (`enable_dp_attention=True`, `dp_size` past 1: a room's KV
    is one DP group's, its attention TP ranks a slice of `tp_size` the line does not say which)."""
    tp_size = server_count(message, "tp_size")
    if tp_size is None or not 0 < tp_size <= RANK_TAG_MAX + 1:
        return None
    attention = (server_count(message, "dp_size") or 1) > 1 and server_arg(message, "enable_dp_attention") == "True"
    return None if attention else tp_size


def launch_of(message: str) -> NodeOf | None:
    """How SGLang's launcher laid out the schedulers of the node a `server_args` line is of (one on a server of one
    node, whatever its address); None for a line without `tp_size`, sizes past `RANK_TAG_MAX` ranks, a layout the
    launcher would not make evenly, and a server with a DP controller (`dp_size` past 1): the launcher then starts
    that one process, which its `Rank 0` names, and the controller the schedulers."""
    node = _layout(message)
    if (
        node is None
        or (server_count(message, "dp_size") or 1) > 1
        or max(node.tp_size, node.pp_size) > RANK_TAG_MAX + 1
    ):
        return None
    return node


def _layout(message: str) -> NodeOf | None:
    """The node a `server_args` line says it is (`nnodes`, `node_rank` and `pp_size` left out: SGLang's defaults);
    None without `tp_size`, and where SGLang's launcher would not share the ranks among the nodes evenly."""
    tp_size = server_count(message, "tp_size")
    if tp_size is None:
        return None
    nnodes, rank = server_count(message, "nnodes") or 1, server_count(message, "node_rank") or 0
    pp_size = server_count(message, "pp_size") or 1
    address = server_arg(message, "dist_init_addr") or "None"
    node = NodeOf(server_arg(message, "disaggregation_mode") or "", address, nnodes, tp_size, rank, pp_size)
    stages_even = pp_size % nnodes == 0 if pp_size >= nnodes else nnodes % pp_size == 0
    if node.rank >= node.nnodes or not stages_even or tp_size % node._nodes_per_stage:
        return None
    return node if node.tp_ranks else None


_glog_last: tuple[str, re.Match[str] | None, re.Match[str] | None] = ("", None, None)


def _glog_of(message: str) -> tuple[re.Match[str] | None, re.Match[str] | None]:
    """(PyTorch's rank prefix, the glog line after it or at the start) of a message: the last message's are kept,
    as `glog_year` and `classify` both ask them of each undated line."""
    global _glog_last
    last = _glog_last  # one read: another thread's line may replace it
    if last[0] is not message:
        torch = _TORCH_RANK.match(message)
        glog = _GLOG.match(message, torch.end() if torch else 0)
        if (
            glog is None
            and torch is None
            and holds_any(message, _GLOG_FILES)
            and (glued := _GLOG_GLUED.search(message))
        ):
            glog = _GLOG.match(message, glued.start())
        last = _glog_last = (message, torch, glog)
    return last[1], last[2]


def glog_year(message: str, near: float, latest: bool = False) -> int:
    """The year to date a glog line (a PyTorch C++ one too) in `message` by, for it prints none: of `near`'s year
    (the time its log last told) and those either side, the one that puts the line nearest `near`, so that an
    `E1231` line after SGLang's `[2026-01-01 ...` is of 2025; `latest` (`near` is its file's time, which no line of
    it is after): the latest year not past it. `near`'s year for any other line, and where no year dates the line."""
    year = time.localtime(near).tm_year
    glog = _glog_of(message)[1]
    if glog is None:
        return year
    try:  # the years either side date it a year (365-366 days, give or take an hour of DST) further off
        own = _glog_seconds(glog, year)
        if abs(own - near) < NEAR_YEAR_S and not (latest and own > near):
            return year
    except Garbled:
        pass
    dated: dict[int, float] = {}
    for candidate in (year - 1, year, year + 1):
        try:
            dated[candidate] = _glog_seconds(glog, candidate)
        except Garbled:  # 29 February of a year without one, or no date at all
            continue
    if latest:
        return max((candidate for candidate, ts in dated.items() if ts <= near), default=year)
    return min(dated, key=lambda candidate: abs(dated[candidate] - near), default=year)


NEAR_YEAR_S = 150 * 86_400
"""A glog line its year dates this near the time its log last told is of that year (the years either side date it
over 200 days further off): `glog_year` needs no other."""


def _glog_seconds(glog: re.Match[str], year: int) -> float:
    """The time a glog line tells (it prints no year: `year`'s)."""
    stamp = f"{year}-{glog[2]}-{glog[3]} {glog[4]}"
    try:
        return stamp_seconds(stamp) + float(glog[5] or 0)
    except ValueError as error:
        raise Garbled(f"a glog line with a bad time: {stamp}") from error


Record = FailureLine | BatchLine | ContextLine | ServerArgsLine | LauncherLine


_ADDRESS = re.compile(r"[^\s:]{1,253}:(\d{1,5})|\[[0-9A-Fa-f:.]{2,45}(?:%[\w.@-]{1,64})?\]:(\d{1,5})")
"""A bootstrap address as a rank label may hold it: a host (or a bracketed IPv6 address, with its zone where a
link-local one has one: `[fe80::1%eth0]`) and a port."""


_lost_last: tuple[str, str | None] = ("", None)


def lost_prefill(text: str) -> str | None:
    """The bootstrap address (`host:port`) of the prefill instance a decode rank's line says it lost
    (`Lost`/`Losing connection with prefill instance (bootstrap_addr: X)`); None for any other line, and for an
    address that is no `host:port` with a port up to 65535 (it would name a rank)."""
    global _lost_last
    if "connection with prefill instance (" not in text:  # what every match holds: asked of every failure's reason
        return None
    last = _lost_last  # one read: another thread's line may replace it
    if last[0] is text:  # a lost connection's line is asked twice (its announcement, the peer it names)
        return last[1]
    match = _LOST.search(text)
    address = _ADDRESS.fullmatch(match[1].strip()) if match else None
    found = None if address is None or int(address[1] or address[2]) > 65535 else address[0]
    _lost_last = (text, found)
    return found


def glued_glog(text: str) -> tuple[str, str] | None:
    """(the text without it, the glog line) of a glog line glued mid-line into a record that is not itself one: a
    traceback's frame (`  File ".../utils.pyE0914 07:12:40.331902  5120 transfer_engine.cpp:398] ...` among its
    lines) or a dated line's end (two processes' output in one stream). The glog line runs to the end of its line.
    None where there is none (an undated line of its own with one glued into it is read as that glog line by
    `classify`: the caller asks this of the others)."""
    if not holds_any(text, _GLOG_FILES) or (glued := _GLOG_GLUED.search(text)) is None:
        return None
    start = glued.start()
    end = text.find("\n", start)
    end = len(text) if end < 0 else end
    return text[:start] + text[end:], text[start:end]


def is_glog(text: str) -> bool:
    """Whether a line (unwrapped) is a glog line: `E0102 03:04:05.123456 4242 file.cpp:294] message`."""
    return _GLOG.match(text) is not None


def classify(prefix: Prefix, year: int) -> Record | None:
    """What a line says (None: nothing kvtop uses), of the pipeline stage and DP rank its prefix names. `year` dates
    glog lines, which print none.

    Raises `Garbled` for a line that starts like a kind kvtop knows but does not finish like one.
    """
    record = _classify(prefix, year)
    if not isinstance(record, ContextLine):  # the rest name their own (failure and batch lines: most of a log's)
        return record
    dp = prefix.tags.get("DP")
    if prefix.pp is None and dp is None:
        return record
    named = {"pp": prefix.pp, "dp": dp}
    return msgspec.structs.replace(record, **{name: value for name, value in named.items() if value is not None})


def _classify(prefix: Prefix, year: int) -> Record | None:
    message, ts = prefix.message, prefix.ts
    if message.startswith("server_args="):
        return ServerArgsLine(
            server_count(message, "disaggregation_bootstrap_port"),
            launch_of(message),
            dp_replicas(message),
            pairing_tp_size(message),
        )
    if "failed for request" in message:
        return _failure(prefix)
    if holds_any(message, _FAILURE_KINDS) and _FAILURE_KIND.search(message):  # the substrings first
        raise Garbled("a failure line without its request")
    if " batch" in message:
        match = _BATCH.match(message)
        if match:
            queues = {f"queue_{name[:-4]}": int(value) for name, value in _QUEUE.findall(message)}
            usage = _PREALLOC_USAGE.search(message)
            if usage:
                queues["prealloc_usage_permille"] = round(float(usage[1]) * 1000)
            throughput = _THROUGHPUT.search(message)
            if throughput:
                queues[f"{throughput[1]}_throughput_tps"] = round(float(throughput[2]))
            return BatchLine(ts, prefix.tp or 0, match[1].lower(), queues, prefix.pp, prefix.tags.get("DP"))
    # each regex below after a substring every match of it holds: most marked lines are none of them
    if "Session " in message and _SESSION.search(message):
        return ContextLine(ts, prefix.tp, "session", None, message)
    if "connection with prefill instance" in message and _LOST.search(message):
        return ContextLine(ts, prefix.tp, "lost_connection", None, message)
    if "room" in message:
        for pattern in _METADATA_FAILURES:
            match = pattern.search(message)
            if match:
                return FailureLine(
                    ts, prefix.tp or 0, METADATA_CHECK, match[1], _room(match[2]), cut_text(message), False, "",
                    prefix.pp, prefix.tags.get("DP"),
                )  # fmt: skip
        for pattern in _ROOM_CONTEXT:
            match = pattern.search(message)
            if match:
                return ContextLine(ts, prefix.tp, "room", _room(match[1]), message)
    if holds_any(message, _HINTS):
        return ContextLine(ts, prefix.tp, "hint", None, message)
    if holds_any(message, _BOOTSTRAP_ERRORS):
        return ContextLine(ts, prefix.tp, BOOTSTRAP_ERROR, None, message)
    if "scheduler " in message and not message.startswith(CRASHES) and (dead := _STARTUP_DEATH.search(message)):
        return _launcher(prefix, dead)
    if message.startswith("Exit code: ") and (code := _EXIT_CODE.fullmatch(message)):
        return LauncherLine(ts, None, int(code[1]))
    if message.startswith("Traceback (most recent call last)"):
        return ContextLine(ts, prefix.tp, "traceback", None, message)
    if message.startswith(CRASHES):
        return ContextLine(ts, prefix.tp, CRASHED, None, crash_text(message))
    if message.startswith(ENGINE_INIT_FAILED):
        return ContextLine(ts, prefix.tp, CRASHED, None, cut_text(message.strip()))
    if "crashed with exit code" in message and (died := _SUBPROCESS_CRASH.search(message)):
        return _subprocess_crash(prefix, died)
    if "unexpectedly failed with" in message and (died := _CHILD_FAILED.search(message)):
        return ContextLine(ts, prefix.tp, CRASHED, None, f"its child process pid={died[2]} {_how(int(died[1]))}")
    if message.startswith(THREAD_DEATH):
        return _thread_died(prefix)
    fatal = _FATAL.search(message) if holds_any(message, _FATAL_WORDS) else None
    if fatal:
        said = message[fatal.start() :].strip().replace(_STRAY_QUOTE, _STRAY_QUOTE[:-1], 1)
        return ContextLine(ts, prefix.tp, CRASHED, None, cut_text(said))
    if ts is None:
        return _transport_library(message, year)
    return None


def holds_any(text: str, words: Iterable[str]) -> bool:
    """Whether `text` holds any of `words` (a loop: a third of `any()` over a generator, on every marked line)."""
    for word in words:  # noqa: SIM110  # any() over a generator costs twice the loop
        if word in text:
            return True
    return False


def crash_text(record: str) -> str:
    """A scheduler's crash in a few words: its exception and the frame that raised it (`Scheduler hit an
    exception: KeyError: 42, in sglang/srt/disaggregation/mooncake/conn.py:950 check_status`)."""
    header = next((crash for crash in CRASHES if record.startswith(crash)), CRASH)
    return cut_text(f"{header}: {_raised(record.rstrip().splitlines())}")


def _subprocess_crash(prefix: Prefix, died: re.Match[str]) -> ContextLine:
    """`Subprocess scheduler_0 (pid=922727) crashed with exit code -11.`: that scheduler's rank crashed (its index
    is its TP rank on a one-node server), by a signal when the code is negative."""
    tp = int(died[1]) if died[1] is not None else prefix.tp
    if tp is not None and tp > RANK_TAG_MAX:
        raise Garbled(f"scheduler_{tp} is past {RANK_TAG_MAX}")
    process = f"scheduler_{died[1]}" if died[1] is not None else "detokenizer"
    return ContextLine(prefix.ts, tp, CRASHED, None, f"its {process} process {_how(int(died[2]))}")


def _launcher(prefix: Prefix, dead: re.Match[str]) -> LauncherLine:
    """`Rank 2 scheduler died during initialization (exit code: -9)`: the scheduler the launcher started third on its
    node died before its server was ready."""
    index = int(dead[1])
    if index > RANK_TAG_MAX:
        raise Garbled(f"rank {index} is past {RANK_TAG_MAX}")
    return LauncherLine(prefix.ts, index, int(dead[2]) if dead[2] is not None else None)


def startup_death(line: LauncherLine, launch: NodeOf | None, code: int | None = None) -> ContextLine:
    """The crash a launcher's line tells, with `code` where the line gives none (its next line's), of the scheduler
    its index names on the node `launch` lays out; `launch` None (not known): the index read as the TP rank (right on
    a server's first node without pipeline stages). Killed by SIGQUIT (-3), the scheduler was taken down with its
    server after another of its processes failed. Raises `Garbled` for an index past the node's schedulers."""
    assert line.index is not None  # an exit code's line tells no crash of its own
    rank = launch.scheduler(line.index) if launch is not None else (None, line.index)
    if rank is None:
        started = len(launch.tp_ranks) * len(launch.pp_ranks) if launch is not None else 0
        raise Garbled(f"rank {line.index} of a node whose launcher started {started} schedulers")
    code = line.code if line.code is not None else code
    how = "" if code is None else f", {_how(code)}"
    if code == -signal.SIGQUIT:
        how += " (its server was taken down after another of its processes failed)"
    return ContextLine(line.ts, rank[1], CRASHED, None, f"{STARTUP_DEATH}{how}", rank[0])


def _how(code: int) -> str:
    """How a process ended, from the exit code its parent saw (negative: the signal that killed it)."""
    return f"killed by {_signal_name(-code)}" if code < 0 else f"exited with code {code}"


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _raised(lines: list[str]) -> str:
    """What a traceback (`lines`, its first the record that logs it) says was raised, and where: `KeyError: 42, in
    sglang/srt/disaggregation/mooncake/conn.py:950 check_status`."""
    at = next(  # the last unindented line shaped as one (a shipper may strip the indents of code lines)
        (
            i
            for i in range(len(lines) - 1, 0, -1)
            if lines[i][:1] not in (" ", "\t") and _EXCEPTION_LINE.match(lines[i])
        ),
        None,
    )
    exception = lines[at].strip() if at is not None else ""
    frames = [frame for line in lines[:at] if (frame := _FRAME.match(line))]  # the frame that raised it is above it
    where = ""
    if frames:
        path, line, function = frames[-1].groups()
        path = path[path.rfind("sglang/") :] if "sglang/" in path else path.rpartition("/")[2]
        where = f", in {path}:{line} {function}"
    return f"{exception or 'its traceback was cut'}{where}"


def _thread_died(prefix: Prefix) -> ContextLine | None:
    """A thread's death with its traceback: one of the rank's KV transfer threads (`thread_died`: `thread Thread-5
    (transfer_worker) died: ValueError: ..., in ...`), or a traceback like any other (context) for another thread."""
    lines = prefix.message.rstrip().splitlines()
    match = _THREAD.match(lines[0])
    if match is None:
        raise Garbled("a thread's death without its name")
    name, target = match[1], match[2] or ""
    if not (_KV_THREAD.search(target or name) or "/disaggregation/" in prefix.message):
        return ContextLine(prefix.ts, prefix.tp, "traceback", None, prefix.message)
    thread = f"{name} ({target})" if target else name
    return ContextLine(prefix.ts, prefix.tp, THREAD_DIED, None, cut_text(f"thread {thread} died: {_raised(lines)}"))


def _failure(prefix: Prefix) -> FailureLine:
    match = _FAILURE.search(prefix.message)
    if match is None:
        raise Garbled("a failure line without its kind")
    if match.start() and prefix.message[match.start() - 1] == '"':  # a JSON string: a response's `finish_reason`
        match = _FAILURE.match(_json_string_at(prefix.message, match.start()))
        if match is None:
            raise Garbled("a failure line without its kind")
    rest = match[2].rstrip()
    own_restore = rest.endswith(OWN_RESTORE_FAILED)
    fields, _, exception = rest.removesuffix(OWN_RESTORE_FAILED).partition(" with exception ")
    rank = _word_search(_RANK, fields)
    rid = _word_search(_RID, fields)
    room_field = _word_search(_ROOM_FIELD, fields)
    if not exception and room_field and room_field[1] != "None" and room_field.end() == len(fields):
        exception = NO_REASON  # nothing raised: the rank failed the room without a record (a HiCache restore, <0.5.23)
    if not exception or (rank is None and prefix.tp is None):
        raise Garbled("a failure line cut before its exception")
    kv_error = _EXCEPTION.match(exception)
    if kv_error is None and exception.startswith("KVTransferError("):
        raise Garbled("a failure line cut in its exception")  # a log cut mid-line: no reason to read
    room_text = kv_error[1] if kv_error else room_field[1] if room_field else "None"
    if room_field and room_field[1] != "None":
        room_text = room_field[1]
    room = _room(room_text) if room_text != "None" else None
    tp = prefix.tp if prefix.tp is not None else int(rank[1]) if rank else 0
    if tp > RANK_TAG_MAX:
        raise Garbled(f"rank={tp} is past {RANK_TAG_MAX}")
    reason = kv_error[2] if kv_error else exception
    reason = cut_text(reason.strip() + (OWN_RESTORE_FAILED if own_restore else ""))
    return FailureLine(
        prefix.ts, tp, match[1], rid[1] if rid else "", room, reason, kv_error is not None, prefix.level, prefix.pp,
        prefix.tags.get("DP"),
    )  # fmt: skip


_AS_PRINTED = re.compile(
    r"\[([0-9]{4}-[0-9]{2}-[0-9]{2} [0-9]{2}:[0-9]{2}:[0-9]{2}) TP([0-9]{1,4})\] "
    r"((Decode handshake|Decode transfer|Prefill transfer|Prefill bootstrap) failed for request "
    r"rank=[0-9]+ (?:[\w.]*\.)?rid='([\w-]*)' (?:[\w.]*\.)?bootstrap_room=([0-9]{1,19}) "
    r"with exception KVTransferError\(bootstrap_room=(?:[0-9]+|None)\): ([^\x1b\n]+))"
)
"""A failure line as SGLang prints it (`[2026-01-02 00:00:01 TP2] Decode transfer failed for request rank=2
decode_req.req.rid='ab12' decode_req.req.bootstrap_room=7 with exception KVTransferError(bootstrap_room=7): ...`):
no wrapper, no fraction of a second, a TP tag alone, a request id of word characters (no field's name in it), no
terminal code. What `parse_prefix` and `classify` read of it, `as_printed` reads in one match."""


_LOST_AS_PRINTED = re.compile(
    r"\[([0-9]{4}-[0-9]{2}-[0-9]{2} [0-9]{2}:[0-9]{2}:[0-9]{2}) TP([0-9]{1,4})\] "
    r"((?:Lost|Losing) connection with prefill instance \(bootstrap_addr: [\w.:%-]*\)"
    r"(?:, [0-9]+ requests affected|, affected [0-9]+ requests)?)"
)
"""A decode rank's lost prefill as SGLang prints it (`[2026-01-02 00:00:01 TP2] Lost connection with prefill instance
(bootstrap_addr: 10.0.0.5:8998), 3 requests affected`): a TP tag alone, an address of no space, bracket or terminal
code, nothing after but the count. No test `classify` makes before its lost connection's can hold in it."""


def as_printed(line: str) -> tuple[Prefix, FailureLine | ContextLine] | None:
    """(its prefix, its record) of a failure line in `_AS_PRINTED`'s shape, or of a lost connection in
    `_LOST_AS_PRINTED`'s, as `parse_prefix` and `classify` read them (most marked lines of a log: their ~40 calls in
    one match); None for any other line, and for one they would refuse (a rank tag, or a room, past its bound;
    checked alike by a test), which they read instead. Raises ValueError for a time that cannot be, as
    `parse_prefix` does."""
    line = line.rstrip()
    match = _AS_PRINTED.fullmatch(line)
    if match is None:
        lost = _LOST_AS_PRINTED.fullmatch(line)
        if lost is None or int(lost[2]) > RANK_TAG_MAX:
            return None
        ts, tp = stamp_seconds(lost[1]), int(lost[2])
        return Prefix(ts, {"TP": tp}, lost[3]), ContextLine(ts, tp, "lost_connection", None, lost[3])
    tp, room, message = int(match[2]), int(match[6]), match[3]
    if tp > RANK_TAG_MAX or room > ROOM_MAX or message.endswith(OWN_RESTORE_FAILED):
        return None
    ts = stamp_seconds(match[1])
    reason = cut_text(match[7].strip())
    return Prefix(ts, {"TP": tp}, message), FailureLine(ts, tp, match[4], match[5], room, reason, True)


def _word_search(pattern: re.Pattern[str], text: str) -> re.Match[str] | None:
    """The first match of `pattern` (which starts with a word character) where a word starts: what `\b` before it
    finds, at a third of the cost (a regex that starts with `\b` has no literal prefix to skip to)."""
    position = 0
    while (found := pattern.search(text, position)) is not None:
        start = found.start()
        if not start or not (text[start - 1].isalnum() or text[start - 1] == "_"):
            return found
        position = start + 1
    return None


def _json_string_at(text: str, start: int) -> str:
    """The JSON string that goes on from `start` (after its opening quote), up to its closing quote, unescaped:
    what a client's response quotes of a failure (`"message":"Decode transfer failed ...","status_code":500`)."""
    body = _JSON_STRING_BODY.match(text, start)[0]  # type: ignore[index]  # matches any text, the empty string too
    try:
        return str(json.loads(f'"{body}"'))
    except ValueError:  # an escape cut short
        return body


def _room(digits: str) -> int:
    """A bootstrap room (a 63-bit id); Garbled past it (a room of 2**70 ended a sidecar's event publisher)."""
    room = int(digits)
    if room > ROOM_MAX:
        raise Garbled(f"room {digits[:24]}... is past a 63-bit id")
    return room


def _transport_library(message: str, year: int) -> ContextLine | None:
    """A Mooncake/NIXL glog line, a UCX line or an Ascend MemFabric error line (they carry their own time, never a
    room); a PyTorch C++ line whose process dies with it (its NCCL watchdog's), its rank's crash."""
    torch, glog = _glog_of(message)
    if glog and torch and any(fatal in glog[7] for fatal in _TORCH_FATAL):
        tp = int(torch[1])
        if tp > RANK_TAG_MAX:
            raise Garbled(f"rank {tp} is past {RANK_TAG_MAX}")
        return ContextLine(_glog_seconds(glog, year), tp, CRASHED, None, cut_text(glog[7].strip()))
    if glog:
        if glog[1] == "I" and not any(word in glog[7] for word in _TRANSPORT_KEYWORDS):
            return None
        said = message if torch else message[glog.start() :]  # a glog line glued to another's text: its own
        return ContextLine(_glog_seconds(glog, year), None, "glog", None, said)
    ucx = _UCX.search(message)
    if ucx:
        return ContextLine(float(ucx[1]), None, "ucx", None, message)
    memfabric = _MEMFABRIC.match(message)
    if memfabric:
        try:
            ts = stamp_seconds(memfabric[1]) + float(memfabric[2])
        except ValueError as error:
            raise Garbled(f"a MemFabric line with a bad time: {memfabric[1]}") from error
        return ContextLine(ts, None, "memfabric", None, message)
    return None
