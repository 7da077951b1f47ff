"""Implementations under test: ours through each front end, and the peers we compare against.

Each `prepare_<impl>(env, case, copies)` returns a Runner built from the case's input copies
(torch tensors, see cases.build_inputs) or raises NotApplicable (the impl does not cover this
case) / any other exception (recorded as "failed: <reason>"; the run goes on).

Ours (every call through benchmarks/ours.py):
        xgo_torch          torch.ops.xla_gpu.paged_attention / simple_add on CUDA tensors (eager)
        xgo_torch_nograph  the same, timed as a plain eager loop (launch cost included)
        xgo_jax_graph      jax.ffi custom call in a jitted program, CUDA graphs on
                           (command buffers incl. CUSTOM_CALL, min graph size 1)
        xgo_jax_nograph    the same with command buffers off (--xla_gpu_enable_command_buffer=)
        xgo_torchax        torch.ops.xla_gpu.* lowered by torchax, jitted (graph options as above)
Peers:  torch_sdpa_contiguous  torch SDPA on contiguous (un-paged) K/V of the same data
        torch_gather_sdpa      gather the pages, then SDPA (gather inside the timed region)
        torch_flex_paged       FlexAttention over the paged cache (BlockMask from the page table)
        jax_pallas_paged       jax.experimental.pallas.ops.gpu.paged_attention (decode)
        jax_composite          XLA-native gather + einsum + softmax (decode)
        flashinfer_decode      FlashInfer batch decode, paged KV, tensor cores (benchmarks/flashinfer_peer.py)
        flashinfer_xqa         FlashInfer's XQA decode (vLLM's decode kernel on Hopper; spec decode)
        flashinfer_prefill     FlashInfer batch prefill, paged KV, FA3 on sm_90 (prefill, mixed,
                               spec decode)
        reference              xla_gpu_ops.reference on the CPU (smoke runs only)

Speculative decoding's verify rows (cases.SPEC_DECODE: q_len > 1 per sequence, causal among the
new tokens) are listed for the decode peers too: those that take one query token per sequence
(FlashInfer's decode wrapper, Pallas, the composite, FlexAttention here) say so (n/a).

A case's variant (cases.Case.features: an fp8 cache, sinks, a sliding window) goes to ours and
the reference as attributes and the sinks operand (cases.op_attributes, op_operands) and to
FlashInfer as its own arguments; a peer without the feature is not applicable, and says so.
"""

from __future__ import annotations

import math
import os
import sys
import warnings
from collections.abc import Callable
from dataclasses import dataclass

from benchmarks import flashinfer_peer, ours
from benchmarks.cases import (
    FP8_FEATURE,
    SINKS_FEATURE,
    SPEC_DECODE,
    WINDOW_FEATURE,
    Case,
    dequantise_kv,
    op_attributes,
    op_operands,
    scale_of,
)
from benchmarks.runners import BenchEnv, NotApplicable, Runner, canon

# XLA options per compile (jax.jit compiler_options). XLA's defaults (jax 0.11 / XLA 2026) record
# FUSION, CUBLAS, CUBLASLT, CUSTOM_CALL, CUDNN into command buffers but only for regions of at
# least 5 commands (xla_gpu_graph_min_graph_size), so a program of one custom call would never be
# captured; min size 1 captures it. An empty command-buffer list turns CUDA graphs off.
GRAPH_OPTIONS = {
    "xla_gpu_enable_command_buffer": "FUSION,CUBLAS,CUBLASLT,CUSTOM_CALL,CUDNN",
    "xla_gpu_graph_min_graph_size": 1,
}
NOGRAPH_OPTIONS = {"xla_gpu_enable_command_buffer": ""}


def _paged_kind(case: Case) -> str:
    return "decode" if case.kind == "overhead_decode" else case.kind


def _is_overhead(case: Case) -> bool:
    return case.kind in ("simple_add", "overhead_decode")


def _refuse_several_queries(case: Case, why: str) -> None:
    """NotApplicable on a speculative-decoding row for a peer that takes one query per sequence."""
    if case.kind == SPEC_DECODE:
        raise NotApplicable(f"one query token per sequence ({why})")


def _refuse_features(case: Case, *supported: str, reasons: dict | None = None) -> None:
    """NotApplicable naming the case's features (Case.features) this peer lacks, and why where
    `reasons` (feature -> text) says."""
    missing = [feature for feature in case.features if feature not in supported]
    if missing:
        raise NotApplicable("; ".join((reasons or {}).get(f, f"cannot take {f}") for f in missing))


