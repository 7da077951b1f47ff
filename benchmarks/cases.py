"""Benchmark cases: shapes, the bytes and FLOPs each must move, and random device inputs.

A case is a ragged batch in the torch_xla ragged_paged_attention layout (docs/DESIGN.md): one
(q_len, context_len) per sequence. Decode rows have q_len 1; prefill rows q_len == context_len
(causal); the mixed row holds both. Speculative decoding's verify step, kind "spec_decode", is a
decode row with q_len 2-8 (`_q4`: 4 query tokens per sequence, causal among themselves after the
cached context): a kind of its own, since the one-token decode peers (FlashInfer's decode wrapper,
Pallas) do not take it and its verdict differs. The "overhead" kind times simple_add / a small
decode inside an XLA program against the same kernel launched eagerly; "host_cost" times the
host's part of one eager call on a tiny decode (benchmarks/host_cost.py).

A case may add a variant, named after the head dim: an fp8 KV cache (`_fp8`: float8_e4m3fn holding
K / K_SCALE and V / V_SCALE), attention sinks (`_sinks`: one float32 logit per query head) and a
sliding window (`_w128`: each query sees its last 128 keys, itself included); a plain row's name
is not part of its variant's, so `--cases NAME` does not take both. A spec_decode row's `_q<N>`
follows the variant, before the page size, for the same reason. The gpt-oss rows (Hq 64 /
Hkv 8, D 64) carry sinks, with and without the window.
"""

from __future__ import annotations

import dataclasses
import math
import random
import re
from dataclasses import dataclass, field

DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4, "float8_e4m3fn": 1}
ANCHOR = "decode_B32_ctx4k_h32-8_d128_p16"
FP8 = "float8_e4m3fn"
# Dequantisation scales of an fp8 cache: powers of two, so the dequantised values are exact in 16
# bits (fp8_copy's 16-bit twin holds exactly what the fp8 cache means).
K_SCALE, V_SCALE = 2.0**-5, 2.0**-4
FP8_MAX = 448.0  # float8_e4m3fn's largest finite value
# Sinks are drawn around this logit: exp(6) is ~6 % of the softmax mass of 4k random keys (logits
# ~ N(0, 1)) and most of it within a 128-key window, so a peer that dropped them fails the checks.
SINK_LOGIT_MEAN = 6.0
# What a case's variant asks of a peer (Case.features), as NotApplicable reasons name it.
FP8_FEATURE = "an fp8 KV cache"
SINKS_FEATURE = "attention sinks"
WINDOW_FEATURE = "a sliding window"
SPEC_DECODE = "spec_decode"  # the kind of a speculative-decoding verify row (q_len > 1)
SPEC_Q_LENS = (2, 4, 8)  # query tokens per sequence of the verify rows (draft tokens + 1)


