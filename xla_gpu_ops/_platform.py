"""Platform defaults: JAX's CUDA plugin kept quiet where there is no GPU (on `import xla_gpu_ops`),
and JAX on its CPU backend there (the command-line entry points: the CLI, the example)."""

from __future__ import annotations

import logging
import os
from pathlib import Path

_JAX_PLUGIN_LOGGER = "jax._src.xla_bridge"


def has_nvidia_gpu() -> bool:
    """An NVIDIA driver with at least one GPU (what /proc shows; no CUDA call needed)."""
    gpus = Path("/proc/driver/nvidia/gpus")
    return gpus.is_dir() and any(gpus.iterdir())


class _NoCudaPluginErrorWithoutGpu(logging.Filter):
    """JAX initialises every installed plugin, whatever JAX_PLATFORMS says; without a GPU its
    CUDA plugin fails cuInit and JAX logs that as an ERROR with a traceback, then carries on with
    the CPU. Drops that record alone: any other record, the same words for a plugin that is not
    CUDA's included, passes."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not (
            message.startswith("Jax plugin configuration error: Exception when calling")
            and "jax_plugins.xla_cuda" in message
        )


def quiet_cuda_plugin_without_gpu() -> None:
    """Without an NVIDIA GPU: no ERROR and traceback from JAX's CUDA plugin when JAX starts. With
    one, nothing changes (a failing plugin there is a real error). Idempotent; JAX need not be
    imported yet (the filter sits on its logger by name)."""
    if has_nvidia_gpu():
        return
    logger = logging.getLogger(_JAX_PLUGIN_LOGGER)
    if not any(isinstance(f, _NoCudaPluginErrorWithoutGpu) for f in logger.filters):
        logger.addFilter(_NoCudaPluginErrorWithoutGpu())


def prefer_cpu_without_gpu() -> None:
    """Without an NVIDIA GPU: JAX on its CPU backend alone (JAX_PLATFORMS=cpu, unless the caller
    chose its platforms) and no ERROR line from its CUDA plugin. Call before JAX starts."""
    if has_nvidia_gpu():
        return
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    quiet_cuda_plugin_without_gpu()
