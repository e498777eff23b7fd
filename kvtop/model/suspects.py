"""Suspects: what most likely broke behind a failure group (DOMAIN.md, "Origins, suspects and incidents").

The origin of a group is who *noticed*; its suspect is what *broke*, with the evidence in a few words:

1. an agent's origin names its suspect itself (`Failure.suspect`: the rank that sent the corrupt chunk, the
   peer whose heartbeat stopped, the rank that never voted): exact;
2. otherwise the domain's rules read the origin: a client's abort -> the client; a checksum mismatch -> the
   sender (`from prefill rank N` on the room's prefill instance, else the label a kvtop agent's line gives it,
   `from prefill rank 1 (prefill-0/TP1)`; for another room's metadata, that room's
   prefill instance, or the prefill side); `Lost`/`Losing connection with prefill
   instance (bootstrap_addr: X)` -> the prefill instance at X; `remote ... session S is not alive` -> the
   decode rank at S; `Failed to send kv chunk of R to P` -> the decode rank at P (named S when its sender said
   `Session S failed.` with it: Mooncake's two addresses of one decode rank); either, where the room's prefill
   ranks name decode ranks on several hosts (one decode instance over several nodes) -> the room's decode
   instance, else the decode side at every host named (`_decode_hosts`), or several on one host (a decode of TP
   or DP attention on one node) -> the room's decode instance, else that host; a decode timeout -> the
   room's prefill side; a prefill timeout -> the room's decode side (the instance when the room's link
   names it, else "the decode side of prefill-0"); a peer lost that the reason does not name (NIXL's
   `NIXL_ERR_REMOTE_DISCONNECT`) -> the room's other side; a consensus timeout -> the rank it waited for; a
   refusal -> the refusing rank; a group whose origin was never seen -> what an agent's echo of it carries
   from the origin's own suspect (learnt through the instance's vote), else that origin (its record never
   came), or, with no origin named, what its echo says ("Failed to get kvcache from prefill instance" -> the prefill
   side, "Aborted by decode-side abort notification." -> the decode side); anything else -> unknown, noticed by
   the origin's instance (the views say so, never guess);
3. liveness corrects both (live agents only): a rank that was itself silent (stopped, starved, partitioned)
   just before it recorded a failure of the `unresponsive` kind is the suspect of it (its peers did not go
   away: it did); an instance suspect with exactly one of its ranks silent then is that rank;
4. so does a crash (server logs): an `unresponsive` suspect (a rank, an instance, or the address of one whose
   log was read) with exactly one rank whose scheduler had crashed up to `CRASH_EXPLAINS_S` before is that
   rank (of several, the one whose crash the others of its instance followed, saying their peer went away:
   `lost_a_peer`); a rank whose own KV transfer thread died is the suspect of the `unresponsive` failures it
   records after;
5. a sender's own transport fault (`local_fault`: `Memory region not registered`, ibverbs' local errors) logged
   just before its send failure makes its instance the suspect, not the peer it could not send to (and of the rooms
   it refuses later on a session it gave up on then: `_refused_after_own_fault`); memory a side's
   transport could not register (`UNREGISTERED`), however long before, makes that side's instance the suspect of the
   sends, sessions and waits of its rooms that failed (the sender first, then the decode it writes into); a
   handshake of the two sides that failed (`handshake_fault`) shortly before makes the link between them the suspect,
   and so does a sender's refusal of sessions whose own decode ranks answered in that second
   (`_refused_while_answering`).

The kind of failure (`Kind`) joins the failure classes one cause produces: a rank that dies makes its peers
lose it (`peer_lost`), time out (`timeout_*`) and fail to send to it (`send_failed`): all `unresponsive`.
"""

from __future__ import annotations

import re
from collections.abc import Collection
from enum import StrEnum
from typing import NamedTuple, Protocol

import msgspec

from kvtop.model.fold import ABORTED, FailureGroup, Observed
from transport.plane.events import LogContext


class Kind(StrEnum):
    """Which kind of failure an incident is: the failure classes one cause produces, joined."""

    CORRUPT = "corrupt"
    UNRESPONSIVE = "unresponsive"
    REFUSING = "refusing"
    FAILING = "failing"
    ABORTED = "aborted"

    @property
    def verb(self) -> str:
        """What the suspect does, in words (`prefill-0/TP1 sends corrupt KV`)."""
        return _VERBS[self]


_VERBS = {
    Kind.CORRUPT: "sends corrupt KV",
    Kind.UNRESPONSIVE: "stopped answering",
    Kind.REFUSING: "refuses transfers",
    Kind.FAILING: "fails transfers",
    Kind.ABORTED: "aborted requests",
}
KIND_OF_CLASS = {
    "checksum": Kind.CORRUPT,
    "timeout_bootstrap": Kind.UNRESPONSIVE,
    "timeout_waiting": Kind.UNRESPONSIVE,
    "timeout_transfer": Kind.UNRESPONSIVE,
    "timeout_consensus": Kind.UNRESPONSIVE,
    "peer_lost": Kind.UNRESPONSIVE,
    "send_failed": Kind.UNRESPONSIVE,
    "bootstrap_error": Kind.UNRESPONSIVE,
    "refused": Kind.REFUSING,
    ABORTED: Kind.ABORTED,
}
"""Every other class (`other`, `propagated`) is `failing`."""

CRASHED = "crash"
"""A rank's process died (its scheduler's exception, a fatal signal): the context kind of its log line."""
THREAD_DIED = "thread_died"
"""One of a rank's KV transfer threads died (its process goes on, the rooms the thread served never finish)."""
CRASH_KINDS = (CRASHED, THREAD_DIED)
"""A rank's crashes (`ClusterModel.crashes`)."""
STARTUP_DEATH = "its scheduler died at start-up"
"""How a crash reads that only SGLang's launcher told (`Rank 0 scheduler is dead.`, `Rank 0 scheduler died during
initialization (exit code: -3)`): right after another rank of its instance crashed it is that crash's aftermath (the
launcher names the first scheduler it waits on that is gone, once the server is being taken down)."""

_PEER_GONE = re.compile(
    r"Connection (?:reset|closed) by (?:remote )?peer|Broken pipe|remote process exited or there was a network error"
)
"""What a crash says of a process it sent to or waited on that went away: the socket's and gloo's words, NCCL's
`ncclRemoteError` (a pipeline stage's `isend` to the next stage that died: sglang #30158)."""


def lost_a_peer(text: str) -> bool:
    """Whether a crash's text says the process it talked to went away (its crash is another's aftermath)."""
    return _PEER_GONE.search(text) is not None


def is_transport_error(kind: str, text: str) -> bool:
    """A context line that is an error of the transfer itself, whatever failed or not near it: a transport
    library's (a glog error or fatal line, UCX's ERROR, Ascend MemFabric's ERROR or FATAL: the only lines of it read)
    or a session SGLang gave up on (`Session X failed.`); Mooncake's warning that it could not register memory."""
    if kind == "glog":
        return text.lstrip()[:1] in ("E", "F") or UNREGISTERED in text  # Mooncake warns of that one (`W`)
    return kind in ("session", "memfabric") or (kind == "ucx" and "UCX  ERROR" in text)


