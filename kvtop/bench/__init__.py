"""Benchmarks behind `kvtop bench ...`: each compares against a baseline measured in the same run."""


class BenchFailed(RuntimeError):
    """What a benchmark measures did not happen (no events applied, no frame drawn, rooms failed, a check
    that gave no verdict): its figures would mean nothing, so `kvtop bench` exits 1 with this message."""
