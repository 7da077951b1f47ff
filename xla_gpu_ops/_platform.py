"""Platform defaults for the command-line entry points (the CLI, the example)."""

from __future__ import annotations

import logging
import os
from pathlib import Path


def has_nvidia_gpu() -> bool:
    """An NVIDIA driver with at least one GPU (what /proc shows; no CUDA call needed)."""
    gpus = Path("/proc/driver/nvidia/gpus")
    return gpus.is_dir() and any(gpus.iterdir())


class _NoCudaPluginErrorWithoutGpu(logging.Filter):
    """JAX initialises every installed plugin, whatever JAX_PLATFORMS says; without a GPU its
    CUDA plugin fails cuInit and JAX logs that as an ERROR, then carries on with the CPU."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (
            record.getMessage().startswith("Jax plugin configuration error")
            and "cuda" in record.getMessage()
        )


def prefer_cpu_without_gpu() -> None:
    """Without an NVIDIA GPU: JAX on its CPU backend alone (JAX_PLATFORMS=cpu, unless the caller
    chose its platforms) and no ERROR line from its CUDA plugin. Call before JAX starts."""
    if has_nvidia_gpu():
        return
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    logging.getLogger("jax._src.xla_bridge").addFilter(_NoCudaPluginErrorWithoutGpu())
