"""Hopper prefill probe: the sm_90a wgmma prefill kernel against the mma.sync one and torch SDPA.

usage: python3 benchmarks/prefill_sm90_probe.py [OUT_DIR] [--cases SUBSTRING] [--sm90-only]
       (from the repository root)

Needs a GPU, torch and the built library (xla_gpu_ops/_lib/libxla_gpu_ops.so or
XLA_GPU_OPS_LIBRARY); nothing else. Cases: causal prefill B1 x 8k and B8 x 2k (Hq 32 / Hkv 8,
page 16, bf16) at D = 64, 128 and 256, and the benchmark's mixed batch (benchmarks/cases.py).
For each case, on the same random inputs:
  - accuracy: relative L2 error of both kernels against a float32 torch reference on sampled query
    rows (the first 64 and last 192 tokens of up to 4 sequences, and every decode of the mixed
    batch), and of the new kernel against the old one on every row;
  - time: both kernels (the library's test hook forces each in turn) and torch SDPA on contiguous
    K/V (uniform batches only), each captured in a CUDA graph of several calls; median over
    replays, per call.
The compact table comes last; OUT_DIR (optional) receives prefill_sm90_probe.json. --cases keeps
the cases whose name contains SUBSTRING (e.g. d128); --sm90-only times only the sm_90a kernel (a
build variant against the default build: no mma.sync or SDPA column, accuracy against float32).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repository root
import xla_gpu_ops  # noqa: F401  (defines torch.ops.xla_gpu.*)
from benchmarks.cases import OPERANDS, Case, build_inputs, mixed_case, rel_l2, scale_of
from xla_gpu_ops import _library

SAMPLES = 15  # timed graph replays per path
TARGET_US = 20_000.0  # calls per graph: about this much device time
KERNELS = {"sm90": 1, "mma": 0}  # xgo_debug_force_prefill_kernel values


def prefill_case(batch: int, length: int, head_dim: int) -> Case:
    name = f"prefill_B{batch}_len{length // 1024}k_h32-8_d{head_dim}_p16"
    return Case(name, "prefill", ((length, length),) * batch, 32, 8, head_dim, 16)


def cases() -> list[Case]:
    out = [prefill_case(b, n, d) for d in (128, 64, 256) for b, n in ((1, 8192), (8, 2048))]
    return [*out, mixed_case()]


def run_ours(c: dict, case: Case):
    return torch.ops.xla_gpu.paged_attention(*(c[name] for name in OPERANDS), scale_of(case))


def force_kernel(kernel: int) -> None:
    _library.load().cdll.xgo_debug_force_prefill_kernel(kernel)


# ------------------------------------------------------------------------------ accuracy
def sampled_rows(case: Case) -> list[tuple[int, int, int, list[int]]]:
    """(sequence, first query row, context, rows within the sequence) to check."""
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


def reference_rows(c: dict, case: Case, seq: int, first: int, ctx: int, rows: list[int]):
    """float32 attention of the given rows of one sequence: [len(rows), Hq, D]."""
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


def accuracy(c: dict, case: Case, outs: dict) -> dict:
    errors = {name: [] for name in outs}
    refs = []
    for seq, first, ctx, rows in sampled_rows(case):
        ref = reference_rows(c, case, seq, first, ctx, rows)
        idx = torch.tensor(rows, device=ref.device) + first
        refs.append(ref)
        for name, out in outs.items():
            errors[name].append(out[idx].float())
    ref = torch.cat(refs)
    result = {f"{name}_vs_f32": rel_l2(torch.cat(parts), ref) for name, parts in errors.items()}
    if "sm90" in outs and "mma" in outs:
        result["sm90_vs_mma"] = rel_l2(outs["sm90"], outs["mma"])
    for name, out in outs.items():
        result[f"{name}_finite"] = bool(torch.isfinite(out).all())
    return result


# ------------------------------------------------------------------------------ timing
def graph_us(call, samples: int = SAMPLES) -> float:
    """Median device time per call: `reps` calls captured in one CUDA graph, replays timed."""
    call()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    call()
    end.record()
    end.synchronize()
    reps = max(2, min(200, int(TARGET_US / max(1000.0 * start.elapsed_time(end), 1.0))))
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(reps):
            call()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(reps):
            call()
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(samples):
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(1000.0 * start.elapsed_time(end) / reps)
    del graph
    return statistics.median(times)


def sdpa_call(c: dict, case: Case):
    """torch SDPA on contiguous K/V of the same data (uniform causal batches), as the benchmark's
    torch_sdpa_contiguous peer: K/V gathered once, outside the timed calls."""
    if len(set(case.seqs)) != 1:
        return None
    q_len, ctx = case.seqs[0]
    q4 = c["query"].view(case.batch, q_len, case.num_q_heads, case.head_dim).transpose(1, 2)
    npp = -(-ctx // case.page_size)
    pages = c["kv_cache"][c["block_tables"][:, :npp].long()]
    kv = pages.view(case.batch, npp * case.page_size, 2 * case.num_kv_heads, case.head_dim)[:, :ctx]
    k = kv[:, :, 0::2].transpose(1, 2).contiguous()
    v = kv[:, :, 1::2].transpose(1, 2).contiguous()
    q4 = q4.contiguous()
    scale = scale_of(case)
    return lambda: F.scaled_dot_product_attention(q4, k, v, is_causal=True, scale=scale,
                                                  enable_gqa=True)  # fmt: skip


def read_bandwidth_gbps() -> float:
    """Read bandwidth: a 2 GiB sum under graph replay (for the mixed batch's memory floor)."""
    x = torch.ones(1 << 30, dtype=torch.float16, device="cuda")
    us = graph_us(lambda: x.sum(dtype=torch.float32), samples=10)
    return (1 << 31) / (us * 1e-6) / 1e9


# ------------------------------------------------------------------------------ main
def probe_case(case: Case, read_gbps: float, kernels: dict[str, int], with_sdpa: bool) -> dict:
    c = build_inputs(case, "cuda", seed=1)
    row = {"case": case.name, "flops": case.flops(), "bytes": case.bytes_needed()}
    outs = {}
    for name, kernel in kernels.items():
        force_kernel(kernel)
        outs[name] = run_ours(c, case)
    torch.cuda.synchronize()
    row.update(accuracy(c, case, outs))
    for name, kernel in kernels.items():
        force_kernel(kernel)
        row[f"{name}_us"] = graph_us(lambda: run_ours(c, case))
    force_kernel(-1)
    sdpa = sdpa_call(c, case) if with_sdpa else None
    row["sdpa_us"] = graph_us(sdpa) if sdpa is not None else None
    if case.kind == "mixed":
        row["floor_us"] = case.bytes_needed() / (read_gbps * 1e9) * 1e6
    return row


def fmt(x, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def table(rows: list[dict]) -> str:
    lines = [
        "| case | sm90 µs | mma µs | SDPA µs | sm90 TFLOP/s | mma TFLOP/s | SDPA TFLOP/s | "
        "mma/sm90 | sm90 vs SDPA | floor frac sm90 / mma | err sm90 / mma / sm90-mma |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        tf = {k: r["flops"] / (r[f"{k}_us"] * 1e6) if r.get(f"{k}_us") else None
              for k in ("sm90", "mma", "sdpa")}  # fmt: skip
        vs_sdpa = r["sdpa_us"] / r["sm90_us"] if r.get("sdpa_us") else None
        mma_ratio = r["mma_us"] / r["sm90_us"] if r.get("mma_us") else None
        floor = r.get("floor_us")
        floors = "-"
        if floor:
            mma_floor = floor / r["mma_us"] if r.get("mma_us") else None
            floors = f"{floor / r['sm90_us']:.2f} / {fmt(mma_floor, '.2f')}"
        errors = " / ".join(
            fmt(r.get(k), ".1e") for k in ("sm90_vs_f32", "mma_vs_f32", "sm90_vs_mma")
        )
        lines.append(
            f"| {r['case']} | {r['sm90_us']:.1f} | {fmt(r.get('mma_us'), '.1f')} | "
            f"{fmt(r['sdpa_us'], '.1f')} | {fmt(tf['sm90'], '.0f')} | {fmt(tf['mma'], '.0f')} | "
            f"{fmt(tf['sdpa'], '.0f')} | {fmt(mma_ratio, '.2f')} | {fmt(vs_sdpa, '.2f')} | {floors} | "
            f"{errors} |"
        )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", nargs="?", type=Path, help="receives prefill_sm90_probe.json")
    parser.add_argument("--cases", default="", help="keep the cases whose name contains this")
    parser.add_argument("--sm90-only", action="store_true", help="time only the sm_90a kernel")
    args = parser.parse_args()
    kernels = {"sm90": KERNELS["sm90"]} if args.sm90_only else KERNELS
    selected = [case for case in cases() if args.cases in case.name]
    if not torch.cuda.is_available():
        print("prefill_sm90_probe: needs a CUDA GPU")
        return 2
    lib = _library.load()
    available = lib.cdll.xgo_debug_sm90_prefill_available()
    props = torch.cuda.get_device_properties(0)
    header = (f"device {props.name} (sm_{props.major}{props.minor}), torch {torch.__version__}, "
              f"sm_90a prefill kernel available: {available == 1}")  # fmt: skip
    print(header, flush=True)
    if available != 1:
        print("the sm_90a kernel is not available here: both columns would time mma.sync")
        return 2
    t0 = time.time()
    read_gbps = read_bandwidth_gbps()
    print(f"read bandwidth {read_gbps:.0f} GB/s", flush=True)
    rows = []
    for case in selected:
        try:
            row = probe_case(case, read_gbps, kernels, with_sdpa=not args.sm90_only)
            torch.cuda.empty_cache()  # this case's inputs are gone
        except Exception as error:  # report and go on: the other rows still count
            print(f"{case.name}: FAILED {type(error).__name__}: {error}", flush=True)
            force_kernel(-1)
            continue
        rows.append(row)
        print(json.dumps(row), flush=True)
    bad = [r["case"] for r in rows
           if not (r["sm90_finite"] and r["sm90_vs_f32"] < 1e-2
                   and r.get("sm90_vs_mma", 0.0) < 1e-2)]  # fmt: skip
    out_dir = args.out_dir
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
        record = {"device": header, "read_gbps": read_gbps, "rows": rows, "inaccurate": bad}
        (out_dir / "prefill_sm90_probe.json").write_text(json.dumps(record, indent=1))
    print(f"\n{header}; read {read_gbps:.0f} GB/s; {time.time() - t0:.0f} s")
    print(table(rows))
    print("accuracy: " + ("all rows within 1e-2" if not bad else f"OUT OF TOLERANCE: {bad}"))
    return 1 if bad or len(rows) < len(selected) else 0


if __name__ == "__main__":
    sys.exit(main())
