"""JAX front end: the library's ops as XLA custom calls (jax.ffi), one generic call per op
(`call`, from the binding in xla_gpu_ops._jax_ffi) and the public wrappers.

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

import functools
from collections.abc import Callable
from typing import Any

import jax

from xla_gpu_ops import ops

# The binding itself, shared with the torchax and sharding front ends (xla_gpu_ops._jax_ffi).
from xla_gpu_ops._jax_ffi import call, register

__all__ = ["call", "kv_cache_update", "paged_attention", "register", "simple_add"]


def wrapper(op: ops.Op) -> Callable[[Callable], Callable]:
    """Turns a hand-written declaration (signature + docstring) into the public JAX function: the
    signature is checked against the op table at import; calls bind their arguments through the
    table and run `call`."""

    def decorate(declared: Callable) -> Callable:
        ops.public_signature(op, extra=("abi",))(declared)

        @functools.wraps(declared)
        def forward(*args, abi: str = "ffi", **kwargs):
            operands, attrs = op.bind(args, kwargs)
            return call(op, operands, attrs, abi)

        return forward

    return decorate


@wrapper(ops.KV_CACHE_UPDATE)
def kv_cache_update(
    new_kv: Any,
    slot_mapping: Any,
    kv_cache: Any,
    *,
    k_scale: float | None = None,
    v_scale: float | None = None,
    abi: str = "ffi",
) -> jax.Array:
    """kv_cache with new K/V rows written (vLLM's reshape_and_cache_flash slots); see
    xla_gpu_ops.kv_cache_update. The result aliases kv_cache: under
    `jax.jit(..., donate_argnums=...)` donating kv_cache, XLA updates it in place, no copy.
    Slots >= P * page_size: skipped on the GPU, an error from the XLA:CPU handler."""


@wrapper(ops.SIMPLE_ADD)
def simple_add(a: Any, b: Any, *, abi: str = "ffi") -> jax.Array:
    """out = a + b (same shape and dtype; float32, float16 or bfloat16)."""


@wrapper(ops.PAGED_ATTENTION)
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
    k_scale: float | None = None,
    v_scale: float | None = None,
    sinks: Any = None,
    abi: str = "ffi",
) -> jax.Array:
    """Ragged paged attention (torch_xla `ragged_paged_attention` semantics, docs/DESIGN.md).

    query [T, Hq, D]; kv_cache [P, page_size, 2*Hkv, D] (K even, V odd combined heads);
    context_lens int32 [S]; block_tables int32 [S, pages_per_seq]; query_start_loc int32 [S + 1];
    num_seqs int32 [1]. Returns out [T, Hq, D] in query's dtype; rows past
    query_start_loc[num_seqs] are zero. scale, sliding_window, soft_cap, k_scale and v_scale are
    static Python numbers (None turns the window and the cap off, and makes a scale 1); an fp8
    kv_cache (float8_e4m3fn) needs a float16 or bfloat16 query on CUDA (any query on XLA:CPU).
    sinks: float32 [Hq] or None, one logit per query head that joins each row's softmax and adds
    no value (gpt-oss attention sinks).

    abi="ffi" (default) calls the typed FFI target (CUDA or XLA:CPU); abi="legacy" calls the
    api_version 2 target, which exists for CUDA only.
    """
