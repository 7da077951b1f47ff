"""The torch front end: the public functions (`xla_gpu_ops.paged_attention`, ...) of the torch ops
torch.ops.xla_gpu.*, which work on every device the ops have a kernel for; one per op of the table,
with its signature and docstring made from the table (ops.public_function).

The torch ops themselves (schema, per-device kernels, fake kernel) are defined by
xla_gpu_ops._torch_library, which this module imports. Importing this module needs torch only.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import torch

from xla_gpu_ops import ops
from xla_gpu_ops._torch import dtype_name
from xla_gpu_ops._torch_library import check_values

VALIDATE_ENV = "XLA_GPU_OPS_VALIDATE"
# What the public wrappers do when `validate` is None: XLA_GPU_OPS_VALIDATE=1 (read at import)
# makes them check metadata values by default.
VALIDATE_DEFAULT = os.environ.get(VALIDATE_ENV, "") not in ("", "0")


EXTRAS = (
    ops.Extra(
        "validate",
        None,
        "True also checks metadata values on the host (one device-to-host copy for CUDA "
        f"tensors); None: {VALIDATE_ENV}=1 at import turns it on. Skipped under torch.compile "
        "and on XLA devices; without it the CUDA kernels guard bad values (never an "
        "out-of-bounds access)",
    ),
)
NOTE = (
    "Runs torch.ops.xla_gpu.<op> on its operands' device: the CPU reference, the CUDA kernel on "
    "the current stream (no sync), an XLA custom call. Static checks (shapes, dtypes, "
    "attributes) always run and never sync; errors name the argument."
)


def _forward(op: ops.Op) -> Callable[..., Any]:
    """What the public function of `op` runs: validation if asked for, then the torch op."""
    overload = getattr(getattr(torch.ops, ops.NAMESPACE), op.name).default

    def forward(operands: list, attrs: dict, validate: bool | None = None):
        for i, operand in op.converted:  # what clients hand over (ops.Operand.converts)
            value = operands[i]
            if isinstance(value, torch.Tensor):
                if dtype_name(value.dtype) in operand.converts:
                    operands[i] = value.to(getattr(torch, operand.cast_to))
            elif operand.host_ok and isinstance(value, int) and not isinstance(value, bool):
                operands[i] = torch.tensor([value], dtype=getattr(torch, operand.cast_to))
        for name, value in attrs.items():  # the dispatcher would .item() a tensor: a sync
            if isinstance(value, torch.Tensor):
                raise TypeError(f"{op.name}: {name}: must be a static Python number, got a tensor")
        # Reading values would sync a GPU, or break a graph under torch.compile / on XLA.
        if (
            (VALIDATE_DEFAULT if validate is None else validate)
            and not torch.compiler.is_compiling()
            and all(isinstance(t, torch.Tensor) for t in operands[: op.num_required])
            and operands[0].device.type in ("cpu", "cuda")
        ):
            check_values(op, operands, attrs)
        try:
            return overload(*op.schema_args(operands, attrs))
        except RuntimeError:
            # The dispatcher's schema check ("Expected a value of type 'Tensor' for argument
            # 'query' ..."): the same as a TypeError / ValueError naming the argument, without
            # the dump. Only on this error path, so a good call pays nothing for it.
            for i, value in enumerate(operands):
                if not isinstance(value, torch.Tensor) and (
                    i < op.num_required or value is not None
                ):
                    raise TypeError(
                        f"{op.name}: {op.operands[i].name}: expected a torch.Tensor, "
                        f"got {type(value).__name__}"
                    ) from None
            op.encode_attrs(attrs)  # raises, naming the attribute, if one is out of range
            raise

    return forward


# The public functions, one per op of the table: xla_gpu_ops.<op> (re-exported by the package).
PUBLIC: dict[str, Callable[..., Any]] = {
    op.name: ops.public_function(op, _forward(op), EXTRAS, __name__, NOTE) for op in ops.OPS
}
globals().update(PUBLIC)
__all__ = list(PUBLIC)
