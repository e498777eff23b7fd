"""Log lines in SGLang's scheduler format: `[YYYY-MM-DD HH:MM:SS TPn] message`."""

from __future__ import annotations

import logging
import sys
import time


class SGLangFormatter(logging.Formatter):
    """SGLang prints no level; the prefix carries time and the rank tags. A traceback follows its line
    unprefixed, as in SGLang's own logs."""

    def __init__(self, rank_tags: str) -> None:
        super().__init__()
        self._tags = f" {rank_tags}" if rank_tags else ""

    def format(self, record: logging.LogRecord) -> str:
        stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(record.created))
        line = f"[{stamp}{self._tags}] {record.getMessage()}"
        if record.exc_info:
            line = f"{line}\n{self.formatException(record.exc_info)}"
        return line


def setup_agent_logging(rank: int, level: str = "INFO", log_file: str = "") -> logging.Logger:
    """The agent's logger, writing SGLang-format lines to `log_file` (appended) or stderr.

    The handler sits on the `transport` logger, so the engine's and the publisher's records (a thread
    that died, with its traceback) land in the same place as the agent's own lines.
    """
    package = logging.getLogger("transport")
    package.handlers.clear()
    handler: logging.Handler = logging.FileHandler(log_file) if log_file else logging.StreamHandler(sys.stderr)
    handler.setFormatter(SGLangFormatter(f"TP{rank}"))
    package.addHandler(handler)
    package.setLevel(level.upper())
    package.propagate = False
    logger = logging.getLogger("transport.harness.agent")
    logger.handlers.clear()
    logger.setLevel(logging.NOTSET)
    logger.propagate = True
    return logger
