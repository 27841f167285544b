"""Benchmark scripts (results in docs/benchmarks.md)."""