@dataclass(frozen=True)
class Case:
    name: str
    # "decode" | SPEC_DECODE | "mixed" | "prefill" | "simple_add" | "overhead_decode" | "host_cost"
    kind: str
    seqs: tuple[tuple[int, int], ...] = ()  # (q_len, context_len) per sequence
    num_q_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    page_size: int = 16
    dtype: str = "bfloat16"  # the query's and the output's (and the cache's, unless kv_dtype)
    num_elements: int = 0  # simple_add only
    slow_peers: bool = False  # run every peer (slow ones included) on this case
    tags: tuple[str, ...] = field(default=())
    kv_dtype: str = ""  # the cache's dtype: "" = dtype; FP8 = float8_e4m3fn with K_SCALE, V_SCALE
    sinks: bool = False  # a float32 [Hq] sinks operand (inputs["sinks"])
    sliding_window: int | None = None  # keys each query sees, itself included (None: all)

    # ---- shape facts
    @property
    def batch(self) -> int:
        return len(self.seqs)

    @property
    def num_tokens(self) -> int:
        return sum(q for q, _ in self.seqs)

    @property
    def uniform(self) -> bool:
        """All sequences share one (q_len, context_len): dense peers apply without masks."""
        return len(set(self.seqs)) == 1

    @property
    def elem_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype]

    @property
    def cache_dtype(self) -> str:
        return self.kv_dtype or self.dtype

    @property
    def kv_fp8(self) -> bool:
        return self.cache_dtype == FP8

    @property
    def kv_token_bytes(self) -> int:
        return 2 * self.num_kv_heads * self.head_dim * DTYPE_BYTES[self.cache_dtype]

    @property
    def features(self) -> tuple[str, ...]:
        """What the variant asks of an implementation beyond plain causal attention."""
        wanted = (
            (self.kv_fp8, FP8_FEATURE),
            (self.sinks, SINKS_FEATURE),
            (self.sliding_window is not None, WINDOW_FEATURE),
        )
        return tuple(name for present, name in wanted if present)

    def visible_keys(self, q_len: int, ctx: int) -> int:
        """Keys one sequence's queries see together: the window cuts the older ones."""
        return ctx if self.sliding_window is None else min(ctx, q_len - 1 + self.sliding_window)

    @property
    def pages_per_seq(self) -> int:
        return max(-(-ctx // self.page_size) for _, ctx in self.seqs)

    @property
    def num_pages_used(self) -> int:
        return sum(-(-ctx // self.page_size) for _, ctx in self.seqs)

    @property
    def kv_cache_bytes(self) -> int:
        """Bytes of the allocated cache (whole pages, plus the spare pages the builder adds)."""
        return (self.num_pages_used + SPARE_PAGES) * self.page_size * self.kv_token_bytes

    def bytes_needed(self) -> int:
        """The fewest bytes the op must move: each needed KV token, q and out once, metadata."""
        if self.kind == "simple_add":
            return 3 * self.num_elements * self.elem_bytes
        kv = sum(self.visible_keys(q, ctx) for q, ctx in self.seqs) * self.kv_token_bytes
        q_out = 2 * self.num_tokens * self.num_q_heads * self.head_dim * self.elem_bytes
        metadata = 4 * (self.num_pages_used + 2 * self.batch + 2)
        sinks = 4 * self.num_q_heads if self.sinks else 0
        return kv + q_out + metadata + sinks

    def flops(self) -> int:
        """2 FLOPs per multiply-add, QK^T and PV, over the causal (query, key) pairs only."""
        if self.kind == "simple_add":
            return self.num_elements
        pairs = 0
        for q_len, ctx in self.seqs:
            # row r (0-based) sees ctx - q_len + r + 1 keys, at most the window's: the first
            # `full` rows see all theirs
            past = ctx - q_len
            window = self.sliding_window or ctx
            full = max(0, min(q_len, window - past))
            pairs += full * past + full * (full + 1) // 2 + (q_len - full) * window
        return 4 * pairs * self.num_q_heads * self.head_dim

    def params(self) -> dict:
        if self.kind == "simple_add":
            return {"num_elements": self.num_elements, "dtype": self.dtype}
        contexts = [ctx for _, ctx in self.seqs]
        return {
            "batch": self.batch,
            "num_tokens": self.num_tokens,
            "context_min": min(contexts),
            "context_max": max(contexts),
            "num_q_heads": self.num_q_heads,
            "num_kv_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "page_size": self.page_size,
            "dtype": self.dtype,
            # the variant, where there is one (records of plain cases stay as they were)
            **({"kv_dtype": self.kv_dtype} if self.kv_dtype else {}),
            **({"sinks": True} if self.sinks else {}),
            **({"sliding_window": self.sliding_window} if self.sliding_window else {}),
        }


SPARE_PAGES = 3


def _k(n: int) -> str:
    return f"{n // 1024}k" if n % 1024 == 0 else str(n)


def _variant_tag(kv_dtype: str = "", sinks: bool = False, sliding_window: int | None = None) -> str:
    """A case's variant (the Case fields of the same names) in its name, after the head dim."""
    return (
        ("_fp8" if kv_dtype == FP8 else "")
        + ("_sinks" if sinks else "")
        + (f"_w{sliding_window}" if sliding_window else "")
    )


def _q_tag(q_len: int) -> str:
    """A spec_decode row's query tokens per sequence in its name, after the variant."""
    return f"_q{q_len}" if q_len > 1 else ""


def decode_case(
    batch: int,
    context: int,
    heads: tuple[int, int],
    head_dim=128,
    page_size=16,
    slow_peers=False,
    tags=(),
    q_len: int = 1,
    **variant,
) -> Case:
    """variant: kv_dtype, sinks, sliding_window (Case fields; _variant_tag names them).
    q_len > 1: a speculative-decoding verify row (kind SPEC_DECODE), `context` counting the new
    tokens as ours does (they are the last q_len of it)."""
    hq, hkv = heads
    tag = _variant_tag(**variant) + _q_tag(q_len)
    name = f"decode_B{batch}_ctx{_k(context)}_h{hq}-{hkv}_d{head_dim}{tag}_p{page_size}"
    return Case(
        name,
        "decode" if q_len == 1 else SPEC_DECODE,
        ((q_len, context),) * batch,
        hq,
        hkv,
        head_dim,
        page_size,
        slow_peers=slow_peers or name == ANCHOR,
        tags=tuple(tags),
        **variant,
    )


def mixed_case(heads=(32, 8), head_dim: int = 128, seed: int = 1234, **variant) -> Case:
    """4 prefills of 512–2k tokens + 60 decodes over 1k–8k contexts (fixed seed: reproducible)."""
    hq, hkv = heads
    rng = random.Random(seed)
    prefills = [(n, n) for n in (rng.randrange(512, 2049) for _ in range(4))]
    decodes = [(1, rng.randrange(1024, 8193)) for _ in range(60)]
    seqs = prefills + decodes
    rng.shuffle(seqs)
    return Case(
        f"mixed_4prefill_60decode_h{hq}-{hkv}_d{head_dim}{_variant_tag(**variant)}_p16",
        "mixed",
        tuple(seqs),
        hq,
        hkv,
        head_dim,
        slow_peers=True,
        **variant,
    )


def prefill_case(batch: int, length: int, head_dim: int = 128, heads=(32, 8), **variant) -> Case:
    """A causal prefill batch; the plain D=128 rows also run the slow peers."""
    hq, hkv = heads
    tag = _variant_tag(**variant)
    return Case(
        f"prefill_B{batch}_len{_k(length)}_h{hq}-{hkv}_d{head_dim}{tag}_p16",
        "prefill",
        ((length, length),) * batch,
        hq,
        hkv,
        head_dim=head_dim,
        slow_peers=head_dim == 128 and not tag,
        **variant,
    )


def host_cost_case() -> Case:
    """A decode so small that the host is the bottleneck of an eager call."""
    return Case("host_cost_decode_B1_ctx256_h32-8_d128_p16", "host_cost", ((1, 256),))


def overhead_cases() -> list[Case]:
    return [
        Case("overhead_simple_add_1M_bf16", "simple_add", num_elements=1 << 20, slow_peers=True),
        Case(
            "overhead_decode_B1_ctx1k_h32-8_d128_p16",
            "overhead_decode",
            ((1, 1024),),
            slow_peers=True,
        ),
    ]


BATCHES = (1, 8, 32, 128)
CONTEXTS = (1024, 4096, 16384, 65536)
HEADS = ((32, 8), (64, 8), (32, 32))


GPT_OSS_WINDOW = 128  # the window of gpt-oss's sliding layers (its other layers see every key)


def fp8_cases() -> list[Case]:
    """The fp8 cache on the rows of its targets: the decode anchor, causal prefill B8 x 2k and
    B1 x 8k at D 128, the mixed batch, then the prefill rows at D 64 and 256. Each has a bf16-cache
    twin in the grid (the same name without "_fp8") for its verdict."""
    prefill = [
        prefill_case(batch, length, head_dim, kv_dtype=FP8)
        for head_dim in (64, 256)
        for batch, length in ((8, 2048), (1, 8192))
    ]
    return [
        decode_case(32, 4096, (32, 8), kv_dtype=FP8),
        prefill_case(8, 2048, kv_dtype=FP8),
        prefill_case(1, 8192, kv_dtype=FP8),
        mixed_case(kv_dtype=FP8),
        *prefill,
    ]


def gpt_oss_cases(window: int | None) -> list[Case]:
    """gpt-oss's attention (Hq 64 / Hkv 8, D 64, sinks), one layer kind: decode B32 x 4k, causal
    prefill B8 x 2k and the mixed batch."""
    shape = {"head_dim": 64, "sinks": True, "sliding_window": window}
    return [
        decode_case(32, 4096, (64, 8), **shape),
        prefill_case(8, 2048, heads=(64, 8), **shape),
        mixed_case((64, 8), **shape),
    ]


def spec_decode_cases() -> list[Case]:
    """Speculative decoding's verify step, q_len 2, 4 and 8 per sequence at B32 x 4k: the decode
    anchor's shape, then gpt-oss's (sinks, its full-attention layers: with a 128-key window the
    row would read 32 x 135 keys, too few to be bound by bandwidth). Each has a q_len 1 twin in
    the full grid (spec_twin) for its verdict."""
    anchor = {"heads": (32, 8)}
    gpt_oss = {"heads": (64, 8), "head_dim": 64, "sinks": True}  # gpt_oss_cases(None)'s shape
    return [
        decode_case(32, 4096, q_len=q, **shape) for shape in (anchor, gpt_oss) for q in SPEC_Q_LENS
    ]


def spec_twin(name: str) -> str:
    """The q_len 1 row of a spec_decode row's shape: its name without `_q<N>`."""
    return re.sub(r"_q\d+(_p\d+)$", r"\1", name)


def all_cases(quick: bool) -> list[Case]:
    """Full grid, or the reduced grid of --quick (it keeps the anchor and every kind).

    The quick rows and the mixed / prefill / overhead cases come first in both, then (full run)
    the fp8, gpt-oss and spec_decode rows, so a full run cut short by --time-limit still has them;
    the rest of the grid follows.
    """
    key_decode = [
        decode_case(32, 4096, (32, 8)),  # anchor
        decode_case(1, 65536, (32, 8), slow_peers=True),
        decode_case(32, 1024, (32, 8), slow_peers=True),
        decode_case(8, 16384, (64, 8)),
        decode_case(32, 4096, (32, 32)),
        decode_case(32, 4096, (32, 8), page_size=64, slow_peers=True),
        decode_case(32, 4096, (32, 8), head_dim=64),
        decode_case(32, 4096, (32, 8), head_dim=256),
    ]
    fp8, sliding, full = fp8_cases(), gpt_oss_cases(GPT_OSS_WINDOW), gpt_oss_cases(None)
    spec = spec_decode_cases()
    # decode: the fp8 anchor, gpt-oss's sliding layer; the anchor's shape verifying 4 tokens
    quick_variants = [fp8[0], sliding[0], spec[SPEC_Q_LENS.index(4)]]
    prefill = [
        prefill_case(batch, length, head_dim)
        for head_dim in (128, 64, 256)
        for batch, length in ((1, 8192), (8, 2048))
    ]
    cases = [
        *key_decode,
        *quick_variants,
        mixed_case(),
        *overhead_cases(),
        host_cost_case(),
        *prefill,
    ]
    if not quick:
        cases += [c for c in (*fp8, *sliding, *full, *spec) if c not in quick_variants]
        names = {c.name for c in cases}
        for heads in HEADS:
            for batch in BATCHES:
                for context in CONTEXTS:
                    case = decode_case(batch, context, heads)
                    if case.name not in names:
                        cases.append(case)
    return cases


def smoke_cases() -> list[Case]:
    """Tiny shapes for the CPU smoke run: every kind and variant, so every harness code path runs."""
    decode = Case(
        "smoke_decode_B4_ctx100_h4-2_d64_p16",
        "decode",
        ((1, 100),) * 4,
        4,
        2,
        64,
        16,
        slow_peers=True,
    )
    mixed = Case(
        "smoke_mixed_h4-2_d64_p16",
        "mixed",
        ((17, 17), (1, 50), (1, 90), (5, 5)),
        4,
        2,
        64,
        16,
        slow_peers=True,
    )
    prefill = Case(
        "smoke_prefill_B2_len32_h4-2_d64_p16",
        "prefill",
        ((32, 32),) * 2,
        4,
        2,
        64,
        16,
        slow_peers=True,
    )
    return [
        decode,
        mixed,
        prefill,
        _with_variant(decode, kv_dtype=FP8),
        _with_variant(mixed, sinks=True, sliding_window=32),
        _with_q_len(decode, 4),
        Case(
            "smoke_simple_add_4k", "simple_add", num_elements=4096, dtype="float32", slow_peers=True
        ),
        Case("smoke_host_cost_B1_ctx64_h4-2_d64_p16", "host_cost", ((1, 64),), 4, 2, 64, 16),
    ]


def _with_variant(case: Case, **variant) -> Case:
    """The case with a variant, named as every case names its variant (after the head dim)."""
    head, page = case.name.rsplit("_p", 1)
    return dataclasses.replace(case, name=f"{head}{_variant_tag(**variant)}_p{page}", **variant)


def _with_q_len(case: Case, q_len: int) -> Case:
    """A decode case verifying q_len tokens per sequence (kind SPEC_DECODE), named as
    decode_case names it."""
    head, page = case.name.rsplit("_p", 1)
    seqs = tuple((q_len, ctx) for _, ctx in case.seqs)
    return dataclasses.replace(
        case, name=f"{head}{_q_tag(q_len)}_p{page}", kind=SPEC_DECODE, seqs=seqs
    )


def select_cases(cases, patterns) -> list[Case]:
    """Cases whose name contains a pattern, in the order of the patterns (each case once)."""
    if not patterns:
        return list(cases)
    chosen = []
    for pattern in patterns:
        chosen += [c for c in cases if pattern in c.name and c not in chosen]
    if not chosen:
        names = ", ".join(c.name for c in cases)
        raise SystemExit(f"--cases {patterns}: no case matches; cases are: {names}")
    return chosen


# ------------------------------------------------------------------------- inputs
def num_copies(case: Case, l2_bytes: int, cap: int) -> int:
    """Input copies to rotate over so the working set is at least 2.5x the L2 cache."""
    per_copy = case.bytes_needed()
    return max(1, min(cap, math.ceil(2.5 * l2_bytes / max(per_copy, 1))))


def build_inputs(case: Case, device, seed: int, metadata=None) -> dict:
    """Random operands on `device` (torch); pages in shuffled order; never zeros.

    `metadata` (the int32 tensors of an earlier copy, and its sinks) is reused when given, so
    copies differ in q and KV only. An fp8 case's cache is quantised (quantise_kv).
    """
    import torch

    dtype = getattr(torch, case.dtype)
    gen = torch.Generator(device=device).manual_seed(seed)
    if case.kind == "simple_add":
        a = torch.randn(case.num_elements, generator=gen, device=device, dtype=torch.float32)
        b = torch.randn(case.num_elements, generator=gen, device=device, dtype=torch.float32)
        return {"a": a.to(dtype), "b": b.to(dtype)}
    num_pages = case.num_pages_used + SPARE_PAGES
    if metadata is None:
        metadata = _build_metadata(case, num_pages, seed)
        metadata = {k: v.to(device) for k, v in metadata.items()}
    query = torch.randn(
        (case.num_tokens, case.num_q_heads, case.head_dim),
        generator=gen,
        device=device,
        dtype=dtype,
    )
    kv_cache = torch.randn(
        (num_pages, case.page_size, 2 * case.num_kv_heads, case.head_dim),
        generator=gen,
        device=device,
        dtype=dtype,
    )
    if case.kv_fp8:
        kv_cache = quantise_kv(kv_cache)
    return {"query": query, "kv_cache": kv_cache, **metadata}


def quantise_kv(kv_cache):
    """An fp8 (e4m3) cache holding K / K_SCALE at the even and V / V_SCALE at the odd combined
    heads, saturated at +-448: what our op, with k_scale and v_scale, reads as `kv_cache`."""
    import torch

    kv = kv_cache.float()
    kv[:, :, 0::2] /= K_SCALE
    kv[:, :, 1::2] /= V_SCALE
    return kv.clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)


def dequantise_kv(fp8_cache, dtype):
    """The values an fp8 cache stands for, in `dtype` (exact in 16 bits: the scales are powers
    of two)."""
    exact = fp8_cache.to(dtype)
    exact[:, :, 0::2] *= K_SCALE
    exact[:, :, 1::2] *= V_SCALE
    return exact


def fp8_copy(inputs: dict) -> tuple[dict, dict]:
    """(fp8 inputs, 16-bit inputs whose cache holds exactly the fp8 values times the scales)."""
    fp8 = quantise_kv(inputs["kv_cache"])
    exact = dequantise_kv(fp8, inputs["query"].dtype)
    return {**inputs, "kv_cache": fp8}, {**inputs, "kv_cache": exact}


def _build_metadata(case: Case, num_pages: int, seed: int) -> dict:
    import torch

    gen = torch.Generator().manual_seed(seed)
    physical = torch.randperm(num_pages, generator=gen).to(torch.int32)
    block_tables = torch.randint(
        0, num_pages, (case.batch, case.pages_per_seq), generator=gen, dtype=torch.int32
    )
    next_page = 0
    for i, (_, ctx) in enumerate(case.seqs):
        n = -(-ctx // case.page_size)
        block_tables[i, :n] = physical[next_page : next_page + n]
        next_page += n
    starts = [0]
    for q_len, _ in case.seqs:
        starts.append(starts[-1] + q_len)
    metadata = {
        "context_lens": torch.tensor([ctx for _, ctx in case.seqs], dtype=torch.int32),
        "block_tables": block_tables,
        "query_start_loc": torch.tensor(starts, dtype=torch.int32),
        "num_seqs": torch.tensor([case.batch], dtype=torch.int32),
    }
    if case.sinks:  # a per-head parameter, like the page table one for every copy
        metadata["sinks"] = torch.randn(case.num_q_heads, generator=gen) + SINK_LOGIT_MEAN
    return metadata


OPERANDS = ("query", "kv_cache", "context_lens", "block_tables", "query_start_loc", "num_seqs")


def scale_of(case: Case) -> float:
    return 1.0 / math.sqrt(case.head_dim)


def kv_scales(case: Case) -> dict:
    """k_scale and v_scale of an fp8 cache (logits x k_scale, out x v_scale); none for 16 bits."""
    return {"k_scale": K_SCALE, "v_scale": V_SCALE} if case.kv_fp8 else {}


def op_attributes(case: Case) -> dict:
    """Our op's attributes for the case: the softmax scale, the window, an fp8 cache's scales."""
    return {"scale": scale_of(case), "sliding_window": case.sliding_window, **kv_scales(case)}


def op_operands(inputs: dict) -> dict:
    """Our op's operands by name: the six of every call, and the sinks where the case has them."""
    return {name: inputs[name] for name in (*OPERANDS, "sinks") if name in inputs}


def rel_l2(out, expected) -> float:
    """Relative L2 error of an output against the expected one, in float64 (NaN if `out` holds a
    non-finite value)."""
    import torch

    if out.shape != expected.shape:
        raise ValueError(f"output shape {tuple(out.shape)} != expected {tuple(expected.shape)}")
    out, expected = out.double(), expected.double()
    if not torch.isfinite(out).all():
        return float("nan")
    return float((out - expected).norm() / expected.norm().clamp_min(1e-30))
