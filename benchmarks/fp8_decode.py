"""fp8 KV cache against a 16-bit one: decode on a GPU host, ours and FlashInfer's, one process.

    python -m benchmarks fp8-decode --out DIR [--cases NAME ...] [--dtype bfloat16|float16]

Per case (queries of --dtype, bfloat16 by default; page 16) the same random cache is held twice: in
float8_e4m3fn (K / k_scale, V / v_scale; power-of-two scales) and in the query's dtype holding
exactly the dequantised values, so both runs compute the same attention. Rows: our kernel on each cache and, where FlashInfer is installed,
its tensor-core batch decode on each (kv_data_type float8_e4m3fn, run(k_scale, v_scale)). Times are
CUDA-graph replays over 2 input copies (benchmarks/timing.py); the floor is the bytes of K and V
(plus q and out) at the read bandwidth measured in the same process. Checks: our fp8 output
against our 16-bit output on the dequantised cache and against FlashInfer's fp8 output (relative
L2). Targets of the serving issue: anchor fp8 time <= 16-bit time / 1.8, and >= 0.9 of the fp8
floor. Writes DIR/fp8_decode.json (fp8_decode-float16.json for float16 queries) and prints a table.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

from benchmarks import environment, flashinfer_peer
from benchmarks.cases import (
    FP8,
    K_SCALE,
    V_SCALE,
    Case,
    build_inputs,
    decode_case,
    fp8_copy,
    kv_scales,
    rel_l2,
)
from benchmarks.ceilings import measure_ceilings
from benchmarks.runners import BenchEnv
from benchmarks.timing import release_cached_memory, time_torch

SPEEDUP_TARGET, FLOOR_TARGET = 1.8, 0.9
SHORT_NAMES = {"bfloat16": "bf16", "float16": "f16"}
CASES = {
    c.name: c
    for c in (
        decode_case(32, 4096, (32, 8)),  # the anchor
        decode_case(1, 65536, (32, 8)),
        decode_case(8, 16384, (64, 8)),
        decode_case(32, 1024, (32, 8)),
        decode_case(32, 4096, (32, 8), head_dim=256),
    )
}


def run_case(case: Case, read_gbps: float, samples: int) -> dict:
    import torch

    fp8_copies, wide_copies = [], []
    metadata = None
    for seed in range(2):  # copies differ in q and KV; one page table (FlashInfer plans once)
        fp8, exact = fp8_copy(build_inputs(case, "cuda", seed, metadata))
        metadata = {k: v for k, v in fp8.items() if k not in ("query", "kv_cache")}
        fp8_copies.append(fp8)
        wide_copies.append(exact)
    release_cached_memory()
    scale = case.head_dim**-0.5

    import xla_gpu_ops  # noqa: F401  (registers torch.ops.xla_gpu.*)

    def ours_calls(copies, scales):
        op = torch.ops.xla_gpu.paged_attention
        return [lambda c=c: op(**c, scale=scale, **scales) for c in copies]

    fp8_case = dataclasses.replace(case, kv_dtype=FP8)
    rows: dict[str, dict] = {}
    outputs = {}
    wide = SHORT_NAMES[case.dtype]  # the 16-bit cache's rows: ours_bf16 / ours_f16, ...
    for name, calls in (
        (f"ours_{wide}", ours_calls(wide_copies, {})),
        ("ours_fp8", ours_calls(fp8_copies, kv_scales(fp8_case))),
    ):
        outputs[name] = calls[0]().float()
        rows[name] = {"median_us": time_torch(calls, samples=samples).median_us}
    for name, peer_case, copies in (
        (f"flashinfer_{wide}", case, wide_copies),
        ("flashinfer_fp8", fp8_case, fp8_copies),
    ):
        reason = flashinfer_peer.unavailable()
        if reason is not None:
            rows[name] = {"skipped": reason}
            continue
        try:
            calls = flashinfer_peer.prepare_decode(BenchEnv(True), peer_case, copies).calls
            outputs[name] = calls[0]().float()
            rows[name] = {"median_us": time_torch(calls, samples=samples).median_us}
        except Exception as error:  # a peer that cannot run this case is recorded, not fatal
            rows[name] = {"skipped": f"{type(error).__name__}: {str(error)[:200]}"}
    kv_tokens = sum(ctx for _, ctx in case.seqs)
    q_out = 2 * case.num_tokens * case.num_q_heads * case.head_dim * 2
    kv_fp8 = kv_tokens * 2 * case.num_kv_heads * case.head_dim
    floors = {
        "fp8": (kv_fp8 + q_out) / read_gbps / 1e3,
        wide: (2 * kv_fp8 + q_out) / read_gbps / 1e3,
    }
    for name, row in rows.items():
        if "median_us" in row:
            row["floor_fraction"] = floors[name.rsplit("_", 1)[1]] / row["median_us"]
    checks = {f"ours_fp8_vs_ours_{wide}": rel_l2(outputs["ours_fp8"], outputs[f"ours_{wide}"])}
    if "flashinfer_fp8" in outputs:
        checks["ours_fp8_vs_flashinfer_fp8"] = rel_l2(
            outputs["ours_fp8"], outputs["flashinfer_fp8"]
        )
    speedup = rows[f"ours_{wide}"]["median_us"] / rows["ours_fp8"]["median_us"]
    verdicts = {
        f"speedup >= {SPEEDUP_TARGET}": "met" if speedup >= SPEEDUP_TARGET else "MISSED",
        f"fp8 floor >= {FLOOR_TARGET}": "met"
        if rows["ours_fp8"]["floor_fraction"] >= FLOOR_TARGET
        else "MISSED",
    }
    del fp8_copies, wide_copies, outputs
    torch.cuda.empty_cache()
    return {
        "case": case.name,
        "dtype": case.dtype,
        "rows": rows,
        "fp8_speedup": speedup,
        "floors_us": floors,
        "checks_rel_l2": checks,
        "verdicts": verdicts,
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks fp8-decode", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--cases", nargs="*", default=list(CASES), choices=list(CASES))
    parser.add_argument("--samples", type=int, default=20)
    parser.add_argument(
        "--dtype",
        choices=list(SHORT_NAMES),
        default="bfloat16",
        help="the queries' dtype, and the 16-bit cache's",
    )
    args = parser.parse_args(argv)
    environment.prepare_process(True)
    env = environment.collect_env(True)
    ceilings = measure_ceilings(True, args.samples)
    wide = SHORT_NAMES[args.dtype]
    results = {
        "env": env,
        "dtype": args.dtype,
        "read_gbps": ceilings["read_gbps"],
        "k_scale": K_SCALE,
        "v_scale": V_SCALE,
        "flashinfer": flashinfer_peer.version(),
        "cases": [],
    }
    print(f"read {ceilings['read_gbps']:.0f} GB/s; FlashInfer {results['flashinfer']}")
    print(
        f"| case | ours {wide} µs | ours fp8 µs | fp8 / {wide} speed-up | fp8 floor frac | "
        f"FlashInfer {wide} µs | FlashInfer fp8 µs | rel L2 vs {wide} / FI | verdicts |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---|---|")
    for name in args.cases:
        case = dataclasses.replace(CASES[name], dtype=args.dtype)
        r = run_case(case, ceilings["read_gbps"], args.samples)
        results["cases"].append(r)
        rows = r["rows"]

        def us(row):
            return f"{row['median_us']:.1f}" if "median_us" in row else "skipped"

        checks = " / ".join(f"{v:.1e}" for v in r["checks_rel_l2"].values())
        verdicts = "; ".join(f"{k} {v}" for k, v in r["verdicts"].items())
        print(
            f"| {name} | {us(rows[f'ours_{wide}'])} | {us(rows['ours_fp8'])} | "
            f"{r['fp8_speedup']:.2f} | {rows['ours_fp8']['floor_fraction']:.2f} | "
            f"{us(rows[f'flashinfer_{wide}'])} | {us(rows['flashinfer_fp8'])} | {checks} | "
            f"{verdicts} |"
        )
        args.out.mkdir(parents=True, exist_ok=True)
        suffix = "" if args.dtype == "bfloat16" else f"-{args.dtype}"
        (args.out / f"fp8_decode{suffix}.json").write_text(
            json.dumps(results, indent=1, default=str)
        )
    for r in results["cases"]:
        for name, row in r["rows"].items():
            if "skipped" in row:
                print(f"{r['case']}: {name} skipped: {row['skipped']}")
    return 0
