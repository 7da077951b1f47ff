"""Benchmarks of xla_gpu_ops against its peers: `python -m benchmarks` (benchmarks/README.md)."""
