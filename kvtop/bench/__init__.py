"""Benchmarks behind `kvtop bench ...`: each compares against a baseline measured in the same run."""
