"""Measurement core shared by asv (benchmarks/), pytest-benchmark (tests/perf) and the CLI."""
