"""The transport package stands alone: it imports without kvtop, textual or typer."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.processes

REPO = Path(__file__).resolve().parents[2]

SCRIPT = """
import importlib
import importlib.abc
import pkgutil
import sys

BANNED = ("kvtop", "textual", "typer")


class Banned(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BANNED:
            raise ImportError(f"transport must not import {name}")
        return None


sys.meta_path.insert(0, Banned())
for banned in BANNED:
    try:
        importlib.import_module(banned)
    except ImportError:
        pass
    else:
        raise SystemExit(f"the import ban does not work for {banned}")

import transport

names = sorted(m.name for m in pkgutil.walk_packages(transport.__path__, "transport."))
for name in names:
    importlib.import_module(name)
leaked = sorted(m for m in sys.modules if m.split(".")[0] in BANNED)
assert not leaked, leaked
print("\\n".join(names))
"""


def test_every_transport_module_imports_without_kvtop_textual_or_typer():
    """With kvtop, textual and typer made unimportable, every module of transport still imports."""
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], cwd=REPO, capture_output=True, text=True, timeout=60, check=False
    )

    assert done.returncode == 0, done.stderr
    imported = set(done.stdout.split())
    expected = {
        ".".join(path.relative_to(REPO).with_suffix("").parts)
        for path in (REPO / "transport").rglob("*.py")
        if path.stem != "__init__"
    }
    assert expected <= imported
    assert {"transport.harness.agent", "transport.harness.cluster", "transport.kv.engine", "transport.wire"} <= imported
