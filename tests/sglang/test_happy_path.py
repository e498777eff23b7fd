"""SGLang's own Mooncake KV managers move pages between prefill TP2 and decode TP2, byte for byte."""

from __future__ import annotations

from pathlib import Path

from cluster import pair

SUCCESS = 4


def test_pages_arrive_byte_for_byte(tmp_path: Path) -> None:
    rooms = [1001, 1002]
    with pair(tmp_path, rooms, {}, prefill={"plugin": False}, decode={"plugin": False}) as ranks:
        ranks.wait("done")
        for rank in ranks.ranks:
            assert {room: report.poll for room, report in rank.rooms().items()} == dict.fromkeys(rooms, SUCCESS)
        for rank in ranks.of("decode"):
            assert all(report.pages_equal for report in rank.rooms().values())
