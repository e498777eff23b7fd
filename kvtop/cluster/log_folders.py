"""A local cluster's temporary log folder, named after the process that owns it, and the sweep of those whose owner
died without removing its own (SIGKILL, the OOM killer, a power cut).

The folder is `kvtop-logs-<pid>-<random>` in the temporary directory; its owner removes it when it stops. The sweep
removes only folders named so, owned by this user, whose pid no process has: a folder of a live cluster, one whose
pid was reused since, or one named another way is left alone.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from pathlib import Path

from kvtop.record.lock import alive

_PREFIX = "kvtop-logs-"
_NAMED = re.compile(rf"{_PREFIX}(\d+)-\w+")


def prefix() -> str:
    """The name's start for this process's folder (`tempfile.TemporaryDirectory(prefix=...)` adds the rest)."""
    return f"{_PREFIX}{os.getpid()}-"


def sweep_orphans(folder: str | None = None) -> list[str]:
    """Remove the log folders in `folder` (default: the temporary directory) whose owner is dead; their paths."""
    removed = []
    for path in sorted(Path(folder or tempfile.gettempdir()).glob(f"{_PREFIX}*")):
        named = _NAMED.fullmatch(path.name)
        if named is None or alive(int(named[1])):
            continue
        try:
            if not path.is_dir() or path.is_symlink() or path.stat().st_uid != os.getuid():
                continue
        except OSError:  # gone meanwhile
            continue
        shutil.rmtree(path, ignore_errors=True)
        if not path.exists():
            removed.append(str(path))
    return removed
