"""The JAX binding of the op table: each op as one XLA custom call through jax.ffi. Private:
shared by the front ends that emit JAX custom calls (xla_gpu_ops.jax, xla_gpu_ops.torchax,
xla_gpu_ops.sharding); xla_gpu_ops.jax re-exports `call` and `register`.

The typed FFI target of each op (`op.ffi_target`) is registered for platform "CUDA" (the CUDA
handler) and "cpu" (the host handler, XLA:CPU); the legacy target (`op.legacy_target`, CUDA only)
is registered with api_version 0 and called with custom_call_api_version=2. Registration happens
once, on first use, from the library's op table. Under vmap the custom call runs once per batch
element (`vmap_method="sequential"`), except elementwise ops, which are batched whole.

Static checks (shapes, dtypes, attributes) run at trace time in the library and raise TypeError /
ValueError naming the argument. Metadata values are checked by the host handler (XLA:CPU raises
with the handler's message); the CUDA kernels guard them with NaN rows (docs/DESIGN.md).
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from xla_gpu_ops import _library, ops

ABIS = ("ffi", "legacy")

_register_lock = threading.Lock()
_registered = False


def register() -> None:
    """Register every op's XLA targets with JAX (idempotent; called by the ops themselves)."""
    global _registered
    with _register_lock:
        if _registered:
            return
        library = _library.load()
        for op in ops.OPS:
            entry = library.op(op)
            jax.ffi.register_ffi_target(op.ffi_target, entry.capsule("cuda_ffi"), platform="CUDA")
            jax.ffi.register_ffi_target(op.ffi_target, entry.capsule("host_ffi"), platform="cpu")
            # api_version=0: the untyped "custom call" registry that api_version 2 calls use.
            jax.ffi.register_ffi_target(
                op.legacy_target, entry.capsule("cuda_legacy"), platform="CUDA", api_version=0
            )
        _registered = True


def _dtype_name(x: Any) -> str:
    # Read the dtype before any conversion: jnp.asarray would silently turn an int64 operand into
    # int32 (without x64) and hide a caller's mistake (metadata's int64 is converted on purpose,
    # by `convert`, and documented).
    dtype = getattr(x, "dtype", None)
    if dtype is None:
        dtype = np.asarray(x).dtype
    return np.dtype(dtype).name


def present(operands: Sequence[Any]) -> list:
    """The operands with each optional one left out (None) as an empty float32 [0] array, which
    the library reads as absent: every custom call of an op has the same operands. The stand-in
    is made by jnp.zeros, so under a trace it is an operation of the program, never a constant:
    jax 0.11.2 hoists constants of a shard_map body into the map's operands, and an empty array
    there crashed XLA's GPU compiler on two GPUs."""
    return [jnp.zeros((0,), ops.ABSENT_DTYPE) if x is None else x for x in operands]


def convert(op: ops.Op, operands: list) -> list:
    """What clients hand over, as the library reads it (ops.Operand.converts): int64 metadata as
    int32, float16/bfloat16 sinks as float32, a Python int num_seqs as int32 [1]."""
    for i, operand in op.converted:
        value = operands[i]
        if operand.host_ok and isinstance(value, int) and not isinstance(value, bool):
            operands[i] = np.array([value], dtype=operand.cast_to)
        elif value is not None and _dtype_name(value) in operand.converts:
            has_astype = hasattr(value, "astype")  # arrays and tracers; else a list or a scalar
            operands[i] = (
                value.astype(operand.cast_to)
                if has_astype
                else np.asarray(value, dtype=operand.cast_to)
            )
    return operands


def call(op: ops.Op, operands: Sequence[Any], attrs: Mapping[str, Any], abi: str = "ffi"):
    """One custom call of `op` (operands in table order, attributes by name); returns the op's
    outputs (scratch results such as paged_attention's workspace are dropped). Results the op
    writes in place alias their operand (`input_output_aliases`): donate that operand
    (`jax.jit(..., donate_argnums=...)`) and XLA updates it without a copy."""
    if abi not in ABIS:
        raise ValueError(f"{op.name}: abi: must be one of {ABIS}, got {abi!r}")
    operands = convert(op, op.complete(operands))
    # An in-place result whose optional operand is left out is not aliased: aliasing the
    # program-made stand-in would cost XLA a copy of it.
    aliases = {operand: result for result, operand in op.given_writes(operands)}
    operands = present(operands)
    shapes = [np.shape(x) for x in operands]
    # Checked with the caller's dtypes first: jnp.asarray would silently turn int64 into int32
    # (without x64) and hide a caller's mistake where an operand must be int32.
    xgo_call, results = _library.describe_call(
        op, shapes, [_dtype_name(x) for x in operands], attrs
    )
    register()
    arrays = [jnp.asarray(x) for x in operands]
    converted = [_dtype_name(a) for a in arrays]
    if converted != [_dtype_name(x) for x in operands]:  # e.g. int64 slots that may be int32
        xgo_call, results = _library.describe_call(op, shapes, converted, attrs)
    encoded = op.encode_attrs(attrs)
    # Scratch space of the CUDA kernels is an extra output: the handlers never allocate.
    result_types = [jax.ShapeDtypeStruct(r.shape, jnp.dtype(r.dtype)) for r in results]
    if abi == "ffi":
        typed = {
            a.name: np.float32(v) if a.kind is float else np.int64(v)
            for a, v in zip(op.attrs, encoded, strict=True)
        }
        outs = jax.ffi.ffi_call(
            op.ffi_target, result_types, vmap_method=op.vmap_method, input_output_aliases=aliases
        )(*arrays, **typed)
    else:
        if jax.default_backend() != "gpu":
            raise RuntimeError(
                f"{op.name}: abi: 'legacy' is a CUDA-only custom call and JAX's default backend "
                f"is {jax.default_backend()!r}; use abi='ffi' (it has an XLA:CPU handler)"
            )
        outs = jax.ffi.ffi_call(
            op.legacy_target,
            result_types,
            vmap_method=op.vmap_method,
            input_output_aliases=aliases,
            custom_call_api_version=2,
            # The opaque is the XgoCall itself; the handler checks its magic, version and op.
            legacy_backend_config=bytes(xgo_call),
        )(*arrays)
    return outs[0] if op.returned == 1 else tuple(outs[: op.returned])
