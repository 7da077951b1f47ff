"""Where a decode call's time goes, per block: phase timestamps from inside the kernel.

Needs a diagnostic build (the phases are compiled out of the normal one):
    XLA_GPU_OPS_CUDA_ARCHS=90a XLA_GPU_OPS_CUDA_FLAGS=-DXGO_PHASE_TIMES=1 nox -s build
    XLA_GPU_OPS_LIBRARY=<the variant path nox prints> python3 benchmarks/phase_probe.py

Each decode block's thread 0 stamps: start, the previous kernel done (programmatic launch wait),
sequence found (metadata loads), first K/V tile landed (block_tables -> K/V round trips), every
tile computed on, outputs stored (RecordPhase in paged_attention_kernels.cuh). Per shape it prints
the median / max of each phase over the blocks of one call, the spread of block start times, and
the span from the first block's start to the last block's end (globaltimer, so across SMs).
Two runs per shape: right after earlier calls (as in a serving loop) and after an idle device.
Phases are clock64 cycles converted at --ghz (the H200 runs decode at 1.98 GHz).
"""

from __future__ import annotations

import argparse
import ctypes
import os
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repository root
from benchmarks import ours
from benchmarks.cases import OPERANDS, build_inputs, decode_case, scale_of

BLOCKS, SLOTS = 8192, 8  # kPhaseBlocks, kPhaseSlots
PHASES = ("pdl-wait", "find", "first-tile", "loop", "epilogue")
SHAPES = {
    "B1 1k": (1, 1024, (32, 8)),
    "B1 16k": (1, 16384, (32, 8)),
    "B8 4k": (8, 4096, (32, 8)),
    "B32 4k": (32, 4096, (32, 8)),
    "B1 64k": (1, 65536, (32, 8)),
}


def phase_table(lib) -> np.ndarray:
    table = np.zeros((BLOCKS, SLOTS), dtype=np.uint64)
    status = lib.xgo_debug_phase_times(table.ctypes.data_as(ctypes.POINTER(ctypes.c_ulonglong)), 0)
    if status != 0:
        raise RuntimeError("xgo_debug_phase_times failed")
    return table


def summarise(table: np.ndarray, ghz: float) -> str:
    # blocks that stored outputs after at least one tile (a block with an empty key range never
    # stamps slot 4, so its phases would mix zeros with clock values)
    done = table[(table > 0).all(axis=1)].astype(np.int64)
    if len(done) == 0:
        return "no block stored outputs (is this a -DXGO_PHASE_TIMES=1 build?)"
    truncated = " (TRUNCATED: more blocks than the table holds)" if len(done) == BLOCKS else ""
    phases_us = np.diff(done[:, 1:7], axis=1) / ghz / 1e3
    start, end = done[:, 0], done[:, SLOTS - 1]
    med, top = np.median(phases_us, axis=0), np.max(phases_us, axis=0)
    parts = " ".join(f"{n} {m:.2f}/{t:.2f}" for n, m, t in zip(PHASES, med, top, strict=True))
    return (
        f"blocks {len(done):4d}  start spread {(start.max() - start.min()) / 1e3:5.2f} us  "
        f"span {(end.max() - start.min()) / 1e3:7.2f} us | median/max us: {parts}{truncated}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ghz", type=float, default=1.98, help="SM clock for clock64 phases")
    parser.add_argument("--shapes", default=",".join(SHAPES), help="comma-separated names")
    args = parser.parse_args()
    path = os.environ.get("XLA_GPU_OPS_LIBRARY")
    if not path:
        sys.exit("set XLA_GPU_OPS_LIBRARY to a -DXGO_PHASE_TIMES=1 build (see the docstring)")
    lib = ctypes.CDLL(path)
    if not hasattr(lib, "xgo_debug_phase_times"):
        sys.exit(f"{path} has no xgo_debug_phase_times: build it with -DXGO_PHASE_TIMES=1")
    for name in args.shapes.split(","):
        batch, context, heads = SHAPES[name]
        case = decode_case(batch, context, heads)
        sets = [[build_inputs(case, "cuda", seed=s)[n] for n in OPERANDS] for s in range(4)]

        def call(i, sets=sets, case=case):
            return ours.launcher_paged_attention(*sets[i % len(sets)], scale=scale_of(case))

        for i in range(20):  # warm-up: library load, attributes, caches
            call(i)
        torch.cuda.synchronize()
        for mode, calls in (("after earlier calls", 3), ("after an idle device", 1)):
            if lib.xgo_debug_phase_times(None, 1) != 0:
                raise RuntimeError("xgo_debug_phase_times could not reset the table")
            torch.cuda.synchronize()
            for i in range(calls):  # the last call's blocks overwrite the earlier ones'
                call(i)
            torch.cuda.synchronize()
            print(f"{case.name:34s} {mode:21s} {summarise(phase_table(lib), args.ghz)}", flush=True)
        del sets
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
