"""JAX front end: the library's ops as XLA custom calls (jax.ffi), one generic call per op
(`call`, from the binding in xla_gpu_ops._jax_ffi) and the public functions, one per op of the
table, made from it (ops.public_function).

The typed FFI target of each op (`op.ffi_target`) is registered for platform "CUDA" (the CUDA
handler) and "cpu" (the host handler, XLA:CPU); the legacy target (`op.legacy_target`, CUDA only)
is registered with api_version 0 and called with custom_call_api_version=2. Registration happens
once, on first use, from the library's op table. Every function is jit-able; under vmap the custom
call runs once per batch element (`vmap_method="sequential"`), except elementwise ops, which are
batched whole.

Static checks (shapes, dtypes, attributes) run at trace time in the library and raise TypeError /
ValueError naming the argument. Metadata values are checked by the host handler (XLA:CPU raises
with the handler's message); the CUDA kernels guard them with NaN rows (docs/DESIGN.md).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from xla_gpu_ops import ops

# The binding itself, shared with the torchax and sharding front ends (xla_gpu_ops._jax_ffi).
from xla_gpu_ops._jax_ffi import call, register

EXTRAS = (
    ops.Extra(
        "abi",
        "ffi",
        '"ffi" calls the typed FFI target (CUDA or XLA:CPU); "legacy" the api_version 2 target, '
        "which exists for CUDA only",
    ),
)
NOTE = (
    "Attributes are static Python numbers (under jax.jit: static_argnames or functools.partial). "
    "Static checks run at trace time and raise TypeError / ValueError naming the argument. A "
    "result written in place aliases its operand: donate the operand to update it without a copy."
)


def _forward(op: ops.Op) -> Callable[..., Any]:
    if not any(op.operands[i].optional for i in op.aliases.values()):
        return lambda operands, attrs, abi="ffi": call(op, operands, attrs, abi)

    def forward(operands: list, attrs: dict, abi: str = "ffi") -> Any:
        # the results written into an optional operand left out are not returned
        outs = call(op, operands, attrs, abi)
        given = op.given_returns(op.complete(operands))
        return outs[given[0]] if len(given) == 1 else tuple(outs[i] for i in given)

    return forward


# The public functions, one per op of the table: xla_gpu_ops.jax.<op>.
PUBLIC: dict[str, Callable[..., Any]] = {
    op.name: ops.public_function(op, _forward(op), EXTRAS, __name__, NOTE) for op in ops.OPS
}
globals().update(PUBLIC)
__all__ = ["call", "register", *PUBLIC]
