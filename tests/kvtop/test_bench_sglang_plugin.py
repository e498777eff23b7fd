"""`kvtop bench sglang-plugin` where SGLang is not installed (the main suite's environment): it fails loudly, naming
what it needs and where to get it. Its measurement runs in the SGLang tier (tests/sglang)."""

from __future__ import annotations

import pytest
from kvtop_cli import kvtop_here

from kvtop.bench.sglang_plugin import sglang_installed


@pytest.mark.skipif(sglang_installed(), reason="SGLang is installed here")
def test_without_sglang_the_bench_exits_1_naming_what_it_needs() -> None:
    done = kvtop_here("bench", "sglang-plugin", "--json")
    assert done.returncode == 1
    assert "kvtop bench sglang-plugin: FAILED: needs SGLang" in done.stderr
    assert "make test-sglang" in done.stderr
    assert done.stdout == ""
