"""What a set of log files gave: the counts behind the `sglang logs: ...` summary line."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from kvtop.model.dates import local_date_time
from kvtop.sources.sglang.clocks import AHEAD_MAX_S, EARLIEST_TS, ClockOffset

EMPTY = "empty"
"""Why nothing was read from a file that holds nothing (yet)."""


@dataclass(frozen=True)
class ClockStep:
    """A log's times going back: its server's clock was set back."""

    back_s: float
    """The largest step back."""
    at: float
    """The time it stepped back to."""

    def text(self, name: str) -> str:
        at = local_date_time(self.at)
        return f"{name}'s times step back {self.back_s:.0f} s at {at} (its clock was set back: read as written)"


@dataclass(frozen=True)
class Misdated:
    """A log's lines dated where no log's can be (`clocks.believable`): each read at the time of the line before
    it, as a line that tells no time is."""

    lines: int
    first: float
    """The time the first of them told."""

    def another(self) -> Misdated:
        return Misdated(self.lines + 1, self.first)

    def text(self, name: str) -> str:
        try:
            at = local_date_time(self.first)
        except (OverflowError, OSError, ValueError):  # a UCX line's epoch seconds of 30 digits
            at = f"{self.first:.0f} s after 1970"
        where = (
            f"before {time.gmtime(EARLIEST_TS).tm_year}"
            if self.first < EARLIEST_TS
            else f"past this machine's clock by more than {AHEAD_MAX_S / 86400:.0f} days"
        )
        if self.lines == 1:
            return (
                f"{name}'s line dated {at} tells a time no log's can ({where}): set aside, the line dated by the one "
                "before it"
            )
        return (
            f"{self.lines} of {name}'s lines tell a time no log's can (the first {at}, {where}): set aside, each line "
            "dated by the one before it"
        )


@dataclass
class LogStats:
    """What the files gave: bytes and lines read, lines parsed, and what was skipped."""

    files: int = 0
    bytes: int = 0
    lines: int = 0
    matched: int = 0
    failures: int = 0
    batches: int = 0
    context: int = 0
    garbled: int = 0
    """Lines that hold a marker but not the shape of their kind, or past the longest line: counted, skipped."""
    no_room: int = 0
    """Failure lines without a room that no related line names (kept as context: they cannot be folded)."""
    undated: int = 0
    """Lines used that told no time, with no dated line before them in their file: the file's mtime dates them."""
    peers_unlisted: int = 0
    """Lines naming a lost prefill instance's address past the ranks the logs may name (`RANKS_MAX`): not listed."""
    asked_unpaired: int = 0
    """Decode bootstrap errors naming an address past the `ASKED_KEPT` kept: not paired with the prefill logs at it."""
    rotations: int = 0
    damaged: list[str] = field(default_factory=list)
    """`FILE: what was wrong` for each `.gz` that could not be read to its end (what came before was used)."""
    cut: list[str] = field(default_factory=list)
    """Each file whose last line had no newline (copied while written, or damaged there): that line was not read."""
    relabelled: list[str] = field(default_factory=list)
    """`FILE: labelled prefill, its lines are decode's` for each file read as its lines say, not as labelled."""
    mixed: list[str] = field(default_factory=list)
    """`FILE: N of its lines are decode's, read as prefill-0's` for each file that holds both servers' lines."""
    repeated: list[str] = field(default_factory=list)
    """Files given again (the same file by another path, or twice): read once."""
    unread: dict[str, str] = field(default_factory=dict)
    """Why kvtop read nothing from a file, by its path: `EMPTY`, its damage (a `.gz` that is none), or not an SGLang
    server log."""
    clocks: dict[str, ClockOffset[str]] = field(default_factory=dict)
    """Servers whose clock differs from their group's first server's by `clocks.DIFFER_S` or more, by name: their
    times were corrected onto that one's (but where `corrected` is False)."""
    clock_steps: dict[str, ClockStep] = field(default_factory=dict)
    """Servers whose log's times step back by more than `clocks.STEP_BACK_S`, by name: read as written."""
    misdated: dict[str, Misdated] = field(default_factory=dict)
    """Servers whose log holds lines dated where no log's can be, by name: their times are not the logs' "now"."""

    @property
    def no_log(self) -> bool:
        """Nothing was read from any file, and some file is no SGLang server log (not just empty)."""
        return len(self.unread) == self.files > 0 and any(why != EMPTY for why in self.unread.values())

    @property
    def nothing_read(self) -> bool:
        """Nothing was read from any file given (each empty, or no SGLang server log)."""
        return len(self.unread) == self.files > 0

    def unread_text(self) -> str:
        return "; ".join(f"{path}: {why}" for path, why in self.unread.items())

    def clock_lines(self) -> list[str]:
        """Each server whose clock differs from another's, each whose clock stepped back, each whose lines were
        dated where no log's can be."""
        return [
            *(clock.text(name) for name, clock in self.clocks.items()),
            *(step.text(name) for name, step in self.clock_steps.items()),
            *(misdated.text(name) for name, misdated in self.misdated.items()),
        ]

    def clock_findings(self) -> list[str]:
        """What the logs' clocks did: `clocks of the logs differ: ...`, `a log's clock stepped back: ...`, `a log's
        lines tell impossible times: ...`."""
        found = []
        if self.clocks:
            found.append("clocks of the logs differ: " + "; ".join(c.text(name) for name, c in self.clocks.items()))
        if self.clock_steps:
            steps = "; ".join(step.text(name) for name, step in self.clock_steps.items())
            found.append(f"a log's clock stepped back: {steps}")
        if self.misdated:
            dates = "; ".join(misdated.text(name) for name, misdated in self.misdated.items())
            found.append(f"a log's lines tell impossible times: {dates}")
        return found

    def summary(self, clocks: bool = True) -> str:
        """The counts, and what was wrong; with `clocks`, what the logs' clocks did (`clock_findings`)."""
        text = (
            f"sglang logs: {_count(self.files, 'file')}, {_count(self.lines, 'line')}, "
            f"{_count(self.failures, 'failure line')}, {_count(self.batches, 'batch line')}, "
            f"{_count(self.context, 'context line')}, {self.garbled} garbled (skipped), {self.no_room} without a room"
        )
        if self.undated:
            text += f", {self.undated} dated by their file's time (no line before them told one)"
        if self.peers_unlisted:
            text += f", {self.peers_unlisted} naming a lost prefill's address past the ranks kept (not listed)"
        if self.asked_unpaired:
            text += (
                f", {self.asked_unpaired} asking a bootstrap address past those kept (not paired with a prefill log)"
            )
        if self.damaged:
            text += f", {len(self.damaged)} damaged (read up to the damage): {'; '.join(self.damaged)}"
        if self.cut:
            text += f", last line cut: not read in {'; '.join(self.cut)}"
        if self.relabelled:
            text += f", {len(self.relabelled)} read as their lines say: {'; '.join(self.relabelled)}"
        if self.mixed:
            text += f", {len(self.mixed)} holding both servers' lines: {'; '.join(self.mixed)}"
        if self.repeated:
            text += f", {len(self.repeated)} given again (read once): {'; '.join(self.repeated)}"
        if self.unread:
            text += f", nothing read from {len(self.unread)}: {self.unread_text()}"
        return "; ".join([text, *(self.clock_findings() if clocks else [])])


def _count(count: int, noun: str) -> str:
    """`1 file`, `2 files`."""
    return f"{count} {noun}{'' if count == 1 else 's'}"
