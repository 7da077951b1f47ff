"""torch helpers shared by the torch modules (the torch op, its CUDA and XLA kernels): the
library's dtype names in torch, and the stand-in for an optional operand left out. Importing it
needs torch only."""

from __future__ import annotations

import torch

from xla_gpu_ops import ops


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def torch_dtype(name: str) -> torch.dtype:
    """The torch dtype of a name from the library's dtype list (it uses torch's names)."""
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise TypeError(f"the library's dtype {name!r} has no torch dtype of that name")
    return dtype


def absent_operand(device: torch.device | str) -> torch.Tensor:
    """The empty float32 [0] tensor that stands for an optional operand left out (None): the
    library reads it as absent, so every call of an op has the same operands."""
    return torch.empty(0, dtype=torch_dtype(ops.ABSENT_DTYPE), device=device)
