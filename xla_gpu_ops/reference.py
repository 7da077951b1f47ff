"""Pure-PyTorch reference implementations: the CPU implementation of the torch ops and the test oracle.

Semantics of paged_attention are torch_xla's `ragged_paged_attention` (docs/DESIGN.md).
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable

import torch

from xla_gpu_ops import ops


def of(op) -> Callable:
    """The reference of an op of the table (xla_gpu_ops.ops.Op): the function of this module named
    after it, which takes the required operands positionally, then the attributes and optional
    operands by keyword, and returns the op's outputs (an op writing in place updates its operand
    and returns None), its on_request ones included (the function's `return_<name>=True`)."""
    function = getattr(sys.modules[__name__], op.name, None)
    if function is not None and op.on_request:
        function = functools.partial(function, **{f"return_{n}": True for n in op.on_request})
    if function is None:
        raise NotImplementedError(
            f"{op.name}: no reference: write `def {op.name}({', '.join(op.call_names)})` in "
            "xla_gpu_ops/reference.py, in plain torch ops: it is the CPU kernel of the torch op, "
            "the tests' oracle and, unless torch_xla.COMPOSITES names another, the composite"
        )
    return function


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
    k_scale: float | None = None,
    v_scale: float | None = None,
    kv_layout: str = "NHD",
    *,
    sinks: torch.Tensor | None = None,
    k_scales: torch.Tensor | None = None,
    v_scales: torch.Tensor | None = None,
    value_cache: torch.Tensor | None = None,
    compute_dtype: torch.dtype = torch.float32,
    return_lse: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """out [T, Hq, D], or with return_lse (out, lse [T, Hq] float32); softmax and products in
    `compute_dtype` (float64 for a tight oracle). lse is the log-sum-exp of each row's logits, its
    sink included, natural log; -inf on rows at or past query_start_loc[num_seqs].

    kv_cache may be float8_e4m3fn: it is dequantised exactly (fp8 -> compute_dtype), and the
    scales apply as logits * k_scale and out * v_scale; k_scales / v_scales [Hkv] or [1] (None or
    empty: none) multiply them per KV head. value_cache [P, page_size, Hkv, D] (None or empty:
    none): V apart, kv_cache then holding K alone; a kv_cache [P, 2, page_size, Hkv, D] holds K at
    [:, 0] and V at [:, 1]. kv_layout "HND": each cache is
    [P, heads, page_size, D] instead of [P, page_size, heads, D]. sinks [Hq] (None or empty: none): head h's
    sink is one more logit in each of its rows, after scale, soft cap and mask, that joins the
    softmax and is dropped after it (gpt-oss's attention sinks). Rows at or past
    query_start_loc[num_seqs] are zero. Metadata must already be valid (the library's
    check_host_values).
    """
    _, num_q_heads, head_dim = query.shape
    kv_cache, value_cache = cache_pair(kv_cache, value_cache)
    if kv_layout == "HND":  # read as NHD views: [P, page_size, heads, D]
        kv_cache = kv_cache.transpose(1, 2)
        if value_cache is not None:
            value_cache = value_cache.transpose(1, 2)
    page_size = kv_cache.shape[1]
    # value_cache None: K and V interleaved in kv_cache
    num_kv_heads = kv_cache.shape[2] if value_cache is not None else kv_cache.shape[2] // 2
    group = num_q_heads // num_kv_heads
    k_per_head = per_q_head(k_scales, k_scale, num_kv_heads, group, compute_dtype, query.device)
    v_per_head = per_q_head(v_scales, v_scale, num_kv_heads, group, compute_dtype, query.device)
    out = torch.zeros(query.shape, dtype=compute_dtype, device=query.device)
    lse = torch.full(query.shape[:2], -torch.inf, dtype=compute_dtype, device=query.device)
    starts = query_start_loc.tolist()
    kv_lens = context_lens.tolist()
    for i in range(int(num_seqs[0])):
        q_start, q_end, kv_len = starts[i], starts[i + 1], kv_lens[i]
        q_len = q_end - q_start
        if q_len == 0:
            continue
        num_used_pages = -(-kv_len // page_size)
        pages = block_tables[i, :num_used_pages].long()
        if value_cache is not None:
            k = _gather(kv_cache, pages).reshape(-1, num_kv_heads, head_dim)[:kv_len]
            v = _gather(value_cache, pages).reshape(-1, num_kv_heads, head_dim)[:kv_len]
        else:
            kv = _gather(kv_cache, pages).reshape(-1, 2 * num_kv_heads, head_dim)[:kv_len]
            k, v = kv[:, 0::2], kv[:, 1::2]
        k = k.to(compute_dtype).repeat_interleave(group, dim=1)  # [kv_len, Hq, D]
        v = v.to(compute_dtype).repeat_interleave(group, dim=1)
        q = query[q_start:q_end].to(compute_dtype)
        logits = torch.einsum("qhd,khd->hqk", q, k) * scale * k_per_head[:, None, None]
        if soft_cap is not None:
            logits = soft_cap * torch.tanh(logits / soft_cap)
        q_pos = torch.arange(kv_len - q_len, kv_len, device=query.device)[:, None]
        k_pos = torch.arange(kv_len, device=query.device)[None, :]
        masked = k_pos > q_pos
        if sliding_window is not None:
            masked |= k_pos <= q_pos - sliding_window
        logits = logits.masked_fill(masked, float("-inf"))
        if sinks is not None and sinks.numel():
            sink = sinks.to(compute_dtype)[:, None, None].expand(-1, q_len, 1)
            logits = torch.cat([logits, sink], dim=-1)
            probs = torch.softmax(logits, dim=-1)[..., :-1]
        else:
            probs = torch.softmax(logits, dim=-1)
        attended = torch.einsum("hqk,khd->qhd", probs, v)
        out[q_start:q_end] = attended * v_per_head[:, None]
        lse[q_start:q_end] = torch.logsumexp(logits, dim=-1).T
    return (out.to(query.dtype), lse.float()) if return_lse else out.to(query.dtype)


FP8_MAX = 448.0  # float8_e4m3fn's largest finite value


def per_kv_head(
    scales: torch.Tensor | None, scale: float | None, num_kv_heads: int, dtype, device
) -> torch.Tensor:
    """[Hkv]: the scale attribute (None: 1) times the scales tensor ([Hkv] or [1]; None or empty:
    1) of each KV head."""
    out = torch.full((num_kv_heads,), scale or 1.0, dtype=dtype, device=device)
    if scales is not None and scales.numel():
        out = out * scales.to(device=device, dtype=dtype).expand(num_kv_heads)
    return out


def per_q_head(scales, scale, num_kv_heads: int, group: int, dtype, device) -> torch.Tensor:
    """[Hq]: per_kv_head's scale of each query head's KV head."""
    return per_kv_head(scales, scale, num_kv_heads, dtype, device).repeat_interleave(group)


def _gather(tensor: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """tensor[index]; float8 through its bytes (torch's CPU indexing has no float8 kernels)."""
    if tensor.dtype == torch.float8_e4m3fn:
        return tensor.view(torch.uint8)[index].view(tensor.dtype)
    return tensor[index]


def kv_cache_update(
    new_kv: torch.Tensor,
    slot_mapping: torch.Tensor,
    kv_cache: torch.Tensor,
    k_scale: float | None = None,
    v_scale: float | None = None,
    kv_layout: str = "NHD",
    *,
    k_scales: torch.Tensor | None = None,
    v_scales: torch.Tensor | None = None,
    value_cache: torch.Tensor | None = None,
) -> None:
    """Writes row n of new_kv [N, 2*Hkv, D] to slot slot_mapping[n] of kv_cache, in place (page
    slot // page_size, row slot % page_size); negative slots are skipped. K heads (even) are
    stored divided by k_scale, V heads (odd) by v_scale (times k_scales / v_scales [Hkv] or [1]
    per KV head), rounded to the cache dtype; an fp8 cache saturates at +-448. With value_cache,
    K goes to kv_cache and V to value_cache; kv_layout "HND": caches [P, heads, page_size, D].
    Slots must be < num_pages * page_size (the library's check_host_values).
    """
    kv_cache_store(
        new_kv[:, 0::2],
        new_kv[:, 1::2],
        slot_mapping,
        kv_cache,
        k_scale,
        v_scale,
        kv_layout,
        k_scales=k_scales,
        v_scales=v_scales,
        value_cache=value_cache,
    )


def kv_cache_store(
    key: torch.Tensor,
    value: torch.Tensor,
    slot_mapping: torch.Tensor,
    kv_cache: torch.Tensor,
    k_scale: float | None = None,
    v_scale: float | None = None,
    kv_layout: str = "NHD",
    *,
    k_scales: torch.Tensor | None = None,
    v_scales: torch.Tensor | None = None,
    value_cache: torch.Tensor | None = None,
) -> None:
    """kv_cache_update of the rows key and value interleave into (K at even, V at odd heads), or
    with value_cache, of key into kv_cache and value into value_cache (a [P, 2, ...] kv_cache:
    into its halves)."""
    scales = {"k_scales": k_scales, "v_scales": v_scales}
    for cache, rows in cache_writes(key, value, kv_cache, value_cache, k_scale, v_scale, **scales):
        _scatter(cache, slot_mapping, rows, kv_layout)


def cache_writes(key, value, kv_cache, value_cache, k_scale, v_scale, *, k_scales, v_scales):
    """[(cache, rows [N, heads, D] float32)] of one write of key and value [N, Hkv, D], each
    divided by its scale per KV head: the interleaved rows into kv_cache, or (value_cache given)
    K into kv_cache and V into value_cache. The reference and the composite scatter them."""
    heads, device = key.shape[1], key.device
    k = key.float() / per_kv_head(k_scales, k_scale, heads, torch.float32, device)[:, None]
    v = value.float() / per_kv_head(v_scales, v_scale, heads, torch.float32, device)[:, None]
    kv_cache, value_cache = cache_pair(kv_cache, value_cache)
    if value_cache is None:
        return [(kv_cache, interleave_kv(k, v))]
    return [(kv_cache, k), (value_cache, v)]


def cache_pair(
    kv_cache: torch.Tensor, value_cache: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(K cache, V cache) of a call: a [P, 2, ...] kv_cache's halves (views, so writes go
    through), or kv_cache and value_cache; None for V where K and V interleave in kv_cache."""
    if kv_cache.dim() == 5:
        return kv_cache[:, 0], kv_cache[:, 1]
    return kv_cache, None if ops.is_absent(value_cache) else value_cache


def _scatter(
    cache: torch.Tensor, slot_mapping: torch.Tensor, scaled: torch.Tensor, kv_layout: str
) -> None:
    """cache's row at slot_mapping[n] (page slot // page_size, row slot % page_size of a
    [P, page_size, heads, D] cache, or [P, heads, page_size, D] with kv_layout "HND") = scaled[n],
    rounded to the cache dtype (fp8: saturated at +-448); negative slots skipped. In place."""
    if cache.dtype == torch.float8_e4m3fn:
        scaled = scaled.clamp(-FP8_MAX, FP8_MAX)
    keep = slot_mapping >= 0
    values = scaled[keep].to(cache.dtype)
    if cache.dtype == torch.float8_e4m3fn:  # no float8 indexing kernels: write the bytes
        cache, values = cache.view(torch.uint8), values.view(torch.uint8)
    pages = cache.transpose(1, 2) if kv_layout == "HND" else cache  # a view: writes go through
    slots = slot_mapping[keep].long()
    pages[slots // pages.shape[1], slots % pages.shape[1]] = values


def interleave_kv(key: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
    """key, value [N, Hkv, D] -> the cache rows [N, 2*Hkv, D]: K at even, V at odd heads."""
    return torch.stack([key, value], dim=2).reshape(key.shape[0], 2 * key.shape[1], key.shape[2])


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """torch.nn.functional.rms_norm's math in float32, rounded once to x's dtype."""
    x32 = x.float()
    inv_rms = torch.rsqrt(x32.pow(2).mean(dim=-1, keepdim=True) + eps)
    return (x32 * inv_rms * weight.float()).to(x.dtype)


def merge_attention_states(
    out_a: torch.Tensor, lse_a: torch.Tensor, out_b: torch.Tensor, lse_b: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(out [T, H, D], lse [T, H]) over both parts' keys, in float32 (ops.MERGE_ATTENTION_STATES)."""
    lse_a, lse_b = (torch.where(s == torch.inf, -torch.inf, s.float()) for s in (lse_a, lse_b))
    m = torch.maximum(lse_a, lse_b)
    empty = m == -torch.inf
    m = torch.where(empty, torch.zeros_like(m), m)  # both parts empty: weights 0, no NaN
    wa, wb = torch.exp(lse_a - m), torch.exp(lse_b - m)
    total = wa + wb
    safe = torch.where(empty, torch.ones_like(total), total)
    out = out_a.float() * (wa / safe)[..., None] + out_b.float() * (wb / safe)[..., None]
    lse = torch.where(empty, torch.full_like(m, -torch.inf), m + torch.log(safe))
    return out.to(out_a.dtype), lse
