"""The alternative `kvtop bench replay` measures the segments against: the same compressed blocks in SQLite
(WAL mode, synchronous=NORMAL, one transaction per block, as the recorder writes one block per flush), with
an index on (kind, t_first) for the seek."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from kvtop.record.format import BlockKind

SCHEMA = """
CREATE TABLE IF NOT EXISTS blocks (id INTEGER PRIMARY KEY, kind INTEGER, t_first REAL, t_last REAL, ops INTEGER,
                                   raw_len INTEGER, data BLOB);
CREATE INDEX IF NOT EXISTS blocks_time ON blocks (kind, t_first);
"""


class SqliteBlocks:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.db = sqlite3.connect(path, isolation_level=None)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=NORMAL")
        self.db.executescript(SCHEMA)

    def append(self, kind: BlockKind, t_first: float, t_last: float, ops: int, raw_len: int, payload: bytes) -> None:
        self.db.execute(
            "INSERT INTO blocks (kind, t_first, t_last, ops, raw_len, data) VALUES (?, ?, ?, ?, ?, ?)",
            (int(kind), t_first, t_last, ops, raw_len, payload),
        )

    def seek(self, t: float) -> list[bytes]:
        """The payloads a seek to `t` reads: the latest keyframe at or before it, then the ops blocks up to `t`."""
        row = self.db.execute(
            "SELECT id, data FROM blocks WHERE kind = ? AND t_first <= ? ORDER BY t_first DESC LIMIT 1",
            (int(BlockKind.KEYFRAME), t),
        ).fetchone()
        if row is None:
            return []
        rows = self.db.execute(
            "SELECT data FROM blocks WHERE id > ? AND kind = ? AND t_first <= ? ORDER BY id",
            (row[0], int(BlockKind.OPS), t),
        ).fetchall()
        return [row[1], *(data for (data,) in rows)]

    def close(self) -> None:
        self.db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        self.db.close()

    def bytes_on_disk(self) -> int:
        return sum(p.stat().st_size for p in self.path.parent.glob(self.path.name + "*"))
