"""Log lines in SGLang's scheduler format: `[YYYY-MM-DD HH:MM:SS TPn] message`."""

from __future__ import annotations

import logging
import sys
import time


class SGLangFormatter(logging.Formatter):
    """SGLang prints no level; the prefix carries time and the rank tags."""

    def __init__(self, rank_tags: str) -> None:
        super().__init__()
        self._tags = f" {rank_tags}" if rank_tags else ""

    def format(self, record: logging.LogRecord) -> str:
        stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(record.created))
        return f"[{stamp}{self._tags}] {record.getMessage()}"


def setup_agent_logging(rank: int, level: str = "INFO", log_file: str = "") -> logging.Logger:
    """The agent's logger, writing SGLang-format lines to `log_file` (appended) or stderr."""
    logger = logging.getLogger("transport.agent")
    logger.handlers.clear()
    handler: logging.Handler = logging.FileHandler(log_file) if log_file else logging.StreamHandler(sys.stderr)
    handler.setFormatter(SGLangFormatter(f"TP{rank}"))
    logger.addHandler(handler)
    logger.setLevel(level.upper())
    logger.propagate = False
    return logger
