"""`kvtop bench transfer`: equal message sizes in every leg, the least-work legs' figures, and --vs-mooncake's
argument handling (the Mooncake leg itself needs the optional extra: not part of the suite)."""

from __future__ import annotations

import json
import sys
import time

import numpy as np
import pytest
import xxhash

from kvtop.bench import BenchFailed, transfer
from kvtop.bench.baselines import page_digests
from kvtop.bench.mooncake import require_mooncake
from kvtop.bench.report import text
from kvtop.bench.transfer import TransferResult, check_sizes
from tests.kvtop.kvtop_cli import kvtop, kvtop_here
from transport import TransferConfig


def test_a_chunk_kvtop_cannot_send_as_whole_pages_is_refused() -> None:
    """96 KiB would go as 64 KiB pages in kvtop and 96 KiB messages raw: the bench says so and exits 2."""
    done = kvtop_here("bench", "transfer", "--chunk-bytes", "96KiB")
    assert done.returncode == 2
    assert "kvtop sends whole 65536 B pages" in done.stderr


def test_a_room_that_is_no_whole_number_of_chunks_is_refused() -> None:
    """A room ending in a shorter chunk would make kvtop's messages differ from the other legs'."""
    with pytest.raises(ValueError, match="not a whole number of 1048576 B chunks"):
        check_sizes(1 << 20, 3 << 19)
    check_sizes(1 << 20, 64 << 20)
    check_sizes(16 << 10, 48 << 10)


def test_the_legs_run_a_ranks_default_credit_window() -> None:
    """The bench measures the window users run (kvtop's default), widened only to hold four chunks."""
    default = TransferConfig().window_bytes
    assert transfer._config(1 << 20, True).window_bytes == default
    assert transfer._config(default, False).window_bytes == 4 * default


def test_page_digests_are_each_pages_xxh3_in_order() -> None:
    """What a writer stores beside its pages: 8 bytes of xxh3-64 per page."""
    buffer = np.arange(4 * 1024, dtype=np.uint32).view(np.uint8)
    pages = [buffer[i * 4096 : (i + 1) * 4096].tobytes() for i in range(4)]
    assert page_digests(buffer, 4096) == b"".join(xxhash.xxh3_64_digest(page) for page in pages)


@pytest.mark.processes
def test_transfer_bench_json_has_every_legs_figures() -> None:
    """With --floor and --e2e each leg's GB/s and ratio to raw is reported (kvtop with per-chunk checksums
    among them), at one message size."""
    done = kvtop("bench", "transfer", "--chunk-bytes", "64KiB", "--room-bytes", "1MiB", "--rooms", "4",
                 "--repeats", "1", "--floor", "--e2e", "--json")  # fmt: skip
    assert done.returncode == 0, done.stderr
    (result,) = json.loads(done.stdout)
    assert result["chunk_bytes"] == 65536
    assert result["total_bytes"] == 4 << 20
    for leg in ("raw_gbps", "kvtop_gbps", "kvtop_unchecked_gbps", "kvtop_chunk_gbps", "floor_gbps",
                "floor_unchecked_gbps", "raw_registered_gbps", "e2e_gbps"):  # fmt: skip
        assert result[leg] > 0, leg
    for ratio in ("ratio", "ratio_unchecked", "ratio_chunk", "ratio_floor", "ratio_floor_unchecked", "ratio_e2e",
                  "ratio_raw_registered", "kvtop_vs_raw_registered"):  # fmt: skip
        assert result[ratio] > 0, ratio
    assert result["e2e_write_hash_gbps"] > 0
    assert result["ratio_gap_e2e"] == pytest.approx(result["ratio_e2e"] - result["ratio"], abs=0.002)
    assert result["e2e_vs_mooncake"] is None  # Mooncake was not asked for
    legs = {"raw", "kvtop", "unchecked", "chunk", "floor", "floor_unchecked", "raw_registered", "e2e"}
    assert set(result["runs_gbps"]) == set(result["cpu_s_per_gb"]) == set(result["cpu_ratio"]) == legs
    assert all(cpu >= 0 for cpu in result["cpu_s_per_gb"].values())  # 4 MiB may pass within one 10 ms tick
    by_thread = result["cpu_s_per_gb_by_thread"]
    assert set(by_thread) == legs
    assert {"engine", "zeromq_io", "main"} <= set(by_thread["kvtop"])  # kvtop's ranks name their threads
    assert "engine" not in by_thread["raw"]


@pytest.fixture
def no_mooncake(monkeypatch: pytest.MonkeyPatch) -> None:
    """Mooncake's transfer engine does not import (the optional extra is not installed)."""
    monkeypatch.setitem(sys.modules, "mooncake.engine", None)


def test_vs_mooncake_without_mooncake_fails_before_any_leg_saying_how_to_install_it(no_mooncake: None) -> None:
    """Asked for and missing, the Mooncake leg fails the bench at once (exit 1) with the extra to install."""
    with pytest.raises(BenchFailed, match=r"pip install 'kvtop\[mooncake\]'.+mooncake-transfer-engine-non-cuda"):
        require_mooncake()
    started = time.monotonic()
    done = kvtop_here("bench", "transfer", "--vs-mooncake", "--chunk-bytes", "64KiB", "--room-bytes", "1MiB",
                      "--rooms", "2", "--repeats", "1")  # fmt: skip
    assert done.returncode == 1
    assert done.stderr.startswith("kvtop bench transfer: FAILED: --vs-mooncake needs Mooncake Transfer Engine")
    assert done.stdout == ""
    assert time.monotonic() - started < 5, "no leg ran before the check"


def test_vs_mooncake_still_refuses_sizes_the_legs_cannot_share(no_mooncake: None) -> None:
    """Sizes are checked first: a bad chunk size is a usage error (exit 2) with or without Mooncake."""
    done = kvtop_here("bench", "transfer", "--vs-mooncake", "--chunk-bytes", "96KiB")
    assert done.returncode == 2
    assert "kvtop sends whole 65536 B pages" in done.stderr


def test_without_vs_mooncake_the_mooncake_figures_are_absent() -> None:
    """A run that did not ask for Mooncake reports no Mooncake figures (None: left out of the text)."""
    result = TransferResult(1 << 20, 2.0, 2.5, 0.8, 2.2, 0.88, 5, 1 << 30)
    assert result.mooncake_gbps is result.kvtop_vs_mooncake is None
    assert "mooncake" not in text(result.as_dict(), result.REPORT)


@pytest.mark.processes
def test_without_libzmq_calls_there_is_no_registered_raw_figure(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where registered sends fall back to pyzmq, a `raw_registered` leg would be raw pyzmq under another name:
    the floor legs run without it and its figures are None."""
    monkeypatch.setattr(transfer, "registered_sends", lambda: False)

    (result,) = transfer.measure([64 << 10], 1 << 20, 4, 1, lambda _: None, floor=True)

    assert result.raw_registered_gbps is result.ratio_raw_registered is result.kvtop_vs_raw_registered is None
    assert "raw_registered" not in result.runs_gbps
    assert result.floor_gbps is not None and result.floor_gbps > 0