_LOCAL_FAULTS = (
    "Memory region not registered",  # Mooncake's RDMA transport: the buffer to send is in no registered region
    "local protection error",  # ibverbs completion codes of the local side (ibv_wc_status_str)
    "local length error",
    "local QP operation error",
    "local access error",
    "hipIpcOpenMemHandle failed",  # Mooncake's HIP transport chose GPU IPC for a peer on another host
    "Bad address",  # EFAULT: memory the sender may not read (GPU memory given to Mooncake's TCP transport)
    "Failed to create QP",  # Mooncake: its side's queue pairs ran out (the driver's limit; Mooncake #1845)
    "Cannot assign requested address",  # EADDRNOTAVAIL on connect: its own ephemeral ports used up (sglang PR #31208)
)
"""What a transport library logs of a fault of its own side (its memory registration, its queue pair), never of
its peer: the sender's own transport broke, whatever it then says of the peer it could not send to."""
_HANDSHAKE_FAULTS = (
    "Failed to modify QP to RTR",  # Mooncake's RDMA handshake: the peer's GID, LID, QP number or MTU would not do
    "received packet mismatch",  # Mooncake: the peer's handshake answer named other NICs (or none)
)
"""What a transport library logs of a handshake between two NICs that failed: either side's setup (its GID index,
MTU, NIC pairing) or the network between them, never one side alone (Mooncake's troubleshooting guide; sglang PR
#27730's ROCm run, both servers on one host)."""
HANDSHAKE_BEFORE_S = 60.0
"""A handshake that failed this long before a send failure explains it: Mooncake's synchronous transfer waits out its
own timeout (30 s in sglang PR #27730's log) before the send is failed."""


def handshake_fault(text: str) -> str:
    """The handshake fault a transport-library line tells (one of `_HANDSHAKE_FAULTS`), "" when it tells none."""
    return next((fault for fault in _HANDSHAKE_FAULTS if fault in text), "")


_IPC_OPEN_FAILED = re.compile(r"IpcOpenMemory\(\w*\) failed")
"""Ascend MemFabric's HYBM could not open a peer's memory slice in this process (`IpcOpenMemory(HANDLE)
failed:507899, ... deviceId=6, sliceInfo.logicDeviceId=5`), as Mooncake's `hipIpcOpenMemHandle failed`: the
side that logs it cannot map what it was to write to."""
IPC_OPEN_FAILED = "IpcOpenMemory failed"
LOCAL_FAULT_BEFORE_S = 5.0


def local_fault(text: str) -> str:
    """The local fault a transport-library line tells (one of `_LOCAL_FAULTS`), "" when it tells none."""
    for fault in _LOCAL_FAULTS:  # a loop, not a generator: this runs on every transport error kept, at each fold
        if fault in text:
            return fault
    return IPC_OPEN_FAILED if "IpcOpenMemory(" in text and _IPC_OPEN_FAILED.search(text) else ""


UNREGISTERED = "Failed to register memory"
"""Mooncake could not register a buffer of its side with the NIC (`RdmaTransport: Failed to register memory: addr A
length L`, a warning it goes on after; `rdma_context.cpp:203] Failed to register memory A: Bad address [14]`): no peer
can write into that memory, nor can it send from it, for as long as the process runs (GPU memory without
`nvidia_peermem`: Mooncake #351, #1207). A standing fault of that side, however long before a failure it was logged."""
_KV_NEVER_CAME = {
    "prefill": frozenset(("send_failed", "peer_lost")),
    "decode": frozenset(("timeout_waiting", "timeout_transfer")),
}
"""What memory out of reach or a failed handshake of the two sides' NICs explains: a prefill's send of KV that failed or
a session it gave up on, a decode's wait for KV that never came (not a heartbeat lost, a handshake over ZeroMQ, a
checksum, an abort)."""


def _kv_never_came(origin: Observed) -> bool:
    """Whether the origin is a failure of the KV's own transfer (`_KV_NEVER_CAME`): a prefill's lost peer only when it
    names a session (`remote ... session S is not alive`), not a backend's disconnect."""
    if origin.reason_class not in _KV_NEVER_CAME.get(origin.role, ()):
        return False
    return origin.reason_class != "peer_lost" or _SESSION.search(origin.reason) is not None


def memory_unregistered(text: str) -> bool:
    """Whether a transport-library line says its side could not register memory (`UNREGISTERED`)."""
    return UNREGISTERED in text


_FAILED_SESSION = re.compile(r"Session (\S+:\d{1,5}) failed\.")
"""Mooncake's `Session S failed.`, logged by a prefill rank just before its `Failed to send kv chunk of R to P`:
S is the decode rank's transfer engine (`host:rpc_port`), P the same rank's ZeroMQ port, and later rooms name S
(`remote mooncake session S is not alive`). SGLang's mooncake/conn.py."""
SESSION_TIE_S = 1.0


def failed_session(text: str) -> str:
    """The session a `Session S failed.` line gave up on, "" for any other line."""
    found = _FAILED_SESSION.search(text) if "Session " in text else None  # the substring first: most lines hold none
    return found[1] if found else ""


BOOTSTRAP_ERROR = "bootstrap_error"
"""A rank could not reach a prefill instance's bootstrap server (a failure that names no room: DOMAIN.md, an
incident of its address); the context kind of such a log line and its incidents' class."""
_BOOTSTRAP_SERVER = re.compile(
    r"host='([^']+)', port=(\d+)|(?:parallel|server) info (?:from|not available from) (?:bootstrap server )?"
    r"([^\s,)']+):(\d+)"
)
"""Where a bootstrap error says it asked: `HTTPConnectionPool(host='X', port=P)`, or SGLang's own words for the
server it gave up on (`Could not fetch prefill parallel info from X:P after 15 attempts`, `... from bootstrap server
X:P`, 0.5.9's `Prefill server info not available from X:P, retrying (1/20)...`)."""
BOOTSTRAP_UNANSWERED = "its bootstrap server did not answer"
REGISTRATION_FAILED = "Prefill instance failed to register to bootstrap server"
"""A prefill rank that gave up registering with its instance's bootstrap server (SGLang PR #25125: the server was not
listening yet): no decode can find that rank, every handshake with the instance fails. `: {error}` after it until
2026-05, ` after 5 retries` (no address) since."""
UNREGISTERED_RANKS = "its ranks could not register with its bootstrap server"
NOT_ALL_REGISTERED = "its bootstrap server answered that not all its ranks had registered"
"""The evidence of a decode's 503 from a bootstrap server (`_NOT_REGISTERED`)."""
_NOT_REGISTERED = "Prefill server not fully registered yet"
"""The bootstrap server's 503 to a decode's query (`Failed to get prefill server info: 503, ...`): it answered, but
not every rank of its instance registered with it."""
_UNPARSED_ADDRESS = "Failed to parse: "
"""The bootstrap address a request named did not parse (SGLang issue #6017: `http://192.168.80.184:None/route`)."""

WAITING_TIMED_OUT = "waiting_timeout"
"""A decode rank timed out a room waiting for its KV and the line that records it was not read (SGLang's hint
before it, `Some requests fail to receive KV Cache transfer done signal`, was): a failure that names no room, of
class `timeout_waiting`; the context kind of such a rank event."""
HINTED = "a room timed out waiting for KV (SGLang's hint; the room's own line was not read)"
BOOTSTRAP_TIMED_OUT = "bootstrap_timeout"
"""A prefill rank timed out a room waiting for the decode's transfer request and the line that records it was not
read (SGLang's hint before it, `Some requests timed out when bootstrapping`, was): a failure that names no room, of
class `timeout_bootstrap`; the context kind of such a rank event."""
BOOTSTRAP_HINTED = "a room timed out waiting for the decode's request (SGLang's hint; the room's own line was not read)"
PREFILL_LOST = "prefill_lost"
"""A decode rank lost a prefill instance's heartbeat (`Lost connection with prefill instance (bootstrap_addr: X), N
requests affected`) and no room's line for it was read: a failure that names no room, of class `peer_lost`; the
context kind of such a rank event."""
HEARTBEAT_LOST = "decode lost its heartbeat"

