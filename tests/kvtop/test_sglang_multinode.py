"""One server whose TP ranks span several nodes (`--nnodes 2 --node-rank 0|1 --dist-init-addr H:P`: DeepSeek-R1 at
TP16 over two 8-GPU nodes) writes one log per node. kvtop read the two as two instances (`prefill-0` TP0..TP7,
`prefill-1` TP8..TP15): each room failed twice over (an origin in each, naming its own node's session: two
incidents for one broken decode), and a prefill lost by its bootstrap address was "prefill-0 or prefill-1". Each
node's `server_args` line says which server it is a node of; logs are merged only where those lines leave no
doubt."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from kvtop_cli import kvtop_here

from kvtop.model.cluster import ClusterModel
from kvtop.sidecar.tail import LogTail
from kvtop.sources.sglang import LogSpec, load
from kvtop.sources.sglang.lines import node_of

pytestmark = pytest.mark.usefixtures("utc")

NODES = Path(__file__).parent / "fixtures" / "sglang" / "multinode"
"""DeepSeek-R1 in 1P1D, each side TP16 over two nodes (the shapes, hosts and rooms of a public deployment's logs,
SGLang 0.5.8.post1): prefill on aihub1 (node 0: the HTTP server, the batch lines, TP0..TP7) and aihub2 (node 1:
TP8..TP15), decode on aihub3 and aihub6. Two rooms fail on all 32 ranks at 16:00:13 and 16:00:14: the prefill
ranks say the decode's mooncake sessions are not alive, the decode ranks that the prefill might be dead."""
LOGS = sorted(NODES.glob("*.log"))
PREFILL_NODES = (NODES / "prefill-aihub1.log", NODES / "prefill-aihub2.log")
ROOMS = (887504041590801090, 4073374190146881990)


def model_of(*paths: Path) -> ClusterModel:
    model = ClusterModel()
    load(paths, model)
    return model


def instances(model: ClusterModel) -> dict[str, list[int]]:
    """Each instance's TP ranks."""
    found: dict[str, list[int]] = {}
    for view in model.ranks.values():
        found.setdefault(view.instance, []).append(view.rank)
    return {instance: sorted(ranks) for instance, ranks in sorted(found.items())}


def copy(tmp_path: Path, log: Path, name: str = "", old: str = "", new: str = "") -> Path:
    """`log` under `name` in `tmp_path`, its text with `old` replaced by `new`."""
    copied = tmp_path / (name or log.name)
    copied.write_text(log.read_text().replace(old, new))
    return copied


def test_the_logs_of_a_servers_nodes_are_one_instance_with_every_rank():
    assert instances(model_of(*LOGS)) == {"decode-0": list(range(16)), "prefill-0": list(range(16))}


def test_each_room_fails_once_and_its_incident_is_one():
    """One origin per room (the prefill's first rank to notice), the other 31 ranks of both sides its echoes."""
    model = model_of(*LOGS)
    args = [arg for log in LOGS for arg in ("--sglang-log", str(log))]
    found = json.loads(kvtop_here("incidents", "--json", *args).stdout)["incidents"]

    groups = [(group.room, group.origin_label, len(group.echoes)) for group in model.groups()]
    assert sorted(groups) == sorted((room, "prefill-0/TP0", 31) for room in ROOMS)
    assert [(incident["room_count"], incident["origins"], incident["noticed_by"]) for incident in found] == [
        (2, 2, {"prefill-0/TP0": 2})
    ]
    # every decode rank, each a refusing prefill rank's peer, logged the prefill's Failed status in that second: the
    # prefill refuses sessions it gave up on before these logs, of a decode that answers (it read `decode-0`)
    assert (found[0]["suspect_text"], found[0]["kind"]) == ("the link between prefill-0 and decode-0", "failing")


def test_a_prefill_lost_by_its_bootstrap_address_is_the_one_instance(tmp_path: Path):
    """Both nodes print the bootstrap port (only node 0 serves it): the address named two instances."""
    decode = tmp_path / "decode.log"
    decode.write_text(
        "[2026-02-26 16:01:30 TP0] Lost connection with prefill instance (bootstrap_addr: 10.99.91.39:8998), "
        "1 requests affected\n"
    )

    model = model_of(*PREFILL_NODES, decode)

    assert model.instances_at["10.99.91.39:8998"] == ("prefill-0",)


def test_a_sidecar_on_a_nodes_log_publishes_that_nodes_ranks():
    """Each node's sidecar published all 16 under the same labels: one node's ranks hid the other's events."""
    tail = LogTail(LogSpec(PREFILL_NODES[1]))
    tail.poll()
    ranks = tail.find_tp()
    tail.close()

    assert (ranks, tail.tp) == (range(8, 16), 16)


def test_two_servers_each_on_two_nodes_are_two_instances(tmp_path: Path):
    other = [
        copy(
            tmp_path, log, f"other-{log.name}", "dist_init_addr='10.99.91.39:5000'", "dist_init_addr='10.99.91.51:5000'"
        )
        for log in PREFILL_NODES
    ]

    assert instances(model_of(*PREFILL_NODES, *other)) == {"prefill-0": list(range(16)), "prefill-1": list(range(16))}


@pytest.mark.parametrize(
    ("old", "new", "both"),
    [
        ("dist_init_addr='10.99.91.39:5000'", "dist_init_addr='10.99.91.41:5000'", False),  # another server's node
        ("tp_size=16", "tp_size=8", False),  # another server's node
        ("node_rank=1", "node_rank=0", False),  # node 0 twice: a log of a restart, or of another server
        ("nnodes=2, node_rank=1", "nnodes=1, node_rank=0", False),  # a server on one node
        ("dist_init_addr='10.99.91.39:5000'", "dist_init_addr=None", True),  # no rendezvous address: no nodes
        ("pp_size=1", "pp_size=2", False),  # another server's node
    ],
)
def test_logs_whose_arguments_leave_a_doubt_are_their_own_instances(tmp_path: Path, old: str, new: str, both: bool):
    first, second = PREFILL_NODES
    logs = (copy(tmp_path, first, "", old, new) if both else first, copy(tmp_path, second, "", old, new))

    assert sorted(instances(model_of(*logs))) == ["prefill-0", "prefill-1"]


