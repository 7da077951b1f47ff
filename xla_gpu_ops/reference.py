"""Pure-PyTorch reference implementations: the CPU implementation of the torch ops and the test oracle.

Semantics of paged_attention are torch_xla's `ragged_paged_attention` (docs/DESIGN.md).
"""

from __future__ import annotations

import torch


def simple_add(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return a + b


def paged_attention(
    query: torch.Tensor,
    kv_cache: torch.Tensor,
    context_lens: torch.Tensor,
    block_tables: torch.Tensor,
    query_start_loc: torch.Tensor,
    num_seqs: torch.Tensor,
    scale: float,
    sliding_window: int | None = None,
    soft_cap: float | None = None,
    *,
    compute_dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """out[T, Hq, D]; softmax and products in `compute_dtype` (float64 for a tight oracle).

    Rows at or past query_start_loc[num_seqs] are zero. Metadata must already be valid
    (see xla_gpu_ops._validation.check_paged_attention_metadata).
    """
    _, num_q_heads, head_dim = query.shape
    page_size = kv_cache.shape[1]
    num_kv_heads = kv_cache.shape[2] // 2
    group = num_q_heads // num_kv_heads
    out = torch.zeros(query.shape, dtype=compute_dtype, device=query.device)
    starts = query_start_loc.tolist()
    kv_lens = context_lens.tolist()
    for i in range(int(num_seqs[0])):
        q_start, q_end, kv_len = starts[i], starts[i + 1], kv_lens[i]
        q_len = q_end - q_start
        if q_len == 0:
            continue
        num_used_pages = -(-kv_len // page_size)
        pages = block_tables[i, :num_used_pages].long()
        kv = kv_cache[pages].reshape(-1, 2 * num_kv_heads, head_dim)[:kv_len].to(compute_dtype)
        k = kv[:, 0::2].repeat_interleave(group, dim=1)  # [kv_len, Hq, D]
        v = kv[:, 1::2].repeat_interleave(group, dim=1)
        q = query[q_start:q_end].to(compute_dtype)
        logits = torch.einsum("qhd,khd->hqk", q, k) * scale
        if soft_cap is not None:
            logits = soft_cap * torch.tanh(logits / soft_cap)
        q_pos = torch.arange(kv_len - q_len, kv_len, device=query.device)[:, None]
        k_pos = torch.arange(kv_len, device=query.device)[None, :]
        masked = k_pos > q_pos
        if sliding_window is not None:
            masked |= k_pos <= q_pos - sliding_window
        logits = logits.masked_fill(masked, float("-inf"))
        out[q_start:q_end] = torch.einsum("hqk,khd->qhd", torch.softmax(logits, dim=-1), v)
    return out.to(query.dtype)
