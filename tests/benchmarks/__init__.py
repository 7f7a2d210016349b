"""Benchmarks: run by hand (`python -m tests.benchmarks.latency --help`), not by pytest."""
