"""The dashboard's own recording: a bounded ring in the user's cache folder, so a live session can rewind.

`kvtop top` on a live cluster and bare `kvtop` record by default (`--no-record` turns it off). One recorder
writes a folder at a time (kvtop.record.lock): a second dashboard on the same folder, or one on a folder that
`kvtop record` writes, runs without recording, and says so. The recorder's writer thread does the I/O; the
collector's thread only appends to a list.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kvtop.record.writer import Recorder

DEFAULT_MAX_BYTES = 256 << 20
KEYFRAME_EVENTS = 1_000_000
"""The dashboard's keyframes come every 1M events (or minute), not the recorder's 50k: a forked child takes
each one (the collector's lock is held ~10-20 ms for the fork, `kvtop bench keyframe`), but on `kvtop bench
ui`'s model (100k rooms, 50k events/s) one costs the child ~0.35 s of CPU and ~4 MB of the ring (47 MB before
compression): every second, they would fill a 256 MiB ring in a minute. A seek then replays at most 1M events."""


@dataclass(frozen=True)
class RecordChoice:
    """What was asked of the dashboard's recording: whether to record, the folder ("": the cache folder) and the
    ring's size in bytes."""

    record: bool = True
    folder: str = ""
    max_bytes: int = DEFAULT_MAX_BYTES


@dataclass
class Recording:
    """The dashboard's recorder (None: not recording) and the folder it writes; `warning` says why not."""

    recorder: Recorder | None
    folder: Path
    warning: str = ""


@contextlib.contextmanager
def dashboard_recording(choice: RecordChoice) -> Iterator[Recording]:
    """The recorder to attach to the dashboard's collector (started; closed, its lock let go, on the way out).

    Close the collector first (inside the block): the recorder then writes what is pending and fsyncs."""
    from kvtop.record.lock import FolderInUse
    from kvtop.record.writer import Recorder, cache_folder

    folder = Path(choice.folder).expanduser() if choice.folder else cache_folder()
    if not choice.record:
        yield Recording(None, folder)
        return
    try:
        recorder = Recorder(folder, max_bytes=choice.max_bytes, keyframe_events=KEYFRAME_EVENTS)
    except FolderInUse as error:
        yield Recording(None, folder, f"not recording: {error} (--record-dir)")
        return
    except OSError as error:
        yield Recording(None, folder, f"not recording: cannot use {folder}: {error.strerror or error}")
        return
    try:
        yield Recording(recorder.start(), folder)
    finally:
        recorder.close()
