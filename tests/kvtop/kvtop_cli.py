"""Running the installed `kvtop` command the way a person or a script would."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys


def kvtop(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run the installed `kvtop` (this Python's entry point) and capture its output; `env` adds variables."""
    command = shutil.which("kvtop") or f"{sys.prefix}/bin/kvtop"
    environment = {**os.environ, **env} if env else None
    return subprocess.run([command, *args], capture_output=True, text=True, timeout=60, check=False, env=environment)
