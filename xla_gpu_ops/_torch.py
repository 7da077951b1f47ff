"""torch helpers shared by the torch modules (the torch op, its CUDA and XLA kernels): the
library's dtype names in torch. Importing it needs torch only."""

from __future__ import annotations

import torch


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def torch_dtype(name: str) -> torch.dtype:
    """The torch dtype of a name from the library's dtype list (it uses torch's names)."""
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise TypeError(f"the library's dtype {name!r} has no torch dtype of that name")
    return dtype
