"""`ServiceThread`: the base of an object that serves on one daemon thread of its own."""

from __future__ import annotations

import logging
import threading
from typing import Self

from transport.thread_names import name_os_thread


class ServiceThread:
    """Serves on one daemon thread: `start()`, then `close()` stops it and waits for it (idempotent).

    A subclass writes `_serve()`, a loop that ends soon after `_stop` is set (it polls with a timeout or
    waits on `_stop`). An exception that escapes `_serve` goes to `_died`, which logs it with its traceback;
    the thread then ends, and `thread.is_alive()` tells its owner.
    """

    def __init__(self, name: str) -> None:
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> Self:
        self.thread.start()
        return self

    def close(self) -> None:
        """Ask the loop to end and wait for it (not when called from the loop itself)."""
        self._stop.set()
        if self.thread.is_alive() and self.thread is not threading.current_thread():
            self.thread.join()

    def _serve(self) -> None:
        raise NotImplementedError

    def _died(self, error: Exception) -> None:
        """The loop raised `error` (being handled now): log it with its traceback."""
        logging.getLogger(type(self).__module__).exception("the %s thread died", self.thread.name)

    def _run(self) -> None:
        name_os_thread()
        try:
            self._serve()
        except Exception as error:
            self._died(error)
