"""Decode timings of the paged_attention CUDA kernels under CUDA-graph replay (run on a GPU machine).

Cases: the decode anchor (B=32, Hq=32, Hkv=8, D=128, context 4096, page 16, bf16) and variants
(B=1 with 64k context, B=32 with 1k context, D=64, no GQA). Each graph holds 10 back-to-back
calls over 2 rotating input sets (K/V far larger than L2, random data); the median replay time
/ 10 is reported, with the fraction of `--read-bw` (bytes of K and V / time). Also the host cost
of an eager (no graph) loop of B=1 context-1k calls. The library is the one xla_gpu_ops loads
(XLA_GPU_OPS_LIBRARY selects another). Prints one line per case.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repository root
from benchmarks import ours

CASES = {
    # name: (batch, context, num_q_heads, num_kv_heads, head_dim)
    "anchor B=32 ctx4k": (32, 4096, 32, 8, 128),
    "B=1 ctx64k": (1, 65536, 32, 8, 128),
    "B=32 ctx1k": (32, 1024, 32, 8, 128),
    "B=32 ctx4k D=64": (32, 4096, 32, 8, 64),
    "B=32 ctx4k Hq=Hkv=32": (32, 4096, 32, 32, 128),
}


def decode_inputs(batch, context, num_q_heads, num_kv_heads, head_dim, page_size=16):
    dtype = torch.bfloat16
    pages_per_seq = -(-context // page_size)
    num_pages = batch * pages_per_seq
    kv_cache = torch.randn(num_pages, page_size, 2 * num_kv_heads, head_dim, device="cuda")
    kv_cache = kv_cache.to(dtype)
    block_tables = torch.randperm(num_pages, device="cuda", dtype=torch.int32)
    query = torch.randn(batch, num_q_heads, head_dim, device="cuda").to(dtype)
    return (
        query,
        kv_cache,
        torch.full((batch,), context, dtype=torch.int32, device="cuda"),
        block_tables.view(batch, pages_per_seq),
        torch.arange(batch + 1, dtype=torch.int32, device="cuda"),
        torch.tensor([batch], dtype=torch.int32, device="cuda"),
    )


def attention(query, *rest):
    return ours.launcher_paged_attention(query, *rest, scale=query.shape[-1] ** -0.5)


def graph_us(sets, calls: int = 10, repeats: int = 30) -> float:
    for s in sets:  # warm-up outside the graph (library load, attribute caching)
        attention(*s)
    torch.cuda.synchronize()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
        for i in range(calls):
            attention(*sets[i % len(sets)])
    torch.cuda.synchronize()
    graph.replay()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / calls)
    return statistics.median(times)


def eager_host_us(calls: int = 200) -> float:
    """Wall time per call of an eager loop (host launch cost when it exceeds the GPU time)."""
    s = decode_inputs(1, 1024, 32, 8, 128)
    for _ in range(20):
        attention(*s)
    torch.cuda.synchronize()
    samples = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(calls):
            attention(*s)
        torch.cuda.synchronize()
        samples.append((time.perf_counter() - t0) * 1e6 / calls)
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--read-bw", type=float, default=4404e9, help="bytes/s (default 4404e9)")
    parser.add_argument("--label", default="", help="prefix of every printed line")
    parser.add_argument("--cases", default=",".join(CASES), help="comma-separated case names")
    args = parser.parse_args()
    torch.manual_seed(0)
    print(f"{args.label} library: {ours.library_path()}")
    for name in args.cases.split(","):
        batch, context, hq, hkv, d = CASES[name]
        sets = [decode_inputs(batch, context, hq, hkv, d) for _ in range(2)]
        kv_bytes = batch * context * hkv * 2 * d * 2
        us = graph_us(sets)
        floor = kv_bytes / args.read_bw * 1e6
        print(f"{args.label} {name:24s} {us:8.1f} us  floor {floor:6.1f} us  -> {floor / us:.2f}")
        del sets
        torch.cuda.empty_cache()
    print(f"{args.label} {'eager B=1 ctx1k host':24s} {eager_host_us():8.1f} us/call")


if __name__ == "__main__":
    main()
