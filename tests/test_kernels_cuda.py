"""CUDA kernels through torch.ops.xla_gpu.* (eager, xla_gpu_ops._torch_cuda) against the float64
CPU reference.

Every check draws fresh random inputs (the seed is in the failure message), never zeros; f32 must
reach 1e-5 relative L2 (exact f32 arithmetic, no TF32), f16/bf16 1e-2 (16-bit P and V operands of
the tensor cores). Bad metadata must give NaN rows, never a crash, hang or silent garbage.
"""

from __future__ import annotations

import pytest
import torch
from paged_inputs import (
    DECODE,
    MIXED,
    PREFILL,
    default_scale,
    fresh_seed,
    is_hopper,
    make_paged_inputs,
    prefill_kernel,
    rel_l2,
    sm90_prefill_available,
)

from xla_gpu_ops import _library, reference

pytestmark = [
    pytest.mark.kernels,
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
    pytest.mark.skipif(not _library.is_built(), reason="needs libxla_gpu_ops.so (nox -s build)"),
]

TOLERANCE = {torch.float32: 1e-5, torch.float16: 1e-2, torch.bfloat16: 1e-2}
SPECS = {"decode": DECODE, "prefill": PREFILL, "mixed": MIXED}


def run_cuda(inputs: dict[str, torch.Tensor], **attrs) -> torch.Tensor:
    on_gpu = {name: t.cuda() for name, t in inputs.items()}
    out = torch.ops.xla_gpu.paged_attention(**on_gpu, **attrs)[0]
    torch.cuda.synchronize()
    return out.cpu()


def check_against_reference(
    inputs, dtype, seed, rows: slice | None = None, **attrs
) -> torch.Tensor:
    """rows: also checked on their own (a sequence the batch's error would hide)."""
    expected = reference.paged_attention(**inputs, **attrs, compute_dtype=torch.float64)
    out = run_cuda(inputs, **attrs)
    assert out.dtype == dtype
    assert out.shape == inputs["query"].shape
    assert torch.isfinite(out).all(), f"non-finite output (seed {seed})"
    error = rel_l2(out, expected)
    assert error < TOLERANCE[dtype], f"relative L2 {error:.3g} (seed {seed})"
    if rows is not None:
        error = rel_l2(out[rows], expected[rows])
        assert error < TOLERANCE[dtype], f"rows {rows}: relative L2 {error:.3g} (seed {seed})"
    num_real = int(inputs["query_start_loc"][int(inputs["num_seqs"][0])])
    assert (out[num_real:] == 0).all(), f"padding rows must be zeros (seed {seed})"
    return out


