"""JAX front end: `simple_add` and `paged_attention` as XLA custom calls (jax.ffi).

The typed FFI target of each op (`op.ffi_target`) is registered for platform "CUDA" (the CUDA
handler) and "cpu" (the host handler, XLA:CPU); the legacy target (`op.legacy_target`, CUDA only)
is registered with api_version 0 and called with custom_call_api_version=2. Registration happens
once, on first use. Every function is jit-able; under vmap the custom call runs once per batch
element (`vmap_method="sequential"`), except the elementwise simple_add, which is batched whole.

Static input checks (shapes, dtypes, attributes) run at trace time and raise TypeError /
ValueError naming the argument. Metadata values are checked by the host handler (XLA:CPU raises
with the handler's message); the CUDA kernel guards them with NaN rows (docs/DESIGN.md).
"""

from __future__ import annotations

import numbers
import threading
from typing import Any

import jax
import numpy as np

from xla_gpu_ops import _library, _validation
from xla_gpu_ops._registry import OPS, PAGED_ATTENTION, SIMPLE_ADD

__all__ = ["paged_attention", "register", "simple_add"]

ABIS = ("ffi", "legacy")
_PAGED_ATTENTION_OPERANDS = (
    "query",
    "kv_cache",
    "context_lens",
    "block_tables",
    "query_start_loc",
    "num_seqs",
)

_register_lock = threading.Lock()
_registered = False


def register() -> None:
    """Register every op's XLA targets with JAX (idempotent; called by the ops themselves)."""
    global _registered
    with _register_lock:
        if _registered:
            return
        for op in OPS:
            jax.ffi.register_ffi_target(
                op.ffi_target, _library.ffi_capsule(op, "cuda_ffi"), platform="CUDA"
            )
            jax.ffi.register_ffi_target(
                op.ffi_target, _library.ffi_capsule(op, "host_ffi"), platform="cpu"
            )
            # api_version=0: the untyped "custom call" registry that api_version 2 calls use.
            jax.ffi.register_ffi_target(
                op.legacy_target,
                _library.ffi_capsule(op, "cuda_legacy"),
                platform="CUDA",
                api_version=0,
            )
        _registered = True


def _dtype_name(x: Any) -> str:
    # Read the dtype before any conversion: jnp.asarray would silently turn int64 metadata into
    # int32 (without x64) and hide a caller's mistake.
    dtype = getattr(x, "dtype", None)
    if dtype is None:
        dtype = np.asarray(x).dtype
    return np.dtype(dtype).name


def _shape(x: Any) -> tuple[int, ...]:
    return tuple(int(d) for d in np.shape(x))


def simple_add(a: Any, b: Any) -> jax.Array:
    """out = a + b (same shape and dtype; float32, float16 or bfloat16)."""
    _validation.check_simple_add(_shape(a), _dtype_name(a), _shape(b), _dtype_name(b))
    register()
    a, b = jax.numpy.asarray(a), jax.numpy.asarray(b)
    call = jax.ffi.ffi_call(
        SIMPLE_ADD.ffi_target,
        jax.ShapeDtypeStruct(a.shape, a.dtype),
        # Elementwise on any shape: batching both operands along the vmapped axis is exact.
        vmap_method="broadcast_all",
    )
    return call(a, b)


def _static_float(name: str, value: Any) -> float:
    try:
        return float(value)
    except (TypeError, jax.errors.ConcretizationTypeError) as error:
        raise TypeError(
            f"paged_attention: {name}: must be a static Python number, got {value!r} "
            "(under jax.jit pass it through static_argnames or functools.partial)"
        ) from error


def _static_int_or_none(name: str, value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        return int(value)
    raise TypeError(f"paged_attention: {name}: must be a static int or None, got {value!r}")


def paged_attention_config(
    operands: dict[str, Any],
    scale: float,
    sliding_window: int | None,
    soft_cap: float | None,
) -> _library.PagedAttentionConfig:
    """Validate the static inputs (raising TypeError/ValueError naming the argument) and build
    the config struct of the C ABI; also the legacy opaque."""
    shapes = {name: _shape(value) for name, value in operands.items()}
    dtypes = {name: _dtype_name(value) for name, value in operands.items()}
    dims = _validation.check_paged_attention_static(shapes, dtypes, scale, sliding_window, soft_cap)
    return _library.paged_attention_config(dims, dtypes["query"], scale, sliding_window, soft_cap)


def paged_attention(
    query: Any,
    kv_cache: Any,
    context_lens: Any,
    block_tables: Any,
    query_start_loc: Any,
    num_seqs: Any,
    *,
    scale: float,
    sliding_window: int | None = None,
    soft_cap: float | None = None,
    abi: str = "ffi",
) -> jax.Array:
    """Ragged paged attention (torch_xla `ragged_paged_attention` semantics, docs/DESIGN.md).

    query [T, Hq, D]; kv_cache [P, page_size, 2*Hkv, D] (K even, V odd combined heads);
    context_lens int32 [S]; block_tables int32 [S, pages_per_seq]; query_start_loc int32 [S + 1];
    num_seqs int32 [1]. Returns out [T, Hq, D] in query's dtype; rows past
    query_start_loc[num_seqs] are zero.

    abi="ffi" (default) calls the typed FFI target (CUDA or XLA:CPU); abi="legacy" calls the
    api_version 2 target, which exists for CUDA only.
    """
    if abi not in ABIS:
        raise ValueError(f"paged_attention: abi: must be one of {ABIS}, got {abi!r}")
    scale = _static_float("scale", scale)
    sliding_window = _static_int_or_none("sliding_window", sliding_window)
    if soft_cap is not None:
        soft_cap = _static_float("soft_cap", soft_cap)
    values = (query, kv_cache, context_lens, block_tables, query_start_loc, num_seqs)
    operands = dict(zip(_PAGED_ATTENTION_OPERANDS, values, strict=True))
    config = paged_attention_config(operands, scale, sliding_window, soft_cap)
    workspace_elems = _library.paged_attention_workspace_elems(config)
    register()
    arrays = [jax.numpy.asarray(v) for v in values]
    result_types = (
        jax.ShapeDtypeStruct(arrays[0].shape, arrays[0].dtype),
        # Scratch space of the CUDA kernel as an extra output: the handler never allocates.
        jax.ShapeDtypeStruct((workspace_elems,), np.float32),
    )
    if abi == "ffi":
        call = jax.ffi.ffi_call(
            PAGED_ATTENTION.ffi_target,
            result_types,
            # The metadata describes one ragged batch; a vmapped axis is a batch of such calls.
            vmap_method="sequential",
        )
        out, _ = call(
            *arrays,
            scale=np.float32(scale),
            sliding_window=np.int64(config.sliding_window),
            soft_cap=np.float32(config.soft_cap),
        )
        return out
    if jax.default_backend() != "gpu":
        raise RuntimeError(
            "paged_attention: abi: 'legacy' is a CUDA-only custom call and JAX's default backend "
            f"is {jax.default_backend()!r}; use abi='ffi' (it has an XLA:CPU handler)"
        )
    call = jax.ffi.ffi_call(
        PAGED_ATTENTION.legacy_target,
        result_types,
        vmap_method="sequential",
        custom_call_api_version=2,
        # The opaque is the C config struct itself (c_api.h); the handler checks its size,
        # magic and version.
        legacy_backend_config=bytes(config),
    )
    out, _ = call(*arrays)
    return out
