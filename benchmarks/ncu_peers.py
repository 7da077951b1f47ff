"""Our kernels and FlashInfer's on the same inputs, one call each, for a profiler (run on a GPU host).

usage: ncu --profile-from-start off --clock-control none --set full -o REPORT \\
           python3 -m benchmarks ncu CASE_SUBSTRING [...]

Each benchmark case whose name holds one of the substrings (benchmarks/cases.py, full grid) gets
its inputs, one warm-up call of ours and of FlashInfer's, then, between cudaProfilerStart and
cudaProfilerStop, one call of each with an NVTX range named "<impl> <case>" around it, so the
report holds exactly those kernels (ours: the attention kernel and its fill / merge kernel).
FlashInfer's plan() runs before, on the host, as in the benchmark.
"""

from __future__ import annotations

from benchmarks import flashinfer_peer, ours
from benchmarks.cases import SPEC_DECODE, all_cases, build_inputs, op_attributes, op_operands
from benchmarks.runners import BenchEnv


def main(argv: list[str]) -> int:
    import torch

    if not argv or argv[0] in ("-h", "--help"):
        raise SystemExit(__doc__)
    env = BenchEnv(on_gpu=True)
    cases = [c for c in all_cases(quick=False) if any(s in c.name for s in argv)]
    cases = [c for c in cases if c.kind in ("decode", SPEC_DECODE, "prefill", "mixed")]
    if not cases:
        raise SystemExit(f"no decode / spec_decode / prefill / mixed case matches {argv}")
    for case in cases:
        inputs = build_inputs(case, "cuda", seed=1)
        # FlashInfer's decode wrapper takes one query per request: its prefill wrapper runs the
        # spec_decode rows, as in the benchmark
        prepare = (
            flashinfer_peer.prepare_decode
            if case.kind == "decode"
            else flashinfer_peer.prepare_prefill
        )
        impls = {
            "ours": lambda inputs=inputs, case=case: ours.op_paged_attention(
                **op_operands(inputs), **op_attributes(case)
            ),
            "flashinfer": prepare(env, case, [inputs]).calls[0],
        }
        for call in impls.values():  # warm-up: module loads, first-use allocations
            call()
        torch.cuda.synchronize()
        torch.cuda.profiler.start()
        for name, call in impls.items():
            torch.cuda.nvtx.range_push(f"{name} {case.name}")
            call()
            torch.cuda.synchronize()
            torch.cuda.nvtx.range_pop()
        torch.cuda.profiler.stop()
        print(f"profiled {case.name}: {', '.join(impls)}", flush=True)
        del inputs, impls
        torch.cuda.empty_cache()
    return 0
