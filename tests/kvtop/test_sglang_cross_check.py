"""The same failures three times: from a live cluster's events, inferred from the SGLang-format logs its agents
wrote, and from log sidecars (`kvtop agent --sglang-log`) that followed those logs live, one per file, through a
`kvtop bootstrap` of their own."""

from __future__ import annotations

import json
from pathlib import Path

from kvtop_cli import kvtop
from sidecar_support import registry, sidecars

from kvtop.sources.live import Collector
from kvtop.views.failures import to_json
from tests.conftest import wait_for
from transport import FaultSpec, Timeouts, TransferConfig
from transport.harness.cluster import ClusterSpec

TRANSFER = TransferConfig(
    chunk_bytes=8192,
    window_bytes=32768,
    heartbeat_s=0.25,
    peer_timeout_s=1.5,
    timeouts=Timeouts(bootstrap_s=1.5, waiting_s=1.5, transfer_s=1.0),
)
CORRUPTED = (0x11, 0x12)
"""Rooms from prefill-0, whose TP1 corrupts a chunk: decode-0/TP1 sees the checksum fail."""
REFUSED = (0x21, 0x22)
"""Rooms from prefill-1, whose TP0 refuses the transfer request."""
ABANDONED = (0x31,)
"""Rooms given to prefill-0 only: no decode ever asks, so prefill-0/TP0 times out in Bootstrapping."""


def folded(groups: list[dict]) -> list[tuple[int, str, str, int]]:
    """Each group as (room, origin rank, origin reason class, echo count)."""
    return sorted(
        (g["room"], g["origin_label"], g["origin"]["reason_class"] if g["origin"] else "", g["echo_count"])
        for g in groups
    )


def test_failures_from_the_agents_logs_and_their_sidecars_match_failures_from_their_events(
    make_cluster, control, tmp_path: Path
):
    """`kvtop failures` infers from the logs, read together or published live by one sidecar per file, the
    origins (room, rank, class) and echo counts the agents' events name."""
    spec = ClusterSpec(
        prefill=2,
        decode=1,
        prefill_tp=2,
        decode_tp=2,
        num_pages=64,
        page_bytes=8192,
        transfer=TRANSFER,
        faults={"prefill-0/TP1": (FaultSpec.parse("corrupt"),), "prefill-1/TP0": (FaultSpec.parse("refuse"),)},
        log_dir=str(tmp_path),
        log_level="DEBUG",
    )
    cluster = make_cluster(spec)
    with registry() as bootstrap, sidecars(bootstrap, tmp_path) as started:
        watch = Collector(bootstrap).start()
        try:
            for log in sorted(tmp_path.glob("*.log")):
                started.start(log, "--tp", "2")

            def heard() -> int:
                with watch.lock:
                    return sum(1 for view in watch.model.ranks.values() if view.last_seen)

            wait_for(lambda: heard() == 6, 60, "six sidecar ranks heard from")
            _fail_rooms_and_compare(cluster, control, tmp_path, watch)
        finally:
            watch.close()


def _fail_rooms_and_compare(cluster, control, tmp_path: Path, watch: Collector) -> None:
    clients = {agent.label: control(agent.control_endpoint) for agent in cluster.agents()}
    submitted: dict[int, list[str]] = {}
    for rooms, prefill, with_decode in ((CORRUPTED, "prefill-0", True), (REFUSED, "prefill-1", True),
                                        (ABANDONED, "prefill-0", False)):  # fmt: skip
        for room in rooms:
            labels = [label for label in clients if label.startswith(prefill)]
            labels += [label for label in clients if label.startswith("decode") and with_decode]
            for label in labels:
                clients[label].submit(room, 8, prefill if label.startswith("decode") else "")
            submitted[room] = labels
    for room, labels in submitted.items():
        for label in labels:
            clients[label].wait_result(room, 15)

    live = kvtop("failures", "--bootstrap", cluster.endpoint, "--json")
    logs = [str(path) for path in sorted(tmp_path.glob("*.log"))]
    logged = kvtop("failures", "--json", *(arg for path in logs for arg in ("--sglang-log", path)))

    assert (live.returncode, logged.returncode) == (0, 0), live.stderr + logged.stderr
    expected = folded(json.loads(live.stdout)["groups"])
    assert sorted(submitted) == sorted({room for room, *_ in expected})
    assert expected == folded(json.loads(logged.stdout)["groups"])
    published: list[tuple[int, str, str, int]] = []

    def sidecars_agree() -> bool:
        with watch.lock:
            published[:] = folded(to_json(watch.model.groups()))
        return published == expected

    try:
        wait_for(sidecars_agree, 60, "the sidecars' fold to match the agents'")
    except AssertionError:
        assert expected == published  # shows the difference
