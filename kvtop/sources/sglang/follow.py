"""SGLang logs as the dashboard's source: a thread that keeps a model current as the files grow."""

from __future__ import annotations

import logging
import threading

from kvtop.model.cluster import JOURNAL_EVENTS_KEPT, ClusterModel
from kvtop.sources.sglang.missing import MissingPaths
from kvtop.sources.sglang.source import SGLangLogs
from kvtop.sources.sglang.stats import EMPTY, LogStats
from transport.thread_names import name_os_thread

POLL_S = 0.25
_log = logging.getLogger(__name__)


class LogFollower:
    """`model`, `lock` and `error` as the dashboard reads them; `now()` is the latest time the logs mention.

    Reads the files from their start (big files load while the dashboard already shows them) and then
    what they gain, with rotation. A damaged `.gz` is read up to its damage and named in `error`, as is a file
    that is no SGLang server log and one gone from its path (for 2 s, until a file is there again). Should
    the thread die anyway, it logs the traceback, says so in `error` and keeps it in `died` (the
    dashboard's command exits non-zero on it).
    """

    def __init__(self, logs: SGLangLogs) -> None:
        self.logs = logs
        self.model = ClusterModel(JOURNAL_EVENTS_KEPT)
        self.lock = threading.Lock()
        self.error = ""
        self.died: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kvtop-sglang-logs", daemon=True)
        self._missing = MissingPaths([file.spec.path for file in logs.files])

    def start(self) -> LogFollower:
        self._thread.start()
        return self

    def now(self) -> float:
        return self.logs.now

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        self.logs.close()

    def _run(self) -> None:
        name_os_thread()
        try:
            self._follow()
        except BaseException as error:  # never silent: the traceback to the log, the news to the dashboard
            _log.exception("the sglang log follower died")
            self.died = error
            self.error = f"sglang log follower died: {error!r} (see the log)"

    def _follow(self) -> None:
        while not self._stop.is_set():
            try:
                with self.lock:  # a few MiB at a time: a big file loads while the dashboard shows it
                    self.logs.poll(self.model, max_bytes=8 << 20)
                    self.model.sweep(self.logs.now)
                    named = len(self.model.ranks)
                self._missing.news()
                self.error = "; ".join(filter(None, [_problems(self.logs.stats(), named), self._missing.gone()]))
            except OSError as error:  # a file vanished without a rotation: say so, keep trying
                self.error = f"sglang log: {error}"
            if all(file.reader.at_end() for file in self.logs.files):
                self._stop.wait(POLL_S)


def _problems(stats: LogStats, ranks: int) -> str:
    """What the dashboard says of the files ("" when nothing is wrong): a `.gz` read up to its damage, a file that
    is no SGLang server log (an empty one is not a problem: its server may not have written yet), lines of which
    no rank came (`ranks` named so far: none is no empty healthy cluster)."""
    problems = []
    if stats.damaged:
        problems.append(f"sglang log damaged, read up to the damage: {'; '.join(stats.damaged)}")
    wrong = [f"{path}: {why}" for path, why in stats.unread.items() if why != EMPTY]
    if wrong:
        problems.append(f"nothing read from {'; '.join(wrong)}")
    elif not ranks and stats.lines:
        garbled = f", {stats.garbled} garbled" if stats.garbled else ""
        problems.append(f"no rank named in {stats.lines} line{'s' if stats.lines > 1 else ''} read{garbled}")
    return "; ".join(problems)
