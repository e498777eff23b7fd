"""kvtop's threads carry their names into the kernel, where `top -H`, `ps -L` and `perf` read them."""

from __future__ import annotations

import sys
import threading

import pytest

from tests.conftest import wait_for
from transport import BootstrapServer, KVManager, KVPool, Role
from transport.thread_names import OS_NAME_BYTES, name_os_thread

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="thread names in /proc are Linux's")


def _kernel_name(thread: threading.Thread) -> str:
    with open(f"/proc/self/task/{thread.native_id}/comm") as comm:
        return comm.read().strip()


def _named_thread(name: str) -> str:
    """The kernel's name of a thread called `name` that named itself."""
    seen: list[str] = []

    def run() -> None:
        name_os_thread()
        seen.append(_kernel_name(threading.current_thread()))

    thread = threading.Thread(target=run, name=name)
    thread.start()
    thread.join()
    return seen[0]


def test_a_thread_takes_its_python_name_and_a_long_one_keeps_its_start() -> None:
    assert _named_thread("kv-short") == "kv-short"
    assert _named_thread("kv-engine-prefill-0/tp2") == "kv-engine-prefill-0/tp2"[:OS_NAME_BYTES]


def test_the_bootstrap_service_and_a_ranks_engine_and_publisher_threads_are_named(
    bootstrap: BootstrapServer,
) -> None:
    wait_for(lambda: _kernel_name(bootstrap.thread) == "bootstrap", what="the bootstrap thread named")
    pool = KVPool(4, 4096)
    endpoint = bootstrap.endpoint
    with KVManager(role=Role.DECODE, instance="names", rank=0, tp=1, pool=pool, bootstrap=endpoint) as manager:
        manager.start()
        engine, publisher = manager._thread, manager.publisher.thread
        wait_for(lambda: _kernel_name(engine) == "kv-engine-names-0"[:OS_NAME_BYTES], what="the engine thread named")
        wait_for(lambda: _kernel_name(publisher).startswith("events-names"), what="the publisher thread named")
