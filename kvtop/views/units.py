"""Byte counts and rates for people, one formatter for the CLI views and the dashboard (JSON keeps base units)."""

from __future__ import annotations


def size(nbytes: float) -> str:
    """Bytes in the decimal unit that keeps three digits: `1.23 GB`, `45.6 MB`, `512 KB`, `900 B`.

    A figure that would round to 1000 of a unit is shown as 1 of the next one (`1.00 GB`, not `1000.0 MB`)."""
    if round(nbytes / 1e6, 1) >= 1000:
        return f"{nbytes / 1e9:.2f} GB"
    if round(nbytes / 1e3) >= 1000:
        return f"{nbytes / 1e6:.1f} MB"
    if round(nbytes) >= 1000:
        return f"{nbytes / 1e3:.0f} KB"
    return f"{nbytes:.0f} B"


def progress(done: int, total: int) -> str:
    """Bytes moved of a total as `size` says (`1.0 MB/1.0 MB`), exact where the two differ but read the same
    (`1.0 MB/1.0 MB (1,048,000/1,048,576 B)`: a room a few bytes short looked whole)."""
    shown = f"{size(done)}/{size(total)}"
    if done != total and size(done) == size(total):
        shown += f" ({done:,}/{total:,} B)"
    return shown


def rate(bytes_per_s: float) -> str:
    """A transfer rate as `size` says, per second: `1.23 GB/s`, `45.6 MB/s`, `512 KB/s`, `0 B/s`."""
    return f"{size(bytes_per_s)}/s"


def gbps(value: float) -> str:
    """A rate the model gives in GB/s (`ClusterModel.rates`, `RankView.gbps`), as `rate` says."""
    return rate(value * 1e9)
