"""Keeps ranks that publish only events (a log sidecar's, an SGLang plugin's) registered with the bootstrap service.

They register again every `REFRESH_S`, so that the service forgets a process that died, and deregister on a
clean exit. With the cluster's CURVE keys the registrations dial the bootstrap as a CURVE client.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable

import zmq

from transport.bootstrap import REFRESH_S, BootstrapClient
from transport.curve import CurveKeys
from transport.errors import BootstrapError, RegistrationRefused
from transport.service import ServiceThread
from transport.wire import AgentInfo, cut_text

_log = logging.getLogger(__name__)


class Registrar(ServiceThread):
    """Registers the ranks `infos()` lists every `REFRESH_S` in its own thread (a registry that does not answer
    never holds up the log); `problems` holds each rank's last error (by label; none while registrations succeed),
    `problem` the first of them. One rank refused holds up no other's refresh (they would expire)."""

    def __init__(
        self,
        bootstrap: str,
        infos: Callable[[], list[AgentInfo]],
        context: zmq.Context[zmq.Socket[bytes]],
        curve: CurveKeys | None = None,
        name: str = "kvtop-registrar",
        log_problems: bool = False,
    ) -> None:
        """`log_problems`: log each new problem (a refusal names its fix) and the recovery, for a process whose log
        is all its operator reads (an SGLang plugin's); a sidecar says `problem` itself."""
        super().__init__(name)
        self.log_problems = log_problems
        self.bootstrap = bootstrap
        self.curve = curve
        self.problem = ""
        self.problems: dict[str, str] = {}
        """Label -> why its latest registration failed (refused, or the service did not answer)."""
        self.registered = 0
        """Registrations the service accepted so far."""
        self._infos = infos
        self._context = context
        self._withdrawn: deque[AgentInfo] = deque()
        """Ranks `infos()` no longer lists, to take off the listing (at once, rather than expired as if died)."""

    def withdraw(self, info: AgentInfo) -> None:
        """Take a rank that `infos()` lists no more off the listing (in this thread, after the registrations it may
        be sending; best effort: one the service does not hear of expires)."""
        self._withdrawn.append(info)

    def close(self) -> None:
        """Stop, then take every rank off the listing (best effort: an unreachable service lets them expire)."""
        super().close()
        try:
            with BootstrapClient(self.bootstrap, 1.0, self._context, curve=self.curve) as client:
                for info in [*self._infos(), *self._withdrawn]:
                    client.deregister(info)
        except BootstrapError:
            pass

    def _serve(self) -> None:
        with BootstrapClient(self.bootstrap, REFRESH_S, self._context, curve=self.curve) as client:
            while not self._stop.is_set():
                self._register(client)
                self._deregister(client)
                self._stop.wait(REFRESH_S)

    def _deregister(self, client: BootstrapClient) -> None:
        while self._withdrawn:
            info = self._withdrawn[0]
            try:
                client.deregister(info)
            except RegistrationRefused as error:  # another client holds its entry now: not ours to drop
                _log.info("kvtop: %s left registered: %s", info.label, error)
            except BootstrapError:
                return  # the service did not answer: asked again at the next refresh
            self._withdrawn.popleft()

    def _died(self, error: Exception) -> None:
        _log.exception("the registrar %s died: its ranks will expire from %s", self.thread.name, self.bootstrap)
        raise error

    def _register(self, client: BootstrapClient) -> None:
        infos, problems = self._infos(), {}
        for index, info in enumerate(infos):
            try:
                client.register(info)
                self.registered += 1
            except RegistrationRefused as error:  # this rank's: the others still refresh
                problems[info.label] = cut_text(str(error))
            except BootstrapError as error:  # the service's: every rank's, and no use asking again now
                problems.update((later.label, cut_text(str(error))) for later in infos[index:])
                break
        self.problems = problems
        problem = next(iter(problems.values()), "")
        if self.log_problems and problem != self.problem:
            if problem:
                _log.warning("kvtop: cannot register, so no kvtop view lists this rank: %s", problem)
            else:
                _log.warning("kvtop: registered with %s again", self.bootstrap)
        self.problem = problem
