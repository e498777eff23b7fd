"""The SGLang interop tier runs only in SGLang's environment (make test-sglang)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))


@pytest.fixture(autouse=True)
def _sglang_installed() -> None:
    pytest.importorskip("sglang.srt.disaggregation.mooncake.conn", reason="run through make test-sglang")
