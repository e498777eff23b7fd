"""A rank's KV memory: one numpy array of pages, registered once, and its allocator.

A page holds the KV of `page_tokens` tokens for every layer and every head this
rank owns; it is stored as one contiguous row of `page_bytes`, so a run of
consecutive pages is one contiguous buffer that goes on the wire zero-copy.

A writer that finished a page may seal it: its xxh3-64 digest, taken while the
page is hot, travels with the transfer and is verified where the page lands
(end-to-end page checksums, no hash pass on the sender's transfer path).
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt
import xxhash
from xxhash import xxh3_64_digest, xxh3_64_intdigest

from transport.errors import ConfigError

PageIndices = npt.NDArray[np.uint32]
LAND_BLOCK_BYTES = 256 << 10
"""How much of a frame `land_digested` copies before it hashes what it copied: well inside a core's L2, so the
hash reads what the copy left in the cache (copying a 1 MiB frame whole, then hashing it, read the pages back
from memory: 15-20 us a MiB more in a transfer on two cores)."""


class PoolExhausted(ConfigError):
    """No free pages are left for a request."""


class KVPool:
    """`num_pages` pages of `page_bytes` each, with a free list.

    `layers` only documents the layout (a page is `layers` equal slices);
    transfers move whole page rows or a fixed byte range of every row.
    """

    def __init__(self, num_pages: int, page_bytes: int, layers: int = 1) -> None:
        if num_pages <= 0 or page_bytes <= 0:
            raise ConfigError(f"a KV pool needs pages: num_pages={num_pages}, page_bytes={page_bytes}")
        if page_bytes % layers:
            raise ConfigError(f"page_bytes={page_bytes} is not a multiple of layers={layers}")
        self.num_pages = num_pages
        self.page_bytes = page_bytes
        self.layers = layers
        self.data: npt.NDArray[np.uint8] = np.empty((num_pages, page_bytes), dtype=np.uint8)
        self.data.fill(0)  # registering touches every page, so no transfer pays for a page fault
        self._bytes = self.data.reshape(-1).data
        self.digests: npt.NDArray[np.uint64] = np.zeros(num_pages, dtype=">u8")
        """xxh3-64 of each sealed page, big-endian: `tobytes()` gives xxhash's canonical digests."""
        self.sealed: npt.NDArray[np.bool_] = np.zeros(num_pages, dtype=bool)
        """Which pages hold their writer's digest (allocating a page unseals it)."""
        self._free: list[int] = list(range(num_pages - 1, -1, -1))

    @property
    def free_pages(self) -> int:
        """How many pages are not allocated."""
        return len(self._free)

    def rows(self, first: int, count: int) -> memoryview:
        """Pages `first .. first+count-1` as one flat byte view (a slice, no copy): what goes on the wire."""
        return self._bytes[first * self.page_bytes : (first + count) * self.page_bytes]

    def check_pages(self, pages: PageIndices) -> PageIndices:
        """`pages`, once each is known to be a page of this pool (ConfigError naming the first that is not)."""
        outside = np.flatnonzero(pages >= self.num_pages)
        if len(outside):
            raise ConfigError(f"page {int(pages[outside[0]])} is outside a pool of {self.num_pages} pages")
        return pages

    def layer_view(self) -> npt.NDArray[np.uint8]:
        """The pool as (pages, layers, bytes per layer), a view without copy."""
        return self.data.reshape(self.num_pages, self.layers, self.page_bytes // self.layers)

    def allocate(self, count: int) -> PageIndices:
        """Take `count` free pages (consecutive where the free list allows)."""
        if count > len(self._free):
            raise PoolExhausted(f"{count} pages requested, {len(self._free)} free of {self.num_pages}")
        taken = np.asarray([self._free.pop() for _ in range(count)], dtype=np.uint32)
        self.sealed[taken] = False
        return taken

    def release(self, pages: Sequence[int] | PageIndices) -> None:
        """Give pages back to the free list."""
        self._free.extend(int(p) for p in reversed(list(pages)))

    def digest(self, pages: PageIndices, offset: int = 0, nbytes: int | None = None) -> int:
        """xxh3-64 of bytes `[offset, offset+nbytes)` of each page, in page order."""
        width = self.page_bytes - offset if nbytes is None else nbytes
        hasher = xxhash.xxh3_64()
        for page in pages:
            hasher.update(self.data[int(page), offset : offset + width].data)
        return hasher.intdigest()

    def seal(self, pages: PageIndices) -> None:
        """The writer finished `pages`: record each one's digest (what the transfer carries and the landing
        side verifies). A page written again after this must be sealed again, or it fails where it lands."""
        for page in pages.tolist():
            self.digests[page] = xxh3_64_intdigest(self._bytes[page * self.page_bytes : (page + 1) * self.page_bytes])
        self.sealed[pages] = True

    def sealed_digests(self, pages: PageIndices) -> bytes | None:
        """The canonical digests of `pages` in order, 8 bytes each; None unless every one is sealed."""
        if not self.sealed[pages].all():
            return None
        return self.digests[pages].tobytes()

    def fill_pattern(self, pages: PageIndices, seed: int) -> None:
        """Write a deterministic, room-specific pattern into `pages` and seal each one as it is written (a
        stand-in forward pass)."""
        rng = np.random.default_rng(seed & 0xFFFFFFFFFFFFFFFF)
        row = rng.integers(0, 256, size=self.page_bytes, dtype=np.uint8)
        for i, page in enumerate(pages.tolist()):
            self.data[page] = np.roll(row, i)
            self.digests[page] = xxh3_64_intdigest(self.data[page])
        self.sealed[pages] = True


def run_breaks(*page_lists: PageIndices) -> list[int]:
    """Positions where any of the page lists stops advancing by one page (sorted)."""
    breaks = np.zeros(max(0, len(page_lists[0]) - 1), dtype=bool)
    for pages in page_lists:
        breaks |= np.diff(pages.astype(np.int64)) != 1
    return [int(i) + 1 for i in np.flatnonzero(breaks)]


def is_one_run(breaks: list[int], start: int, count: int) -> bool:
    """True when positions `[start, start+count)` hold consecutive pages (no break inside)."""
    return bisect.bisect_right(breaks, start) == bisect.bisect_left(breaks, start + count)


def split_runs(breaks: list[int], start: int, count: int) -> list[int]:
    """Lengths of the consecutive runs that cover positions `[start, start+count)`."""
    end = start + count
    inner = breaks[bisect.bisect_right(breaks, start) : bisect.bisect_left(breaks, end)]
    edges = [start, *inner, end]
    return [b - a for a, b in itertools.pairwise(edges)]


def land_digested(frame: memoryview, target: memoryview, page_bytes: int) -> bytes:
    """Copy `frame` into `target` (as long, whole pages) a block at a time, hashing each page of the block just
    copied: the xxh3-64 digests of the landed pages in order, 8 bytes each (`KVPool.sealed_digests`' form)."""
    step = max(1, LAND_BLOCK_BYTES // page_bytes) * page_bytes
    digests = []
    for start in range(0, len(target), step):
        end = min(start + step, len(target))
        target[start:end] = frame[start:end]
        digests += [xxh3_64_digest(target[page : page + page_bytes]) for page in range(start, end, page_bytes)]
    return b"".join(digests)
