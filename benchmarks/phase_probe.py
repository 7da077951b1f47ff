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
--blocks DIR: also one CSV per shape and run with every block's SM, start and end (ns from the
first start) and phases (us), blocks in launch order (grid.x fastest, then grid.y, then the split).

--prefill: the sm_90a prefill kernel instead (forced through the library's test hook), on the
causal prefill shapes of prefill_sm90_probe.py. Per block: barrier set-up, the tile lookup, the
wait for Q and the first K tile, the first tile's S and softmax, the rest of the tiles, the
epilogue (Sm90Phase in paged_attention_sm90.cuh); per SM (%smid) the gaps between one block's end
and the next one's start and the idle tail; cycles converted at the clock each block measured
(its clock64 span over its %globaltimer span). A persistent launch (one block per SM) keeps the
set-up and lookup of each block's first item and the later phases of its last one: build with
-DXGO_SM90_PERSISTENT=0 as well for per-item phases.
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

BLOCKS, SLOTS = 8192, 9  # kPhaseBlocks, kPhaseSlots
DECODE_END_NS, DECODE_SM = 7, 8  # kPhaseEndSlot, kPhaseSmSlot (RecordPhase)
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


def stored_outputs(rows: np.ndarray) -> np.ndarray:
    """Mask of the blocks that stored outputs after at least one tile (a block with an empty key
    range never stamps slot 4, so its phases would mix zeros with clock values)."""
    return (rows[:, : DECODE_END_NS + 1] > 0).all(axis=1)


def write_blocks(table: np.ndarray, ghz: float, path: Path) -> None:
    rows = table[: np.count_nonzero(table[:, 0])].astype(np.int64)  # blocks in launch order
    t0 = rows[rows[:, 0] > 0, 0].min()
    phases_us = np.diff(rows[:, 1:7], axis=1) / ghz / 1e3
    with path.open("w") as f:
        f.write("block,sm,start_ns,end_ns," + ",".join(PHASES) + "\n")
        for i, (r, ph, done) in enumerate(zip(rows, phases_us, stored_outputs(rows), strict=True)):
            cells = [f"{v:.3f}" for v in ph] if done else [""] * len(PHASES)
            end = str(r[DECODE_END_NS] - t0) if done else ""
            f.write(f"{i},{r[DECODE_SM]},{r[0] - t0},{end}," + ",".join(cells) + "\n")


def summarise(table: np.ndarray, ghz: float) -> str:
    done = table[stored_outputs(table)].astype(np.int64)
    if len(done) == 0:
        return "no block stored outputs (is this a -DXGO_PHASE_TIMES=1 build?)"
    truncated = " (TRUNCATED: more blocks than the table holds)" if len(done) == BLOCKS else ""
    phases_us = np.diff(done[:, 1:7], axis=1) / ghz / 1e3
    start, end = done[:, 0], done[:, DECODE_END_NS]
    med, top = np.median(phases_us, axis=0), np.max(phases_us, axis=0)
    parts = " ".join(f"{n} {m:.2f}/{t:.2f}" for n, m, t in zip(PHASES, med, top, strict=True))
    return (
        f"blocks {len(done):4d}  start spread {(start.max() - start.min()) / 1e3:5.2f} us  "
        f"span {(end.max() - start.min()) / 1e3:7.2f} us | median/max us: {parts}{truncated}"
    )


SM90_SLOTS = 16  # kSm90PhaseSlots; slot names as Sm90Phase
(
    START_NS,
    START,
    SM,
    FOUND,
    SPLIT,
    PRODUCER_FIRST_K,
    FIRST_TILE,
    FIRST_STEP,
    LOOP,
    END,
    OTHER_END,
    TILES,
    END_NS,
    PRODUCER_END,
    PRODUCER_Q,
) = range(15)
PREFILL_SHAPES = {  # name: (batch, tokens per sequence, head dim)
    "B1 8k": (1, 8192, 128),
    "B8 2k": (8, 2048, 128),
    "B1 8k d64": (1, 8192, 64),
    "B8 2k d64": (8, 2048, 64),
}


def sm90_summary(table: np.ndarray) -> str:
    rows = table[(table[:, END] > 0) & (table[:, TILES] > 0)].astype(np.int64)
    if len(rows) == 0:
        return "no block finished a tile (is this a -DXGO_PHASE_TIMES=1 build?)"
    ghz = np.median(
        (rows[:, END] - rows[:, START]) / np.maximum(rows[:, END_NS] - rows[:, START_NS], 1)
    )
    us = lambda cycles: cycles / ghz / 1e3  # noqa: E731
    tiles = rows[:, TILES]
    # Order in the kernel: barriers and the role split, then the producer's lookup of the first
    # item (a persistent block's later items overwrite the other slots: see the docstring).
    phases = {
        "setup": rows[:, SPLIT] - rows[:, START],
        "lookup": rows[:, FOUND] - rows[:, SPLIT],
        "first-QK-wait": rows[:, FIRST_TILE] - rows[:, FOUND],
        "first-step": rows[:, FIRST_STEP] - rows[:, FIRST_TILE],
        "tiles": rows[:, LOOP] - rows[:, FIRST_STEP],
        "epilogue": rows[:, END] - rows[:, LOOP],
    }
    lines = [
        f"  blocks {len(rows)}, {tiles.mean():.1f} tiles each, clock {ghz:.3f} GHz, "
        f"span {(rows[:, END_NS].max() - rows[:, START_NS].min()) / 1e3:.1f} us"
    ]
    lines.append(
        "  per block (us, median / mean): "
        + ", ".join(f"{n} {us(np.median(v)):.2f} / {us(v.mean()):.2f}" for n, v in phases.items())
    )
    step = (rows[:, LOOP] - rows[:, FIRST_STEP]) / np.maximum(tiles - 1, 1)
    lines.append(
        f"  per later tile {us(np.median(step[tiles > 1])):.3f} us (median); producer "
        f"issues Q {us(np.median(rows[:, PRODUCER_Q] - rows[:, SPLIT])):.2f} and the first K "
        f"{us(np.median(rows[:, PRODUCER_FIRST_K] - rows[:, SPLIT])):.2f}"
        f" us after the split; consumer 1 ends {us(np.median(rows[:, OTHER_END] - rows[:, END])):.2f}"
        " us after consumer 0"
    )
    # Per SM: where the span goes (sums of each phase over the SM's blocks, gaps between blocks,
    # the idle head and tail against the whole launch's span, in globaltimer ns).
    t0, t1 = rows[:, START_NS].min(), rows[:, END_NS].max()
    totals = {n: 0.0 for n in [*phases, "between blocks", "idle head+tail"]}
    sms = np.unique(rows[:, SM])
    for sm in sms:
        mine = rows[rows[:, SM] == sm]
        mine = mine[np.argsort(mine[:, START])]
        for n, v in phases.items():
            totals[n] += us(v[rows[:, SM] == sm].sum())
        ends = np.maximum(mine[:, END], mine[:, OTHER_END])
        totals["between blocks"] += us(np.clip(mine[1:, START] - ends[:-1], 0, None).sum())
        totals["idle head+tail"] += (mine[0, START_NS] - t0 + t1 - mine[-1, END_NS]) / 1e3
    whole = sum(totals.values())
    lines.append(
        f"  share of {len(sms)} SMs x span: "
        + ", ".join(f"{n} {100 * v / whole:.1f} %" for n, v in totals.items())
    )
    return "\n".join(lines)


def prefill_main(lib, shapes: list[str]) -> None:
    from benchmarks.cases import build_inputs, scale_of
    from benchmarks.prefill_sm90_probe import force_kernel, prefill_case

    if not hasattr(lib, "xgo_debug_sm90_phase_times"):
        sys.exit("the library has no xgo_debug_sm90_phase_times: build it with -DXGO_PHASE_TIMES=1")
    force_kernel(1)
    for name in shapes:
        batch, length, head_dim = PREFILL_SHAPES[name]
        case = prefill_case(batch, length, head_dim)
        c = build_inputs(case, "cuda", seed=0)

        def call(c=c, case=case):
            return torch.ops.xla_gpu.paged_attention(*(c[n] for n in OPERANDS), scale_of(case))

        for _ in range(5):
            call()
        torch.cuda.synchronize()
        for mode, calls in (("after earlier calls", 3), ("after an idle device", 1)):
            if lib.xgo_debug_sm90_phase_times(None, 1) != 0:
                raise RuntimeError("xgo_debug_sm90_phase_times could not reset the table")
            torch.cuda.synchronize()
            for _ in range(calls):
                call()
            torch.cuda.synchronize()
            table = np.zeros((BLOCKS, SM90_SLOTS), dtype=np.uint64)
            ptr = table.ctypes.data_as(ctypes.POINTER(ctypes.c_ulonglong))
            if lib.xgo_debug_sm90_phase_times(ptr, 0) != 0:
                raise RuntimeError("xgo_debug_sm90_phase_times failed")
            print(f"{case.name} {mode}:\n{sm90_summary(table)}", flush=True)
        del c
        torch.cuda.empty_cache()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ghz", type=float, default=1.98, help="SM clock for clock64 phases")
    parser.add_argument("--shapes", default=None, help="comma-separated names")
    parser.add_argument("--prefill", action="store_true", help="the sm_90a prefill kernel")
    parser.add_argument("--blocks", type=Path, default=None, help="per-block CSVs into this dir")
    args = parser.parse_args()
    path = os.environ.get("XLA_GPU_OPS_LIBRARY")
    if not path:
        sys.exit("set XLA_GPU_OPS_LIBRARY to a -DXGO_PHASE_TIMES=1 build (see the docstring)")
    lib = ctypes.CDLL(path)
    if not hasattr(lib, "xgo_debug_phase_times"):
        sys.exit(f"{path} has no xgo_debug_phase_times: build it with -DXGO_PHASE_TIMES=1")
    if args.prefill:
        prefill_main(lib, (args.shapes or ",".join(PREFILL_SHAPES)).split(","))
        return
    for name in (args.shapes or ",".join(SHAPES)).split(","):
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
            table = phase_table(lib)
            print(f"{case.name:34s} {mode:21s} {summarise(table, args.ghz)}", flush=True)
            if args.blocks:
                args.blocks.mkdir(parents=True, exist_ok=True)
                tag = "warm" if calls > 1 else "idle"
                write_blocks(table, args.ghz, args.blocks / f"{case.name}-{tag}.csv")
        del sets
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
