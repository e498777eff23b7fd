"""Soak a faulty local cluster: rooms finished and the RSS of every process, once per interval.

Runs `kvtop cluster up --rate 40 --fault corrupt:0.05 --fault stall:0.02 --fault refuse:0.02
--duration N` (arguments after `--` replace those), reads its status lines (stderr) and samples,
every `--interval` seconds, the rooms it finished (ok, failed, refused, lost) since the last
sample and the resident memory of `kvtop` itself (the router) and of every agent (named by its
rank label from the bootstrap service). Prints one row per sample, then the RSS growth of each
process from the first sample to the last. Exits 1 when an interval finished no room (a wedge)
or `cluster up` itself failed.

    .venv/bin/python scripts/soak.py --duration 600            # the 10-minute soak of issue 12
    .venv/bin/python scripts/soak.py --duration 60 --interval 15
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

from transport.bootstrap import BootstrapClient

STATUS = re.compile(r"rooms ok (\d+), failed (\d+), refused (\d+), lost (\d+), in flight (\d+)")
DEFAULT_ARGS = ["--rate", "40", "--fault", "corrupt:0.05", "--fault", "stall:0.02", "--fault", "refuse:0.02"]


class StatusReader:
    """Keeps the latest counters of `cluster up`'s status lines and every other stderr line it printed."""

    def __init__(self, process: subprocess.Popen[str]) -> None:
        self.latest = (0, 0, 0, 0, 0)
        self.notes: list[str] = []
        self._process = process
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self._process.stderr is not None
        for line in self._process.stderr:
            match = STATUS.search(line)
            if match:
                ok, failed, refused, lost, inflight = (int(value) for value in match.groups())
                self.latest = (ok, failed, refused, lost, inflight)
            else:
                self.notes.append(line.rstrip("\n"))


def rss_by_label(root: psutil.Process, labels: dict[int, str]) -> dict[str, int]:
    """RSS in bytes of `root` ("router") and of each of its child processes, by rank label (or pid)."""
    sizes = {"router": root.memory_info().rss}
    for child in root.children(recursive=True):
        try:
            sizes[labels.get(child.pid, f"pid {child.pid}")] = child.memory_info().rss
        except psutil.NoSuchProcess:
            continue
    return sizes


def agent_labels(bootstrap: str) -> dict[int, str]:
    with BootstrapClient(bootstrap, timeout_s=2.0) as client:
        return {agent.pid: agent.label for agent in client.list_agents()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=float, default=600.0, help="seconds the cluster runs")
    parser.add_argument("--interval", type=float, default=60.0, help="seconds between samples")
    parser.add_argument("cluster_args", nargs="*", help="after --: arguments for `kvtop cluster up` instead")
    args = parser.parse_args()
    kvtop = shutil.which("kvtop") or str(Path(sys.executable).with_name("kvtop"))
    log_dir = tempfile.mkdtemp(prefix="kvtop-soak-")
    command = [kvtop, "cluster", "up", *(args.cluster_args or DEFAULT_ARGS), "--duration", f"{args.duration:g}"]
    print(f"# {' '.join(command)} --log-dir {log_dir}", flush=True)
    process = subprocess.Popen(
        [*command, "--log-dir", log_dir], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    assert process.stdout is not None
    bootstrap = process.stdout.readline().strip()
    if not bootstrap:
        print("cluster up did not print its bootstrap address", file=sys.stderr)
        return 1
    status = StatusReader(process)
    root = psutil.Process(process.pid)
    start = time.monotonic()
    previous = (0, 0, 0, 0, 0)
    samples: list[dict[str, int]] = []
    wedged = False
    header_printed = False
    while process.poll() is None:
        time.sleep(max(0.0, start + args.interval * (len(samples) + 1) - time.monotonic()))
        if process.poll() is not None:
            break
        labels = agent_labels(bootstrap)
        sizes = rss_by_label(root, labels)
        now = status.latest
        ok, failed, refused, lost = (now[i] - previous[i] for i in range(4))
        previous = now
        wedged = wedged or ok + failed == 0
        names = sorted(sizes)
        if not header_printed:
            print(f"{'t_s':>6} {'ok':>6} {'failed':>6} {'refused':>7} {'lost':>5} {'inflight':>8}  "
                  + "  ".join(f"{name:>13}" for name in names) + "  (RSS MiB)", flush=True)  # fmt: skip
            header_printed = True
        print(
            f"{time.monotonic() - start:6.0f} {ok:6} {failed:6} {refused:7} {lost:5} {now[4]:8}  "
            + "  ".join(f"{sizes[name] / 2**20:13.1f}" for name in names),
            flush=True,
        )
        samples.append(sizes)
    code = process.wait()
    for note in status.notes:
        if "kvtop:" in note or note.startswith("done:"):
            print(f"# {note}")
    if len(samples) >= 2:
        first, last = samples[0], samples[-1]
        growth = ", ".join(
            f"{name} {(last[name] - first[name]) / 2**20:+.1f}" for name in sorted(last) if name in first
        )
        print(f"# RSS growth first to last sample (MiB): {growth}")
    if code != 0 or wedged:
        print(f"# cluster up exited {code}; an interval with no finished room: {wedged}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