@pytest.mark.parametrize("order", [(0, 1, 2), (0, 2, 1), (2, 0, 1)])
def test_a_node_whose_log_was_rotated_joins_in_its_pieces(tmp_path: Path, order: tuple[int, ...]):
    """`prefill.log*` in a shell gives the live piece, whose head no longer holds the arguments, first."""
    lines = PREFILL_NODES[1].read_text().splitlines(keepends=True)
    (tmp_path / "node1").mkdir()
    (tmp_path / "node1" / "prefill.log.1").write_text("".join(lines[:20]))
    (tmp_path / "node1" / "prefill.log").write_text("".join(lines[20:]))
    logs = (tmp_path / "node1" / "prefill.log", tmp_path / "node1" / "prefill.log.1", PREFILL_NODES[0])

    assert instances(model_of(*(logs[index] for index in order))) == {"prefill-0": list(range(16))}


def test_sglang_0523s_arguments_printed_as_a_dict_tell_the_nodes_too(tmp_path: Path):
    """`server_args={'model_path': ..., 'nnodes': 2, 'node_rank': 1, ...}` (SGLang 0.5.23)."""

    def as_dict(line: str) -> str:
        pairs = re.findall(r"(\w+)=('[^']*'|[^,)]+)", line.partition("server_args=ServerArgs(")[2])
        return line.partition("server_args=")[0] + "server_args={" + ", ".join(f"'{k}': {v}" for k, v in pairs) + "}\n"

    logs = []
    for log in PREFILL_NODES:
        first, *rest = log.read_text().splitlines(keepends=True)
        logs.append(tmp_path / log.name)
        logs[-1].write_text(as_dict(first) + "".join(rest))

    assert instances(model_of(*logs)) == {"prefill-0": list(range(16))}


def test_a_server_args_count_of_thousands_of_digits_is_no_count(tmp_path: Path):
    """`tp_size=999...` (5000 digits) in two logs' start-up lines made `check` UNKNOWN, `internal error: ValueError(
    'Exceeds the limit (4300 digits) for integer string conversion')`: a count past 6 digits is none."""
    line = (
        f"[2026-01-02 03:04:05] server_args=ServerArgs(tp_size={'9' * 5000}, nnodes=2, node_rank={{rank}}, "
        "dist_init_addr='10.0.0.1:5000', disaggregation_mode='prefill')\n"
        "[2026-01-02 03:04:06 TP0] Prefill batch, #new-seq: 1, #new-token: 4, #queue-req: 0\n"
    )
    logs = []
    for rank in (0, 1):
        (tmp_path / f"node{rank}.log").write_text(line.format(rank=rank))
        logs += ["--sglang-log", str(tmp_path / f"node{rank}.log")]

    check = kvtop_here("check", *logs)

    assert check.returncode == 0 and "internal error" not in check.stdout


STAGES = tuple(sorted((NODES.parent / "pipeline-nodes").glob("*.log")))
"""A prefill server over two nodes, a pipeline stage on each (`--tp-size 4 --pp-size 2 --nnodes 2`): node 0 logs
PP0 TP0..TP3, node 1 PP1 TP0..TP3; a room fails on all eight ranks (its decode's mooncake sessions are gone)."""


def test_pipeline_stages_over_two_nodes_are_one_instance_with_each_stages_ranks():
    """Read apart as two instances before (their TP ranks were the same): the room failed once in each."""
    model = model_of(*STAGES)

    assert sorted(model.ranks) == sorted(f"prefill-0/{stage}TP{tp}" for stage in ("", "PP1-") for tp in range(4))
    [group] = model.groups()
    assert (group.origin_label, len(group.echoes)) == ("prefill-0/PP1-TP0", 7)


def test_a_sidecar_on_a_later_stages_node_publishes_that_stage():
    tail = LogTail(LogSpec(STAGES[1]))
    tail.poll()
    ranks = tail.find_tp()
    tail.close()

    assert (ranks, tail.stages) == (range(4), range(1, 2))


@pytest.mark.parametrize(
    ("nnodes", "node_rank", "tp_size", "pp_size", "stages", "tps"),
    [
        (2, 1, 16, 1, range(1), range(8, 16)),  # TP over the nodes
        (2, 1, 8, 2, range(1, 2), range(8)),  # a stage on each node
        (4, 3, 16, 2, range(1, 2), range(8, 16)),  # each stage over two nodes
        (2, 1, 8, 4, range(2, 4), range(8)),  # two stages on each node
    ],
)
def test_a_nodes_ranks_are_laid_out_as_sglangs_launcher_does(
    nnodes: int, node_rank: int, tp_size: int, pp_size: int, stages: range, tps: range
):
    line = (
        f"server_args=ServerArgs(tp_size={tp_size}, pp_size={pp_size}, dist_init_addr='10.0.0.1:5000', "
        f"nnodes={nnodes}, node_rank={node_rank}, disaggregation_mode='prefill')"
    )
    node = node_of(line)

    assert node is not None and (node.pp_ranks, node.tp_ranks) == (stages, tps)


def test_stages_the_nodes_cannot_share_evenly_leave_a_doubt():
    assert node_of("server_args=ServerArgs(tp_size=8, pp_size=2, dist_init_addr='h:1', nnodes=3, node_rank=1)") is None