SILENT_BEFORE_S = 5.0
"""A rank's own `unresponsive` failure this soon after a silence of it ended is the silence's doing."""


class Suspect(msgspec.Struct, frozen=True, array_like=True, gc=False):
    """What most likely broke: a `rank` or an `instance` (by label, or by address where only the logs name it),
    the unnamed other `side` of an instance, a `host` (the ranks of a role on it: several decode sessions of one
    host that failed together), the `client`, or `unknown` (`name`: the instance that noticed)."""

    kind: str
    name: str
    role: str = ""

    @property
    def text(self) -> str:
        """`prefill-0/TP1`, `prefill at 10.0.0.7:8998`, `decode at 10.0.0.7, 10.0.0.8`, `decode at 10.0.0.7` (a
        host), `the decode side of prefill-0`, `the link between prefill-0 and decode-0`, `the client`, `unknown
        (noticed by decode-0)`."""
        if self.kind == "client":
            return "the client"
        if self.kind == "unknown":
            return f"unknown (noticed by {self.name})" if self.name else "unknown"
        if self.kind == "side":
            return f"the {self.role} side of {self.name}"
        if self.kind == "link":
            prefill, _, decode = self.name.partition(LINK_JOIN)
            return f"the link between {_end_text(prefill, 'prefill')} and {_end_text(decode, 'decode')}"
        if self.kind == "host":
            return f"{self.role} at {self.name}"
        if self.role and (_ADDRESS_NAME.fullmatch(self.name) or _HOSTS_NAME.fullmatch(self.name)):
            return f"{self.role} at {self.name}"
        return self.name

    def as_dict(self) -> dict[str, str]:
        return {"kind": self.kind, "name": self.name, "role": self.role}


CLIENT = Suspect("client", "client")
LINK_JOIN = " - "
"""Between the two ends of a `link` suspect's name (`prefill-0 - decode-0`: the prefill's end first)."""


def _end_text(end: str, role: str) -> str:
    """One end of a link as a suspect of its own reads (`prefill-0`, `decode at 10.0.0.7:16416`)."""
    return Suspect("instance", end, role).text


_ADDRESS_NAME = re.compile(r"[^/\s]+:\d{1,5}")
"""A suspect named by an address (`10.0.0.7:8998`, a bootstrap server's host and port), not by a rank or an instance
label, whatever a wrapper named those (`sglang-prefill-0/TP2`): said with its role (`prefill at 10.0.0.7:8998`)."""
_HOSTS_NAME = re.compile(r"[^/\s,]+(?:, [^/\s,]+)+(?: and \d+ more)?")
"""An instance named by the hosts its ranks are on (`10.0.0.7, 10.0.0.8`: a multi-node decode whose log was not
read), said with its role (`decode at 10.0.0.7, 10.0.0.8`)."""


class Attribution(msgspec.Struct, frozen=True, gc=False):
    """A group's suspect, the kind of failure, and the evidence for the suspect in a few words."""

    suspect: Suspect
    kind: Kind
    evidence: str
    symptom_of: str = ""
    """A capacity symptom (a rank refusing under a full pool): an instance whose `unresponsive` incident, when
    one is under way then, explains it better than the rank itself (the pool filled with rooms waiting on it)."""
    unseen_origin: str = ""
    """A group whose origin's own record never arrived: that origin's label (an incident under way that it is
    the suspect of, or that it was noticing failures of then, explains the group better)."""
    echoed: bool = False
    """The suspect an echo carried for an origin whose own record never arrived: the kind of failure is unknown (or
    the origin named itself: a rank that refused a room, then went silent before its record was published), so an
    incident of that suspect under way, whatever its kind, takes the group."""
    standing: bool = False
    """A sender's standing refusal of a peer it gave up on (`remote mooncake session S is not alive`: SGLang
    blacklists the session at its first failed send and fails every later room to it at once): one cause however
    long the quiet between its rooms."""
    sessions: tuple[str, ...] = ()
    """The decode sessions (`host:port`, each prefill rank's peer) a room named, several: a multi-node decode
    instance's on several hosts, or those of one host, which its incident remembers (`Incident.sessions`)."""
    session: str = ""
    """The decode session (`host:port`) suspected by a room that named sessions on one host only: an incident of a
    multi-node decode instance whose rooms named it may take the group (`IncidentTracker._joinable`)."""
    registration_of: tuple[str, ...] = ()
    """A decode's bootstrap error (an address that did not answer, an answer that not all the prefill's ranks had
    registered): the names (the address it asked, the ranks of the one prefill it can be) that prefill's incident of
    its ranks' registration failure (`UNREGISTERED_RANKS`) goes by: one of them takes the line as an echo
    (`IncidentTracker.add_roomless`)."""


class Crashed(NamedTuple):
    """The rank that had crashed, its crash, and the ranks whose crashes after it were its aftermath."""

    label: str
    crash: LogContext
    aftermath: tuple[str, ...] = ()


class Surroundings(Protocol):
    """What the model knows around a group: the room's link and the ranks' liveness."""

    instances_at: dict[str, tuple[str, ...]]
    """The instances whose logs were read, by the bootstrap address (`host:port`) they serve at."""
    tp_sizes: dict[str, int]
    """The TP size of each instance whose log said it (its `server_args` line)."""

    def link_of(self, room: int) -> tuple[str, str]:
        """(prefill instance, decode instance) of a room, "" where unknown."""
        ...

    def role_of(self, label: str) -> str:
        """The role of a rank or instance label ("" when unknown)."""
        ...

    def silent_at(self, label: str, ts: float) -> tuple[float, float] | None:
        """The silence of the live rank `label` (since, until; `inf` while it lasts) that covers `ts` or ended at
        most `SILENT_BEFORE_S` before it; None when there was none."""
        ...

    def ranks_of(self, instance: str) -> list[str]:
        """The labels of the ranks of `instance` the model knows (of its layout: none heard as taken)."""
        ...

    def peers_of(self, name: str, instances_only: bool = False) -> Collection[str]:
        """The instances (or addresses) of the other role the model saw linked with an instance (or an address);
        `instances_only`: not the addresses."""
        ...

    def instances_of(self, role: str) -> list[str]:
        """The instances of `role` the model knows ranks of."""
        ...

    def crashed_at(self, name: str, ts: float) -> Crashed | None:
        """The one rank of `name` (a rank, an instance, a bootstrap address logs read may be at, or a role: every
        rank of it) that had crashed by `ts`, its crash and the crashes that were its aftermath; None when none had,
        or several whose crashes none explains."""
        ...

    def own_transport_fault(self, instance: str, ts: float) -> str:
        """The local fault a transport library of `instance` logged at most `LOCAL_FAULT_BEFORE_S` before `ts` or
        in its second (SGLang's lines tell whole seconds, glog's microseconds), "" when none did."""
        ...

    def handshake_failed(self, instance: str, ts: float) -> tuple[float, str] | None:
        """The latest handshake fault (`handshake_fault`) a transport library of `instance` logged at most
        `HANDSHAKE_BEFORE_S` before `ts` or in its second: when, what; None when none did."""
        ...

    def unregistered_at(self, instance: str, ts: float) -> float | None:
        """When a transport library of `instance` first said it could not register memory (`UNREGISTERED`), at or
        before `ts` (in its second); None when none did."""
        ...

    def session_failed_with(self, instance: str, address: str, ts: float, rank: str = "") -> str:
        """The session on `address`'s host that `instance` said failed (`failed_session`) within `SESSION_TIE_S` of
        `ts`: the one its `rank` said failed (the sender's own: with decode TP > 1 each prefill rank gives up on its own
        peer's session in the same second), else the one any rank of it did; "" when none did (or several did)."""
        ...

    def gave_up_on(self, instance: str, session: str, ts: float) -> float | None:
        """When `instance` last said `session` failed (`failed_session`) at or before `ts` (in its second); None when it
        did not (or that line is no longer kept)."""
        ...


