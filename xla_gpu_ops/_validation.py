"""Input checks shared by every front end, written on shapes, dtype names and plain Python values.

Static checks (shapes, dtypes, attributes) never touch device data. Metadata checks read the
int32 arrays and therefore need them on the host (a sync for device tensors).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

FLOAT_DTYPES = ("float32", "float16", "bfloat16")
SUPPORTED_HEAD_DIMS = (64, 128, 256)
MAX_PAGE_SIZE = 128


@dataclass(frozen=True)
class PagedAttentionDims:
    num_tokens: int
    num_q_heads: int
    num_kv_heads: int
    head_dim: int
    num_pages: int
    page_size: int
    max_num_seqs: int
    pages_per_seq: int

    @property
    def group_size(self) -> int:
        return self.num_q_heads // self.num_kv_heads


def _fail(argument: str, message: str, kind: type[Exception] = ValueError) -> None:
    raise kind(f"paged_attention: {argument}: {message}")


def check_simple_add(
    a_shape: Sequence[int], a_dtype: str, b_shape: Sequence[int], b_dtype: str
) -> None:
    if a_dtype not in FLOAT_DTYPES:
        raise TypeError(f"simple_add: a: dtype {a_dtype} is not one of {FLOAT_DTYPES}")
    if b_dtype != a_dtype:
        raise TypeError(f"simple_add: b: dtype {b_dtype} differs from a's {a_dtype}")
    if tuple(b_shape) != tuple(a_shape):
        raise ValueError(f"simple_add: b: shape {tuple(b_shape)} differs from a's {tuple(a_shape)}")


def check_paged_attention_static(
    shapes: dict[str, Sequence[int]],
    dtypes: dict[str, str],
    scale: float,
    sliding_window: int | None,
    soft_cap: float | None,
) -> PagedAttentionDims:
    """Check ranks, shapes, dtypes and attributes; return the static dims. No data is read."""
    ranks = {"query": 3, "kv_cache": 4, "context_lens": 1, "block_tables": 2,
             "query_start_loc": 1, "num_seqs": 1}  # fmt: skip
    for name, rank in ranks.items():
        if len(shapes[name]) != rank:
            _fail(name, f"expected rank {rank}, got shape {tuple(shapes[name])}")
    q_dtype = dtypes["query"]
    if q_dtype not in FLOAT_DTYPES:
        _fail("query", f"dtype {q_dtype} is not one of {FLOAT_DTYPES}", TypeError)
    if dtypes["kv_cache"] != q_dtype:
        _fail("kv_cache", f"dtype {dtypes['kv_cache']} differs from query's {q_dtype}", TypeError)
    for name in ("context_lens", "block_tables", "query_start_loc", "num_seqs"):
        if dtypes[name] != "int32":
            _fail(name, f"dtype must be int32, got {dtypes[name]}", TypeError)

    num_tokens, num_q_heads, head_dim = shapes["query"]
    num_pages, page_size, combined_heads, kv_head_dim = shapes["kv_cache"]
    (max_num_seqs,) = shapes["context_lens"]
    if kv_head_dim != head_dim:
        _fail("kv_cache", f"head_dim {kv_head_dim} differs from query's {head_dim}")
    if head_dim not in SUPPORTED_HEAD_DIMS:
        _fail("query", f"head_dim {head_dim} is not one of {SUPPORTED_HEAD_DIMS}")
    if combined_heads <= 0 or combined_heads % 2:
        _fail(
            "kv_cache",
            f"dim 2 must be 2 * num_kv_heads (K and V interleaved), got {combined_heads}",
        )
    num_kv_heads = combined_heads // 2
    if num_q_heads <= 0 or num_q_heads % num_kv_heads:
        _fail(
            "query", f"num_q_heads {num_q_heads} is not a multiple of num_kv_heads {num_kv_heads}"
        )
    if not 1 <= page_size <= MAX_PAGE_SIZE:
        _fail("kv_cache", f"page_size {page_size} is outside [1, {MAX_PAGE_SIZE}]")
    if num_pages <= 0:
        _fail("kv_cache", "needs at least one page")
    if max_num_seqs <= 0:
        _fail("context_lens", "needs at least one sequence slot")
    if len(shapes["block_tables"]) == 2 and shapes["block_tables"][0] != max_num_seqs:
        _fail(
            "block_tables", f"dim 0 is {shapes['block_tables'][0]}, context_lens has {max_num_seqs}"
        )
    pages_per_seq = shapes["block_tables"][1]
    if pages_per_seq <= 0:
        _fail("block_tables", "needs at least one page per sequence")
    if tuple(shapes["query_start_loc"]) != (max_num_seqs + 1,):
        _fail(
            "query_start_loc",
            f"shape must be ({max_num_seqs + 1},), got {tuple(shapes['query_start_loc'])}",
        )
    if tuple(shapes["num_seqs"]) != (1,):
        _fail("num_seqs", f"shape must be (1,), got {tuple(shapes['num_seqs'])}")

    if not np.isfinite(scale):
        _fail("scale", f"must be finite, got {scale}")
    if sliding_window is not None and (not isinstance(sliding_window, int) or sliding_window <= 0):
        _fail("sliding_window", f"must be a positive int or None, got {sliding_window!r}")
    if soft_cap is not None and (not np.isfinite(soft_cap) or soft_cap <= 0):
        _fail("soft_cap", f"must be a positive finite float or None, got {soft_cap!r}")
    return PagedAttentionDims(num_tokens, num_q_heads, num_kv_heads, head_dim, num_pages,
                              page_size, max_num_seqs, pages_per_seq)  # fmt: skip


def check_paged_attention_metadata(
    dims: PagedAttentionDims,
    context_lens: np.ndarray,
    block_tables: np.ndarray,
    query_start_loc: np.ndarray,
    num_seqs: np.ndarray,
) -> None:
    """Check the metadata values (host arrays); the same rules the CUDA kernel guards with NaN."""
    n = int(num_seqs[0])
    if not 0 <= n <= dims.max_num_seqs:
        _fail("num_seqs", f"{n} is outside [0, {dims.max_num_seqs}]")
    starts = query_start_loc[: n + 1].astype(np.int64)
    if starts[0] < 0 or starts[-1] > dims.num_tokens:
        _fail(
            "query_start_loc", f"values must lie in [0, {dims.num_tokens}], got {starts.tolist()}"
        )
    q_lens = np.diff(starts)
    if (q_lens < 0).any():
        _fail("query_start_loc", f"must be non-decreasing, got {starts.tolist()}")
    kv_lens = context_lens[:n].astype(np.int64)
    capacity = dims.pages_per_seq * dims.page_size
    if (kv_lens > capacity).any() or (kv_lens < 0).any():
        bad = int(np.flatnonzero((kv_lens > capacity) | (kv_lens < 0))[0])
        _fail(
            "context_lens", f"sequence {bad} has {kv_lens[bad]} tokens; must be in [0, {capacity}]"
        )
    if (q_lens > kv_lens).any():
        bad = int(np.flatnonzero(q_lens > kv_lens)[0])
        _fail(
            "context_lens",
            f"sequence {bad}: q_len {q_lens[bad]} exceeds context_len {kv_lens[bad]}",
        )
    for i in range(n):
        used = block_tables[i, : -(-int(kv_lens[i]) // dims.page_size)]
        if used.size and (used.min() < 0 or used.max() >= dims.num_pages):
            _fail(
                "block_tables",
                f"sequence {i} uses page indices outside [0, {dims.num_pages}): {used.tolist()}",
            )
