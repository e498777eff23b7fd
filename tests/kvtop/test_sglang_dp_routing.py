"""A prefill that dispatched rooms to another DP rank than their room implies: it fails them itself.

The shape is a public report's (SGLang PR #29730, 2026-06: a prefill with plain `--dp-size 2`, no DP attention,
rejected half its rooms with `follow_bootstrap_room conflict: dispatched to dp_rank 0 but bootstrap_room X implies
dp_rank 1. ...`; PR #22901 and #24772 tell of routers whose `routed_dp_rank` does the same). The fixture's rids and
rooms are made up. The reason names the cause, the prefill instance's own routing; before, its incident's
suspect was `unknown` ("nothing names a cause").
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from kvtop_cli import kvtop_here

pytestmark = pytest.mark.usefixtures("utc")

PREFILL = Path(__file__).parent / "fixtures" / "sglang" / "dp-routing" / "prefill.log"


def test_the_rooms_it_misrouted_are_one_incident_of_the_prefill_instance_itself():
    [incident] = json.loads(kvtop_here("incidents", "--sglang-log", str(PREFILL), "--json").stdout)["incidents"]

    assert incident["suspect"] == {"kind": "instance", "name": "prefill-0", "role": "prefill"}
    assert incident["room_count"] == 3
    assert incident["evidence"][0] == "it dispatched rooms to another DP rank than their bootstrap_room implies"
