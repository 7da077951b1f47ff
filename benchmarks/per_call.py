"""Per-call checks of our custom call inside XLA: the JAX chain's slope, the device's own kernel
timestamps, and where XLA put the custom calls (inside a CUDA graph or not), from XLA's thunk dump.
"""

from __future__ import annotations

import re
import tempfile
from pathlib import Path

from benchmarks.timing import device_trace, error_text, time_jax_slope

THUNK_LINE = re.compile(r"^(\s*)(\d+): (k[A-Za-z0-9]+)")


def parse_thunk_sequence(text: str) -> dict:
    """Where XLA put the custom calls of one thunk-sequence dump.

    XLA's dump (GpuExecutable's `thunk_sequence*.txt`, root_thunk->ToString) has one line per
    thunk, "<indent><index>: <kind> ..."; thunks recorded into a command buffer (CUDA graph) are
    indented under their `kCommandBuffer` thunk (the format XLA's own tests parse:
    CountThunksInDump in xla/backends/gpu/tests/collective_ops_e2e_test_base.cc).
    """
    stack: list[tuple[int, str]] = []  # (indent, kind) of the enclosing thunks
    counts = {"custom_call_in_command_buffer": 0, "custom_call_outside": 0, "command_buffers": 0}
    lines = {"command_buffer": None, "custom_call": None}
    for number, line in enumerate(text.splitlines(), start=1):
        match = THUNK_LINE.match(line)
        if not match:
            continue
        indent, kind = len(match.group(1)), match.group(3)
        while stack and stack[-1][0] >= indent:
            stack.pop()
        inside = any(k == "kCommandBuffer" for _, k in stack)
        if kind == "kCommandBuffer":
            counts["command_buffers"] += 1
            lines["command_buffer"] = lines["command_buffer"] or f"{number}: {line.strip()[:160]}"
        elif kind == "kCustomCall":
            key = "custom_call_in_command_buffer" if inside else "custom_call_outside"
            counts[key] += 1
            lines["custom_call"] = lines["custom_call"] or f"{number}: {line.strip()[:160]}"
        stack.append((indent, kind))
    return {**counts, "lines": lines}


def command_buffer_evidence(runner) -> dict:
    """Compile the runner's program with --xla_dump_to and read where its custom calls ended up.

    XLA converts thunks into command buffers after HLO optimisation (CommandBufferConversionPass
    in the thunk pass pipeline); GpuExecutable writes `*thunk_sequence.txt` before the passes and
    `*thunk_sequence_after_thunk_passes.txt` only when a pass changed the sequence. Captured means:
    every custom-call thunk sits inside a kCommandBuffer thunk.
    """
    with tempfile.TemporaryDirectory(prefix="xgo-dump-") as dump:
        runner.compile_for_dump({"xla_dump_to": dump, "xla_dump_hlo_as_text": True})
        files = sorted(p for p in Path(dump).rglob("*thunk_sequence*.txt") if p.is_file())
        after = [p for p in files if "after_thunk_passes" in p.name]
        chosen = after or [p for p in files if p.name.endswith("thunk_sequence.txt")]
        if not chosen:
            names = sorted(p.name for p in Path(dump).rglob("*") if p.is_file())
            return {"captured": None, "error": "no thunk_sequence dump", "dump_files": names[:8]}
        # one program was compiled; the largest dump is its main module
        path = max(chosen, key=lambda p: p.stat().st_size)
        text = path.read_text(errors="replace")
        parsed = parse_thunk_sequence(text)
    inside, outside = parsed["custom_call_in_command_buffer"], parsed["custom_call_outside"]
    # no custom-call thunk found (a changed dump format?): None, never a guess
    captured = None if inside + outside == 0 else (inside > 0 and outside == 0)
    evidence = [f"{path.name}:{line}" for line in parsed["lines"].values() if line]  # file:line
    return {
        "captured": captured,
        "file": path.name,
        "after_thunk_passes_written": bool(after),
        "custom_calls_in_command_buffer": inside,
        "custom_calls_outside": outside,
        "command_buffers": parsed["command_buffers"],
        "evidence": evidence,
        "head": [line[:160] for line in text.splitlines()[:6]],
    }


# Ours, measured per call in detail on the overhead cases and the anchor (the custom call's cost).
PER_CALL_IMPLS = ("xgo_torch", "xgo_jax_graph", "xgo_jax_nograph")


def per_call_measurements(runner, env, samples: int) -> dict:
    """Device time per call from the GPU's own timestamps, the slope of a JAX chain, and where
    XLA put the custom calls (command buffer or not). Each part fails on its own."""
    out: dict = {}
    if runner.framework == "jax":
        try:
            slope = time_jax_slope(
                runner.make_program,
                runner.first_carry,
                runner.operand_sets,
                chain=runner.chain,
                samples=samples,
            )
            out["slope_us"] = slope.median_us
            out["slope_p10_p90_us"] = [slope.quantile(0.1), slope.quantile(0.9)]
            out["slope_method"] = slope.method
        except Exception as error:
            out["slope_error"] = error_text(error, 300)
        try:
            out["command_buffer"] = command_buffer_evidence(runner)
        except Exception as error:
            out["command_buffer"] = {"captured": None, "error": error_text(error, 300)}
    if not env.on_gpu:
        return out
    try:
        if runner.framework == "jax":
            import jax

            rounds = 3

            def run(runner=runner):
                carry = runner.first_carry
                for _ in range(rounds):
                    carry = runner.program(carry, runner.operand_sets)
                jax.block_until_ready(carry)

            calls = rounds * runner.chain
        else:
            import torch

            def run(runner=runner):
                for _ in range(4):
                    for call in runner.calls:
                        call()
                torch.cuda.synchronize()

            calls = 4 * len(runner.calls)
        run()  # warm: nothing compiles inside the trace
        out["device"] = device_trace(run, calls)
    except Exception as error:
        out["device"] = {"error": error_text(error, 300)}
    return out
