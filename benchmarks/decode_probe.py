"""Decode probes for kernel work (run on a GPU machine; graph replay, decode_timing's method).

usage: python3 benchmarks/decode_probe.py LABEL [group ...]
groups: bw (read bandwidth), layout (page placement and kv-head interleave), layout2 (anchor,
ctx 16k, B=1 64k, D=256, D=64), b1 (B=1 at 4k, 16k, 64k: the KV-split merge), prefill (the benchmark's own mixed, 1x8k and 8x2k prefill
cases), ctx (context sweep: the intercept is the fixed cost per call), big (64k contexts),
splits (forced split counts: needs a library built with -DXGO_SPLITS_FROM_ENV), small (the
same for B = 1 and B = 8 decodes of 1k-64k keys: the model's choice, then forced counts), mixed (the
benchmark's mixed case, its decodes alone and its prefills alone, then forced short-region split
counts: XGO_SHORT_SPLITS, a tuning build with -DXGO_SPLITS_FROM_ENV -DXGO_SHORT_SPLIT_KEYS=256).
XLA_GPU_OPS_LIBRARY picks the library, so variants built side by side are compared in one call.
Each line: two medians (the noise) and the fraction of the K/V bytes at READ_BW (default
4475e9, the H200 read bandwidth).
"""

import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repository root
from benchmarks import decode_timing as dt
from benchmarks.cases import OPERANDS, Case, build_inputs, mixed_case, prefill_case
from benchmarks.ceilings import measure_ceilings

READ_BW = float(os.environ.get("READ_BW", "4475e9"))


def inputs(batch, context, hq, hkv, d, identity=False, page_size=16):
    s = list(dt.decode_inputs(batch, context, hq, hkv, d, page_size))
    if identity:
        pages = s[3].numel()
        s[3] = torch.arange(pages, dtype=torch.int32, device="cuda").view_as(s[3])
    return s


def run(label, name, b, ctx, hq, hkv, d, identity=False, page_size=16, nsets=2):
    sets = [inputs(b, ctx, hq, hkv, d, identity, page_size) for _ in range(nsets)]
    us = dt.graph_us(sets)
    us2 = dt.graph_us(sets)
    floor = b * ctx * hkv * 2 * d * 2 / READ_BW * 1e6
    print(
        f"{label:8s} {name:34s} {us:8.1f} {us2:8.1f} us  floor {floor:7.1f} -> {floor / us:.3f}",
        flush=True,
    )
    del sets
    torch.cuda.empty_cache()
    return us


def run_case(label, case):
    """One of the benchmark's own cases (benchmarks/cases.py), two input copies."""
    sets = [[build_inputs(case, "cuda", seed)[name] for name in OPERANDS] for seed in (1, 2)]
    us = dt.graph_us(sets, repeats=10)
    us2 = dt.graph_us(sets, repeats=10)
    print(f"{label:8s} {case.name:40s} {us:8.1f} {us2:8.1f} us", flush=True)
    del sets
    torch.cuda.empty_cache()


def read_bw():
    """The benchmark's own ceiling (run.measure_ceilings: a 2 GiB sum under graph replay)."""
    ceilings = measure_ceilings(on_gpu=True, samples=20)
    print(
        f"read bandwidth: {ceilings['read_gbps']:.0f} GB/s ({ceilings['read_method']})", flush=True
    )


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    label = sys.argv[1]
    groups = sys.argv[2:] or ["layout", "ctx", "splits", "big"]
    torch.manual_seed(0)
    if "bw" in groups:
        read_bw()
    if "layout" in groups:
        run(label, "anchor randperm", 32, 4096, 32, 8, 128)
        run(label, "anchor identity", 32, 4096, 32, 8, 128, identity=True)
        run(label, "B256 Hq4/Hkv1 randperm", 256, 4096, 4, 1, 128)
        run(label, "B256 Hq4/Hkv1 identity", 256, 4096, 4, 1, 128, identity=True)
        run(label, "anchor page64 identity", 32, 4096, 32, 8, 128, identity=True, page_size=64)
    if "layout2" in groups:
        run(label, "anchor randperm", 32, 4096, 32, 8, 128)
        run(label, "B32 ctx16k", 32, 16384, 32, 8, 128)
        run(label, "B1 ctx64k", 1, 65536, 32, 8, 128)
        run(label, "B32 ctx4k D=256", 32, 4096, 32, 8, 256)
        run(label, "B32 ctx4k D=64", 32, 4096, 32, 8, 64)
    if "b1" in groups:
        for ctx in (4096, 16384, 65536):
            run(label, f"B1 ctx{ctx // 1024}k", 1, ctx, 32, 8, 128)
    if "prefill" in groups:
        for case in (mixed_case(), prefill_case(1, 8192), prefill_case(8, 2048)):
            run_case(label, case)
    if "ctx" in groups:
        for ctx in (1024, 2048, 8192, 16384):
            run(label, f"B32 ctx{ctx}", 32, ctx, 32, 8, 128)
    if "big" in groups:
        run(label, "B32 ctx64k randperm", 32, 65536, 32, 8, 128, nsets=1)
        run(label, "B32 ctx64k identity", 32, 65536, 32, 8, 128, identity=True, nsets=1)
    if "mixed" in groups:
        case = mixed_case()
        run_case(label, case)
        for kind, keep in (("decodes", lambda q: q == 1), ("prefills", lambda q: q > 1)):
            seqs = tuple(s for s in case.seqs if keep(s[0]))
            run_case(label, Case(f"{case.name} {kind} alone", "mixed", seqs))
        for n in (1, 2, 3, 4, 6, 8):
            os.environ["XGO_SHORT_SPLITS"] = str(n)
            run_case(f"{label} s{n}", case)
        del os.environ["XGO_SHORT_SPLITS"]
    if "small" in groups:
        for b, ctx, counts in (
            (1, 1024, (1, 2, 4, 8, 16)),
            (8, 1024, (1, 2, 4, 8, 16)),
            (1, 4096, (4, 8, 16, 32, 64)),
            (1, 16384, (16, 32, 64, 128)),
            (1, 65536, (17, 33, 49, 66)),
        ):
            run(label, f"B{b} ctx{ctx // 1024}k model", b, ctx, 32, 8, 128)
            for n in counts:
                os.environ["XGO_DECODE_SPLITS"] = str(n)
                run(label, f"B{b} ctx{ctx // 1024}k splits={n}", b, ctx, 32, 8, 128)
            del os.environ["XGO_DECODE_SPLITS"]
    if "splits" in groups:
        for n in (1, 2, 3, 4, 6, 8):
            os.environ["XGO_DECODE_SPLITS"] = str(n)
            run(label, f"anchor splits={n}", 32, 4096, 32, 8, 128)
        del os.environ["XGO_DECODE_SPLITS"]


if __name__ == "__main__":
    main()
