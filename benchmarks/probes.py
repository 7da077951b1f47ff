"""Kernel probes on a GPU host, for kernel work: `python -m benchmarks probe {decode,prefill}`.

Both time the library xla_gpu_ops loads (XLA_GPU_OPS_LIBRARY picks another build: that is how
`python -m benchmarks ab` compares builds) with the benchmark's timer (timing.time_torch: CUDA-
graph replays over two input copies) on the benchmark's inputs (cases.build_inputs). Each row
printed begins with a case name and our time, the form `ab` reads.

decode [GROUP ...] (default: rows): our op on each shape, timed twice (their difference is the
noise), and the fraction of its bytes floor at the read bandwidth measured first. Groups:
  rows     the benchmark's key decode rows (anchor, B1 x 64k, B32 x 1k, Hq 64, Hkv 32, page 64,
           D 64, D 256)
  layout   the anchor and a B256 x (Hq 4 / Hkv 1) batch, pages shuffled and in order (-inorder)
  context  B32 from 1k to 16k keys (the intercept is the fixed cost of a call)
  long     B1 from 4k to 128k keys, and B32 x 64k
  dtypes   the anchor in float16 and float32
  mixed    the benchmark's mixed batch, its decodes alone and its prefills alone
  head_dims  the anchor at D 80, 96, 128, 192, 256 (80, 96 and 192 run the next kernel width,
           padded in shared memory; the target: each at D 256's fraction of the floor or above)
scales: k_scale / v_scale as per-KV-head float32 tensors against the same values as floats, on
the decode, prefill and mixed anchors: both timed in alternation, twice; ratio = the slower
tensor time / the slower float time, and the largest difference of the outputs (0: the same
products per head).
fp8: our op on an fp8 (e4m3) cache against the same values in a 16-bit cache, on the rows of the
fp8 targets (causal prefill B1 x 8k and B8 x 2k at D 64, 128, 256; the mixed batch; the decode
anchor): each pair timed in alternation, twice; ratio = the slower fp8 time / the slower 16-bit
time (targets: prefill <= 1.1, mixed <= 1.0, decode <= 1/1.8), and the relative L2 error of the
fp8 output against the 16-bit one.
sinks: our op with attention sinks against the same call without, on the anchor rows (decode
B32 x 4k, B1 x 64k; prefill B8 x 2k, B1 x 8k; the mixed batch) and gpt-oss-shaped ones (Hq 64 /
Hkv 8, D 64, sliding window 128 and full): each pair timed in alternation, twice, with the ratio
(the target: <= 1.03) and the relative L2 error of the sinks output against a float32 reference.
layouts: separate K and V caches (vLLM's `cache.unbind(0)` views of [2, P, page, Hkv, D]) and K
and V in one [P, 2, ...] tensor (FlashInfer's), each in NHD and HND order, against the interleaved
cache with the same values, on README's decode and prefill rows, the mixed batch and gpt-oss's
decode: timed in alternation, twice; ratio = the slower time of the layout / the slower
interleaved time (target <= 1.03), and the largest difference of the outputs.
rms_norm [--shapes NxH ...]: our rms_norm (bf16) beside torch.nn.functional.rms_norm eager and
under torch.compile (on a GPU), each timed twice on two input copies; the bytes floor is read x and
weight + write out at the copy bandwidth measured first (target: >= 0.85 of it at N x H >= 8k x
4k), and each output's relative L2 error against F.rms_norm in float32.
prefill [--cases SUBSTR] [--ours-only]: the causal prefill rows (B1 x 8k and B8 x 2k at D 64, 128,
256; B8 x 2k at D 80, 96, 192) and the mixed batch on the sm_90a kernel and on the mma.sync one
(each forced in turn by
the library's test hook), and torch SDPA on contiguous K/V; each kernel's relative L2 error
against a float32 reference on sampled rows. --ours-only: our op alone, with the library's own
kernel choice (for an A/B of two builds).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import math

from benchmarks import ours
from benchmarks.cases import (
    K_SCALE,
    OPERANDS,
    V_SCALE,
    Case,
    build_inputs,
    decode_case,
    fp8_copy,
    mixed_case,
    prefill_case,
    rel_l2,
    scale_of,
)
from benchmarks.ceilings import free_memory, measure_ceilings
from benchmarks.peers import prepare_torch_sdpa_contiguous
from benchmarks.runners import BenchEnv, NotApplicable
from benchmarks.timing import time_torch

SAMPLES = 15
PADDED_HEAD_DIMS = (80, 96, 192)  # run by the next kernel width (64, 128, 256), zero-padded
LONG = ((1, 4096), (1, 16384), (1, 65536), (1, 131072), (32, 65536))  # (batch, keys)


def _copies(case: Case, in_order: bool = False, device: str = "cuda") -> list[dict]:
    """Two input copies (same page table); in_order: pages in sequence order."""
    import torch

    first = build_inputs(case, device, seed=1)
    if in_order:
        tables = first["block_tables"]
        first["block_tables"] = torch.arange(
            tables.numel(), dtype=torch.int32, device=tables.device
        ).view_as(tables)
    meta = {k: v for k, v in first.items() if k not in ("query", "kv_cache")}
    return [first, build_inputs(case, device, seed=2, metadata=meta)]


def _calls(case: Case, copies: list[dict]) -> list:
    return [
        functools.partial(ours.op_paged_attention, *(c[n] for n in OPERANDS), scale=scale_of(case))
        for c in copies
    ]


def _us(calls) -> float:
    return time_torch(calls, samples=SAMPLES).median_us


# ------------------------------------------------------------------------------ decode
def decode_groups() -> dict[str, list[tuple[Case, bool]]]:
    """group -> [(case, pages in order)]."""
    anchor = decode_case(32, 4096, (32, 8))
    many = decode_case(256, 4096, (4, 1))
    mixed = mixed_case()
    halves = [
        Case(f"{mixed.name}-{part}", "mixed", tuple(s for s in mixed.seqs if keep(s[0])))
        for part, keep in (("decodes", lambda q: q == 1), ("prefills", lambda q: q > 1))
    ]
    rows = [
        anchor,
        decode_case(1, 65536, (32, 8)),
        decode_case(32, 1024, (32, 8)),
        decode_case(8, 16384, (64, 8)),
        decode_case(32, 4096, (32, 32)),
        decode_case(32, 4096, (32, 8), page_size=64),
        decode_case(32, 4096, (32, 8), head_dim=64),
        decode_case(32, 4096, (32, 8), head_dim=256),
    ]
    dtypes = [
        dataclasses.replace(anchor, name=f"{anchor.name}-{short}", dtype=dtype)
        for short, dtype in (("f16", "float16"), ("f32", "float32"))
    ]
    return {
        "rows": [(c, False) for c in rows],
        "layout": [(anchor, False), (anchor, True), (many, False), (many, True)],
        "context": [(decode_case(32, n, (32, 8)), False) for n in (1024, 2048, 4096, 8192, 16384)],
        "long": [(decode_case(b, n, (32, 8)), False) for b, n in LONG],
        "dtypes": [(c, False) for c in dtypes],
        "mixed": [(mixed, False), *((c, False) for c in halves)],
        "head_dims": [
            (decode_case(32, 4096, (32, 8), head_dim=d), False)
            for d in sorted((*PADDED_HEAD_DIMS, 128, 256))
        ],
    }


def decode_row(name: str, first: float, again: float, floor: float) -> str:
    return f"{name:52s} {first:9.1f} {again:9.1f}  {floor:8.1f}  {floor / first:.3f}"


def probe_decode(groups: list[str]) -> None:
    import torch

    known = decode_groups()
    unknown = [g for g in groups if g not in known]
    if unknown:
        raise SystemExit(f"probe decode: unknown groups {unknown}; groups are {list(known)}")
    read_gbps = measure_ceilings(True, SAMPLES)["read_gbps"]
    print(
        f"library {ours.library_path()}; {torch.cuda.get_device_name()}; read {read_gbps:.0f} GB/s",
        flush=True,
    )
    print(f"{'case':52s} {'µs':>9s} {'again':>9s}  floor µs  fraction", flush=True)
    for group in groups or ["rows"]:
        for case, in_order in known[group]:
            name = case.name + ("-inorder" if in_order else "")
            calls = _calls(case, _copies(case, in_order))
            first, again = _us(calls), _us(calls)
            print(
                decode_row(name, first, again, case.bytes_needed() / (read_gbps * 1e3)), flush=True
            )
            del calls
            torch.cuda.empty_cache()


# ------------------------------------------------------------------------------ prefill
def _sampled_rows(case: Case) -> list[tuple[int, int, int, list[int]]]:
    """(sequence, its first query row, context, rows within it) to check: the first 64 and last
    192 rows of up to 4 prefills, and every decode."""
    out, start, prefills = [], 0, 0
    for i, (q_len, ctx) in enumerate(case.seqs):
        if q_len == 1:
            out.append((i, start, ctx, [0]))
        elif prefills < 4:
            prefills += 1
            rows = sorted(set(range(min(64, q_len))) | set(range(max(0, q_len - 192), q_len)))
            out.append((i, start, ctx, rows))
        start += q_len
    return out


def _reference_rows(c: dict, case: Case, seq: int, first: int, ctx: int, rows: list[int]):
    """float32 attention of some rows of one sequence: [len(rows), Hq, D]."""
    import torch

    q_len = case.seqs[seq][0]
    pages = c["block_tables"][seq, : -(-ctx // case.page_size)].long()
    kv = c["kv_cache"][pages].reshape(-1, 2 * case.num_kv_heads, case.head_dim)[:ctx].float()
    group = case.num_q_heads // case.num_kv_heads
    k = kv[:, 0::2].repeat_interleave(group, dim=1)  # [ctx, Hq, D]
    v = kv[:, 1::2].repeat_interleave(group, dim=1)
    idx = torch.tensor(rows, device=kv.device)
    q = c["query"][first + idx].float()  # [R, Hq, D]
    logits = torch.einsum("rhd,khd->hrk", q, k) * scale_of(case)
    pos = (ctx - q_len + idx)[:, None]
    logits = logits.masked_fill(torch.arange(ctx, device=kv.device)[None, :] > pos, -math.inf)
    return torch.einsum("hrk,khd->rhd", torch.softmax(logits, dim=-1), v)


def _errors(c: dict, case: Case, outs: dict) -> dict[str, float]:
    """Each output's relative L2 error against float32 on the sampled rows; sm90 against mma."""
    import torch

    parts: dict[str, list] = {name: [] for name in outs}
    refs = []
    for seq, first, ctx, rows in _sampled_rows(case):
        refs.append(_reference_rows(c, case, seq, first, ctx, rows))
        idx = torch.tensor(rows, device=refs[-1].device) + first
        for name, out in outs.items():
            parts[name].append(out[idx].float())
    ref = torch.cat(refs)
    errors = {name: rel_l2(torch.cat(p), ref) for name, p in parts.items()}
    if "sm90" in outs and "mma" in outs:
        errors["sm90-mma"] = rel_l2(outs["sm90"], outs["mma"])
    return errors


