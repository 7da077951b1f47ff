"""Benchmark harness: python -m benchmarks.run (see benchmarks/run.py)."""
