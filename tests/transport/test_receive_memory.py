"""A decode rank keeps the memory its links receive chunks into (`transport.kv.memory`).

Each case runs in a fresh interpreter (the allocator's thresholds are the process's, and only rise) and
allocates a block of a chunk's size the way ZeroMQ's I/O thread does for each message: glibc's counters
say whether it was mapped for itself (unmapped again when freed) and whether the heap kept it when freed.
"""

from __future__ import annotations

import ctypes
import subprocess
import sys

import pytest

pytestmark = [
    pytest.mark.processes,
    pytest.mark.skipif(
        not hasattr(ctypes.CDLL(None), "mallinfo2"), reason="glibc's allocator counters (mallinfo2) are not here"
    ),
]

_PROBE = """
import ctypes
libc = ctypes.CDLL(None)
class Info(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                 "keepcost")]
libc.mallinfo2.restype = Info
{setup}
before = libc.mallinfo2().hblks
block = bytearray({size})
mapped = libc.mallinfo2().hblks - before
del block
print(mapped, libc.mallinfo2().arena)
"""

_MANAGER = """
from transport import KVManager, KVPool, Role, TransferConfig
manager = KVManager(role=Role.{role}, instance="probe", rank=0, tp=1, pool=KVPool(4, 64 << 10),
                    bootstrap="tcp://127.0.0.1:9", publish_events=False,
                    config=TransferConfig(chunk_bytes=8 << 20, window_bytes=32 << 20, keep_receive_buffers={keep}))
manager.close()
"""


def _probe(setup: str, size: int) -> tuple[int, int]:
    """(blocks mapped for the allocation, heap bytes after it was freed) in a fresh interpreter."""
    script = _PROBE.format(setup=setup, size=size)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True)
    mapped, arena = result.stdout.split()
    return int(mapped), int(arena)


def test_a_chunk_sized_block_is_mapped_and_unmapped_by_default() -> None:
    mapped, arena = _probe("", 20 << 20)
    assert mapped == 1
    assert arena < 20 << 20


def test_keep_receive_buffers_serves_chunks_from_a_heap_it_does_not_trim() -> None:
    setup = "from transport.kv.memory import keep_receive_buffers\nassert keep_receive_buffers(24 << 20, 32 << 20)"
    mapped, arena = _probe(setup, 20 << 20)
    assert mapped == 0
    assert arena >= 20 << 20  # freed, and kept for the next chunks


@pytest.mark.parametrize(("role", "keep", "mapped"), [("DECODE", True, 0), ("DECODE", False, 1), ("PREFILL", True, 1)])
def test_a_decode_rank_applies_the_setting_unless_told_not_to(role: str, keep: bool, mapped: int) -> None:
    assert _probe(_MANAGER.format(role=role, keep=keep), 6 << 20)[0] == mapped