def probe_prefill(pattern: str, ours_only: bool) -> int:
    import torch

    if not ours.sm90_prefill_available() and not ours_only:
        raise SystemExit("probe prefill: this GPU or library has no sm_90a prefill kernel")
    kernels = ["auto"] if ours_only else ["sm90", "mma"]
    read_gbps = measure_ceilings(True, SAMPLES)["read_gbps"]
    print(
        f"library {ours.library_path()}; {torch.cuda.get_device_name()}; read {read_gbps:.0f} GB/s",
        flush=True,
    )
    cases = [prefill_case(b, n, d) for d in (128, 64, 256) for b, n in ((1, 8192), (8, 2048))]
    cases += [prefill_case(8, 2048, d) for d in PADDED_HEAD_DIMS]
    cases = [c for c in (*cases, mixed_case()) if pattern in c.name]
    head = "ours" if ours_only else "sm90"
    lines = [
        f"| case | {head} µs | mma µs | SDPA µs | {head} TFLOP/s | mma / {head} | "
        f"SDPA / {head} | floor fraction | rel. L2 vs float32: {' / '.join(kernels)} |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    inaccurate = []
    for case in cases:
        copies = _copies(case)
        times, outs = {}, {}
        for kernel in kernels:
            ours.force_prefill_kernel(kernel)
            outs[kernel] = _calls(case, copies)[0]()
            times[kernel] = _us(_calls(case, copies))
        ours.force_prefill_kernel("auto")
        try:
            times["sdpa"] = _us(prepare_torch_sdpa_contiguous(BenchEnv(True), case, copies).calls)
        except NotApplicable:  # a ragged batch (the mixed one)
            times["sdpa"] = None
        errors = _errors(copies[0], case, outs)
        inaccurate += [f"{case.name} {k}" for k, e in errors.items() if not e < 1e-2]
        ours_us, mma, sdpa = times[kernels[0]], times.get("mma"), times["sdpa"]
        floor = case.bytes_needed() / (read_gbps * 1e3) if case.kind == "mixed" else None

        def fmt(x, spec=".1f"):
            return "-" if x is None else format(x, spec)

        lines.append(
            f"| {case.name} | {ours_us:.1f} | {fmt(mma)} | {fmt(sdpa)} | "
            f"{case.flops() / ours_us / 1e6:.0f} | {fmt(mma and mma / ours_us, '.3f')} | "
            f"{fmt(sdpa and sdpa / ours_us, '.3f')} | {fmt(floor and floor / ours_us, '.2f')} | "
            + " / ".join(f"{e:.1e}" for e in errors.values())
            + " |"
        )
        print(lines[-1], flush=True)
        del copies, outs
        torch.cuda.empty_cache()
    print("\n".join(["", *lines]))
    print(
        "accuracy: "
        + (f"OUT OF TOLERANCE (1e-2): {inaccurate}" if inaccurate else "every error below 1e-2")
    )
    return 1 if inaccurate else 0


# ------------------------------------------------------------------------------ fp8
def fp8_rows() -> list[tuple[Case, float]]:
    """(case, the fp8 / 16-bit time target)."""
    prefills = [prefill_case(b, n, d) for d in (64, 128, 256) for b, n in ((1, 8192), (8, 2048))]
    return [
        *((c, 1.1) for c in prefills),
        (mixed_case(), 1.0),
        (decode_case(32, 4096, (32, 8)), 1 / 1.8),
    ]


def probe_fp8() -> None:
    import torch

    print(f"library {ours.library_path()}; {torch.cuda.get_device_name()}", flush=True)
    print(
        f"{'case':48s} {'16-bit µs':>9s} {'fp8 µs':>9s} {'again':>9s} {'again':>9s}  ratio  "
        "target  rel L2",
        flush=True,
    )
    for case, target in fp8_rows():
        pairs = [fp8_copy(c) for c in _copies(case)]
        scale = scale_of(case)
        wide = [
            functools.partial(ours.op_paged_attention, *(w[n] for n in OPERANDS), scale=scale)
            for _, w in pairs
        ]
        fp8 = [
            functools.partial(
                ours.op_paged_attention,
                *(f[n] for n in OPERANDS),
                scale=scale,
                k_scale=K_SCALE,
                v_scale=V_SCALE,
            )
            for f, _ in pairs
        ]
        times = [_us(calls) for calls in (wide, fp8, wide, fp8)]
        ratio = max(times[1], times[3]) / max(times[0], times[2])
        error = rel_l2(fp8[0]().float(), wide[0]().float())
        print(
            f"{case.name:48s} {times[0]:9.1f} {times[1]:9.1f} {times[2]:9.1f} {times[3]:9.1f}  "
            f"{ratio:.3f}  {target:.3f}  {error:.1e}",
            flush=True,
        )
        del pairs, wide, fp8
        torch.cuda.empty_cache()


# ------------------------------------------------------------------------------ sinks
def sinks_rows() -> list[tuple[Case, int | None]]:
    """(case, sliding window): the anchor rows and gpt-oss's shapes (Hq 64 / Hkv 8, D 64)."""
    rows: list[tuple[Case, int | None]] = [
        (decode_case(32, 4096, (32, 8)), None),
        (decode_case(1, 65536, (32, 8)), None),
        (prefill_case(8, 2048), None),
        (prefill_case(1, 8192), None),
        (mixed_case(), None),
    ]
    for window in (None, 128):
        rows += [
            (decode_case(32, 4096, (64, 8), head_dim=64), window),
            (prefill_case(8, 2048, 64, heads=(64, 8)), window),
        ]
    return rows


def probe_sinks() -> None:
    import torch

    print(f"library {ours.library_path()}; {torch.cuda.get_device_name()}", flush=True)
    print(
        f"{'case':60s} {'plain µs':>9s} {'sinks µs':>9s} {'again':>9s} {'again':>9s}  ratio  "
        "rel L2",
        flush=True,
    )
    for case, window in sinks_rows():
        copies = _copies(case)
        sinks = (
            torch.randn(
                case.num_q_heads, device="cuda", generator=torch.Generator("cuda").manual_seed(5)
            )
            + 2.0
        )
        scale = scale_of(case)
        plain = [
            functools.partial(
                ours.op_paged_attention,
                *(c[n] for n in OPERANDS),
                scale=scale,
                sliding_window=window,
            )
            for c in copies
        ]
        with_sinks = [functools.partial(call, sinks=sinks) for call in plain]
        times = [_us(calls) for calls in (plain, with_sinks, plain, with_sinks)]
        ratio = max(times[1], times[3]) / max(times[0], times[2])
        out = with_sinks[0]().float()
        expected = ours.reference_paged_attention(
            *(copies[0][n] for n in OPERANDS), scale=scale, sliding_window=window, sinks=sinks
        )
        error = rel_l2(out, expected.float())
        name = case.name + (f"-w{window}" if window else "")
        print(
            f"{name:60s} {times[0]:9.1f} {times[1]:9.1f} {times[2]:9.1f} {times[3]:9.1f}  "
            f"{ratio:.3f}  {error:.1e}",
            flush=True,
        )
        del copies, plain, with_sinks


# ------------------------------------------------------------------------------ scales
def scales_rows() -> list[Case]:
    """The anchor rows of decode, prefill and the mixed batch, and gpt-oss's decode."""
    return [
        decode_case(32, 4096, (32, 8)),
        decode_case(1, 65536, (32, 8)),
        decode_case(32, 4096, (64, 8), head_dim=64),
        prefill_case(8, 2048),
        prefill_case(1, 8192),
        mixed_case(),
    ]


def probe_scales() -> None:
    """k_scale / v_scale as float32 tensors per KV head against the same values as floats: the
    time of reading them at run time, and whether the output is the same (it must be: each head's
    product is the same float)."""
    import torch

    print(f"library {ours.library_path()}; {torch.cuda.get_device_name()}", flush=True)
    print(
        f"{'case':60s} {'float µs':>9s} {'tensor µs':>9s} {'again':>9s} {'again':>9s}  ratio  "
        "max |diff|",
        flush=True,
    )
    for case in scales_rows():
        copies = _copies(case)
        k, v = 0.5, 2.0
        k_heads = torch.full((case.num_kv_heads,), k, device="cuda")
        v_heads = torch.full((case.num_kv_heads,), v, device="cuda")
        floats = [
            functools.partial(
                ours.op_paged_attention,
                *(c[n] for n in OPERANDS),
                scale=scale_of(case),
                k_scale=k,
                v_scale=v,
            )
            for c in copies
        ]
        tensors = [
            functools.partial(call, k_scale=None, v_scale=None, k_scales=k_heads, v_scales=v_heads)
            for call in floats
        ]
        times = [_us(calls) for calls in (floats, tensors, floats, tensors)]
        ratio = max(times[1], times[3]) / max(times[0], times[2])
        diff = (tensors[0]().float() - floats[0]().float()).abs().max().item()
        print(
            f"{case.name:60s} {times[0]:9.1f} {times[1]:9.1f} {times[2]:9.1f} {times[3]:9.1f}  "
            f"{ratio:.3f}  {diff:.1e}",
            flush=True,
        )
        del copies, floats, tensors


# ------------------------------------------------------------------------------ layouts
def layouts_rows() -> list[Case]:
    """README's decode and prefill rows, the mixed batch and gpt-oss's decode."""
    return [
        decode_case(32, 4096, (32, 8)),
        decode_case(128, 1024, (32, 8)),
        decode_case(1, 65536, (32, 8)),
        decode_case(32, 4096, (64, 8), head_dim=64),
        prefill_case(8, 2048),
        prefill_case(1, 8192),
        prefill_case(8, 2048, 64),
        mixed_case(),
    ]


def split_cache(kv_cache):
    """(K, V) views of one [2, P, page, Hkv, D] tensor holding an interleaved cache's values:
    vLLM's FlashAttention layout, `cache.unbind(0)`."""
    import torch

    return torch.stack((kv_cache[:, :, 0::2], kv_cache[:, :, 1::2])).unbind(0)


def layout_variants() -> dict:
    """name -> (K cache, V cache [P, page, Hkv, D]) -> the call's cache keyword arguments: K and V
    apart (NHD, HND) and in one [P, 2, ...] tensor (FlashInfer's; NHD, HND)."""
    import torch

    def hnd(cache):
        return cache.transpose(1, 2).contiguous()

    return {
        "two": lambda k, v: {"kv_cache": k, "value_cache": v, "kv_layout": "NHD"},
        "two-HND": lambda k, v: {"kv_cache": hnd(k), "value_cache": hnd(v), "kv_layout": "HND"},
        "one5": lambda k, v: {"kv_cache": torch.stack([k, v], dim=1), "kv_layout": "NHD"},
        "one5-HND": lambda k, v: {
            "kv_cache": torch.stack([hnd(k), hnd(v)], dim=1),
            "kv_layout": "HND",
        },
    }


def layout_calls(case: Case, copies: list[dict], variants: dict) -> list[list]:
    """Per copy, our op's call on the interleaved cache, then on each variant's caches holding the
    same values: [interleaved calls, variant calls, ...]."""
    order = [_calls(case, copies)]
    for make in variants.values():
        calls = []
        for c in copies:
            caches = make(*split_cache(c["kv_cache"]))
            operands = [caches.pop("kv_cache") if n == "kv_cache" else c[n] for n in OPERANDS]
            calls.append(
                functools.partial(
                    ours.op_paged_attention, *operands, scale=scale_of(case), **caches
                )
            )
        order.append(calls)
    return order


def probe_layouts() -> None:
    """Each layout_variants() cache against the interleaved cache holding the same values: timed
    in alternation, twice; ratio = the slower time of the layout / the slower interleaved time
    (target <= 1.03), and the largest difference of any layout's output from the interleaved
    one's."""
    import torch

    variants = layout_variants()
    print(f"library {ours.library_path()}; {torch.cuda.get_device_name()}", flush=True)
    print(
        f"| case | interleaved µs | {' | '.join(f'{n} µs | {n} / one' for n in variants)} | "
        "max diff |",
        flush=True,
    )
    for case in layouts_rows():
        copies = _copies(case)
        order = layout_calls(case, copies, variants)
        first = [_us(calls) for calls in order]
        again = [_us(calls) for calls in order]
        slower = [max(a, b) for a, b in zip(first, again, strict=True)]
        want = order[0][0]().float()
        diff = max((calls[0]().float() - want).abs().max().item() for calls in order[1:])
        cells = " | ".join(f"{t:.1f} | {t / slower[0]:.3f}" for t in slower[1:])
        print(f"| {case.name} | {slower[0]:.1f} | {cells} | {diff:.1e} |", flush=True)
        del copies, order
        torch.cuda.empty_cache()


# ------------------------------------------------------------------------------ rms_norm
RMS_NORM_SHAPES = ((8192, 4096), (16384, 4096), (4096, 8192), (32768, 8192))  # N x H


def probe_rms_norm(shapes=RMS_NORM_SHAPES, dtype_name: str = "bfloat16") -> list[dict]:
    """Rows of (case, impl, µs, again, floor µs, fraction, rel_l2); printed as they come."""
    import torch
    import torch.nn.functional as F

    import xla_gpu_ops

    on_gpu = torch.cuda.is_available()
    device, dtype = ("cuda" if on_gpu else "cpu"), getattr(torch, dtype_name)
    copy_gbps = measure_ceilings(on_gpu, SAMPLES)["copy_gbps"]
    print(f"library {ours.library_path()}; {device}; copy {copy_gbps:.0f} GB/s", flush=True)
    print(f"{'case':28s} {'impl':14s} {'µs':>9s} {'again':>9s} floor µs fraction  rel_l2")
    rows = []
    gen = torch.Generator(device=device).manual_seed(0)
    for n, h in shapes:
        copies = [
            (
                torch.randn(n, h, generator=gen, device=device).to(dtype),
                (torch.rand(h, generator=gen, device=device) + 0.5).to(dtype),
            )
            for _ in range(2)
        ]
        impls = {
            "ours": lambda x, w: xla_gpu_ops.rms_norm(x, w, eps=1e-6),
            "torch": lambda x, w, h=h: F.rms_norm(x, (h,), w, 1e-6),
        }
        if on_gpu:  # inductor's CPU code needs a C++ toolchain: the GPU row is the one that counts
            impls["torch.compile"] = torch.compile(lambda x, w, h=h: F.rms_norm(x, (h,), w, 1e-6))
        x, w = copies[0]
        want = F.rms_norm(x.float(), (h,), w.float(), 1e-6)
        floor_us = (2 * n * h + h) * x.element_size() / (copy_gbps * 1e3)
        case = f"rms_norm_{n}x{h}_{dtype_name}"
        for name, fn in impls.items():
            error = rel_l2(fn(x, w).float(), want)
            calls = [lambda fn=fn, c=c: fn(*c) for c in copies]
            first, again = _us(calls), _us(calls)
            row = {
                "case": case,
                "impl": name,
                "us": first,
                "again": again,
                "floor_us": floor_us,
                "fraction": floor_us / max(first, again),
                "rel_l2": error,
            }
            rows.append(row)
            print(
                f"{case:28s} {name:14s} {first:9.1f} {again:9.1f} {floor_us:8.1f} "
                f"{row['fraction']:8.3f}  {error:.1e}",
                flush=True,
            )
        del copies
        free_memory(on_gpu)
    return rows


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks probe",
        description=__doc__.splitlines()[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="\n".join(__doc__.splitlines()[6:]),
    )
    sub = parser.add_subparsers(dest="probe", required=True)
    decode = sub.add_parser("decode", help="decode shapes and groups")
    decode.add_argument("groups", nargs="*", help=f"of {list(decode_groups())}")
    sub.add_parser("sinks", help="the cost of attention sinks on the anchor and gpt-oss rows")
    sub.add_parser("fp8", help="an fp8 cache against a 16-bit one: prefill, mixed, decode")
    sub.add_parser("scales", help="k_scale / v_scale as tensors per KV head against floats")
    sub.add_parser("layouts", help="separate K and V caches against the interleaved cache")
    rms = sub.add_parser("rms_norm", help="rms_norm beside torch's, eager and compiled")
    rms.add_argument("--shapes", nargs="*", default=[], help="N x H, e.g. 8192x4096")
    prefill = sub.add_parser("prefill", help="the sm_90a kernel, mma.sync and SDPA")
    prefill.add_argument("--cases", default="", help="keep the cases whose name contains this")
    prefill.add_argument("--ours-only", action="store_true", help="our op alone, its own choice")
    args = parser.parse_args(argv)
    if args.probe == "decode":
        probe_decode(args.groups)
        return 0
    if args.probe == "sinks":
        probe_sinks()
        return 0
    if args.probe == "fp8":
        probe_fp8()
        return 0
    if args.probe == "scales":
        probe_scales()
        return 0
    if args.probe == "layouts":
        probe_layouts()
        return 0
    if args.probe == "rms_norm":
        shapes = [tuple(int(d) for d in shape.split("x")) for shape in args.shapes]
        probe_rms_norm(shapes or RMS_NORM_SHAPES)
        return 0
    return probe_prefill(args.cases, args.ours_only)
