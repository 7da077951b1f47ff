"""torch_xla's `ragged_paged_attention` (torch_xla.experimental.custom_kernel, 2.9) on our kernels:
the same parameters and defaults; see xla_gpu_ops.compat. Works on CUDA, CPU and XLA tensors, as
xla_gpu_ops.paged_attention does. use_kernel is ignored: both of upstream's paths compute the same
attention, and ours always runs the library's (its CPU reference on CPU tensors)."""

from __future__ import annotations

from typing import Any

from xla_gpu_ops import torch_ops
from xla_gpu_ops.compat import check_mask_value


def ragged_paged_attention(
    q: Any,
    kv_pages: Any,
    kv_lens: Any,
    page_indices: Any,
    cu_q_lens: Any,
    num_seqs: Any,
    *,
    sm_scale=1.0,
    sliding_window: int | None = None,
    soft_cap: float | None = None,
    mask_value=None,
    k_scale: float | None = None,
    v_scale: float | None = None,
    use_kernel=True,
    num_kv_pages_per_block=None,
    num_queries_per_block=None,
    vmem_limit_bytes=None,
) -> Any:
    """out [T, Hq, D] of q [T, Hq, D] over kv_pages [P, page_size, 2*Hkv, D] (K even, V odd heads),
    kv_lens int32 [S], page_indices int32 [S, pages_per_seq], cu_q_lens int32 [S + 1], num_seqs
    int32 [1]: torch_xla's ragged_paged_attention, run by xla_gpu_ops.paged_attention."""
    del use_kernel, num_kv_pages_per_block, num_queries_per_block, vmem_limit_bytes  # see above
    check_mask_value(mask_value)
    return torch_ops.PUBLIC["paged_attention"](
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
