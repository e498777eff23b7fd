"""Running the installed `kvtop` command the way a person or a script would."""

from __future__ import annotations

import shutil
import subprocess
import sys


def kvtop(*args: str) -> subprocess.CompletedProcess[str]:
    """Run the installed `kvtop` (this Python's entry point) and capture its output."""
    command = shutil.which("kvtop") or f"{sys.prefix}/bin/kvtop"
    return subprocess.run([command, *args], capture_output=True, text=True, timeout=60, check=False)