# ------------------------------------------------------------------------------ ours: torch
def prepare_xgo_torch(env: BenchEnv, case: Case, copies: list[dict], graph: bool = True) -> Runner:
    if not env.on_gpu:
        raise NotApplicable("needs a CUDA GPU (the CUDA kernel of the torch op)")
    if case.kind == "simple_add":

        def make(c):
            return lambda: ours.op_simple_add(c["a"], c["b"])
    else:
        attrs = op_attributes(case)

        def make(c):
            operands = op_operands(c)
            return lambda: ours.op_paged_attention(**operands, **attrs)

    calls = [make(c) for c in copies]
    return Runner("torch", lambda: canon(calls[0]()), calls=calls, graph=graph)


def prepare_xgo_torch_nograph(env, case, copies):
    return prepare_xgo_torch(env, case, copies, graph=False)


# ------------------------------------------------------------------------------ jax programs
def _chain_program(env: BenchEnv, op: Callable, num_sets: int, chain: int, options: dict | None):
    """jit(program(carry, sets)): `chain` calls of op, each reading set i % num_sets."""

    def program(carry, sets):
        for i in range(chain):
            carry = op(carry, sets[i % num_sets])
        return carry

    if options:
        return env.jax.jit(program, compiler_options=options)
    return env.jax.jit(program)


