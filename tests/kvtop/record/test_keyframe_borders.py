"""A keyframe is a file's bytes: what it holds is checked where it is restored."""

from __future__ import annotations

import msgspec
import pytest

from kvtop.model.cluster import ClusterModel
from kvtop.record.keyframes import _DECODER, _ENCODER, capture, restore
from tests.kvtop.test_incidents import T0, checksum, deliver


def test_a_keyframe_that_does_not_hang_together_is_refused_where_it_is_restored():
    """Forged keyframes (their blocks' checksums right) ended status with KeyError (an open room it did not hold)
    and ValueError (NaN in a ring); a rank's NaN last_seen showed it alive. Restoring refuses each (a replay
    counts the block damaged and skips it)."""
    model = ClusterModel()
    deliver(model, "decode-0/TP1", [checksum(T0, 1)], T0)
    state = _DECODER.decode(capture(model))
    nan_ring = msgspec.structs.replace(state.transfers, data=b"\xff" * 8 * state.transfers.columns, rows=1)
    forged = [
        msgspec.structs.replace(state, open=[424242]),
        msgspec.structs.replace(state, transfers=nan_ring),
        msgspec.structs.replace(state, ranks=[msgspec.structs.replace(state.ranks[0], last_seen=float("nan"))]),
    ]

    for bad in forged:
        with pytest.raises(ValueError):
            restore(_ENCODER.encode(bad))
