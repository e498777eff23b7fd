"""Which server wrote a log, from its head: the first role-telling line wins, wherever the head's pieces are cut."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvtop.sources.sglang import sniff
from kvtop.sources.sglang.lines import ROLE_MARKERS
from kvtop.sources.sglang.sniff import sniff_role

_FILLER = st.text(alphabet="abcdeP D'=_-:[] 0123", max_size=40)
_MARKER = st.sampled_from([marker.decode() for marker in ROLE_MARKERS])
_LINE = st.one_of(_FILLER, st.builds(lambda before, marker, after: before + marker + after, _FILLER, _MARKER, _FILLER))


def _first_marker_role(text: bytes) -> str:
    """The role of the marker that starts first (ties: the role first in alphabetical order): a `find` of each."""
    found = [(pos, role) for marker, role in ROLE_MARKERS.items() if (pos := text.find(marker)) >= 0]
    return min(found)[1] if found else ""


@settings(max_examples=300, deadline=None)
@given(lines=st.lists(_LINE, max_size=30), piece=st.sampled_from([1, 7, 64]))
def test_the_role_is_the_first_markers_in_pieces_of_any_size(tmp_path_factory, lines, piece):
    log = tmp_path_factory.mktemp("sniff") / "server.log"
    text = "".join(f"{line}\n" for line in lines).encode()
    log.write_bytes(text)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(sniff, "ROLE_PIECE_BYTES", piece)
        assert sniff_role(log) == _first_marker_role(text)


def test_a_marker_deep_in_the_head_and_one_past_it(tmp_path: Path):
    """The pieces go on to the first marker (a decode's, 3 MiB in); a prefill's past the 4 MiB head is not read."""
    log = tmp_path / "server.log"
    filler = b"[2026-01-02 03:04:05 TP0] nothing of either side\n" * ((3 << 20) // 48)
    log.write_bytes(filler + b"[2026-01-02 03:04:06 TP0] Decode batch, #running-req: 1\n")
    assert sniff_role(log) == "decode"
    log.write_bytes(filler * 2 + b"[2026-01-02 03:04:06 TP0] Prefill batch, #new-seq: 1\n")
    assert sniff_role(log) == ""
