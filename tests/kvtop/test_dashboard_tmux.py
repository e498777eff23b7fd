"""The installed `kvtop` in a real terminal (tmux), driven by keys as a person would."""

from __future__ import annotations

import re
import shutil
import socket
import subprocess
import sys
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest
from prometheus_client.parser import text_string_to_metric_families

from kvtop import __version__ as kvtop_version
from tests.conftest import wait_for

pytestmark = [pytest.mark.processes, pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")]

KVTOP = shutil.which("kvtop") or f"{sys.prefix}/bin/kvtop"
_EXIT_MARK = "KVTOP-EXITED"


@dataclass
class Pane:
    """One tmux session on a private server: type keys, read the screen."""

    server: str
    session: str = "kvtop"

    def tmux(self, *args: str) -> str:
        result = subprocess.run(["tmux", "-L", self.server, *args], capture_output=True, text=True, check=False)
        return result.stdout

    def start(self, command: str) -> None:
        self.tmux("new-session", "-d", "-s", self.session, "-x", "160", "-y", "45", command)

    def keys(self, *keys: str) -> None:
        self.tmux("send-keys", "-t", self.session, *keys)

    def screen(self) -> str:
        return self.tmux("capture-pane", "-p", "-t", self.session)

    def shows(self, pattern: str) -> re.Match[str] | None:
        return re.search(pattern, self.screen())


@pytest.fixture
def pane(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Pane]:
    """A private tmux server; what it runs records into a private cache folder (the dashboard's default ring) and
    is told the pane's size (the server's environment otherwise says COLUMNS=80, which Textual believes)."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("COLUMNS", "160")
    monkeypatch.setenv("LINES", "45")
    pane = Pane(f"kvtop-test-{uuid.uuid4().hex[:8]}")
    yield pane
    print(f"the pane at the end of the test:\n{pane.screen()}")  # pytest shows it when the test failed
    pane.tmux("kill-server")


def _agents_of(bootstrap: str) -> list[psutil.Process]:
    """Agent processes started for the cluster whose bootstrap address is `bootstrap`."""
    found = []
    for process in psutil.process_iter(["cmdline"]):
        cmdline = process.info["cmdline"] or []
        named = any(arg == bootstrap or f'"{bootstrap}"' in arg for arg in cmdline)  # a flag, or in --options-json
        if "transport.harness.agent" in cmdline and named:
            found.append(process)
    return found


def _start_dashboard(pane: Pane, *options: str, follow_resizes: bool = False) -> str:
    """Bare `kvtop` with a fault that fails rooms within seconds; returns the bootstrap address it shows.
    `follow_resizes`: without COLUMNS and LINES, which would fix its size whatever the window's."""
    command = (
        f"{'env -u COLUMNS -u LINES ' if follow_resizes else ''}"
        f"{KVTOP} --prefill 1 --decode 1 --tp 2 --rate 20 --fault prefill-0/TP0=corrupt:0.3 {' '.join(options)}; "
        f"echo {_EXIT_MARK}=$?; sleep 60"
    )
    pane.start(command)
    banner = wait_for(lambda: pane.shows(r"bootstrap (tcp://127\.0\.0\.1:\d+)"), 60, "the dashboard's banner")
    bootstrap = banner.group(1)
    wait_for(lambda: len(_agents_of(bootstrap)) == 4, 10, "four agents running")
    wait_for(lambda: pane.shows(r"4/4 ranks alive"), 30, "every rank alive on the health line")
    return bootstrap


def _scrape(url: str) -> dict[str, float]:
    """`name{labels}` -> value of every sample /metrics serves."""
    with urllib.request.urlopen(url, timeout=5) as response:
        text = response.read().decode()
    return {
        sample.name + str(sorted(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def test_dashboard_shows_an_origin_with_its_echoes_and_quits_without_leaving_agents(pane):
    """Start bare kvtop (serving its model to Prometheus with --export), open failures, expand the incident of the
    corrupting rank into its failure groups and a group into its echoes, quit: every agent is gone, and so is the
    metrics server."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{probe.getsockname()[1]}/metrics"
    bootstrap = _start_dashboard(pane, "--export", url.removeprefix("http://").removesuffix("/metrics"))
    metrics = _scrape(url)
    assert metrics["kvtop_exporter_info" + str([("source", "embedded"), ("version", kvtop_version)])] == 1
    alive = [value for name, value in metrics.items() if name.startswith("kvtop_rank_state") and "'alive'" in name]
    assert sum(alive) == 4

    pane.keys("f")
    incident = r"[▶▼] ONGOING  prefill-0/TP0 sends corrupt KV \(checksum\)"
    wait_for(lambda: pane.shows(incident), 60, "the corrupting rank's incident, naming the sender")
    pane.keys("p")  # freeze the tree: the newest groups may not have their echoes yet
    wait_for(lambda: pane.shows(r"PAUSED \(p resumes\)"), 10, "the dashboard paused")
    rows = pane.screen().splitlines()
    top = next(i for i, line in enumerate(rows) if re.match(r"\d+ incidents? \(", line)) + 1  # the tree's first row
    pane.keys("Home", *["Down"] * (next(i for i, line in enumerate(rows) if re.search(incident, line)) - top), "Enter")
    folded = r"▶ room (\d+) +decode-0/TP\d +checksum +[1-9]\d* echoes"
    wait_for(lambda: pane.shows("▼" + incident[4:]) and pane.shows(folded), 10, "the incident expanded")
    rows = pane.screen().splitlines()
    opened = next(i for i, line in enumerate(rows) if re.search(incident, line))
    target = next(i for i, line in enumerate(rows) if re.search(folded, line))
    pane.keys(*["Down"] * (target - opened), "Enter")  # a frame in flight as it paused may shift the rows: any
    wait_for(lambda: pane.shows(r"▼ room \d+ "), 10, "a group expanded")  # group then, each has echoes
    echoes = wait_for(lambda: re.findall(r"└ echo (\S+)", pane.screen()), 10, "its echoes listed under it")
    assert all(label.startswith(("decode-0/", "prefill-0/")) for label in echoes)

    pane.keys("q")
    wait_for(lambda: pane.shows(f"{_EXIT_MARK}=0"), 30, "kvtop exiting with status 0")
    wait_for(lambda: not _agents_of(bootstrap), 10, "no agent left running")
    with pytest.raises(OSError):
        _scrape(url)


RANK_ROW = re.compile(r"(prefill|decode)-\d/TP\d\s")
WHOLE_RANK_ROW = re.compile(
    r"\S+ +(?:(?:prefill|decode) +)?(?:alive|suspect|stale|gone) +\d[\d.]* [KMG]?B/s(?: +(?:\d+|[·▁▂▃▄▅▆▇█]{12}))*"
    r"(?:   +[▁▂▃▄▅▆▇█▔]{1,2})?"
)
"""A rank row whose every cell is whole: the rate with its unit, then whole counts and whole trends of 12 cells
(a scrollbar may follow)."""


def test_at_80x24_100x30_and_160x45_keys_health_and_numbers_stay_whole(pane):
    """One dashboard, its window resized: at every size the banner keeps the cluster's bootstrap address whole (at
    100 columns it read `bootstrap tcp:/…`), the data's time and `? help`, the health
    line its failure rate, stuck and gaps, the footer `? Help` and `q Quit`, and no rank row cuts a number (columns
    leave whole)."""
    _start_dashboard(pane, follow_resizes=True)
    for columns, rows in ((160, 45), (100, 30), (80, 24)):
        pane.tmux("resize-window", "-t", pane.session, "-x", str(columns), "-y", str(rows))

        def laid_out(columns: int = columns, rows: int = rows) -> list[str] | None:
            lines = pane.screen().splitlines()
            header = next((line for line in lines if line.startswith("RANK ")), "")
            drawn = len(lines) == rows and lines[-1].strip() and lines[0].rstrip().endswith("? help")
            health = len(lines) > 1 and lines[1].rstrip().endswith("gaps")  # redrawn at this width too (the
            return lines if drawn and health and header and len(header) <= columns else None  # banner, every tick)

        lines = wait_for(laid_out, 15, f"the dashboard laid out at {columns}x{rows}")
        assert "? help" in lines[0] and "as of " in lines[0], lines[0]
        assert re.match(r" kvtop  bootstrap tcp://127\.0\.0\.1:\d+, ", lines[0]), lines[0]  # whole: tools take it
        assert re.search(r" \d+ stuck  \d+ gaps", lines[1]), lines[1]
        assert re.search(r"[\d.]+% failed in (the last )?\d+ s", lines[1]), lines[1]  # how bad, at 80 columns too
        assert "? Help" in lines[-1] and "q Quit" in lines[-1], lines[-1]
        header = next(line for line in lines if line.startswith("RANK ")).split("▏")[0]  # the side panel beside
        assert header.rstrip().endswith(("5m", "IN FLIGHT", "ORIGINS", "ECHOES", "CPU %", "REJECTED")), header
        ranks = [line.split("▏")[0].rstrip() for line in lines if RANK_ROW.match(line)]
        assert ranks and all(WHOLE_RANK_ROW.fullmatch(row) for row in ranks), (columns, ranks)
    pane.keys("q")
    wait_for(lambda: pane.shows(f"{_EXIT_MARK}=0"), 30, "kvtop exiting with status 0")


def test_a_closed_terminal_ends_kvtop_and_its_agents(pane):
    """Killing the terminal (SIGHUP to kvtop) stops the dashboard and every agent it started."""
    bootstrap = _start_dashboard(pane)
    kvtop_pid = int(pane.tmux("list-panes", "-t", pane.session, "-F", "#{pane_pid}").strip())
    shell = psutil.Process(kvtop_pid)
    kvtop = wait_for(lambda: [p for p in shell.children() if "kvtop" in " ".join(p.cmdline())], 5, "kvtop")[0]

    pane.tmux("kill-session", "-t", pane.session)

    wait_for(lambda: not kvtop.is_running() or kvtop.status() == psutil.STATUS_ZOMBIE, 20, "kvtop gone")
    wait_for(lambda: not _agents_of(bootstrap), 20, "no agent left running")


def test_rewind_keys_on_the_dashboards_own_recording_and_its_replay(pane, tmp_path):
    """Bare kvtop records into --record-dir: `,` replays 10 s back, `[` lands on a failure origin, `L` is live
    again; after q, `kvtop top --replay` on that folder opens at its end and steps back from there."""
    ring = tmp_path / "ring"
    pane.start(
        f"{KVTOP} --prefill 1 --decode 1 --tp 2 --rate 20 --fault prefill-0/TP0=corrupt:0.3 --record-dir {ring}; "
        f"echo {_EXIT_MARK}=$?; {KVTOP} top --replay {ring}; echo {_EXIT_MARK}-REPLAY=$?; sleep 60"
    )
    bootstrap = wait_for(lambda: pane.shows(r"bootstrap (tcp://127\.0\.0\.1:\d+)"), 120, "the dashboard").group(1)
    wait_for(lambda: pane.shows(r"[\d.]+% failed in \d+ s \([1-9]\d* origins\)"), 120, "a failure origin seen live")

    def ten_seconds_back() -> bool:
        """`,` went 10 s back (10-19 s ago, more on a loaded machine). The first origin can show before the
        recorder wrote its first segment (a note: `nothing recorded yet`) or less than 10 s after (`,` stops
        at the recording's start): then, once the note is gone or live again, try again."""
        pane.keys(",")
        wait_for(lambda: pane.shows(r"REPLAY .* — paused|nothing recorded yet|cannot rewind"), 20, "an answer")
        if pane.shows("nothing recorded yet|cannot rewind"):  # (cannot: a segment caught before its header)
            wait_for(lambda: not pane.shows("nothing recorded yet|cannot rewind"), 20, "the note gone")
            return False
        if pane.shows("the recording starts at"):
            pane.keys("L")
            wait_for(lambda: not pane.shows("REPLAY"), 20, "live again")
            return False
        assert pane.shows(r"REPLAY \d\d:\d\d:\d\d \([1-5]\ds ago\) — paused"), "stepped back, but not 10 s"
        return True

    wait_for(ten_seconds_back, 60, "the replay banner, 10 s back")
    pane.keys("L")
    wait_for(lambda: not pane.shows("REPLAY") and pane.shows("ranks alive"), 20, "live again")
    pane.keys("[")
    # the corrupt chunks' (checksum) most of the time; on a loaded machine a timeout's may be the last
    wait_for(lambda: pane.shows(r"REPLAY .* · origin: room \d+ on \S+ \([a-z_]+\)"), 20, "the last origin")
    pane.keys("L")
    wait_for(lambda: not pane.shows("REPLAY"), 20, "live again")
    pane.keys("q")
    wait_for(lambda: pane.shows(f"{_EXIT_MARK}=0"), 30, "kvtop exiting with status 0")
    wait_for(lambda: not _agents_of(bootstrap), 10, "no agent left running")
    assert list(ring.glob("seg-*.kvr")), "the session was recorded"

    wait_for(lambda: pane.shows(r"REPLAY .* — the recording's end, paused"), 30, "the recording opened at its end")
    pane.keys(",")
    wait_for(lambda: pane.shows(r"REPLAY .* — paused \(p plays"), 20, "10 s before its end")
    pane.keys("q")
    wait_for(lambda: pane.shows(f"{_EXIT_MARK}-REPLAY=0"), 30, "the replay exiting with status 0")


def test_the_dashboard_on_sglang_logs_shows_them_as_they_were_at_the_instant_given(pane):
    """`kvtop top --sglang-log ... --at`: its help says it works, and it exited 2 (`--at reads a recording`)."""
    logs = Path(__file__).parent / "fixtures" / "sglang" / "lost-prefill"
    pane.start(
        f"{KVTOP} top --sglang-log decode={logs / 'decode.log'} --sglang-log prefill={logs / 'prefill.log'} "
        f"--at '2026-03-05 09:00:20'; echo {_EXIT_MARK}=$?; sleep 60"
    )

    wait_for(lambda: pane.shows(r"logs as of 2026-03-05 09:00:20"), 30, "the logs as of the instant given")
    pane.keys("q")
    wait_for(lambda: pane.shows(f"{_EXIT_MARK}=0"), 30, "kvtop exiting with status 0")
