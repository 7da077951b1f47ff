"""Random paged-attention inputs shared by the kernel, binding and benchmark tests.

`make_paged_inputs` returns the six operands of `xla_gpu_ops.reference.paged_attention` (CPU torch
tensors), so `reference.paged_attention(**inputs, scale=...)` works as is. Pages are assigned in a
shuffled order (a kernel that assumes contiguous pages fails), the cache holds spare pages full of
random values that no sequence uses, and every value is random, never zero.
"""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Sequence

import torch

from xla_gpu_ops import _library

SeqSpec = tuple[int, int]  # (q_len, context_len)

DECODE = ((1, 37), (1, 300), (1, 5), (1, 129))
PREFILL = ((37, 37), (64, 200), (5, 5))
MIXED = ((1, 100), (17, 17), (1, 1), (40, 257), (3, 64))


def default_scale(head_dim: int) -> float:
    return 1.0 / math.sqrt(head_dim)


def rel_l2(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """Relative L2 error of `actual` against `expected`, in float64 on the CPU; inf when `actual`
    holds a non-finite value, so every `< tolerance` check fails on it."""
    actual, expected = actual.double().cpu(), expected.double().cpu()
    if not torch.isfinite(actual).all():
        return math.inf
    return ((actual - expected).norm() / expected.norm().clamp_min(1e-30)).item()


def fresh_seed() -> int:
    """A new seed per call (per test run); tests print it in failure messages to reproduce."""
    return int.from_bytes(os.urandom(4), "little")


def make_cache_write_inputs(
    seed: int,
    dtype: torch.dtype = torch.bfloat16,
    cache_dtype: torch.dtype | None = None,
    slot_dtype: torch.dtype = torch.int32,
    scale: float = 1.0,
    num_kv_heads: int = 3,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """kv_cache_update's operands: new_kv [40, 2*Hkv, 64] (times `scale`), slot_mapping [40] of
    distinct slots with every 7th token padding (-1), and a random kv_cache [7, 16, 2*Hkv, 64]."""
    gen = torch.Generator().manual_seed(seed)
    num_pages, page_size, head_dim, num_tokens = 7, 16, 64, 40
    combined = 2 * num_kv_heads
    slots = torch.randperm(num_pages * page_size, generator=gen)[:num_tokens].to(slot_dtype)
    slots[::7] = -1
    new_kv = (torch.randn(num_tokens, combined, head_dim, generator=gen) * scale).to(dtype)
    cache = torch.randn(num_pages, page_size, combined, head_dim, generator=gen)
    return new_kv, slots, cache.to(cache_dtype or dtype)


def _pages_needed(context_len: int, page_size: int) -> int:
    return -(-context_len // page_size)


def make_paged_inputs(
    seq_specs: Sequence[SeqSpec],
    num_q_heads: int,
    num_kv_heads: int,
    head_dim: int,
    page_size: int,
    dtype: torch.dtype,
    seed: int,
    shared_prefix: bool = False,
    pad_tokens: int = 0,
    extra_seqs: int = 0,
    sinks: bool = False,
) -> dict[str, torch.Tensor]:
    """Random ragged batch in the torch_xla ragged_paged_attention layout (docs/DESIGN.md).

    seq_specs: one (q_len, context_len) per live sequence, 0 <= q_len <= context_len.
    shared_prefix: every sequence's first pages point at the same physical pages (prefix caching);
        it shares the pages all sequences fill completely (at least the first page).
    pad_tokens: random query rows after the last sequence's tokens (their output must be zeros).
    extra_seqs: unused sequence slots past num_seqs, holding random but valid metadata.

    Returns query [T, Hq, D], kv_cache [P, page_size, 2*Hkv, D] (K even, V odd), context_lens
    int32 [S], block_tables int32 [S, pages_per_seq], query_start_loc int32 [S + 1], num_seqs
    int32 [1], with S = len(seq_specs) + extra_seqs and T = sum(q_len) + pad_tokens; with
    sinks=True also sinks float32 [Hq], attention-sink logits (gpt-oss's are of order 1), drawn
    around 2 so that they take a real share of each row's softmax.
    """
    if not seq_specs:
        raise ValueError("seq_specs: need at least one sequence")
    for q_len, context_len in seq_specs:
        if not 0 <= q_len <= context_len or context_len < 1:
            raise ValueError(
                f"seq_specs: need 0 <= q_len <= context_len, >= 1, got {(q_len, context_len)}"
            )
    gen = torch.Generator().manual_seed(seed)
    num_live = len(seq_specs)
    num_slots = num_live + extra_seqs
    used_pages = [_pages_needed(ctx, page_size) for _, ctx in seq_specs]
    pages_per_seq = max(used_pages)

    shared = 0
    if shared_prefix:
        full_pages = min(ctx // page_size for _, ctx in seq_specs)
        shared = min(max(1, full_pages), min(used_pages))
    private = [n - shared for n in used_pages]
    spare = 3  # pages no sequence uses: their random contents must never leak into the output
    num_pages = shared + sum(private) + spare
    physical = torch.randperm(num_pages, generator=gen).to(torch.int32)

    block_tables = torch.randint(
        0, num_pages, (num_slots, pages_per_seq), generator=gen, dtype=torch.int32
    )
    next_page = shared
    for i, n in enumerate(private):
        block_tables[i, :shared] = physical[:shared]
        block_tables[i, shared : shared + n] = physical[next_page : next_page + n]
        next_page += n

    q_lens = [q for q, _ in seq_specs]
    num_real_tokens = sum(q_lens)
    starts = [0]
    for q_len in q_lens:
        starts.append(starts[-1] + q_len)
    starts += [num_real_tokens] * extra_seqs  # unused slots: empty, like vLLM's padding
    capacity = pages_per_seq * page_size
    extra_lens = torch.randint(1, capacity + 1, (extra_seqs,), generator=gen).tolist()
    context_lens = [ctx for _, ctx in seq_specs] + extra_lens

    num_tokens = num_real_tokens + pad_tokens
    query = torch.randn((num_tokens, num_q_heads, head_dim), generator=gen).to(dtype)
    kv_cache = torch.randn((num_pages, page_size, 2 * num_kv_heads, head_dim), generator=gen)
    extra = {}
    if sinks:
        extra["sinks"] = torch.randn((num_q_heads,), generator=gen) + 2.0
    return {
        "query": query,
        "kv_cache": kv_cache.to(dtype),
        "context_lens": torch.tensor(context_lens, dtype=torch.int32),
        "block_tables": block_tables,
        "query_start_loc": torch.tensor(starts, dtype=torch.int32),
        "num_seqs": torch.tensor([num_live], dtype=torch.int32),
        **extra,
    }


def with_absent(op, operands):
    """The operands and, for each optional operand left off the end, the empty float32 [0] array
    a front end passes for it: what a raw custom call of the op needs."""
    import numpy as np

    from xla_gpu_ops import ops

    missing = len(op.operands) - len(operands)
    return [*operands, *[np.zeros((0,), ops.ABSENT_DTYPE) for _ in range(missing)]]


def library_call(op, operands, attrs):
    """(XgoCall, result specs) of one call, from arrays or tensors (anything with .shape/.dtype):
    what a front end hands the library (xla_gpu_ops._library)."""
    import numpy as np

    from xla_gpu_ops import _library

    operands = with_absent(op, operands)

    def name(x):
        return (
            str(x.dtype).removeprefix("torch.") if hasattr(x, "dtype") else np.asarray(x).dtype.name
        )

    call = _library.make_call(
        op, [tuple(x.shape) for x in operands], [name(x) for x in operands], op.encode_attrs(attrs)
    )
    return call, _library.describe(op, call)


def to_jax_arrays(inputs: dict, device) -> list:
    """The tensors' values (fp8 through its bytes, bf16 through f32) as jax arrays on device."""
    import jax
    import jax.numpy as jnp

    def to_jax(t):
        if t.dtype == torch.float8_e4m3fn:
            return jnp.asarray(t.view(torch.uint8).numpy()).view(jnp.float8_e4m3fn)
        if t.dtype == torch.bfloat16:
            return jnp.asarray(t.float().numpy()).astype(jnp.bfloat16)
        return jnp.asarray(t.numpy())

    return [jax.device_put(to_jax(t), device) for t in inputs.values()]


# ---------------------------------------------------------------- prefill kernel choice (CUDA)
def is_hopper() -> bool:
    return torch.cuda.get_device_capability()[0] == 9


def sm90_prefill_available() -> bool:
    return _library.load().cdll.xgo_debug_sm90_prefill_available() == 1


@contextlib.contextmanager
def prefill_kernel(kernel: int):
    """-1: the launcher's choice; 0: the mma.sync prefill kernel; 1: the sm_90a kernel."""
    lib = _library.load()
    previous = lib.cdll.xgo_debug_force_prefill_kernel(kernel)
    try:
        yield
    finally:
        lib.cdll.xgo_debug_force_prefill_kernel(previous)