_FROM_PREFILL_RANK = re.compile(r"from prefill rank (\d{1,4})(?: \(([\w.-]{1,128}/(?:PP\d{1,4}-)?TP\d{1,4})\))?")
"""A checksum failure's sender: its rank, and its label where a kvtop agent's line names it (`(prefill-0/TP1)`)."""
_METADATA_OF = re.compile(r"received metadata from bootstrap_room=(\d+)")
"""A decode's `Context corruption detected`: another room's metadata landed in the room's buffer."""
_BOOTSTRAP_ADDR = re.compile(r"(?:Lost|Losing) connection with prefill instance \(bootstrap_addr: ([^)]*)\)")
_SESSION = re.compile(r"remote (?:\w+ )?session (\S+) is not alive")
"""`mooncake`, `Mooncake` (since early 2026) or `p2p` before `session`, or no word."""
SESSION_NOT_ALIVE = "its session is not alive"
CARRIED_BOTH = "named and classed by the rank that noticed (its own record never arrived; an echo carried both)"
_SILENT_RANK = re.compile(r"Lost connection with rank (\S+) of this instance")
_FETCH_FROM = re.compile(
    r"Could not fetch prefill (?:parallel|server) info (?:from|for) (?:bootstrap_addr: )?([^\s,)]+)"
)
"""A room a decode rank failed because the prefill's bootstrap server did not answer: that server's address."""
_SEND_TO = re.compile(r"Failed to send (?:kv chunk|state components) of \S+ to (\S+)")
_SEND_TO_PREFILL = re.compile(r"(?:send_metadata|_register_kv_args) to prefill (\S+) failed")
_DOWN_AT = re.compile(r"Prefill server with bootstrap_addr: (\S+) is healthy before, but now it is down")
"""A room created after the decode's health check marked its prefill down (SGLang 0.5.23's `init`)."""
_VOTE_OF = re.compile(r"waiting for the vote of rank (\S+)")
_JOIN = re.compile(r"waiting for every rank of (\S+) to join")
_TOLD_BY = {
    "decode": ("Failed to get kvcache from prefill instance", "prefill"),
    "prefill": ("Aborted by decode", "decode"),  # `Aborted by decode peer`, `... decode-side abort notification.`
}
"""A rank's record of a room the other side failed (role -> (the reason's start, that side))."""
_POOL_FULL = "its KV pool is full"
_NOT_HEARD = re.compile(r"wait on the vote of \S+, not heard for (\d+(?:\.\d+)?)s\)")
"""How long the refusing rank had not heard the vote of the rank its rooms waited on (our agents say it)."""
_OWN_RESTORE = "(HiCache local restore failed on this rank)"
"""A decode rank's own HiCache restore of the room failed (SGLang 0.5.23 says so after the reason)."""
_TIMEOUTS = frozenset(("timeout_bootstrap", "timeout_waiting", "timeout_transfer"))
_MISROUTED = "follow_bootstrap_room conflict: "
"""A prefill rank that got a room another DP rank of its instance should have (its room says which): its instance's
routing failed the room, before any peer was asked (SGLang PR #29730: plain DP; #22901: a router's DP rank)."""


def attribute(group: FailureGroup, around: Surroundings) -> Attribution:
    """The suspect of one failure group, the kind of failure and the evidence (the rules of the module doc)."""
    origin = group.origin
    if origin is None:
        return _unseen_origin(group, around)
    kind = KIND_OF_CLASS.get(origin.reason_class, Kind.FAILING)
    if kind is Kind.UNRESPONSIVE:
        silence = around.silent_at(origin.rank, origin.ts)
        if silence is not None:
            evidence = f"{origin.rank} was silent {_span(silence)} itself, then recorded {origin.reason_class}"
            return Attribution(_rank(origin.rank, origin.role), kind, evidence)
        own = around.crashed_at(origin.rank, origin.ts)
        if own is not None and own.crash.kind == THREAD_DIED:  # what it waited for, a thread of its own did not do
            died = origin.ts - own.crash.ts
            evidence = f"a transfer thread of it died {died:.0f} s before it recorded {origin.reason_class}"
            return Attribution(_rank(origin.rank, origin.role), kind, evidence)
    session, sessions = "", tuple[str, ...]()
    if origin.suspect:
        suspect = _named(origin.suspect, around)
        evidence = "named by the rank that noticed"
        if kind is Kind.REFUSING and origin.suspect != origin.rank:  # its pool filled with rooms waiting on a peer
            kind, evidence = Kind.UNRESPONSIVE, "the rooms it refused waited on it"
            if heard := _NOT_HEARD.search(origin.reason):
                evidence = f"the rooms {origin.rank} refused waited on its vote, not heard for {heard[1]} s"
        elif kind is Kind.REFUSING and _POOL_FULL in origin.reason:
            evidence = f"the KV pool of {origin.instance} is full"  # whose: it may join another rank's incident
            return Attribution(suspect, kind, evidence, symptom_of=origin.instance)
    else:
        suspect, evidence = _by_rules(origin, group.room, around)
        if origin.reason_class == "send_failed" and (fault := around.own_transport_fault(origin.instance, origin.ts)):
            evidence = f"its own transport logged '{fault}' just before"  # the peer was not the one that failed
            return Attribution(Suspect("instance", origin.instance, origin.role), Kind.FAILING, evidence)
        if evidence == SESSION_NOT_ALIVE and (refused := _refused_after_own_fault(origin, suspect.name, around)):
            return refused
        if (
            evidence == SESSION_NOT_ALIVE
            and group.echoes
            and (refused := _refused_while_answering(group, origin, around))
        ):
            return refused
        if _kv_never_came(origin) and (link := _handshake(origin, group.room, suspect, around)):
            return link
        if _kv_never_came(origin) and (unregistered := _unregistered(origin, group.room, around)):
            return unregistered
        if suspect.kind == "rank" and suspect.role == "decode" and origin.role == "prefill":  # the peer it named
            session = suspect.name
            suspect, evidence, sessions = _across_hosts(group, suspect, evidence, around)
    if kind is Kind.UNRESPONSIVE and suspect.kind in ("rank", "instance"):
        suspect, evidence = _with_liveness(suspect, evidence, origin.ts, around)
    standing = evidence == SESSION_NOT_ALIVE or evidence.startswith(_SESSIONS_ON)
    if kind is Kind.UNRESPONSIVE and suspect.kind in ("rank", "instance", "side"):
        suspect, evidence = _with_crash(suspect, evidence, origin.ts, around)
    session = session if suspect.name == session else ""  # still the one session it named (no crash named a rank)
    return Attribution(suspect, kind, evidence, standing=standing, sessions=sessions, session=session)