# ---------------------------------------------------------------------------- simple_add
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("size", [0, 1, 7, 8, 9, 4095, 1_000_003])
def test_simple_add_matches_torch(dtype, size):

    a = torch.randn(size, device="cuda").to(dtype)
    b = torch.randn(size, device="cuda").to(dtype)
    out = torch.ops.xla_gpu.simple_add(a, b)
    torch.testing.assert_close(out, a + b, rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_simple_add_unaligned_and_strided(dtype):

    base = torch.randn(2, 1001, device="cuda").to(dtype)
    a, b = base[0, 1:], base[1, :-1]  # a is not 16-byte aligned
    torch.testing.assert_close(torch.ops.xla_gpu.simple_add(a, b), a + b, rtol=0, atol=0)
    m = torch.randn(64, 48, device="cuda").to(dtype)
    torch.testing.assert_close(
        torch.ops.xla_gpu.simple_add(m.t(), m.t()), m.t() + m.t(), rtol=0, atol=0
    )


def test_simple_add_rejects_cpu_and_mixed_dtypes():

    a = torch.randn(8, device="cuda")
    with pytest.raises(ValueError, match="b: on cpu"):
        torch.ops.xla_gpu.simple_add(a, torch.randn(8))
    with pytest.raises(TypeError, match="b: dtype"):
        torch.ops.xla_gpu.simple_add(a, a.half())


# ---------------------------------------------------------------------------- paged_attention
# The kernels' widths (64, 128, 256) and head dims below them, each run by the next width with the
# columns past head_dim read as zeros and not stored (80, 96: Phi, StableLM; 192: MLA-style
# prefill; 160: a partial 64-column box and one wholly past head_dim; 32: below the narrowest).
HEAD_DIMS = [32, 64, 80, 96, 128, 160, 192, 256]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
@pytest.mark.parametrize("kind", ["decode", "prefill", "mixed"])
def test_paged_attention_dtypes_head_dims(dtype, head_dim, kind):
    seed = fresh_seed()
    inputs = make_paged_inputs(SPECS[kind], 8, 2, head_dim, 16, dtype, seed, pad_tokens=3)
    check_against_reference(inputs, dtype, seed, scale=default_scale(head_dim))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("page_size", [1, 5, 8, 16, 32, 128])
@pytest.mark.parametrize(
    ("num_q_heads", "num_kv_heads"), [(4, 4), (8, 4), (8, 2), (8, 1), (12, 4), (32, 2), (6, 6)]
)
def test_paged_attention_page_sizes_and_gqa(dtype, page_size, num_q_heads, num_kv_heads):
    seed = fresh_seed()
    inputs = make_paged_inputs(
        MIXED, num_q_heads, num_kv_heads, 128, page_size, dtype, seed, pad_tokens=2, extra_seqs=2
    )
    check_against_reference(inputs, dtype, seed, scale=default_scale(128))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize(
    ("sliding_window", "soft_cap"), [(7, None), (None, 5.0), (40, 2.0), (1, None), (100_000, None)]
)
@pytest.mark.parametrize("kind", ["decode", "prefill", "mixed"])
def test_paged_attention_window_and_soft_cap(dtype, sliding_window, soft_cap, kind):
    seed = fresh_seed()
    inputs = make_paged_inputs(SPECS[kind], 8, 2, 64, 16, dtype, seed, shared_prefix=True)
    check_against_reference(
        inputs, dtype, seed, scale=0.3, sliding_window=sliding_window, soft_cap=soft_cap
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("sliding_window", [None, 1000])
def test_paged_attention_long_context_split_kv(dtype, sliding_window):
    """Few sequences with long contexts: the launcher splits the KV range and merges the parts."""
    seed = fresh_seed()
    specs = ((1, 20_000), (1, 4_097), (3, 9_000))
    inputs = make_paged_inputs(specs, 8, 2, 128, 16, dtype, seed, pad_tokens=1)
    check_against_reference(
        inputs, dtype, seed, scale=default_scale(128), sliding_window=sliding_window
    )


# Decode-like (tokens <= 2 x sequences): one-token decodes and one 4-token sequence.
D256_DECODES = ((1, 37), (1, 300), (1, 5), (1, 129), (1, 4_133), (1, 32), (1, 33), (4, 300))
D256_SPLIT_SEQUENCE = 4  # the 4133-key sequence: several KV splits


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("page_size", [1, 5, 16, 48, 128])
@pytest.mark.parametrize(("sliding_window", "soft_cap"), [(None, None), (45, None), (None, 4.0)])
@pytest.mark.parametrize(("num_q_heads", "num_kv_heads"), [(12, 4), (16, 1)])
def test_decode_head_dim_256_tiles(
    dtype, page_size, sliding_window, soft_cap, num_q_heads, num_kv_heads
):
    """16-bit D = 256 decodes run 32-key tiles (8 keys per warp, P V by m16n8k8): contexts that
    end inside a tile or on its edge, pages shorter and longer than a tile, windows that start
    inside one, all 16 rows of a tile (16 heads per KV head; 4 tokens of 3 heads), and the KV
    splits of the 4133-key sequence, checked on its own rows too (the short sequences would
    otherwise dominate the batch's error)."""
    seed = fresh_seed()
    inputs = make_paged_inputs(
        D256_DECODES, num_q_heads, num_kv_heads, 256, page_size, dtype, seed, pad_tokens=2
    )
    check_against_reference(
        inputs,
        dtype,
        seed,
        rows=_rows_of(inputs, D256_SPLIT_SEQUENCE),
        scale=default_scale(256),
        sliding_window=sliding_window,
        soft_cap=soft_cap,
    )


@pytest.mark.parametrize("corruption", ["page_out_of_range", "negative_page"])
def test_decode_head_dim_256_bad_page_poisons_its_sequence(corruption):
    seed = fresh_seed()
    inputs = make_paged_inputs(D256_DECODES, 8, 2, 256, 16, torch.bfloat16, seed)
    expected = reference.paged_attention(**inputs, scale=0.06, compute_dtype=torch.float64)
    bad = D256_SPLIT_SEQUENCE  # its third page
    inputs["block_tables"][bad, 2] = (
        -1 if corruption == "negative_page" else (inputs["kv_cache"].shape[0])
    )
    out = run_cuda(inputs, scale=0.06)
    _assert_only_sequence_poisoned(out, expected, inputs, bad, torch.bfloat16, seed)


def test_paged_attention_128k_context_decode():
    seed = fresh_seed()
    inputs = make_paged_inputs(((1, 131_072),), 8, 1, 128, 16, torch.bfloat16, seed)
    check_against_reference(inputs, torch.bfloat16, seed, scale=default_scale(128))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_paged_attention_long_prefill(dtype):
    seed = fresh_seed()
    specs = ((1000, 1500), (300, 300), (1, 2000))
    inputs = make_paged_inputs(specs, 4, 2, 128, 32, dtype, seed, shared_prefix=True)
    check_against_reference(inputs, dtype, seed, scale=default_scale(128))


def test_paged_attention_many_sequences():
    seed = fresh_seed()
    gen = torch.Generator().manual_seed(seed)
    contexts = torch.randint(1, 300, (1024,), generator=gen).tolist()
    specs = tuple((1 if i % 7 else min(ctx, 5), ctx) for i, ctx in enumerate(contexts))
    inputs = make_paged_inputs(specs, 8, 2, 128, 16, torch.bfloat16, seed)
    check_against_reference(inputs, torch.bfloat16, seed, scale=default_scale(128))


def test_paged_attention_empty_sequences_and_zero_num_seqs():
    seed = fresh_seed()
    inputs = make_paged_inputs(
        ((0, 10), (4, 9), (0, 3), (1, 30)), 4, 2, 64, 8, torch.bfloat16, seed, pad_tokens=2
    )
    check_against_reference(inputs, torch.bfloat16, seed, scale=0.2)
    inputs["num_seqs"] = torch.tensor([0], dtype=torch.int32)
    out = run_cuda(inputs, scale=0.2)
    assert (out == 0).all(), "with num_seqs = 0 every row is padding"


def test_decode_grid_orders():
    """Decode launches of more than one wave number head blocks fastest (grid.y = the static bound
    of q tiles, T / tokens per tile + S), except past grid.y's 65535; one wave keeps q tiles
    fastest. 1200 sequences x 2 head blocks: more blocks than any GPU holds at once."""
    seed = fresh_seed()
    gen = torch.Generator().manual_seed(seed)
    many = tuple((1, c) for c in torch.randint(1, 700, (1200,), generator=gen).tolist())
    few = ((1, 700), (1, 33), (1, 1), (1, 260))
    for specs, extra_seqs in ((many, 0), (many, 66000), (few, 0)):  # the last two: q tiles fastest
        inputs = make_paged_inputs(
            specs, 8, 2, 128, 16, torch.bfloat16, seed, extra_seqs=extra_seqs
        )
        check_against_reference(
            inputs, torch.bfloat16, seed, scale=default_scale(128), rows=slice(0, 4)
        )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_paged_attention_is_deterministic(dtype):
    """Two runs on the same inputs agree bit for bit (a moving result would mean a race)."""
    seed = fresh_seed()
    inputs = make_paged_inputs(((1, 5000), (30, 700), (1, 64)), 8, 2, 128, 16, dtype, seed)
    first, second = run_cuda(inputs, scale=0.1), run_cuda(inputs, scale=0.1)
    assert torch.equal(first, second), f"seed {seed}"


def test_scratch_buffer_per_stream_grows_and_stays_out_of_graphs():
    """The eager path reuses one scratch buffer (the KV-split workspace) per stream: calls on two
    streams at once and a buffer that grows give the reference's rows; a CUDA graph captured on a
    stream that has a cached buffer gets its own scratch, so replays beside eager calls on that
    stream stay right, and the cached buffer is not replaced by the capture."""
    from xla_gpu_ops import _torch_cuda

    seed = fresh_seed()
    scale = default_scale(128)
    small = make_paged_inputs(((1, 4_133), (1, 300)), 8, 2, 128, 16, torch.bfloat16, seed)
    large = make_paged_inputs(((1, 20_000),) * 3, 8, 2, 128, 16, torch.bfloat16, seed + 1)
    expected = {
        name: reference.paged_attention(**inputs, scale=scale, compute_dtype=torch.float64)
        for name, inputs in (("small", small), ("large", large))
    }
    on_gpu = {
        "small": {k: v.cuda() for k, v in small.items()},
        "large": {k: v.cuda() for k, v in large.items()},
    }

    def attend(name):
        return torch.ops.xla_gpu.paged_attention(**on_gpu[name], scale=scale)[0]

    def check(out, name):
        error = rel_l2(out.cpu(), expected[name])
        assert error < TOLERANCE[torch.bfloat16], f"{name}: relative L2 {error:.3g} (seed {seed})"

    side = torch.cuda.Stream()
    first = attend("small")  # the default stream's buffer
    side.wait_stream(torch.cuda.current_stream())  # the inputs' copies
    with torch.cuda.stream(side):
        beside = [attend("large") for _ in range(4)]  # the side stream's, at the same time
    grown = attend("large")  # the default stream's buffer grows
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    for out, name in ((first, "small"), *((o, "large") for o in beside), (grown, "large")):
        check(out, name)
    device = torch.cuda.current_device()
    side_key = (device, side.cuda_stream)
    assert (device, torch.cuda.current_stream().cuda_stream) in _torch_cuda._scratch
    cached = _torch_cuda._scratch[side_key]

    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=side):
        captured = attend("small")
    assert _torch_cuda._scratch[side_key] is cached
    outs = []
    for _ in range(3):  # replays on the default stream while the side stream runs eager calls
        graph.replay()
        with torch.cuda.stream(side):
            outs.append(attend("large"))
        outs.append(captured.clone())
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    for i, out in enumerate(outs):
        check(out, "large" if i % 2 == 0 else "small")


def test_paged_attention_noncontiguous_inputs():
    seed = fresh_seed()
    inputs = make_paged_inputs(MIXED, 8, 2, 64, 16, torch.bfloat16, seed)
    expected = reference.paged_attention(**inputs, scale=0.2, compute_dtype=torch.float64)
    q = inputs["query"]
    inputs["query"] = torch.empty(q.shape[1], q.shape[0], q.shape[2], dtype=q.dtype).transpose(0, 1)
    inputs["query"].copy_(q)
    assert not inputs["query"].is_contiguous()
    assert rel_l2(run_cuda(inputs, scale=0.2), expected) < 1e-2


def _short_tokens(num_q_heads: int, num_kv_heads: int) -> int:
    """Query tokens of one 16-row decode tile: 16 / heads per block (the group's largest divisor
    <= 16), as the launch plan computes it."""
    group = num_q_heads // num_kv_heads
    heads = max(h for h in range(1, 17) if group % h == 0)
    return 16 // heads


def _short_region_inputs(
    num_q_heads, num_kv_heads, head_dim, dtype, seed, long_context=17_000, **kwargs
):
    """A prefill-like batch with >= 1024 blocks (so the plan gives it one split), whose sequences
    of at most short_tokens query tokens run as decode blocks with their own KV splits next to the
    prefill tiles (the mixed-batch path): >= 1100 / head-blocks sequences, 20 of them prefills, 4
    decodes of long_context keys (17000: 3 KV splits of 8192 keys; 2000: 1 split, rows written
    directly), and short sequences one token longer than a tile (prefill tiles)."""
    gen = torch.Generator().manual_seed(seed)
    short = _short_tokens(num_q_heads, num_kv_heads)
    head_blocks = num_q_heads // (16 // short)
    num_seqs = max(100, -(-1100 // head_blocks))

    def randint(lo: int, hi: int) -> int:
        return int(torch.randint(lo, hi + 1, (1,), generator=gen))

    specs = [(randint(1, short), long_context) for _ in range(4)]
    specs += [(q, q + randint(0, 300)) for q in (randint(100, 200) for _ in range(20))]
    specs += [
        (q, q + randint(0, 200)) for q in (randint(1, short + 1) for _ in range(num_seqs - 24))
    ]
    order = torch.randperm(len(specs), generator=gen).tolist()
    specs = tuple(specs[i] for i in order)
    assert sum(q for q, _ in specs) > 2 * (len(specs) + kwargs.get("extra_seqs", 0))  # not decode
    return make_paged_inputs(specs, num_q_heads, num_kv_heads, head_dim, 16, dtype, seed, **kwargs)


@pytest.mark.parametrize(
    ("dtype", "head_dim", "num_q_heads", "num_kv_heads", "long_context"),
    [
        (torch.bfloat16, 128, 32, 8, 17_000),  # 4 tokens per short tile, 3 splits
        (torch.float16, 64, 32, 8, 17_000),
        (torch.bfloat16, 64, 64, 4, 17_000),  # 1 token per short tile
        (torch.bfloat16, 64, 32, 4, 17_000),  # 2 tokens
        (torch.bfloat16, 64, 16, 16, 17_000),  # 16 tokens
        (torch.bfloat16, 64, 32, 8, 2000),  # 1 split: the short blocks write rows directly
    ],
)
def test_paged_attention_short_sequences_of_a_large_prefill_batch(
    dtype, head_dim, num_q_heads, num_kv_heads, long_context
):
    seed = fresh_seed()
    inputs = _short_region_inputs(
        num_q_heads, num_kv_heads, head_dim, dtype, seed, long_context, pad_tokens=3, extra_seqs=5
    )
    # Slots past num_seqs are unused: their query_start_loc entries may hold anything (here short
    # "sequences" and rows past T), and no block or merge may act on them.
    num_tokens, live = inputs["query"].shape[0], int(inputs["num_seqs"][0])
    inputs["query_start_loc"][live + 1 :] = torch.tensor([1, 2, num_tokens + 9, 0, 3])
    check_against_reference(inputs, dtype, seed, scale=default_scale(head_dim))


@pytest.mark.parametrize(("sliding_window", "soft_cap"), [(7, None), (300, 3.0)])
def test_paged_attention_short_sequences_window_and_soft_cap(sliding_window, soft_cap):
    seed = fresh_seed()
    inputs = _short_region_inputs(64, 4, 64, torch.bfloat16, seed)
    check_against_reference(
        inputs, torch.bfloat16, seed, scale=0.3, sliding_window=sliding_window, soft_cap=soft_cap
    )


# ---------------------------------------------------------------------------- bad metadata
def _bad_inputs(seed: int) -> dict[str, torch.Tensor]:
    return make_paged_inputs(
        ((2, 40), (1, 17), (3, 3), (1, 64)), 4, 2, 64, 16, torch.bfloat16, seed, pad_tokens=2
    )


def _rows_of(inputs, seq: int) -> slice:
    starts = inputs["query_start_loc"]
    return slice(int(starts[seq]), int(starts[seq + 1]))


def _assert_only_sequence_poisoned(out, expected, inputs, bad: int, dtype, seed: int) -> None:
    """Sequence `bad` has NaN rows; every other row is finite and matches the reference."""
    rows = _rows_of(inputs, bad)
    assert out[rows].isnan().all(), f"seed {seed}"
    good = torch.ones(out.shape[0], dtype=torch.bool)
    good[rows] = False
    assert torch.isfinite(out[good]).all(), f"seed {seed}"
    assert rel_l2(out[good], expected[good]) < TOLERANCE[dtype], f"seed {seed}"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("num_seqs", [-1, 5, 1 << 30])
def test_bad_num_seqs_poisons_every_row(dtype, num_seqs):
    inputs = make_paged_inputs(((2, 40), (1, 17)), 4, 2, 64, 16, dtype, fresh_seed())
    inputs["num_seqs"] = torch.tensor([num_seqs], dtype=torch.int32)
    assert run_cuda(inputs, scale=0.2).isnan().all()


def test_non_monotone_query_start_loc_poisons_every_row():
    inputs = _bad_inputs(fresh_seed())
    inputs["query_start_loc"][2] = 1  # [0, 2, 1, ...]: the row partition is broken
    assert run_cuda(inputs, scale=0.2).isnan().all()


def test_query_start_loc_past_num_tokens_poisons_every_row():
    inputs = _bad_inputs(fresh_seed())
    inputs["query_start_loc"][4] = 10_000
    assert run_cuda(inputs, scale=0.2).isnan().all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    "corruption",
    [
        "context_too_long",
        "negative_context",
        "q_longer_than_context",
        "page_out_of_range",
        "negative_page",
    ],
)
def test_bad_sequence_gets_nan_rows_others_stay_right(dtype, corruption):
    seed = fresh_seed()
    inputs = make_paged_inputs(
        ((2, 40), (1, 17), (3, 3), (1, 64)), 4, 2, 64, 16, dtype, seed, pad_tokens=2
    )
    expected = reference.paged_attention(**inputs, scale=0.2, compute_dtype=torch.float64)
    bad = 1
    if corruption == "context_too_long":
        inputs["context_lens"][bad] = inputs["block_tables"].shape[1] * 16 + 1
    elif corruption == "negative_context":
        inputs["context_lens"][bad] = -5
    elif corruption == "q_longer_than_context":
        inputs["context_lens"][bad] = 0
    elif corruption == "page_out_of_range":
        inputs["block_tables"][bad, 1] = inputs["kv_cache"].shape[0]
    else:
        inputs["block_tables"][bad, 0] = -1
    out = run_cuda(inputs, scale=0.2)
    _assert_only_sequence_poisoned(out, expected, inputs, bad, dtype, seed)


def test_static_errors_name_the_argument():

    inputs = {n: t.cuda() for n, t in _bad_inputs(fresh_seed()).items()}
    with pytest.raises(ValueError, match="kv_cache: on cpu"):
        torch.ops.xla_gpu.paged_attention(
            **{**inputs, "kv_cache": inputs["kv_cache"].cpu()}, scale=1.0
        )[0]
    with pytest.raises(TypeError, match="kv_cache: dtype"):
        torch.ops.xla_gpu.paged_attention(
            **{**inputs, "kv_cache": inputs["kv_cache"].half()}, scale=1.0
        )[0]
    q = inputs["query"][..., :32].contiguous()
    kv = inputs["kv_cache"][..., :32].contiguous()
    with pytest.raises(ValueError, match="head_dim"):
        torch.ops.xla_gpu.paged_attention(**{**inputs, "query": q, "kv_cache": kv}, scale=1.0)[0]
    with pytest.raises(ValueError, match="soft_cap"):
        torch.ops.xla_gpu.paged_attention(**inputs, scale=1.0, soft_cap=-1.0)[0]


def test_bad_page_past_the_first_check_chunk_poisons_the_sequence():
    """The prep kernel checks block_tables in chunks of 1024 entries per block: a bad entry in a
    later chunk must still poison the whole sequence, and only it."""
    seed = fresh_seed()
    inputs = make_paged_inputs(((1, 20_000), (2, 40)), 4, 2, 64, 16, torch.bfloat16, seed)
    expected = reference.paged_attention(**inputs, scale=0.2, compute_dtype=torch.float64)
    inputs["block_tables"][0, 1100] = -7
    out = run_cuda(inputs, scale=0.2)
    assert out[0].isnan().all(), f"seed {seed}"
    assert rel_l2(out[1:], expected[1:]) < TOLERANCE[torch.bfloat16], f"seed {seed}"


@pytest.mark.parametrize("corruption", ["page_out_of_range", "q_longer_than_context"])
def test_bad_short_sequence_of_a_large_prefill_batch_gets_nan_rows(corruption):
    """In the short region each KV split of a bad sequence writes NaN parts; the merge must turn
    them into NaN rows of that sequence only."""
    seed = fresh_seed()
    inputs = _short_region_inputs(64, 4, 64, torch.bfloat16, seed)
    expected = reference.paged_attention(**inputs, scale=0.2, compute_dtype=torch.float64)
    lens = inputs["context_lens"].tolist()
    bad = lens.index(17_000)  # a one-token decode with 3 KV splits (16 heads per block: 1 token)
    if corruption == "page_out_of_range":
        inputs["block_tables"][bad, 200] = inputs["kv_cache"].shape[0]
    else:
        inputs["context_lens"][bad] = 0
    out = run_cuda(inputs, scale=0.2)
    _assert_only_sequence_poisoned(out, expected, inputs, bad, torch.bfloat16, seed)


def test_broken_partition_of_a_large_prefill_batch_poisons_every_row():
    inputs = _short_region_inputs(32, 8, 64, torch.bfloat16, fresh_seed())
    inputs["query_start_loc"][7] = inputs["query_start_loc"][5] - 1
    assert run_cuda(inputs, scale=0.2).isnan().all()


# ---------------------------------------------------------------------------- sm_90a prefill kernel
# On a Hopper GPU the prefill tiles of f16/bf16 batches run on the wgmma kernel
# (paged_attention/prefill_sm90.cuh) whenever the library holds sm_90a code, so every prefill-like
# test above already runs it there; these add the shapes it is most likely to get wrong (tile edges,
# tokens x heads rows that do not fill a tile, pages smaller than, straddling or not dividing a
# tile, empty KV splits, D = 256) and compare it with the mma.sync kernel on the same inputs.
def test_sm90_prefill_kernel_runs_on_hopper():
    """The default build (80;86;89;90a) and a 90a build hold sm_90a code: on compute capability
    9.x the launcher must pick the wgmma kernel; elsewhere it must not."""
    assert sm90_prefill_available() == is_hopper(), (
        f"sm_90a prefill kernel available: {sm90_prefill_available()}, "
        f"device capability {torch.cuda.get_device_capability()}"
    )


# (q_len, context_len): rows of 1, 15, 16, 17, 127, 128, 129 and 300 tokens, prefixes before them,
# a context shorter than one 128-key tile and one ending one key into a new tile.
TILE_EDGE_SPECS = (
    (129, 129),
    (1, 1),
    (16, 300),
    (17, 17),
    (127, 1000),
    (128, 257),
    (15, 40),
    (300, 300),
)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("head_dim", [64, 128, 256])
@pytest.mark.parametrize(
    ("num_q_heads", "num_kv_heads"),
    [(32, 8), (8, 8), (12, 4), (64, 4)],  # 16 / 128 / 42 (126 rows) / 8 tokens per 128-row tile
)
def test_prefill_tile_edges_and_gqa(dtype, head_dim, num_q_heads, num_kv_heads):
    seed = fresh_seed()
    inputs = make_paged_inputs(
        TILE_EDGE_SPECS,
        num_q_heads,
        num_kv_heads,
        head_dim,
        16,
        dtype,
        seed,
        pad_tokens=5,
        extra_seqs=1,
    )
    check_against_reference(inputs, dtype, seed, scale=default_scale(head_dim))


@pytest.mark.parametrize("page_size", [1, 3, 5, 16, 48, 128])
def test_prefill_page_sizes(page_size):
    """Pages of 1 key, pages that do not divide a 128-key tile (3, 5, 48) and one page per tile."""
    seed = fresh_seed()
    specs = ((200, 331), (64, 64), (129, 500), (7, 130))
    inputs = make_paged_inputs(
        specs, 32, 8, 128, page_size, torch.bfloat16, seed, pad_tokens=2, shared_prefix=True
    )
    check_against_reference(inputs, torch.bfloat16, seed, scale=default_scale(128))


@pytest.mark.parametrize("head_dim", HEAD_DIMS)
@pytest.mark.parametrize("sliding_window", [None, 3000])
def test_prefill_kv_splits(head_dim, sliding_window):
    """A prefill-like batch with few blocks and long contexts: the launcher splits the key range
    (many splits, later ones empty for the shorter sequence) and merges the parts."""
    seed = fresh_seed()
    specs = ((40, 20_000), (33, 9_000))
    inputs = make_paged_inputs(specs, 8, 2, head_dim, 16, torch.bfloat16, seed, pad_tokens=1)
    check_against_reference(
        inputs, torch.bfloat16, seed, scale=default_scale(head_dim), sliding_window=sliding_window
    )


def test_prefill_many_sequences():
    """300 sequences of 1..40 query tokens: the sequence lookup, a short region (the 1-2 token
    sequences) beside prefill tiles in one launch, and tiles holding a sequence's last tokens."""
    seed = fresh_seed()
    gen = torch.Generator().manual_seed(seed)
    q_lens = torch.randint(1, 41, (300,), generator=gen).tolist()
    specs = tuple((q, q + int(torch.randint(0, 400, (1,), generator=gen))) for q in q_lens)
    inputs = make_paged_inputs(specs, 32, 8, 128, 16, torch.bfloat16, seed, pad_tokens=4)
    check_against_reference(inputs, torch.bfloat16, seed, scale=default_scale(128))


@pytest.mark.parametrize("head_dim", [128, 256])
@pytest.mark.parametrize(
    ("sliding_window", "soft_cap", "scale"),
    [(100, None, 0.1), (None, 30.0, 0.1), (129, 5.0, 0.3), (None, None, -0.05)],
)
def test_prefill_window_soft_cap_and_scale(head_dim, sliding_window, soft_cap, scale):
    """Window edges inside a tile, soft cap on every tile, and a negative scale (the kernel folds
    a positive scale into the exponent: a negative one must take the general path)."""
    seed = fresh_seed()
    specs = ((700, 900), (130, 130), (5, 300))
    inputs = make_paged_inputs(specs, 16, 4, head_dim, 16, torch.float16, seed, pad_tokens=3)
    check_against_reference(
        inputs, torch.float16, seed, scale=scale, sliding_window=sliding_window, soft_cap=soft_cap
    )


@pytest.mark.skipif(not torch.cuda.is_available() or not is_hopper(), reason="needs sm_90")
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
@pytest.mark.parametrize("cache", ["bf16", "fp8"])
def test_sm90_and_mma_prefill_kernels_agree(head_dim, cache):
    """The same inputs through both prefill kernels: each matches the reference, and they agree
    with each other to the rounding of 16-bit P (D = 256 and fp8 caches: against the 64-row
    mma.sync kernel)."""
    assert sm90_prefill_available(), "no sm_90a code in this library"
    seed = fresh_seed()
    specs = ((1000, 1500), (300, 300), (1, 2000), (77, 77))
    inputs = make_paged_inputs(specs, 32, 8, head_dim, 16, torch.bfloat16, seed, pad_tokens=2)
    scales = {}
    if cache == "fp8":
        inputs, scales = with_fp8_cache(inputs), FP8_SCALES
    scale = default_scale(head_dim)
    with prefill_kernel(1):
        new = check_against_reference(inputs, torch.bfloat16, seed, scale=scale, **scales)
    with prefill_kernel(0):
        old = check_against_reference(inputs, torch.bfloat16, seed, scale=scale, **scales)
    assert rel_l2(new, old) < 1e-2, f"seed {seed}"
    assert not torch.equal(new, old), "both runs took the same kernel"


@pytest.mark.parametrize("head_dim", [64, 128, 256])
@pytest.mark.parametrize("bad", [0, 3])
@pytest.mark.parametrize("cache", ["bf16", "fp8"])
def test_prefill_persistent_blocks_poison_one_sequence(head_dim, bad, cache):
    """Enough 128-row tiles (~470) that on Hopper the sm_90a launch is persistent (one block per
    SM, each taking further tiles from a counter): a sequence with a page out of range gets NaN
    rows, and the tiles a block takes after it (and before) stay correct."""
    seed = fresh_seed()
    specs = ((400, 700), (300, 300), (129, 1000), (500, 520), (1, 64), (480, 480))
    inputs = make_paged_inputs(specs, 32, 8, head_dim, 16, torch.bfloat16, seed, pad_tokens=3)
    scales = {}
    if cache == "fp8":
        inputs, scales = with_fp8_cache(inputs), FP8_SCALES
    expected = reference.paged_attention(
        **inputs, scale=default_scale(head_dim), **scales, compute_dtype=torch.float64
    )
    inputs["block_tables"][bad, 2] = inputs["kv_cache"].shape[0]
    out = run_cuda(inputs, scale=default_scale(head_dim), **scales)
    _assert_only_sequence_poisoned(out, expected, inputs, bad, torch.bfloat16, seed)


def _poison_unused_slots(inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """NaN in every cache slot no live sequence's context covers: the tail of each last page and
    the pages no sequence uses."""
    kv = inputs["kv_cache"]
    page_size = kv.shape[1]
    used = torch.zeros(kv.shape[:2], dtype=torch.bool)
    for i in range(int(inputs["num_seqs"][0])):
        keys = torch.arange(int(inputs["context_lens"][i]))
        pages = inputs["block_tables"][i, keys // page_size].long()
        used[pages, keys % page_size] = True
    return {**inputs, "kv_cache": kv.masked_fill(~used[:, :, None, None], float("nan"))}


@pytest.mark.parametrize("head_dim", [64, 128, 256])
@pytest.mark.parametrize("page_size", [5, 8, 16, 32, 64, 128])
@pytest.mark.parametrize("cache", ["bf16", "fp8"])
def test_prefill_whole_page_reads_skip_poisoned_slots(head_dim, page_size, cache):
    """On Hopper the sm_90a kernel reads K/V pages whole (TMA boxes of a page, or of a tile of a
    larger page; fp8 caches into a staging buffer) where the page size is a multiple of 8 that
    divides or is divided by the tile, and gathers key by key (zero-filling) the tiles that reach
    past the block's last key and every tile of other page sizes (5). NaN in the slots past each
    context and in unused pages must not reach the output."""
    seed = fresh_seed()
    specs = ((300, 1000), (129, 129), (1, 77), (64, 200), (250, 250))
    inputs = make_paged_inputs(
        specs, 32, 8, head_dim, page_size, torch.bfloat16, seed, pad_tokens=2
    )
    inputs, scales = _poison_unused_slots(inputs), {}
    if cache == "fp8":
        inputs, scales = with_fp8_cache(inputs), FP8_SCALES
    check_against_reference(inputs, torch.bfloat16, seed, scale=default_scale(head_dim), **scales)


# ---------------------------------------------------------------------------- fp8 KV cache
# The cache holds K / k_scale and V / v_scale in float8_e4m3fn, as a serving engine stores it; the
# kernels dequantise exactly (every e4m3 value is a 16-bit value), so the tolerances are the
# 16-bit ones against the float64 reference, which dequantises the same bytes.
FP8 = torch.float8_e4m3fn
FP8_SCALES = {"k_scale": 0.02, "v_scale": 0.05}


def with_fp8_cache(inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    kv = inputs["kv_cache"].float()
    kv[:, :, 0::2] /= FP8_SCALES["k_scale"]
    kv[:, :, 1::2] /= FP8_SCALES["v_scale"]
    return {**inputs, "kv_cache": kv.clamp(-448.0, 448.0).to(FP8)}


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
@pytest.mark.parametrize("kind", ["decode", "prefill", "mixed"])
def test_fp8_cache_dtypes_head_dims(dtype, head_dim, kind):
    seed = fresh_seed()
    inputs = make_paged_inputs(SPECS[kind], 8, 2, head_dim, 16, dtype, seed, pad_tokens=3)
    check_against_reference(
        with_fp8_cache(inputs), dtype, seed, scale=default_scale(head_dim), **FP8_SCALES
    )


@pytest.mark.parametrize("head_dim", [64, 128, 256])
@pytest.mark.parametrize("kind", ["decode", "mixed"])
def test_fp8_cache_bf16_queries_beyond_float16_range(head_dim, kind):
    """Decode tiles compute bf16 queries against an fp8 cache in float16, each Q row scaled by a
    power of two first: rows from 2^-70 to 2^70 (far outside float16's range), a row with one
    element 2^40 above the rest, and zero rows must all match the float64 reference."""
    seed = fresh_seed()
    inputs = make_paged_inputs(SPECS[kind], 8, 2, head_dim, 16, torch.bfloat16, seed)
    query = inputs["query"].float()
    powers = torch.tensor([-70.0, -30.0, 0.0, 12.0, 30.0, 70.0])
    rows = query.shape[0] * query.shape[1]
    query *= torch.exp2(powers[torch.arange(rows) % len(powers)]).view(*query.shape[:2], 1)
    query[0, 1] = 0.0
    query[0, 0, 3] = 2.0**40
    inputs["query"] = query.to(torch.bfloat16)
    check_against_reference(with_fp8_cache(inputs), torch.bfloat16, seed, scale=0.1, **FP8_SCALES)


@pytest.mark.parametrize(("sliding_window", "soft_cap"), [(7, None), (40, 2.0), (None, 5.0)])
@pytest.mark.parametrize("kind", ["decode", "mixed"])
def test_fp8_cache_window_and_soft_cap(sliding_window, soft_cap, kind):
    seed = fresh_seed()
    inputs = make_paged_inputs(SPECS[kind], 8, 2, 64, 16, torch.bfloat16, seed, shared_prefix=True)
    check_against_reference(
        with_fp8_cache(inputs),
        torch.bfloat16,
        seed,
        scale=0.3,
        sliding_window=sliding_window,
        soft_cap=soft_cap,
        **FP8_SCALES,
    )


@pytest.mark.parametrize("page_size", [1, 5, 32])
@pytest.mark.parametrize(("num_q_heads", "num_kv_heads"), [(8, 1), (12, 4), (6, 6)])
def test_fp8_cache_page_sizes_and_gqa(page_size, num_q_heads, num_kv_heads):
    seed = fresh_seed()
    inputs = make_paged_inputs(
        MIXED,
        num_q_heads,
        num_kv_heads,
        128,
        page_size,
        torch.float16,
        seed,
        pad_tokens=2,
        extra_seqs=2,
    )
    check_against_reference(
        with_fp8_cache(inputs), torch.float16, seed, scale=default_scale(128), **FP8_SCALES
    )


@pytest.mark.parametrize("head_dim", [64, 128, 256])
@pytest.mark.parametrize(
    ("num_q_heads", "num_kv_heads"),
    [(32, 8), (12, 4), (64, 4)],  # 16 / 42 (126 rows) / 8 tokens per 128-row tile
)
def test_fp8_cache_prefill_tile_edges_and_gqa(head_dim, num_q_heads, num_kv_heads):
    """Prefill tiles on an fp8 cache (the sm_90a kernel on Hopper): tile and page edges."""
    seed = fresh_seed()
    inputs = make_paged_inputs(
        TILE_EDGE_SPECS,
        num_q_heads,
        num_kv_heads,
        head_dim,
        16,
        torch.bfloat16,
        seed,
        pad_tokens=5,
        extra_seqs=1,
    )
    check_against_reference(
        with_fp8_cache(inputs), torch.bfloat16, seed, scale=default_scale(head_dim), **FP8_SCALES
    )


@pytest.mark.parametrize(
    ("dtype", "head_dim", "num_q_heads", "num_kv_heads", "long_context"),
    [
        (torch.bfloat16, 128, 32, 8, 17_000),
        (torch.float16, 64, 64, 4, 17_000),
        (torch.bfloat16, 64, 32, 8, 2000),
    ],
)
def test_fp8_cache_short_sequences_of_a_large_prefill_batch(
    dtype, head_dim, num_q_heads, num_kv_heads, long_context
):
    """On Hopper an fp8 cache's mixed batch runs its short sequences as decode blocks beside the
    sm_90a kernel's prefill tiles (elsewhere all of them as 64-row tiles)."""
    seed = fresh_seed()
    inputs = _short_region_inputs(
        num_q_heads, num_kv_heads, head_dim, dtype, seed, long_context, pad_tokens=3, extra_seqs=5
    )
    check_against_reference(
        with_fp8_cache(inputs), dtype, seed, scale=default_scale(head_dim), **FP8_SCALES
    )


@pytest.mark.parametrize("specs", [((1, 20_000), (1, 4_097), (3, 9_000)), ((700, 3000), (1, 5000))])
def test_fp8_cache_long_context_split_kv(specs):
    """KV splits and their merge, on decode tiles and on 64-row tiles."""
    seed = fresh_seed()
    inputs = make_paged_inputs(specs, 8, 2, 128, 16, torch.bfloat16, seed, pad_tokens=1)
    check_against_reference(
        with_fp8_cache(inputs), torch.bfloat16, seed, scale=default_scale(128), **FP8_SCALES
    )


# ---------------------------------------------------------------------------- KV split parts
def _tie_keys_at_huge_logits(inputs: dict[str, torch.Tensor], seed: int) -> None:
    """Every query gets element 0 = 1.25 * 2^40; K element 0 is 0 in every key except tied keys,
    copies of one key with element 0 = 1: keys 0-2 of each sequence (every causal query sees one)
    and clusters of 1, 2 and 3 adjacent keys at random places (so KV splits hold unequal numbers
    of them). The tied logits are ~1e11, where a float32 ulp (16384) exceeds log2 of any key
    count, and their product with scale * log2(e) is inexact (1.25: not a power of two): the
    output is the mean of the visible tied keys' V rows, weighed per key, not per split."""
    gen = torch.Generator().manual_seed(seed ^ 0x5EED)
    query = inputs["query"].float()
    query[..., 0] = 1.25 * 2.0**40
    inputs["query"] = query.to(inputs["query"].dtype)
    kv = inputs["kv_cache"].float()
    page_size = kv.shape[1]
    kv[:, :, 0::2, 0] = 0.0
    tie = kv[0, 0, 0].clone()
    tie[0] = 1.0
    for i in range(int(inputs["num_seqs"][0])):
        context = int(inputs["context_lens"][i])
        # groups of 4 keys; group 0 holds keys 0-2, the clusters start in 3 others
        groups = (1 + torch.randperm(max(context // 4 - 1, 0), generator=gen))[:3].tolist()
        clusters = [range(4 * g, 4 * g + n) for g, n in zip(groups, (1, 2, 3), strict=False)]
        for key in [0, 1, 2][:context] + [key for cluster in clusters for key in cluster]:
            kv[inputs["block_tables"][i, key // page_size], key % page_size, 0::2] = tie
    inputs["kv_cache"] = kv.to(inputs["kv_cache"].dtype)


@pytest.mark.parametrize(
    ("batch", "dtype", "head_dim", "prefill_kernel"),
    [
        ("decode", torch.float32, 128, -1),  # the f32 kernel
        ("decode", torch.bfloat16, 128, -1),  # decode tiles: key-split warps, then KV splits
        ("decode", torch.bfloat16, 256, -1),
        ("decode", FP8, 128, -1),  # decode tiles on an fp8 cache (queries scaled to float16)
        ("prefill", torch.float32, 128, -1),
        ("prefill", torch.bfloat16, 128, -1),  # the sm_90a kernel on Hopper
        ("prefill", torch.bfloat16, 128, 0),  # the mma.sync prefill kernel
        ("prefill", torch.bfloat16, 256, -1),  # the sm_90a kernel on Hopper, else 64-row tiles
        ("prefill", torch.bfloat16, 256, 0),  # 64-row tiles
        ("prefill", FP8, 128, -1),  # the sm_90a kernel on Hopper, else 64-row tiles
        ("prefill", FP8, 128, 0),  # 64-row tiles on an fp8 cache
        ("short", torch.bfloat16, 128, -1),  # the short region's split parts and their merge
    ],
)
def test_split_parts_weigh_keys_not_parts_at_huge_logits(batch, dtype, head_dim, prefill_kernel):
    """KV split parts keep their softmax maximum and sum apart: stored as one float32
    max + log2(sum), logits past ~2^24 lose the sum and the merge weighs each part 1 : 1. The
    sm_90a kernel scales such tiles before the exponent (its one-FFMA form exp2(s * scale - max)
    leaves the rounding error of the largest product in the exponent: rows of 0 at ~1e11)."""
    seed = fresh_seed()
    compute = torch.bfloat16 if dtype == FP8 else dtype
    if batch == "short":
        inputs = _short_region_inputs(32, 8, head_dim, compute, seed)
    else:
        specs = {"decode": ((1, 3000), (1, 1200), (1, 40)), "prefill": ((40, 5000), (33, 2000))}
        inputs = make_paged_inputs(specs[batch], 8, 2, head_dim, 16, compute, seed, pad_tokens=1)
    _tie_keys_at_huge_logits(inputs, seed)
    scales = {}
    if dtype == FP8:
        inputs, scales = with_fp8_cache(inputs), FP8_SCALES
    with prefill_kernel(prefill_kernel):
        check_against_reference(inputs, compute, seed, scale=default_scale(head_dim), **scales)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("head_dim", [64, 128, 256])
@pytest.mark.parametrize("kind", ["decode", "prefill"])
def test_fp8_cache_every_byte_value_comes_out_exactly(dtype, head_dim, kind):
    """One-key sequences have softmax weight exactly 1, so each of their output rows is V's row,
    dequantised: all 256 e4m3 bytes (subnormals, both zeros and NaN included) must come out as
    themselves. kind "prefill" adds a long sequence, so 64-row tiles convert the same bytes."""
    seed = fresh_seed()
    num_kv_heads = 2
    per_seq = num_kv_heads * head_dim
    num_one_key = max(2, -(-512 // per_seq))  # every byte value at least twice
    specs = ((1, 1),) * num_one_key + (((200, 200),) if kind == "prefill" else ())
    inputs = with_fp8_cache(make_paged_inputs(specs, 4, num_kv_heads, head_dim, 16, dtype, seed))
    cache_bytes = inputs["kv_cache"].view(torch.uint8)
    pages = inputs["block_tables"][:num_one_key, 0].long()
    assert len(set(pages.tolist())) == num_one_key
    values = torch.arange(num_one_key * per_seq, dtype=torch.int64).remainder(256).to(torch.uint8)
    cache_bytes[pages, 0, 1::2, :] = values.view(num_one_key, num_kv_heads, head_dim)
    out = run_cuda(inputs, scale=default_scale(head_dim), k_scale=1.0, v_scale=1.0)
    rows = inputs["query_start_loc"][:num_one_key].long()  # the one-key sequences' tokens
    expected = values.view(torch.float8_e4m3fn).to(dtype).view(num_one_key, num_kv_heads, 1, -1)
    expected = expected.expand(-1, -1, 2, -1).reshape(num_one_key, 4, head_dim)  # 2 q heads each
    got = out[rows]
    assert torch.equal(got.isnan(), expected.isnan()), f"seed {seed}"
    assert torch.equal(got.nan_to_num(), expected.nan_to_num()), f"seed {seed}"


@pytest.mark.parametrize("part", ["key", "value"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("kind", ["decode", "prefill"])
def test_fp8_cache_nan_stays_nan(part, dtype, kind):
    """A NaN byte at key 0 of kv head 0 in sequence 0 (a key every row of that sequence sees):
    as in the reference, a NaN key poisons those rows and a NaN value its column; the rest is
    untouched."""
    seed = fresh_seed()
    inputs = with_fp8_cache(make_paged_inputs(SPECS[kind], 8, 2, 128, 16, dtype, seed))
    page = int(inputs["block_tables"][0, 0])
    inputs["kv_cache"].view(torch.uint8)[page, 0, 0 if part == "key" else 1, 5] = 0x7F
    expected = reference.paged_attention(
        **inputs, scale=0.1, compute_dtype=torch.float64, **FP8_SCALES
    )
    out = run_cuda(inputs, scale=0.1, **FP8_SCALES)
    assert expected.isnan().any()
    assert torch.equal(out.isnan(), expected.isnan()), f"seed {seed}"
    finite = ~expected.isnan()
    assert rel_l2(out[finite], expected[finite]) < TOLERANCE[dtype], f"seed {seed}"


def test_fp8_cache_agrees_with_the_host_handler():
    """The same fp8 bytes through the CUDA kernels and the C++ host handler (the CPU op)."""
    seed = fresh_seed()
    inputs = with_fp8_cache(make_paged_inputs(MIXED, 8, 2, 128, 16, torch.bfloat16, seed))
    on_host = torch.ops.xla_gpu.paged_attention(**inputs, scale=0.1, **FP8_SCALES)[0]
    assert rel_l2(run_cuda(inputs, scale=0.1, **FP8_SCALES), on_host) < 1e-2, f"seed {seed}"


def test_fp8_cache_with_a_float32_query_is_refused_naming_the_host_paths():
    inputs = with_fp8_cache(make_paged_inputs(DECODE, 8, 2, 64, 16, torch.float32, fresh_seed()))
    with pytest.raises(
        TypeError, match="kv_cache: float8_e4m3fn with a float32 query runs on the host"
    ):
        run_cuda(inputs, scale=0.1)


# ---------------------------------------------------------------------------- attention sinks
# Every place a row is finished: decode tiles with one split and with several (the merge), the
# 64-row tiles, the mma.sync prefill tiles, the sm_90a prefill tiles, the short region of a large
# prefill batch, the f32 kernel; a sink joins each row's denominator once, never a split's part.
SINK_SPECS = {
    "decode": DECODE,
    "decode_split": ((1, 20_000), (1, 4_097), (3, 9_000)),  # long contexts: KV splits, merged
    "prefill": PREFILL,
    "prefill_split": ((300, 300), (1_000, 12_000)),  # a prefill with KV splits
    "mixed": MIXED,
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
@pytest.mark.parametrize("kind", list(SINK_SPECS))
def test_sinks_every_path(kind, head_dim, dtype):
    seed = fresh_seed()
    inputs = make_paged_inputs(
        SINK_SPECS[kind], 8, 2, head_dim, 16, dtype, seed, pad_tokens=3, extra_seqs=1, sinks=True
    )
    check_against_reference(inputs, dtype, seed, scale=default_scale(head_dim))


@pytest.mark.parametrize(("sliding_window", "soft_cap"), [(128, None), (7, 5.0)])
@pytest.mark.parametrize("kind", ["decode", "prefill", "mixed"])
def test_sinks_with_window_and_soft_cap(kind, sliding_window, soft_cap):
    """gpt-oss's layers: sinks with a 128-token window; the sink is neither scaled nor capped."""
    seed = fresh_seed()
    inputs = make_paged_inputs(SINK_SPECS[kind], 64, 8, 64, 16, torch.bfloat16, seed, sinks=True)
    check_against_reference(
        inputs, torch.bfloat16, seed, scale=0.125, sliding_window=sliding_window, soft_cap=soft_cap
    )


@pytest.mark.skipif(not torch.cuda.is_available() or not is_hopper(), reason="needs sm_90")
@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_sinks_both_prefill_kernels(head_dim):
    assert sm90_prefill_available(), "no sm_90a code in this library"
    seed = fresh_seed()
    specs = ((1000, 1500), (300, 300), (1, 2000), (77, 77))
    inputs = make_paged_inputs(
        specs, 32, 8, head_dim, 16, torch.bfloat16, seed, pad_tokens=2, sinks=True
    )
    for kernel in (1, 0):
        with prefill_kernel(kernel):
            check_against_reference(inputs, torch.bfloat16, seed, scale=default_scale(head_dim))


@pytest.mark.parametrize("long_context", [17_000, 2000])  # several short splits, one
def test_sinks_short_sequences_of_a_large_prefill_batch(long_context):
    seed = fresh_seed()
    inputs = _short_region_inputs(32, 8, 128, torch.bfloat16, seed, long_context, pad_tokens=3)
    inputs["sinks"] = torch.randn(32, generator=torch.Generator().manual_seed(seed)) + 2.0
    check_against_reference(inputs, torch.bfloat16, seed, scale=default_scale(128))


@pytest.mark.parametrize("head_dim", [64, 128, 256])
@pytest.mark.parametrize("kind", ["decode", "prefill", "mixed"])
def test_sinks_with_an_fp8_cache(kind, head_dim):
    seed = fresh_seed()
    inputs = make_paged_inputs(
        SINK_SPECS[kind], 8, 2, head_dim, 16, torch.bfloat16, seed, sinks=True
    )
    check_against_reference(
        with_fp8_cache(inputs), torch.bfloat16, seed, scale=default_scale(head_dim), **FP8_SCALES
    )


@pytest.mark.parametrize(("sinks", "cache"), [(False, "fp8"), (True, "bf16"), (True, "fp8")])
@pytest.mark.parametrize("corruption", ["page_out_of_range", "context_too_long"])
@pytest.mark.parametrize("kind", ["decode", "prefill"])
def test_bad_sequence_with_fp8_or_sinks_gets_nan_rows(kind, corruption, sinks, cache):
    """Bad metadata with an fp8 cache, with sinks, or both: the bad sequence's rows are NaN (a
    sink does not turn them into numbers), the other rows stay right. The self-checking decode
    tiles and the prep kernel before 64-row tiles guard fp8 too; a 16-bit cache on Hopper goes
    through both prefill kernels."""
    seed = fresh_seed()
    specs = (
        ((2, 40), (1, 17), (3, 3), (1, 64)) if kind == "decode" else ((20, 40), (9, 17), (30, 64))
    )
    inputs = make_paged_inputs(specs, 4, 2, 64, 16, torch.bfloat16, seed, pad_tokens=2, sinks=sinks)
    scales = {}
    if cache == "fp8":
        inputs, scales = with_fp8_cache(inputs), FP8_SCALES
    expected = reference.paged_attention(**inputs, scale=0.2, compute_dtype=torch.float64, **scales)
    bad = 1
    if corruption == "page_out_of_range":
        inputs["block_tables"][bad, 1] = inputs["kv_cache"].shape[0]
    else:
        inputs["context_lens"][bad] = inputs["block_tables"].shape[1] * 16 + 1
    both = kind == "prefill" and cache == "bf16" and is_hopper()
    for kernel in (1, 0) if both else (-1,):
        with prefill_kernel(kernel):
            out = run_cuda(inputs, scale=0.2, **scales)
        _assert_only_sequence_poisoned(out, expected, inputs, bad, torch.bfloat16, seed)


@pytest.mark.parametrize("kind", ["decode", "decode_split", "prefill", "mixed"])
def test_sinks_at_their_limits(kind):
    """A sink far above every logit takes the whole softmax (output ~0); a sink of -inf takes
    none (the output without sinks, bit for bit); sinks=None is that output too."""
    seed = fresh_seed()
    inputs = make_paged_inputs(SINK_SPECS[kind], 8, 2, 128, 16, torch.bfloat16, seed, pad_tokens=2)
    plain = run_cuda(inputs, scale=default_scale(128))
    none = run_cuda({**inputs, "sinks": torch.full((8,), float("-inf"))}, scale=default_scale(128))
    assert torch.equal(none, plain), f"seed {seed}"
    assert torch.equal(run_cuda(inputs, scale=default_scale(128), sinks=None), plain)
    huge = run_cuda({**inputs, "sinks": torch.full((8,), 1e4)}, scale=default_scale(128))
    assert torch.isfinite(huge).all(), f"seed {seed}"
    assert huge.abs().max() < 1e-30, f"seed {seed}"


def test_sinks_errors_name_the_argument():
    inputs = {
        k: t.cuda()
        for k, t in make_paged_inputs(DECODE, 8, 2, 64, 16, torch.bfloat16, fresh_seed()).items()
    }
    call = torch.ops.xla_gpu.paged_attention
    with pytest.raises(ValueError, match="sinks: on cpu"):
        call(**inputs, scale=0.1, sinks=torch.zeros(8))
    with pytest.raises(TypeError, match="sinks: dtype"):
        call(**inputs, scale=0.1, sinks=torch.zeros(8, device="cuda", dtype=torch.bfloat16))
    with pytest.raises(ValueError, match=r"sinks: shape must be \(8,\)"):
        call(**inputs, scale=0.1, sinks=torch.zeros(4, device="cuda"))