def _jax_runner(
    env: BenchEnv,
    op: Callable,
    carry0,
    sets: list,
    options: dict | None,
    notes: str = "",
    overhead: bool = False,
) -> Runner:
    jax = env.jax
    # Enough calls per program that one dispatch is small next to the device work; the tiny
    # overhead cases get 64 so launch gaps, not Python, dominate what is measured.
    min_chain = 64 if overhead else 8
    chain = len(sets) * -(-min_chain // len(sets))
    program = _chain_program(env, op, len(sets), chain, options)
    single = jax.jit(lambda c, s: op(c, s), **({"compiler_options": options} if options else {}))

    def output():
        return env.to_torch_cpu(single(carry0, sets[0]))

    def compile_for_dump(extra: dict):
        merged = {**(options or {}), **extra}
        return _chain_program(env, op, len(sets), chain, merged).lower(carry0, sets).compile()

    def make_program(n: int):
        return _chain_program(env, op, len(sets), n, options)

    return Runner(
        "jax",
        output,
        program=program,
        first_carry=carry0,
        operand_sets=sets,
        chain=chain,
        notes=notes,
        compile_for_dump=compile_for_dump,
        make_program=make_program,
    )


def _first(result):
    return result[0] if isinstance(result, tuple | list) else result


# ------------------------------------------------------------------------------ ours: jax
def _xgo_jax_op(env: BenchEnv, case: Case):
    if case.kind == "simple_add":
        return lambda a, b: _first(ours.jax_simple_add(a, b))
    attrs = op_attributes(case)
    return lambda q, s: _first(ours.jax_paged_attention(q, **s, **attrs))


def _jax_sets(env: BenchEnv, case: Case, copies: list[dict]):
    """(first query, per copy the other operands by name): the chain's carry and operand sets."""
    if case.kind == "simple_add":
        return env.to_jax(copies[0]["a"]), [env.to_jax(c["b"]) for c in copies]
    sets = [
        {name: env.to_jax(t) for name, t in op_operands(c).items() if name != "query"}
        for c in copies
    ]
    return env.to_jax(copies[0]["query"]), sets


def prepare_xgo_jax_graph(env, case, copies):
    carry, sets = _jax_sets(env, case, copies)
    return _jax_runner(
        env,
        _xgo_jax_op(env, case),
        carry,
        sets,
        GRAPH_OPTIONS,
        "CUDA graphs on (command buffer incl. CUSTOM_CALL, min graph size 1)",
        overhead=_is_overhead(case),
    )


def prepare_xgo_jax_nograph(env, case, copies):
    carry, sets = _jax_sets(env, case, copies)
    return _jax_runner(
        env,
        _xgo_jax_op(env, case),
        carry,
        sets,
        NOGRAPH_OPTIONS,
        "CUDA graphs off (xla_gpu_enable_command_buffer='')",
        overhead=_is_overhead(case),
    )


def prepare_xgo_torchax(env, case, copies):
    import torchax
    import torchax.interop

    ours.torchax_register()
    if case.kind == "simple_add":
        jax_fn = torchax.interop.jax_view(ours.op_simple_add)
        op = jax_fn
    else:
        attrs = op_attributes(case)

        def torch_fn(q, **operands):
            return ours.op_paged_attention(q, **operands, **attrs)

        jax_fn = torchax.interop.jax_view(torch_fn)

        def op(q, s):
            return jax_fn(q, **s)

    carry, sets = _jax_sets(env, case, copies)
    return _jax_runner(
        env,
        op,
        carry,
        sets,
        GRAPH_OPTIONS,
        "torchax jax_view, jitted, graphs on",
        overhead=_is_overhead(case),
    )


# ------------------------------------------------------------------------------ torch peers
def _dense_layout(case: Case, c: dict):
    """(q [B, Hq, q_len, D], long block table, pages per seq) of a uniform batch."""
    if not case.uniform:
        raise NotApplicable("ragged batch: dense layout needs one shape per batch")
    q_len, ctx = case.seqs[0]
    q4 = c["query"].view(case.batch, q_len, case.num_q_heads, case.head_dim).transpose(1, 2)
    npp = -(-ctx // case.page_size)
    return q4, c["block_tables"][:, :npp].long(), npp


def _gather_kv(case: Case, c: dict, tables, npp: int):
    """K, V as [B, Hkv, ctx, D] views of the gathered pages."""
    _, ctx = case.seqs[0]
    pages = c["kv_cache"][tables]  # [B, npp, page, 2Hkv, D]
    kv = pages.view(case.batch, npp * case.page_size, 2 * case.num_kv_heads, case.head_dim)
    kv = kv[:, :ctx]
    return kv[:, :, 0::2].transpose(1, 2), kv[:, :, 1::2].transpose(1, 2)


def _causal(q_len: int, ctx: int) -> dict:
    """SDPA's mask keywords for our causal mask, the queries being the last q_len of ctx positions.
    is_causal aligns the mask top-left (query i sees keys <= i): ours only where q_len == ctx.
    Between (speculative decoding, chunked prefill), torch's lower-right causal bias: it runs the
    flash kernel where that applies, an explicit mask would time another kernel."""
    if q_len in (1, ctx):
        return {"is_causal": q_len > 1}
    from torch.nn.attention.bias import causal_lower_right

    return {"attn_mask": causal_lower_right(q_len, ctx)}


def _canon_dense(out4, case: Case):
    """[B, Hq, q_len, D] -> [T, Hq, D]."""
    return canon(out4.transpose(1, 2).reshape(case.num_tokens, case.num_q_heads, case.head_dim))


# Why SDPA (its fast kernels: flash, memory-efficient, cuDNN) does not take a variant's feature
SDPA_LACKS = {
    FP8_FEATURE: "SDPA reads no fp8 (torch_sdpa_contiguous reads a dequantised copy)",
    SINKS_FEATURE: "SDPA has no sink logit: a padded key column and an explicit mask would time "
    "another kernel",
    WINDOW_FEATURE: "SDPA takes a window only as an explicit mask, which times another kernel",
}


def prepare_torch_sdpa_contiguous(env, case, copies):
    import torch.nn.functional as F

    if _paged_kind(case) not in ("decode", "prefill", SPEC_DECODE):
        raise NotApplicable("dense SDPA needs a uniform batch")
    _refuse_features(case, FP8_FEATURE, reasons=SDPA_LACKS)
    scale = scale_of(case)
    mask = _causal(*case.seqs[0])
    calls = []
    for c in copies:
        q4, tables, npp = _dense_layout(case, c)
        # SDPA reads no fp8: the values the fp8 cache stands for
        cache = {"kv_cache": dequantise_kv(c["kv_cache"], q4.dtype)} if case.kv_fp8 else {}
        k, v = (t.contiguous() for t in _gather_kv(case, {**c, **cache}, tables, npp))
        calls.append(
            lambda q4=q4, k=k, v=v: F.scaled_dot_product_attention(
                q4, k, v, scale=scale, enable_gqa=True, **mask
            )
        )
    dequantised = f", dequantised to {case.dtype}" if case.kv_fp8 else ""
    lower_right = "; lower-right causal bias" if "attn_mask" in mask else ""
    return Runner(
        "torch",
        lambda: _canon_dense(calls[0](), case),
        calls=calls,
        notes=f"K/V gathered once outside the timed region{dequantised}{lower_right}",
    )


def prepare_torch_gather_sdpa(env, case, copies):
    import torch
    import torch.nn.functional as F

    _refuse_features(case, reasons=SDPA_LACKS)
    scale = scale_of(case)
    if case.uniform:
        mask = _causal(*case.seqs[0])

        def make(c):
            q4, tables, npp = _dense_layout(case, c)

            def call():
                k, v = _gather_kv(case, c, tables, npp)
                return F.scaled_dot_product_attention(
                    q4, k, v, scale=scale, enable_gqa=True, **mask
                )

            return call

        calls = [make(c) for c in copies]
        return Runner("torch", lambda: _canon_dense(calls[0](), case), calls=calls)

    # ragged batch: one gather + SDPA per sequence (what a framework without a ragged kernel does)
    starts = [0]
    for q_len, _ in case.seqs:
        starts.append(starts[-1] + q_len)

    def make_ragged(c):
        tables = c["block_tables"].long()
        per_seq = []
        for i, (q_len, ctx) in enumerate(case.seqs):
            npp = -(-ctx // case.page_size)
            q4 = c["query"][starts[i] : starts[i + 1]].transpose(0, 1).unsqueeze(0)
            per_seq.append((q4, tables[i, :npp], npp, ctx, _causal(q_len, ctx)))

        def call():
            outs = []
            for q4, tab, npp, ctx, mask in per_seq:
                kv = c["kv_cache"][tab].view(
                    1, npp * case.page_size, 2 * case.num_kv_heads, case.head_dim
                )[:, :ctx]
                k, v = kv[:, :, 0::2].transpose(1, 2), kv[:, :, 1::2].transpose(1, 2)
                o = F.scaled_dot_product_attention(q4, k, v, scale=scale, enable_gqa=True, **mask)
                outs.append(o[0].transpose(0, 1))
            return torch.cat(outs)

        return call

    calls = [make_ragged(c) for c in copies]
    return Runner(
        "torch",
        lambda: canon(calls[0]()),
        calls=calls,
        notes=f"{case.batch} gathers + SDPA calls per step",
    )


def prepare_torch_flex_paged(env, case, copies):
    import torch
    from torch.nn.attention.flex_attention import BlockMask, flex_attention

    _refuse_several_queries(case, "its BlockMask here has one query block and no causal part")
    if _paged_kind(case) != "decode" or not case.uniform:
        raise NotApplicable("decode batches only")
    _refuse_features(case)
    scale = scale_of(case)
    page, hkv, d = case.page_size, case.num_kv_heads, case.head_dim
    # compiled (Triton) on a GPU; the CPU smoke run uses eager flex_attention (same code path)
    if env.on_gpu:
        flex = torch.compile(flex_attention, dynamic=False)
    else:

        def flex(*args, **kwargs):
            with warnings.catch_warnings():  # eager flex warns that it is not the fast path
                warnings.simplefilter("ignore", UserWarning)
                return flex_attention(*args, **kwargs)

    calls = []
    for c in copies:
        q4, tables, npp = _dense_layout(case, c)
        num_pages = c["kv_cache"].shape[0]
        # FlexAttention wants K and V as [1, Hkv, pages * page_size, D]: one transposed copy
        # (outside the timed region); the page table becomes the BlockMask's kv_indices.
        k_cache = c["kv_cache"][:, :, 0::2].permute(2, 0, 1, 3).reshape(1, hkv, -1, d).contiguous()
        v_cache = c["kv_cache"][:, :, 1::2].permute(2, 0, 1, 3).reshape(1, hkv, -1, d).contiguous()
        logical = torch.full((case.batch, num_pages), -1, dtype=torch.int32, device=env.device)
        rows = torch.arange(case.batch, device=env.device)[:, None]
        logical[rows, tables] = torch.arange(npp, dtype=torch.int32, device=env.device)[None, :]
        lens = c["context_lens"]

        def mask_mod(b, h, q_idx, kv_idx, logical=logical, lens=lens):
            block = logical[b, kv_idx // page]
            return (block >= 0) & (block * page + kv_idx % page < lens[b])

        kv_num_blocks = torch.full((case.batch, 1, 1), npp, dtype=torch.int32, device=env.device)
        # kv_indices hold physical page numbers, so it needs one column per physical page
        # (as torch's PagedAttention.convert_logical_block_mask does): BlockMask builds a dense
        # [.., columns] map from it, and an index past the columns is out of bounds (on a GPU, a
        # device-side assert that ends the process).
        kv_indices = torch.zeros(
            (case.batch, 1, 1, num_pages), dtype=torch.int32, device=env.device
        )
        kv_indices[:, 0, 0, :npp] = tables.to(torch.int32)
        block_mask = BlockMask.from_kv_blocks(
            kv_num_blocks,
            kv_indices,
            BLOCK_SIZE=(128, page),
            mask_mod=mask_mod,
            seq_lengths=(1, num_pages * page),
        )
        calls.append(
            lambda q4=q4, k=k_cache, v=v_cache, bm=block_mask: flex(
                q4, k, v, block_mask=bm, scale=scale, enable_gqa=True
            )
        )
    return Runner(
        "torch",
        lambda: _canon_dense(calls[0](), case),
        calls=calls,
        notes="torch.compile(flex_attention), K/V caches transposed outside timing",
    )


# ------------------------------------------------------------------------------ jax peers
def prepare_jax_pallas_paged(env, case, copies):
    _refuse_several_queries(case, "Pallas' paged_attention takes q [batch, heads, head_dim]")
    if _paged_kind(case) != "decode" or not case.uniform:
        raise NotApplicable("decode batches only")
    _refuse_features(case)
    from jax.experimental.pallas.ops.gpu import paged_attention as pallas_pa

    jnp = env.jax.numpy
    scale = scale_of(case)
    ctx = case.seqs[0][1]
    # Pallas wants [Hkv, pages, page_size, D] K and V (transposed outside the timed region) and
    # applies no softmax scale of its own: q is pre-scaled inside the program (one tiny op).
    # Its asserts: k_splits divides the pages per sequence, pages_per_compute_block the split.
    npp = -(-ctx // case.page_size)
    k_splits = math.gcd(npp, 16)
    pages_per_block = math.gcd(npp // k_splits, 8)
    sets = []
    for c in copies:
        kv = c["kv_cache"]
        k_pages = env.to_jax(kv[:, :, 0::2].permute(2, 0, 1, 3).contiguous())
        v_pages = env.to_jax(kv[:, :, 1::2].permute(2, 0, 1, 3).contiguous())
        tables = env.to_jax(c["block_tables"][:, :npp].contiguous())
        sets.append((k_pages, v_pages, tables, env.to_jax(c["context_lens"])))

    def op(q, s):
        k_pages, v_pages, tables, lens = s
        qs = (q.astype(jnp.float32) * scale).astype(q.dtype)
        # the CPU smoke run uses Pallas' interpreter (same wrapper, no Triton)
        return pallas_pa.paged_attention(
            qs,
            k_pages,
            v_pages,
            tables,
            lens,
            k_splits=k_splits,
            pages_per_compute_block=pages_per_block,
            interpret=not env.on_gpu,
        )

    return _jax_runner(
        env,
        op,
        env.to_jax(copies[0]["query"]),
        sets,
        None,
        f"k_splits={k_splits}, pages_per_compute_block={pages_per_block}, XLA defaults",
    )


def prepare_jax_composite(env, case, copies):
    _refuse_several_queries(case, "the composite is the one-query decode program")
    if _paged_kind(case) != "decode":
        raise NotApplicable("decode only (dense masks of prefill would not fit)")
    _refuse_features(case)
    jax = env.jax
    jnp = jax.numpy
    scale = scale_of(case)
    b, hq, hkv, d, page = (
        case.batch,
        case.num_q_heads,
        case.num_kv_heads,
        case.head_dim,
        case.page_size,
    )
    group = hq // hkv
    npp = case.pages_per_seq
    length = npp * page

    def op(q, s):
        kv_cache, lens, tables = s
        kv = kv_cache[tables].reshape(b, length, 2 * hkv, d)  # gather
        k, v = kv[:, :, 0::2], kv[:, :, 1::2]  # [B, L, Hkv, D]
        qg = q.reshape(b, hkv, group, d)
        logits = jnp.einsum("bhgd,blhd->bhgl", qg, k, preferred_element_type=jnp.float32) * scale
        valid = jnp.arange(length)[None, :] < lens[:, None]
        logits = jnp.where(valid[:, None, None, :], logits, -jnp.inf)
        probs = jax.nn.softmax(logits, axis=-1).astype(q.dtype)
        out = jnp.einsum("bhgl,blhd->bhgd", probs, v, preferred_element_type=jnp.float32)
        return out.reshape(b, hq, d).astype(q.dtype)

    sets = [
        (env.to_jax(c["kv_cache"]), env.to_jax(c["context_lens"]), env.to_jax(c["block_tables"]))
        for c in copies
    ]
    return _jax_runner(env, op, env.to_jax(copies[0]["query"]), sets, None, "XLA default options")


# ------------------------------------------------------------------------------ reference
def prepare_reference(env, case, copies):
    if env.on_gpu:
        raise NotApplicable("CPU smoke runs only (a per-sequence Python loop)")
    if case.kind == "simple_add":
        calls = [lambda c=c: ours.reference_simple_add(c["a"], c["b"]) for c in copies]
    else:
        attrs = op_attributes(case)
        calls = [
            lambda c=c: ours.reference_paged_attention(**op_operands(c), **attrs) for c in copies
        ]
    return Runner("torch", lambda: canon(calls[0]()), calls=calls)


@dataclass(frozen=True)
class ImplSpec:
    name: str
    role: str  # "ours" | "peer"
    kinds: frozenset[str]
    slow: bool  # only on cases marked slow_peers
    prepare: Callable[[BenchEnv, Case, list[dict]], Runner]
    anchor_only: bool = False  # on a GPU, only the anchor case (compiles per shape for long)
    # torch.compile (dynamo) on a GPU: must run in a process where torchax was never imported
    # (torchax renames torch's PrivateUse1 backend to "jax"; torch 2.11's dynamo then fails with
    # "PyTorch is not linked with support for jax devices"), so it runs first in its case and,
    # where torchax is already loaded, the case moves to a fresh worker process.
    needs_clean_torch: bool = False


def torchax_loaded() -> bool:
    """Whether torchax was imported in this process (it cannot be unloaded)."""
    return "torchax" in sys.modules


# Tests set this to apply the clean-process rule on the CPU too (where flex runs eagerly).
FORCE_CLEAN_TORCH_ENV = "XGO_BENCH_FORCE_CLEAN_TORCH"


def needs_clean_process(spec: ImplSpec, env: BenchEnv) -> bool:
    return spec.needs_clean_torch and (env.on_gpu or os.environ.get(FORCE_CLEAN_TORCH_ENV) == "1")


PAGED = frozenset({"decode", "mixed", "prefill", SPEC_DECODE})
DECODE = frozenset({"decode", SPEC_DECODE})  # decode peers: n/a, with why, where q_len > 1
ALL = PAGED | {"simple_add", "overhead_decode"}
IMPLS: tuple[ImplSpec, ...] = (
    ImplSpec("xgo_torch", "ours", ALL, False, prepare_xgo_torch),
    ImplSpec(
        "xgo_torch_nograph",
        "ours",
        frozenset({"simple_add", "overhead_decode"}),
        False,
        prepare_xgo_torch_nograph,
    ),
    ImplSpec("xgo_jax_graph", "ours", ALL, False, prepare_xgo_jax_graph),
    ImplSpec("xgo_jax_nograph", "ours", ALL, True, prepare_xgo_jax_nograph),
    ImplSpec("xgo_torchax", "ours", ALL, True, prepare_xgo_torchax),
    ImplSpec(
        "torch_sdpa_contiguous",
        "peer",
        frozenset({"decode", "prefill", SPEC_DECODE}),
        False,
        prepare_torch_sdpa_contiguous,
    ),
    ImplSpec("torch_gather_sdpa", "peer", PAGED, True, prepare_torch_gather_sdpa),
    ImplSpec(
        "torch_flex_paged",
        "peer",
        DECODE,
        True,
        prepare_torch_flex_paged,
        anchor_only=True,
        needs_clean_torch=True,
    ),
    ImplSpec("jax_pallas_paged", "peer", DECODE, True, prepare_jax_pallas_paged),
    ImplSpec("jax_composite", "peer", DECODE, True, prepare_jax_composite),
    *(
        ImplSpec(name, "peer", kinds, False, prepare)
        for name, (kinds, prepare) in flashinfer_peer.PEERS.items()
    ),
    ImplSpec("reference", "peer", ALL, False, prepare_reference),
)
