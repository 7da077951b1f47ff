"""xla-gpu-ops: CUDA kernels as XLA custom calls, one per op of the table (`xla_gpu_ops.ops`).

`import xla_gpu_ops` needs no framework. With torch installed it registers torch.ops.xla_gpu.* and
exposes one public function per op (`xla_gpu_ops.paged_attention`, ...); `xla_gpu_ops.jax`, `xla_gpu_ops.torchax` and
`xla_gpu_ops.torch_xla` are imported on demand. The op table is `xla_gpu_ops.ops`.
"""

from __future__ import annotations

import importlib
import importlib.util

from xla_gpu_ops import ops
from xla_gpu_ops._platform import quiet_cuda_plugin_without_gpu

__version__ = "0.1.0"
__all__ = [op.name for op in ops.OPS]  # the public functions (xla_gpu_ops.torch_ops)

# The public modules (front ends, the op table, tools), imported on attribute access. Modules
# with a leading underscore are private: shared helpers and device kernels of the front ends.
_SUBMODULES = (
    "jax",
    "torchax",
    "torch_xla",
    "torch_ops",
    "hlo",
    "ops",
    "reference",
    "xla_cuda",
    "torch_xla_plugin",
    "sharding",
    "head_sharding",
    "torch_xla_sharding",
    "transformers",
)

# On a machine without a GPU, JAX's CUDA plugin (installed with jax[cuda]) fails to start and JAX
# logs an ERROR with a traceback before it falls back to its CPU: expected there, so not printed.
quiet_cuda_plugin_without_gpu()

if importlib.util.find_spec("torch") is not None:
    from xla_gpu_ops.torch_ops import PUBLIC

    globals().update(PUBLIC)


def __getattr__(name: str):
    if name in _SUBMODULES:
        return importlib.import_module(f"xla_gpu_ops.{name}")
    if name in __all__:
        raise ImportError(f"xla_gpu_ops.{name} needs torch: pip install torch")
    raise AttributeError(f"module 'xla_gpu_ops' has no attribute {name!r}")