def _refused_after_own_fault(origin: Observed, session: str, around: Surroundings) -> Attribution | None:
    """The sender's instance, when the session it refuses (`remote ... session S is not alive`: SGLang's blacklist) is
    one it gave up on (`Session S failed.`) right after a fault of its own transport (`own_transport_fault`): every
    later room to it fails of that fault, the decode never stopped answering (sglang PR #31208: its own ports used
    up, then `is not alive` on prefill and `Failed to get kvcache` on decode, both alive); None otherwise."""
    at = around.gave_up_on(origin.instance, session, origin.ts)
    fault = around.own_transport_fault(origin.instance, at) if at is not None else ""
    if at is None or not fault:
        return None
    evidence = f"it gave up on {session} {origin.ts - at:.0f} s before, right after its own transport logged '{fault}'"
    return Attribution(Suspect("instance", origin.instance, origin.role), Kind.FAILING, evidence, standing=True)


RANKS_SHOWN = 3
"""The decode ranks that answered a refusal names (the rest counted)."""


def _refused_while_answering(group: FailureGroup, origin: Observed, around: Surroundings) -> Attribution | None:
    """The link between the sender's instance and the room's decode instance (with the sessions refused), the sender
    refusing sessions it gave up on before (`remote ... session S is not alive`: SGLang keeps a failed session
    refused) whose own decode ranks (the ranks they send to: `_peer_ranks`) logged the prefill's Failed status
    (`Failed to get kvcache from prefill instance`) in that second: they answered, so the decode did not stop
    answering; what fails the room is the path to its sessions: an address the prefill cannot reach (a public report:
    the decode nodes had registered the wrong IPs), or a failure since gone that SGLang keeps refusing (an operator's
    notes, multi-node R1: what made the prefill give up was before the excerpt). Later rooms refusing those sessions
    join its incident (`IncidentTracker._of_session`). None when no such rank answered (a decode node that died leaves
    its ranks silent), or when the sender's giving up on the session is in its log (`Session S failed.`): that
    failure's cause, read, is the refusal's too."""
    members = (origin, *group.echoes)
    session = _SESSION.search(origin.reason)
    if session is None or around.gave_up_on(origin.instance, session[1], origin.ts) is not None:
        return None
    refused = {m.rank: found[1] for m in members if m.role == "prefill" and (found := _SESSION.search(m.reason))}
    told = _TOLD_BY["decode"][0]
    tellers = [m for m in members if m.role == "decode" and m.reason.startswith(told)]
    peers = _peer_ranks(refused, tellers[0].instance if tellers else "", around)
    answered = sorted(
        {m.rank for m in tellers if abs(m.ts - origin.ts) <= SESSION_TIE_S and _rank_order(m.rank)[1] in peers},
        key=_rank_order,
    )
    if not answered:
        return None
    more = len(answered) - RANKS_SHOWN
    named = ", ".join(answered[:RANKS_SHOWN]) + (f" and {more} more" if more > 0 else "")
    decode = _link_of(around, group.room)[1] or answered[0].rpartition("/")[0]
    evidence = (
        f"{origin.instance} refuses sessions it gave up on before while their decode ranks answered in that second "
        f"({named}): the path to them, not the decode's process (a session at an address the prefill cannot reach, "
        "or a failure since gone that it refuses until restarted)"
    )
    link = Suspect("link", f"{origin.instance}{LINK_JOIN}{decode}")
    sessions = _decode_sessions(group, around)
    return Attribution(link, Kind.FAILING, evidence, standing=True, sessions=sessions)


