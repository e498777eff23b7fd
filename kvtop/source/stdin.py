"""A log piped in (`--sglang-log -`, `decode=-`, `/dev/stdin`): copied to a temporary file first, which the reader
reads as any log (it opens a file more than once: to sniff its encoding, gzip and roles, then to read it; a pipe
gives its bytes once)."""

from __future__ import annotations

import contextlib
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

from kvtop.source.errors import SourceError

STDIN_NAMES = ("-", "/dev/stdin")
"""The paths that name this process's standard input."""


def piped(path: str) -> bool:
    """Whether `path` names stdin as a pipe (a `/dev/stdin` redirected from a file is that file, read as one)."""
    return path == "-" or (path == "/dev/stdin" and not Path(path).is_file())


def names_stdin(spec: str) -> bool:
    """Whether a `--sglang-log` value (`FILE`, `prefill=FILE`, `decode=FILE`) names stdin as a pipe."""
    role, sep, path = spec.partition("=")
    return piped(path if sep and role in ("prefill", "decode") else spec)


def _same(text: str) -> str:
    return text


@contextlib.contextmanager
def spooled(specs: tuple[str, ...]) -> Iterator[tuple[tuple[str, ...], Callable[[str], str]]]:
    """`specs` (`FILE`, `prefill=FILE`, `decode=FILE`) with stdin's replaced by a temporary copy of everything
    piped in (to its end), removed on exit, and what names the copy `stdin` in a line for the user (it points at
    no file once kvtop exits). SourceError when stdin is named twice or is a terminal."""
    from kvtop.sources.sglang.spec import LogSpec

    parsed = [LogSpec.parse(spec) for spec in specs]
    stdin = [spec for spec in parsed if piped(str(spec.path))]
    if not stdin:
        yield specs, _same
        return
    if len(stdin) > 1:
        raise SourceError("stdin given twice as --sglang-log: it holds one server's log (pipe one, name the others)")
    if sys.stdin is None or sys.stdin.isatty():
        raise SourceError("--sglang-log - reads a log piped in, and stdin is a terminal: pipe one (zcat x.gz | ...)")
    with tempfile.TemporaryDirectory(prefix="kvtop-stdin-") as folder:
        copy = Path(folder) / "stdin"
        with copy.open("wb") as out:
            shutil.copyfileobj(sys.stdin.buffer, out, 1 << 20)
        named = [(f"{spec.role}={copy}" if spec.role else str(copy)) if spec in stdin else text
                 for spec, text in zip(parsed, specs, strict=True)]  # fmt: skip

        def shown(text: str) -> str:
            return text.replace(str(copy), "stdin")

        try:
            yield tuple(named), shown
        except SourceError as error:
            raise SourceError(shown(str(error))) from None
