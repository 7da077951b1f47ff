"""JAX's `ragged_paged_attention` (jax.experimental.pallas.ops.tpu.ragged_paged_attention) on our
kernels: the same parameters and defaults; see xla_gpu_ops.compat. jit-able: the keyword arguments
are static (pass them through functools.partial or static_argnames), as upstream's are."""

from __future__ import annotations

from typing import Any

from xla_gpu_ops import jax as xjax
from xla_gpu_ops.compat import check_mask_value

DEFAULT_MASK_VALUE = -0.7 * 3.4028234663852886e38  # upstream's: -0.7 * float32 max


def ragged_paged_attention(
    q: Any,
    kv_pages: Any,
    kv_lens: Any,
    page_indices: Any,
    cu_q_lens: Any,
    num_seqs: Any,
    *,
    sm_scale: float = 1.0,
    sliding_window: int | None = None,
    soft_cap: float | None = None,
    mask_value: float | None = DEFAULT_MASK_VALUE,
    k_scale: float | None = None,
    v_scale: float | None = None,
    num_kv_pages_per_block: int | None = None,
    num_queries_per_block: int | None = None,
    vmem_limit_bytes: int | None = None,
) -> Any:
    """out [T, Hq, D] (query's dtype) of JAX's ragged_paged_attention, run as the library's
    custom call (xla_gpu_ops.jax.paged_attention: CUDA or XLA:CPU)."""
    del num_kv_pages_per_block, num_queries_per_block, vmem_limit_bytes  # see xla_gpu_ops.compat
    check_mask_value(mask_value)
    return xjax.PUBLIC["paged_attention"](
        q,
        kv_pages,
        kv_lens,
        page_indices,
        cu_q_lens,
        num_seqs,
        scale=sm_scale,
        sliding_window=sliding_window,
        soft_cap=soft_cap,
        k_scale=k_scale,
        v_scale=v_scale,
    )