def _peer_ranks(refused: dict[str, str], decode: str, around: Surroundings) -> set[int]:
    """The numbers of the decode ranks the refusing prefill ranks (label -> the session each refused) sent to, by
    DOMAIN.md's rank mapping: where both instances' TP sizes are known (`_tp_size`), equal sizes pair each prefill
    rank with the decode rank of its number, a decode k times wider gives prefill rank p decode ranks kp to kp+k-1, a
    prefill k times wider gives it decode rank p // k; sizes neither equal nor multiples pair none. Where a size is
    not known (excerpts of logs), ranks pair by number unless one session is refused by two prefill ranks (they send
    to one decode rank: the prefill is wider): then none pair."""
    prefill = _rank_order(next(iter(refused)))[0] if refused else ""
    numbers = {_rank_order(rank)[1] for rank in refused}
    widths = _tp_size(prefill, around), _tp_size(decode, around)
    if widths[0] and widths[1]:
        wide, narrow = max(widths), min(widths)
        if wide % narrow:
            return set()
        k = wide // narrow
        if widths[1] >= widths[0]:
            return {k * p + i for p in numbers for i in range(k)}
        return {p // k for p in numbers}
    return numbers if len(set(refused.values())) == len(refused) else set()


def _tp_size(instance: str, around: Surroundings) -> int:
    """The TP size of an instance: what its log's `server_args` line said, else as far as the model knows its ranks:
    N where it knows ranks 0 to N-1 of it (of every pipeline stage), none missing; 0 when not (or the instance is
    unknown)."""
    if stated := around.tp_sizes.get(instance):
        return stated
    numbers = {_rank_order(label)[1] for label in around.ranks_of(instance)} if instance else set()
    return len(numbers) if numbers and numbers == set(range(len(numbers))) else 0


def _handshake(origin: Observed, room: int, named: Suspect, around: Surroundings) -> Attribution | None:
    """The link between the room's two sides when a transport library of either logged a failed handshake shortly
    before the origin failed (`_HANDSHAKE_FAULTS`): the room's prefill instance and its decode instance (or the decode
    rank the sender named by address); None when neither did, or an end is not known."""
    prefill, decode = _link_of(around, room)
    if origin.role == "prefill":
        prefill = origin.instance
        decode = decode or (named.name if named.kind == "rank" and named.role == "decode" else "")
    else:
        decode = origin.instance
    if not prefill or not decode:
        return None
    for end in (prefill, decode):
        if not named_by_address(end) and (fault := around.handshake_failed(end, origin.ts)) is not None:
            at, what = fault
            evidence = f"{end}'s transport logged '{what}' {origin.ts - at:.0f} s before"
            evidence += " (either end's setup, or the network between them)"
            return Attribution(Suspect("link", f"{prefill}{LINK_JOIN}{decode}"), Kind.FAILING, evidence)
    return None


def _unregistered(origin: Observed, room: int, around: Surroundings) -> Attribution | None:
    """The side of the room whose transport could not register its memory before the origin failed (`UNREGISTERED`):
    the sender first (the prefill), then the receiver it writes into (the decode); None when neither said so."""
    prefill, decode = _link_of(around, room)
    own = {origin.role: origin.instance}
    for role, instance in (("prefill", own.get("prefill", prefill)), ("decode", own.get("decode", decode))):
        at = around.unregistered_at(instance, origin.ts) if instance else None
        if at is not None:
            evidence = f"its transport could not register its memory ('{UNREGISTERED}' {origin.ts - at:.0f} s before)"
            return Attribution(Suspect("instance", instance, role), Kind.FAILING, evidence)
    return None


def bootstrap_unreachable(instance: str, text: str, ts: float, around: Surroundings) -> Attribution:
    """The suspect of a bootstrap server that a rank of `instance` could not reach: the prefill instance at the
    address the error names (`HTTPConnectionPool(host='X', port=P)`), else the prefill side of `instance` (a decode
    asking), or `instance` itself (a prefill rank registering with its own); an address that did not parse asked
    nothing (unknown, noticed by `instance`)."""
    if _UNPARSED_ADDRESS in text:  # `http://10.0.0.5:None/route`: nothing was asked, the address had no port
        return Attribution(Suspect("unknown", instance), Kind.FAILING, "its bootstrap address did not parse")
    address = bootstrap_address(text)
    evidence = BOOTSTRAP_UNANSWERED
    if REGISTRATION_FAILED in text:
        suspect = Suspect("instance", address or instance, "prefill")
        evidence = UNREGISTERED_RANKS
    elif address:
        suspect = Suspect("instance", address, "prefill")
    else:
        suspect = Suspect("side", instance, "prefill")
    if _NOT_REGISTERED in text:
        evidence = NOT_ALL_REGISTERED
    suspect, evidence = _with_crash(suspect, evidence, ts, around)
    asking = REGISTRATION_FAILED not in text and (address or _NOT_REGISTERED in text)
    meant = _prefill_meant(address, around) if asking else ()
    return Attribution(suspect, Kind.UNRESPONSIVE, evidence, registration_of=meant)


def _prefill_meant(address: str, around: Surroundings) -> tuple[str, ...]:
    """The names a decode's bootstrap error can only mean one prefill by (`Attribution.registration_of`): the address
    it asked and the ranks of the instances logs read at it; with no address (a `not fully registered` answer), the
    ranks of the one prefill instance known (none: several are, or none)."""
    if address:
        instances = around.instances_at.get(address, ())
        return (address, *(rank for instance in instances for rank in around.ranks_of(instance)))
    prefills = around.instances_of("prefill")
    return tuple(around.ranks_of(prefills[0])) if len(prefills) == 1 else ()


def bootstrap_address(text: str) -> str:
    """The `host:port` of the bootstrap server a bootstrap error says it asked ("" when it names none)."""
    found = _BOOTSTRAP_SERVER.search(text)
    if found is None:
        return ""
    return f"{found[1]}:{found[2]}" if found[1] is not None else f"{found[3]}:{found[4]}"


def asked_in_vain(instance: str, ts: float, around: Surroundings) -> Attribution:
    """The suspect of a prefill rank's roomless timeout in Bootstrapping (`BOOTSTRAP_TIMED_OUT`): the decode side of
    its instance (the request never came), a decode rank whose log said it crashed shortly before."""
    return _hinted_side(instance, "decode", BOOTSTRAP_HINTED, ts, around)


def waited_in_vain(instance: str, ts: float, around: Surroundings) -> Attribution:
    """The suspect of a decode rank's roomless timeout in WaitingForInput (`WAITING_TIMED_OUT`): the prefill side
    of its instance (the KV never came), a prefill rank whose log said it crashed shortly before."""
    return _hinted_side(instance, "prefill", HINTED, ts, around)


def _hinted_side(instance: str, other: str, evidence: str, ts: float, around: Surroundings) -> Attribution:
    """The `other` side of the instance whose log held a hint; unknown when that instance is of the `other` role
    itself (one log of both servers read as one: "the prefill side of prefill-0" names nothing)."""
    if around.role_of(instance) == other:
        return Attribution(Suspect("unknown", instance), Kind.UNRESPONSIVE, f"{evidence}, in a log of the other role")
    suspect, evidence = _with_crash(Suspect("side", instance, other), evidence, ts, around)
    return Attribution(suspect, Kind.UNRESPONSIVE, evidence)


def prefill_lost(instance: str, text: str, ts: float, around: Surroundings) -> Attribution:
    """The suspect of a prefill instance's heartbeat a decode rank of `instance` lost (`PREFILL_LOST`): the prefill
    instance at the address the line names (else the prefill side of `instance`), a rank of it whose log said it
    crashed shortly before."""
    found = _BOOTSTRAP_ADDR.search(text)
    address = found[1].strip() if found else ""
    suspect = Suspect("instance", address, "prefill") if address else Suspect("side", instance, "prefill")
    suspect, evidence = _with_crash(suspect, HEARTBEAT_LOST, ts, around)
    return Attribution(suspect, Kind.UNRESPONSIVE, evidence)


def _unseen_origin(group: FailureGroup, around: Surroundings) -> Attribution:
    """A group whose origin's own record never arrived (its rank named by echoes), or that names no origin."""
    lead = group.lead
    carrier = carrying_echo(group)
    if carrier is not None:  # an agent's echo carries what its origin named (its vote, an ABORT, a status)
        suspect = _named(carrier.suspect, around)
        if not carrier.origin_class:  # an agent that does not carry the class: the kind is unknown
            evidence = "named by the rank that noticed (its own record never arrived; an echo carried it)"
            return Attribution(suspect, Kind.FAILING, evidence, echoed=True)
        kind = KIND_OF_CLASS.get(carrier.origin_class, Kind.FAILING)
        if kind is Kind.REFUSING and carrier.suspect != group.origin_label:
            kind = Kind.UNRESPONSIVE  # its pool filled with rooms waiting on the suspect
        itself = carrier.suspect == group.origin_label  # its silence since may be why its record never came
        return Attribution(suspect, kind, CARRIED_BOTH, echoed=itself)
    if group.origin_label:
        silence = around.silent_at(group.origin_label, lead.ts)
        suspect = _rank(group.origin_label, around.role_of(group.origin_label))
        if silence is not None:
            evidence = f"its own record never arrived: {group.origin_label} silent {_span(silence)}"
            return Attribution(suspect, Kind.UNRESPONSIVE, evidence)
        evidence = "its own record never arrived (only echoes of it did)"
        return Attribution(suspect, Kind.FAILING, evidence, unseen_origin=group.origin_label)
    told = _TOLD_BY.get(lead.role)
    if told is not None and lead.reason.startswith(told[0]):
        if link := _handshake(lead, group.room, Suspect("unknown", ""), around):  # their handshake failed
            return link
        if unregistered := _unregistered(lead, group.room, around):  # the other side failed for want of it
            return unregistered
        other = told[1]
        instance = _link_of(around, group.room)[0 if other == "prefill" else 1]
        suspect = Suspect("instance", instance, other) if instance else Suspect("side", lead.instance, other)
        return Attribution(suspect, Kind.FAILING, f"{lead.role} was told by {other} that the room failed")
    return Attribution(Suspect("unknown", lead.instance), Kind.FAILING, "no origin seen, nothing names a cause")


def carrying_echo(group: FailureGroup) -> Observed | None:
    """The echo that carries what the group's origin named (an agent's echo of an origin in another rank)."""
    for echo in group.echoes:  # a loop, not `next()` over a generator: asked twice of every group without an origin
        if echo.suspect:
            return echo
    return None


_HELD: dict[re.Pattern[str], str] = {
    _BOOTSTRAP_ADDR: " connection with prefill instance (bootstrap_addr: ",
    _DOWN_AT: " is healthy before, but now it is down",
    _FETCH_FROM: "Could not fetch prefill ",
    _SESSION: " is not alive",
    _SEND_TO: "Failed to send ",
    _SEND_TO_PREFILL: " to prefill ",
    _SILENT_RANK: "Lost connection with rank ",
    _VOTE_OF: "waiting for the vote of rank ",
    _JOIN: "waiting for every rank of ",
}
"""What every match of each pattern a failure's reason is searched for holds: looked for first (most reasons hold
none, and each regex was a search of every origin's reason)."""
_RULES = tuple(
    (pattern, _HELD[pattern], kind, role, evidence)
    for pattern, kind, role, evidence in (
        (_BOOTSTRAP_ADDR, "instance", "prefill", HEARTBEAT_LOST),
        (_DOWN_AT, "instance", "prefill", HEARTBEAT_LOST),
        (_FETCH_FROM, "instance", "prefill", BOOTSTRAP_UNANSWERED),
        (_SESSION, "rank", "decode", SESSION_NOT_ALIVE),
        (_SEND_TO, "rank", "decode", "sending to it failed"),  # `_decode_rank_at` names it by its session
        (_SEND_TO_PREFILL, "rank", "prefill", "sending to it failed"),
        (_SILENT_RANK, "rank", "", "stopped voting in its instance"),
        (_VOTE_OF, "rank", "", "never voted on the room"),
        (_JOIN, "instance", "", "not every rank joined"),
    )
)
"""`_by_rules`' suspects named in a reason, in order: (pattern, the text its matches hold, suspect kind, role ("": the
origin's), evidence). The text is kept beside its pattern: a lookup in `_HELD` hashes the compiled pattern each time
(its whole code, uncached: 0.2-0.7 us), nine lookups an origin."""


def _by_rules(origin: Observed, room: int, around: Surroundings) -> tuple[Suspect, str]:
    """The domain's rules for an origin that names no suspect (SGLang logs; agents of older versions)."""
    reason, name = origin.reason, origin.reason_class
    if name == ABORTED:
        return CLIENT, "Aborted by AbortReq. (the client or router asked)"
    if name == "checksum" and (other := _METADATA_OF.search(reason)):  # written by the other room's prefill
        prefill = _link_of(around, int(other[1]))[0]
        suspect = Suspect("instance", prefill, "prefill") if prefill else _other_side(origin, room, around)
        return suspect, f"room {other[1]}'s metadata landed in its buffer (metadata buffer index collision)"
    if name == "checksum":
        prefill = _link_of(around, room)[0]
        prefill = "" if named_by_address(prefill) else prefill  # a bootstrap address names no rank of it
        sender = _FROM_PREFILL_RANK.search(reason)
        if sender and (prefill or sender[2]):  # the room's prefill instance, else the label the line names
            evidence = f"a chunk from prefill rank {sender[1]} failed its checksum"
            return _rank(f"{prefill}/TP{sender[1]}" if prefill else sender[2], "prefill"), evidence
        return _other_side(origin, room, around), "what prefill sent failed its checksum"
    for pattern, held, kind, role, evidence in _RULES:
        found = pattern.search(reason) if held in reason else None
        if found and pattern is _SEND_TO:
            return Suspect(kind, _decode_rank_at(found[1], origin, around), role), evidence
        prefill = _link_of(around, room)[0] if found and pattern is _SEND_TO_PREFILL else ""
        if found and prefill and not named_by_address(prefill):  # a rank's endpoint: its instance's log
            return Suspect("instance", prefill, role), f"sending to its rank at {found[1]} failed"
        if found:
            return Suspect(kind, found[1], role or origin.role), evidence
    if name in _TIMEOUTS:
        waited = "the KV never came" if origin.role == "decode" else "the transfer request never came"
        return _other_side(origin, room, around), f"{waited} ({name})"
    if name == "peer_lost":  # a backend's code that names no peer (NIXL_ERR_REMOTE_DISCONNECT): the room's other side
        return _other_side(origin, room, around), "the room's peer disconnected"
    if name == "send_failed":  # a send that names no peer (Mooncake's `Failed to send aux data of R`)
        return _other_side(origin, room, around), "sending to the room's peer failed"
    if name == "bootstrap_error":  # a query that names no address (`Could not fetch bootstrap info for: ...`)
        return _other_side(origin, room, around), BOOTSTRAP_UNANSWERED
    if name == "refused":
        return _rank(origin.rank, origin.role), "it refused the transfer"
    if reason.endswith(_OWN_RESTORE):
        return _rank(origin.rank, origin.role), "its own HiCache restore of the room failed"
    if reason.startswith(_MISROUTED):
        evidence = "it dispatched rooms to another DP rank than their bootstrap_room implies"
        return Suspect("instance", origin.instance, origin.role), evidence
    return Suspect("unknown", origin.instance), "nothing names a cause"


_PEER_ADDRESS = re.compile(r"(?:[^\s/:\[\]]{1,253}|\[[0-9A-Fa-f:.]{2,45}(?:%[\w.@-]{1,64})?\]):(\d{1,5})")
"""A peer's address as a link may name it: a host (or a bracketed IPv6 address, with its zone: `[fe80::1%eth0]`)
and a port."""
_PEERS_NAMED = {
    role: tuple((pattern, _HELD[pattern]) for pattern in patterns)  # each with its text (`_RULES`: no lookup)
    for role, patterns in (
        ("decode", (_BOOTSTRAP_ADDR, _DOWN_AT, _FETCH_FROM)),  # a prefill instance, by its bootstrap address
        ("prefill", (_SESSION, _SEND_TO)),  # the decode rank it sent to, by its session (or the address it sent to)
    )
}


def room_peer(role: str, instance: str, reason: str, ts: float, around: Surroundings, rank: str = "") -> str:
    """The other side of a room that a failure of a rank of `role` (`rank`, of `instance`) names by address: a decode
    rank's prefill instance by its bootstrap address, a prefill rank's decode rank by its session (a send's address:
    the session its sender said failed with it, as `_decode_rank_at`); "" where it names none, or no `host:port`."""
    for pattern, held in _PEERS_NAMED.get(role, ()):
        found = pattern.search(reason) if held in reason else None
        address = _PEER_ADDRESS.fullmatch(found[1].strip()) if found else None
        if address is None or int(address[1]) > 65535:
            continue
        if pattern is _SEND_TO:
            return around.session_failed_with(instance, address[0], ts, rank) or address[0]
        return address[0]
    return ""


def _link_of(around: Surroundings, room: int) -> tuple[str, str]:
    """The room's (prefill, decode) instances: a decode side the link names by a session (`room_peer`) is one rank
    of an instance, none of them named, so ""."""
    prefill, decode = around.link_of(room)
    return prefill, "" if named_by_address(decode) else decode


def _decode_hosts(group: FailureGroup, host: str) -> list[str]:
    """The hosts of the decode ranks a room's prefill ranks said they failed to reach (`remote ... session S is not
    alive`, `Failed to send kv chunk of R to P`), each once, in the order of the lowest rank that named it (a
    multi-node decode's node 0 first: each prefill rank names the session of its own peer); just `host`, the one its
    origin named, when no rank named another (checked first, with no regex for a rank that names `host`)."""
    members = [member for member in (group.origin, *group.echoes) if member is not None and member.role == "prefill"]
    named = f" {host}:"
    if all(named in member.reason or _peer_host(member.reason) in ("", host) for member in members):
        return [host]
    hosts: dict[str, None] = {}
    for member in sorted(members, key=lambda member: _rank_order(member.rank)):
        if peer := _peer_host(member.reason):
            hosts[peer] = None
    return list(hosts)


def _peer_host(reason: str) -> str:
    """The host of the decode rank a prefill's failure names (its session, or the address a send went to), or ""."""
    found = _SESSION.search(reason) or _SEND_TO.search(reason)
    return found[1].rpartition(":")[0] if found else ""


_SESSIONS_ON = "its sessions on "
HOSTS_SHOWN = 8
"""The hosts a suspect named by its hosts lists (the rest counted: `... and 3 more`)."""


def _across_hosts(
    group: FailureGroup, suspect: Suspect, evidence: str, around: Surroundings
) -> tuple[Suspect, str, tuple[str, ...]]:
    """A decode rank named by one sender where the room's senders named decode ranks on several hosts: one decode
    instance over several nodes, dead as a whole (its nodes, not the session the first sender named), so the room's
    decode instance when its log was read, else the decode side at every host named; with the sessions named."""
    hosts = _decode_hosts(group, suspect.name.rpartition(":")[0])
    if len(hosts) < 2:
        return _on_one_host(group, suspect, evidence, around)
    more = len(hosts) - HOSTS_SHOWN
    named = ", ".join(hosts[:HOSTS_SHOWN]) + (f" and {more} more" if more > 0 else "")
    if evidence == SESSION_NOT_ALIVE:
        evidence = f"{_SESSIONS_ON}{named} are not alive"
    else:
        evidence = f"sending to its ranks on {named} failed"
    decode = _link_of(around, group.room)[1]
    return Suspect("instance", decode or named, "decode"), evidence, _decode_sessions(group, around)


def _on_one_host(
    group: FailureGroup, suspect: Suspect, evidence: str, around: Surroundings
) -> tuple[Suspect, str, tuple[str, ...]]:
    """A decode rank named by one sender where the room's senders named several decode ranks (sessions) on its host
    (a decode of TP or DP attention over one node, its ranks failed together): the room's decode instance when its
    log was read, else the decode side of that host, not the session its first sender named; with the sessions."""
    if not any(echo.role == "prefill" for echo in group.echoes):  # its origin the one sender (most rooms)
        return suspect, evidence, ()
    sessions = _decode_sessions(group, around)
    if len(sessions) < 2:
        return suspect, evidence, ()
    host = suspect.name.rpartition(":")[0]
    if evidence == SESSION_NOT_ALIVE:
        evidence = f"{_SESSIONS_ON}{host} are not alive"
    else:
        evidence = f"sending to its ranks on {host} failed"
    decode = _link_of(around, group.room)[1]
    return Suspect("instance", decode, "decode") if decode else Suspect("host", host, "decode"), evidence, sessions


def session_host(suspect: Suspect) -> str:
    """The host of a decode suspect named by address: a session (`host:port`: one rank) or a host; "" otherwise."""
    if suspect.role != "decode":
        return ""
    if suspect.kind == "host":
        return suspect.name
    host, _, port = suspect.name.rpartition(":")  # `_ADDRESS_NAME`, without a regex: this runs for every incident
    return host if suspect.kind == "rank" and host and "/" not in host and port.isdigit() and len(port) <= 5 else ""


def _decode_sessions(group: FailureGroup, around: Surroundings) -> tuple[str, ...]:
    """The decode ranks a room's prefill ranks named (a session, or the address a send went to: the session its
    sender said failed with it), each once, in rank order."""
    sessions: dict[str, None] = {}
    members = (member for member in (group.origin, *group.echoes) if member is not None and member.role == "prefill")
    for member in sorted(members, key=lambda member: _rank_order(member.rank)):
        if found := _SESSION.search(member.reason):
            sessions[found[1]] = None
        elif found := _SEND_TO.search(member.reason):
            sessions[_decode_rank_at(found[1], member, around)] = None
    return tuple(sessions)


def _rank_order(label: str) -> tuple[str, int]:
    """A rank label's instance and number (`prefill-0/TP12` after `prefill-0/TP2`)."""
    instance, _, rank = label.rpartition("/")
    digits = re.search(r"\d+$", rank)
    return instance, int(digits[0]) if digits else -1


def _decode_rank_at(address: str, origin: Observed, around: Surroundings) -> str:
    """The name of the decode rank a send failed to: the session its sender said failed with it (on the address's
    host, in the same second), which later rooms name, else the address itself."""
    return around.session_failed_with(origin.instance, address, origin.ts, origin.rank) or address


def _other_side(origin: Observed, room: int, around: Surroundings) -> Suspect:
    """The room's instance on the other side of the origin, or that side of the origin's instance unnamed."""
    prefill, decode = _link_of(around, room)
    role = "prefill" if origin.role == "decode" else "decode"
    instance = prefill if role == "prefill" else decode
    return Suspect("instance", instance, role) if instance else Suspect("side", origin.instance, role)


def _named(label: str, around: Surroundings) -> Suspect:
    """An agent's named suspect: `client`, a rank label, or an instance."""
    if label == CLIENT.name:
        return CLIENT
    role = around.role_of(label) or label.partition("-")[0]
    return Suspect("rank" if "/" in label else "instance", label, role if role in ("prefill", "decode") else "")


def _rank(label: str, role: str) -> Suspect:
    return Suspect("rank", label, role)


def _with_liveness(suspect: Suspect, evidence: str, ts: float, around: Surroundings) -> tuple[Suspect, str]:
    """A rank suspect that was silent then says so; an instance suspect with one silent rank is that rank."""
    if suspect.kind == "instance":
        silent = [label for label in around.ranks_of(suspect.name) if around.silent_at(label, ts) is not None]
        if len(silent) != 1:
            return suspect, evidence
        suspect = _rank(silent[0], suspect.role)
    silence = around.silent_at(suspect.name, ts)
    if silence is None:
        return suspect, evidence
    return suspect, f"{evidence}; {suspect.name} silent {_span(silence)}"


def _with_crash(suspect: Suspect, evidence: str, ts: float, around: Surroundings) -> tuple[Suspect, str]:
    """A suspect with one rank that had crashed (its server log said so) is that rank, and says so (the side of an
    instance: one rank of that role, whichever instance)."""
    crashed = around.crashed_at(suspect.role if suspect.kind == "side" else suspect.name, ts)
    if crashed is None:
        return suspect, evidence
    label, crash, aftermath = crashed
    if crash.kind == THREAD_DIED:
        what = "a transfer thread of it died"
    else:  # its scheduler's exception, or a fatal signal
        what = "its scheduler crashed" if crash.text.startswith("Scheduler") else "its process died"
    evidence = f"{evidence}; {what} {ts - crash.ts:.0f} s before"
    if aftermath:
        evidence += f" ({', '.join(aftermath)} crashed after it, losing it)"
    return _rank(label, suspect.role), evidence


def could_serve(rank: Suspect, instance: str, around: Surroundings) -> bool:
    """Whether a rank of the other role could have served rooms of `instance` (an unnamed side's: "the decode side of
    prefill-0"): its instance (or its address) was seen linked with `instance`, or neither was seen linked with
    another of the other's role (nothing says it was not its peer). A decode rank of an instance that only ever
    served prefill-1 is no cause of prefill-0's timeouts. Addresses `instance` named (the sessions of decode ranks)
    may be the rank's own: they say nothing against it."""
    end = rank.name.rpartition("/")[0] or rank.name  # an address names the rank itself
    peers = around.peers_of(end)
    if instance in peers:
        return True
    return not peers and not around.peers_of(instance, instances_only=True)


def named_by_address(name: str) -> bool:
    """Whether a link's end (or a suspect) is named by an address (`10.0.0.7:8998`), not by an instance label (the
    colon every address holds looked for first: asked of a room's ends at every failure's attribution)."""
    return ":" in name and _ADDRESS_NAME.fullmatch(name) is not None


def _span(silence: tuple[float, float]) -> str:
    since, until = silence
    return "and still is" if until == float("inf") else f"for {until - since:.1f} s"
