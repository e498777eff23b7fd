"""Prefill instances that wrote no log but that decode lines name as the peer they lost: listed, marked so."""

from __future__ import annotations

import json
from pathlib import Path

from kvtop_cli import kvtop_here

from kvtop.model.cluster import JOURNAL_EVENTS_KEPT, ClusterModel
from kvtop.model.shapes import Liveness
from kvtop.model.suspects import room_peer
from kvtop.record.keyframes import capture, restore
from kvtop.sources.sglang import load
from kvtop.sources.sglang.lines import lost_prefill
from kvtop.views.tables import ranks_json

FIXTURES = Path(__file__).parent / "fixtures" / "sglang"
PEERS = FIXTURES / "peer-named"
"""decode-0 (TP2) loses the prefill instances at 10.0.0.6:8999 (both ranks, two rooms) and 10.0.0.5:8998 (TP0,
one room); one more room fails with `Failed to get kvcache ...`, which names no address. The prefill log
beside it prints bootstrap port 8998."""


def model_of(*paths: Path) -> ClusterModel:
    model = ClusterModel(JOURNAL_EVENTS_KEPT)
    load(paths, model)
    return model


def named(model: ClusterModel) -> dict[str, list[str]]:
    return {label: view.named_by for label, view in model.ranks.items() if view.named_by}


def test_decode_lines_alone_list_every_prefill_address_they_name_with_the_ranks_that_named_it():
    model = model_of(PEERS / "decode.log")

    assert named(model) == {"10.0.0.6:8999": ["decode-0/TP0", "decode-0/TP1"], "10.0.0.5:8998": ["decode-0/TP0"]}
    view = model.ranks["10.0.0.6:8999"]
    assert (view.role, view.instance, view.host, view.source) == ("prefill", "10.0.0.6:8999", "10.0.0.6", "log")
    assert view.liveness(0.0) is Liveness.LOG


def test_a_prefill_log_whose_bootstrap_port_is_the_address_s_may_be_that_instance_so_it_is_not_listed():
    """The prefill log prints port 8998: it may be 10.0.0.5:8998 (kvtop cannot tell), never 10.0.0.6:8999."""
    model = model_of(PEERS / "decode.log", PEERS / "prefill.log")

    assert named(model) == {"10.0.0.6:8999": ["decode-0/TP0", "decode-0/TP1"]}
    assert "prefill-0/TP0" in model.ranks


def test_a_prefill_log_that_prints_no_bootstrap_port_may_be_any_instance():
    """lost-prefill's decode lines name 10.0.0.5:8998; its prefill log's arguments name no host: not listed."""
    model = model_of(FIXTURES / "lost-prefill" / "decode.log", FIXTURES / "lost-prefill" / "prefill.log")
    assert named(model) == {}

    alone = model_of(FIXTURES / "lost-prefill" / "decode.log")
    assert named(alone) == {"10.0.0.5:8998": ["decode-0/TP0", "decode-0/TP1"]}


def test_sglang_0523s_arguments_printed_as_a_dict_say_the_prefill_and_its_bootstrap_port(tmp_path: Path):
    """SGLang 0.5.23 prints `server_args={'model_path': ..., 'disaggregation_bootstrap_port': 8998, ...}`: read as no
    server's, a log of nothing else was no prefill, so both addresses the decode lost were listed as logless."""
    server = tmp_path / "server.log"
    server.write_text(
        "[2026-03-05 09:00:00] server_args={'model_path': 'Qwen/Qwen3-32B', 'host': '0.0.0.0', 'port': 30000, "
        "'tp_size': 2, 'disaggregation_mode': 'prefill', 'disaggregation_transfer_backend': 'mooncake', "
        "'disaggregation_bootstrap_port': 8998}\n"
    )

    model = model_of(PEERS / "decode.log", server)

    assert named(model) == {"10.0.0.6:8999": ["decode-0/TP0", "decode-0/TP1"]}
    assert model.instances_at["10.0.0.5:8998"] == ("prefill-0",)


def test_the_json_gives_what_peers_lines_do_not_tell_as_null_and_who_named_the_instance():
    model = model_of(PEERS / "decode.log")

    rows = {row["label"]: row for row in ranks_json(model, now=0.0)}

    peer = rows["10.0.0.6:8999"]
    assert peer["named_by"] == ["decode-0/TP0", "decode-0/TP1"]
    assert (peer["source"], peer["state"], peer["host"]) == ("log", "log", "10.0.0.6")
    unknown = ("rank", "pid", "gbps", "inflight", "origins", "echoes", "cpu_percent", "rss_bytes", "last_seen_s")
    assert {name: peer[name] for name in unknown} == dict.fromkeys(unknown)
    assert rows["decode-0/TP0"]["named_by"] == []
    assert rows["decode-0/TP0"]["origins"] == 3


def test_ranks_and_status_text_show_dashes_and_say_the_instance_is_known_from_its_peers():
    logs = ("--sglang-log", str(PEERS / "decode.log"), "--sglang-log", str(PEERS / "prefill.log"))

    ranks = kvtop_here("ranks", *logs)
    status = kvtop_here("status", *logs)
    status_json = kvtop_here("status", "--json", *logs)

    assert ranks.returncode == status.returncode == status_json.returncode == 0, ranks.stderr + status.stderr
    row = next(line for line in ranks.stdout.splitlines() if line.startswith("10.0.0.6:8999"))
    assert row.split()[:9] == ["10.0.0.6:8999", "prefill", "log", "suspect", "10.0.0.6", "-", "-", "-", "-"]
    assert row.endswith("no log of its own: named by decode-0/TP0, decode-0/TP1")
    assert "4 from logs (logs tell no liveness), 1 known only from peers' lines" in status.stdout
    assert json.loads(status_json.stdout)["ranks"]["named_by_peers"] == 1


def test_a_keyframe_keeps_who_named_a_rank():
    model = model_of(PEERS / "decode.log")

    restored = restore(capture(model), JOURNAL_EVENTS_KEPT)

    assert named(restored) == named(model)


def test_only_an_address_that_is_host_and_port_is_taken_from_a_lost_connection_line():
    """The address a line names becomes a rank's label: anything but `host:port` (port <= 65535) names none."""
    line = "Lost connection with prefill instance (bootstrap_addr: {}), 1 requests affected"
    assert lost_prefill(line.format("10.0.0.6:8999")) == "10.0.0.6:8999"
    assert lost_prefill(line.format("[fd00::1]:8998")) == "[fd00::1]:8998"
    assert lost_prefill(line.format("[fe80::1%eth0]:8998")) == "[fe80::1%eth0]:8998"  # a zone: named no side
    for bad in ("", "10.0.0.6", "10.0.0.6:99999", "host:port", "a b:1", "x" * 300 + ":1", "[fe80::1%e th0]:1"):
        assert lost_prefill(line.format(bad)) is None, bad


def test_a_decode_failure_naming_a_zoned_link_local_prefill_names_that_side():
    """`[fe80::1%eth0]:8998` (a link-local address with its zone, as Python prints one) named no side of the room."""
    reason = "Lost connection with prefill instance (bootstrap_addr: [fe80::1%eth0]:8998), 1 requests affected"

    assert room_peer("decode", "decode-0", reason, 0.0, None) == "[fe80::1%eth0]:8998"  # type: ignore[arg-type]
    assert room_peer("decode", "decode-0", reason.replace("%eth0", ""), 0.0, None) == "[fe80::1]:8998"  # type: ignore[arg-type]
