"""Benchmark entry point: `python -m benchmarks.run [--quick] [--cases SUBSTR ...] [--out DIR]`.

On a GPU: measures the device's read / copy bandwidth and bf16 matrix rate, then every case for
every implementation available (benchmarks/peers.py), and writes results.json, table.md,
plot.png and env.json to benchmarks/results/<date>-<device>/ (or --out). Without a GPU it says
so and runs the CPU smoke run (tiny shapes, host timings) so every harness code path is exercised.
Timing method: benchmarks/timing.py.
"""

from __future__ import annotations

import argparse
import datetime as dt
import gc
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NO_GPU_MESSAGE = (
    "No GPU: torch.cuda.is_available() is False. Running the CPU smoke run of the harness "
    "(tiny shapes; host handler, reference and composite on the CPU). Its timings are host "
    "timings of the harness code paths, not kernel performance."
)
DEFAULT_BUDGET_GB = 24.0  # KV cache bytes per case (all copies) the harness may allocate


def _prepare_process(on_gpu: bool) -> None:
    # JAX must not grab 75% of the GPU up front: torch allocates the inputs it shares through
    # DLPack. Both must be set before jax is imported.
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    if not on_gpu:
        os.environ.setdefault("JAX_PLATFORMS", "cpu")


def gpu_available() -> bool:
    import torch

    return torch.cuda.is_available()


# ------------------------------------------------------------------------------ environment
def _git_commit() -> str:
    """XLA_GPU_OPS_GIT_COMMIT when set (device_bench.sh passes it on: the lent GPU machine's copy
    of the working tree has no .git, or a stale one), else HEAD (+dirty) of the checkout."""
    given = os.environ.get("XLA_GPU_OPS_GIT_COMMIT")
    if given:
        return given
    if not (ROOT / ".git").exists():
        return "unknown (no .git; set XLA_GPU_OPS_GIT_COMMIT)"
    try:
        out = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True,
                             text=True, timeout=10, check=True)  # fmt: skip
        dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--", "kernels",
                                "xla_gpu_ops", "benchmarks"], capture_output=True, text=True,
                               timeout=10).stdout.strip()  # fmt: skip
        return out.stdout.strip() + ("+dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def library_info() -> dict | None:
    """Which build of libxla_gpu_ops.so ran: path, size, mtime, sha256, ABI version, and the
    CUDA architectures its fatbinary holds (cuobjdump, where available)."""
    import hashlib

    try:
        from xla_gpu_ops import _library
    except Exception as error:
        return {"error": f"xla_gpu_ops does not import: {error}"}
    path = _library.library_path()
    if not path.is_file():
        return None
    data = path.read_bytes()
    info = {
        "path": str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path),
        "bytes": len(data),
        "mtime_utc": dt.datetime.fromtimestamp(path.stat().st_mtime, dt.UTC).strftime(
            "%Y-%m-%dT%H:%M:%SZ"
        ),
        "sha256": hashlib.sha256(data).hexdigest(),
    }
    try:
        info["abi_version"] = int(_library.load().cdll.xla_gpu_ops_abi_version())
    except Exception as error:  # a CPU-only box still loads it; say why if not
        info["abi_version"] = f"not loadable: {error}"
    try:
        listing = subprocess.run(["cuobjdump", "--list-elf", str(path)], capture_output=True,
                                 text=True, timeout=30).stdout  # fmt: skip
        archs = sorted(set(re.findall(r"sm_\d+[a-z]?", listing)))
        if archs:
            info["cuda_archs"] = archs
    except (OSError, subprocess.SubprocessError):
        pass
    return info


def _version(module: str) -> str | None:
    try:
        from importlib.metadata import version

        return version(module)
    except Exception:
        return None


def collect_env(on_gpu: bool) -> dict:
    import torch

    env = {
        "date_utc": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "git_commit": _git_commit(),
        "python": platform.python_version(),
        "host": platform.node(),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "jax": _version("jax"),
        "jaxlib": _version("jaxlib"),
        "jax_cuda_plugin": _version("jax-cuda13-plugin") or _version("jax-cuda12-plugin"),
        "triton": _version("triton"),
        "torchax": _version("torchax"),
        "library": library_info(),
        "gpu": None,
    }
    if on_gpu:
        props = torch.cuda.get_device_properties(0)
        env["gpu"] = {
            "name": props.name,
            "memory_gb": round(props.total_memory / 1e9, 1),
            "sm_count": props.multi_processor_count,
            "capability": f"{props.major}.{props.minor}",
            "l2_bytes": getattr(props, "L2_cache_size", None),
        }
        try:
            fields = ("driver_version", "clocks.max.sm", "clocks.max.mem", "power.limit",
                      "persistence_mode", "compute_mode")  # fmt: skip
            smi = subprocess.run(["nvidia-smi", f"--query-gpu={','.join(fields)}",
                                  "--format=csv,noheader"], capture_output=True, text=True,
                                 timeout=20).stdout.strip()  # fmt: skip
            # max clocks, not current ones: at query time the GPU idles (345 MHz read as if
            # it were the clock the run used)
            values = [v.strip() for v in smi.splitlines()[0].split(",")] if smi else []
            env["nvidia_smi"] = dict(zip(fields, values, strict=False))
            env["driver"] = values[0] if values else None
        except (OSError, subprocess.SubprocessError) as error:
            env["driver"] = f"unknown ({error})"
    else:
        env["cpu"] = platform.processor() or platform.machine()
    return env


def device_slug(env: dict) -> str:
    name = env["gpu"]["name"] if env.get("gpu") else "cpu-smoke"
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


# ------------------------------------------------------------------------------ ceilings
def measure_ceilings(on_gpu: bool, samples: int) -> dict:
    """Read bandwidth (a large sum), copy bandwidth (read + write) and the bf16 matmul rate."""
    import torch

    from benchmarks.timing import time_torch

    device = "cuda" if on_gpu else "cpu"
    gen = torch.Generator(device=device).manual_seed(7)

    def timed(make_call) -> object:
        # the buffers live only inside this call, so each measurement frees its own
        return time_torch([make_call()], samples=samples, target_us=20000.0)

    read_elems = (1 << 29) if on_gpu else (1 << 21)  # 2 GiB / 8 MiB of float32

    def make_read():
        x = torch.randn(read_elems, generator=gen, device=device)
        return lambda: x.sum()

    copy_elems = (1 << 28) if on_gpu else (1 << 20)

    def make_copy():  # copy_ of one dtype is a cudaMemcpyAsync (copy engine path)
        src = torch.randn(copy_elems, generator=gen, device=device)
        dst = torch.empty_like(src)
        return lambda: dst.copy_(src)

    def make_copy_kernel():  # an elementwise kernel that reads one buffer and writes another
        src = torch.randn(copy_elems, generator=gen, device=device)
        dst = torch.empty_like(src)
        return lambda: torch.neg(src, out=dst)

    n = 8192 if on_gpu else 256
    dtype = torch.bfloat16 if on_gpu else torch.float32

    def make_matmul():
        a = torch.randn(n, n, generator=gen, device=device).to(dtype)
        b = torch.randn(n, n, generator=gen, device=device).to(dtype)
        return lambda: a @ b

    read = timed(make_read)
    _free(on_gpu)
    copy = timed(make_copy)
    _free(on_gpu)
    copy_kernel = timed(make_copy_kernel)
    _free(on_gpu)
    matmul = timed(make_matmul)
    _free(on_gpu)
    return {
        "read_gbps": 4 * read_elems / read.median_us / 1e3,
        "copy_gbps": 2 * 4 * copy_elems / min(copy.median_us, copy_kernel.median_us) / 1e3,
        "copy_memcpy_gbps": 2 * 4 * copy_elems / copy.median_us / 1e3,
        "copy_kernel_gbps": 2 * 4 * copy_elems / copy_kernel.median_us / 1e3,
        "matmul_tflops": 2 * n**3 / matmul.median_us / 1e6,
        "matmul_dtype": str(dtype).removeprefix("torch."),
        "read_method": f"torch.sum over {4 * read_elems >> 20} MiB float32; {read.method}",
        "copy_method": f"best of copy_ and torch.neg(out=) over {4 * copy_elems >> 20} MiB float32 "
        f"(read + write bytes); {copy.method}",
        "matmul_method": f"{n}x{n} @ {n}x{n}; {matmul.method}",
        "read_spread_us": [read.quantile(0.1), read.quantile(0.9)],
    }


def _free(on_gpu: bool) -> None:
    gc.collect()
    if on_gpu:
        from benchmarks.timing import release_cached_memory

        release_cached_memory()


# ------------------------------------------------------------------------------ one case
def _rel_l2(out, ref) -> float:
    import torch

    if out.shape != ref.shape:
        raise ValueError(f"output shape {tuple(out.shape)} != expected {tuple(ref.shape)}")
    if not torch.isfinite(out).all():
        return float("nan")
    return float((out - ref).norm() / ref.norm().clamp_min(1e-30))


def _expected(case, first_copy, on_gpu: bool):
    """Higher-precision expected output of copy 0, when affordable; else None."""
    from benchmarks.cases import OPERANDS, scale_of
    from xla_gpu_ops import reference

    if case.kind == "simple_add":
        return (first_copy["a"].double() + first_copy["b"].double()).float().cpu()
    biggest_logits = max(q * ctx for q, ctx in case.seqs) * case.num_q_heads * 8
    if biggest_logits > 2e9 or case.bytes_needed() > 2e9:
        return None
    args = [first_copy[name] for name in OPERANDS]
    compute = "float64" if not on_gpu else "float32"
    import torch

    out = reference.paged_attention(*args, scale_of(case), compute_dtype=getattr(torch, compute))
    return out.float().cpu()


def _tolerance(case) -> float:
    return 1e-5 if case.dtype == "float32" else 2e-2


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


def run_case(env, case, ceilings: dict, *, samples: int, budget_bytes: float, l2_bytes: int,
             progress=None, skips: dict | None = None, on_impl=None) -> dict:  # fmt: skip
    """Measure one case for every implementation; never raises for an implementation's failure.

    skips: {impl: reason} recorded as failed without running (an earlier worker crashed there).
    on_impl(impl): called before each implementation starts (the isolated runner's bookkeeping).
    """
    from benchmarks import peers as P
    from benchmarks.cases import build_inputs, num_copies
    from benchmarks.timing import _short, time_jax_chain, time_torch

    record = {
        "name": case.name,
        "kind": case.kind,
        "params": case.params(),
        "bytes": case.bytes_needed(),
        "flops": case.flops(),
        "floor_us": case.bytes_needed() / (ceilings["read_gbps"] * 1e3),
        "compute_floor_us": case.flops() / (ceilings["matmul_tflops"] * 1e6),
        "impls": {},
    }
    per_copy = case.kv_cache_bytes if case.kind != "simple_add" else case.bytes_needed()
    # peers that keep a second layout of the cache (contiguous K/V, transposed pages) double it
    if 2 * per_copy > budget_bytes:
        record["skipped"] = (f"KV cache {per_copy / 1e9:.1f} GB (x2 for peer layouts) exceeds the "
                             f"memory budget {budget_bytes / 1e9:.0f} GB")  # fmt: skip
        return record
    # CPU smoke: two copies exercise the rotation without multiplying slow host timings
    copies_wanted = num_copies(case, l2_bytes, cap=32 if env.on_gpu else 2)
    copies_n = max(1, min(copies_wanted, int(budget_bytes // (2 * per_copy))))
    record["input_copies"] = copies_n
    record["working_set_bytes"] = copies_n * case.bytes_needed()
    copies = [build_inputs(case, env.device, seed=1000 + case_seed(case))]
    meta = meta_of(copies[0])
    for i in range(1, copies_n):
        copies.append(build_inputs(case, env.device, seed=1000 + case_seed(case) + i,
                                   metadata=meta or None))  # fmt: skip
    expected = _expected(case, copies[0], env.on_gpu)
    record["check_against"] = "reference (higher precision)" if expected is not None else None
    fingerprint = _fingerprint(copies)

    # Entries appear in IMPLS order; torch.compile peers run first (before torchax is imported).
    specs = [spec for spec in P.IMPLS if case.kind in spec.kinds]
    for spec in specs:
        record["impls"][spec.name] = {"role": spec.role}
    for spec in sorted(specs, key=lambda spec: not spec.needs_clean_torch):
        if progress is not None:
            progress.set_postfix_str(f"{case.name[:28]} {spec.name}")
        entry = record["impls"][spec.name]
        skipped = _skip_reason(spec, case, env, skips)
        if skipped is not None:
            entry.update(status=skipped[0], reason=skipped[1])
            continue
        if P.needs_clean_process(spec, env):
            entry["torchax_loaded_before"] = P.torchax_loaded()
            if entry["torchax_loaded_before"]:
                entry.update(status="failed", reason=TORCHAX_LOADED_REASON)
                continue
        if on_impl is not None:
            on_impl(spec.name)
        try:
            runner = spec.prepare(env, case, copies)
        except P.NotApplicable as why:
            entry.update(status="n/a", reason=str(why))
            continue
        except Exception as error:
            entry.update(status="failed", reason=_short(error, 300))
            continue
        try:
            out = runner.output()
            if expected is None and record.get("check_against") is None:
                expected = out  # the first implementation that ran is the yardstick
                record["check_against"] = spec.name
            if expected is not out:
                err = _rel_l2(out, expected)
                entry["rel_l2_err"] = err
                entry["check"] = "ok" if err <= _tolerance(case) else "MISMATCH"
            del out

            def timed(runner=runner):
                if runner.framework == "torch":
                    return time_torch(runner.calls, samples=samples, graph=runner.graph)
                return time_jax_chain(runner.program, runner.first_carry, runner.operand_sets,
                                      chain=runner.chain, samples=samples)  # fmt: skip

            timing = timed()
            entry.update(_summarise(timing, case, record, ceilings), status="ok")
            if runner.notes:
                entry["notes"] = runner.notes
            if spec.name in ("xgo_torch", "xgo_jax_graph") or (
                spec.name == "reference" and not env.on_gpu
            ):
                again = timed()  # the same version timed twice: the noise of this setup
                entry["median_us_repeat"] = again.median_us
                entry["noise_pct"] = (
                    100
                    * abs(again.median_us - timing.median_us)
                    / min(again.median_us, timing.median_us)
                )
            if spec.name in PER_CALL_IMPLS and (
                case.kind in ("simple_add", "overhead_decode") or case.name == ANCHOR_NAME
            ):
                entry.update(_per_call_measurements(runner, env, samples))
        except Exception as error:
            entry.update(status="failed", reason=_short(error, 300))
        finally:
            del runner
            _free(env.on_gpu)
        # An implementation that writes outside its outputs would corrupt the inputs of the ones
        # after it: check, blame it, and give the rest fresh inputs.
        if _fingerprint(copies) != fingerprint:
            entry["check"] = "CORRUPTED ITS INPUTS"
            entry["status"] = "failed"
            entry["reason"] = "inputs changed while it ran (a write outside its outputs)"
            first = build_inputs(case, env.device, seed=1000 + case_seed(case))
            copies = [first] + [build_inputs(case, env.device, seed=1000 + case_seed(case) + i,
                                             metadata=meta_of(first) or None)
                                for i in range(1, copies_n)]  # fmt: skip
            fingerprint = _fingerprint(copies)
    del copies
    _free(env.on_gpu)
    return record


ANCHOR_NAME = "decode_B32_ctx4k_h32-8_d128_p16"
TORCHAX_LOADED_REASON = (
    "torchax was imported earlier in this process and breaks torch.compile (dynamo: "
    "'PyTorch is not linked with support for jax devices'); the isolated runner (--isolate) "
    "moves such a case to a fresh worker"
)


# Ours, measured per call in detail on the overhead cases and the anchor (the custom call's cost).
PER_CALL_IMPLS = ("xgo_torch", "xgo_jax_graph", "xgo_jax_nograph")


def _per_call_measurements(runner, env, samples: int) -> dict:
    """Device time per call from the GPU's own timestamps, the slope of a JAX chain, and where
    XLA put the custom calls (command buffer or not). Each part fails on its own."""
    from benchmarks.timing import _short, device_trace, time_jax_slope

    out: dict = {}
    if runner.framework == "jax":
        try:
            slope = time_jax_slope(runner.make_program, runner.first_carry, runner.operand_sets,
                                   chain=runner.chain, samples=samples)  # fmt: skip
            out["slope_us"] = slope.median_us
            out["slope_p10_p90_us"] = [slope.quantile(0.1), slope.quantile(0.9)]
            out["slope_method"] = slope.method
        except Exception as error:
            out["slope_error"] = _short(error, 300)
        try:
            out["command_buffer"] = command_buffer_evidence(runner)
        except Exception as error:
            out["command_buffer"] = {"captured": None, "error": _short(error, 300)}
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
        out["device"] = {"error": _short(error, 300)}
    return out


def _skip_reason(spec, case, env, skips: dict | None) -> tuple[str, str] | None:
    """(status, reason) when `spec` is not run on `case`; None when it runs."""
    if spec.slow and not case.slow_peers:
        return "skipped", "slow peer: run on the anchor and key rows only"
    if spec.anchor_only and env.on_gpu and case.name != ANCHOR_NAME:
        return "skipped", "compiles per shape (tens of s): anchor only"
    if skips and spec.name in skips:
        return "failed", skips[spec.name]
    return None


def needs_fresh_process(case, env, skips: dict | None) -> bool:
    """Whether `case` runs an implementation that needs a process without torchax, and this
    process has torchax loaded already."""
    from benchmarks import peers as P

    if not P.torchax_loaded():
        return False
    return any(case.kind in spec.kinds and P.needs_clean_process(spec, env)
               and _skip_reason(spec, case, env, skips) is None for spec in P.IMPLS)  # fmt: skip


def meta_of(inputs: dict) -> dict:
    return {k: v for k, v in inputs.items() if k not in ("query", "kv_cache", "a", "b")}


FINGERPRINT_CHUNK = 1 << 24  # elements: a 128 MiB int64 temporary


def _fingerprint(copies: list[dict]) -> list[int]:
    """Exact integer checksums of every input tensor (one host sync)."""
    import torch

    sums = []
    for inputs in copies:
        for name in sorted(inputs):
            t = inputs[name].contiguous()
            bits = t.view(torch.int16) if t.element_size() == 2 else t.view(torch.int32)
            weights = torch.arange(1, 8, device=t.device, dtype=torch.int64)
            flat = bits.reshape(-1).to(torch.int64) if bits.numel() < (1 << 20) else None
            if flat is not None:  # small tensors (metadata): position-weighted, catches swaps
                sums.append((flat * weights.repeat(-(-flat.numel() // 7))[: flat.numel()]).sum())
            else:
                # in chunks: sum(dtype=int64) materialises an int64 copy (34 GB for an 8.6 GB
                # cache), and freeing that slows the next timing (timing.release_cached_memory)
                total = torch.zeros((), dtype=torch.int64, device=t.device)
                for chunk in bits.reshape(-1).split(FINGERPRINT_CHUNK):
                    total += chunk.sum(dtype=torch.int64)
                sums.append(total)
    return torch.stack(sums).tolist() if sums else []


def case_seed(case) -> int:
    return sum(ord(ch) for ch in case.name) * 97


def _summarise(timing, case, record, ceilings) -> dict:
    median = timing.median_us
    return {
        "median_us": median,
        "p10_us": timing.quantile(0.1),
        "p90_us": timing.quantile(0.9),
        "samples": len(timing.samples_us),
        "method": timing.method,
        "gbps": record["bytes"] / median / 1e3,
        "tflops": record["flops"] / median / 1e6,
        "frac_floor": record["floor_us"] / median,
    }


# ------------------------------------------------------------------------------ driver
PLANTED_CRASH_ENV = "XGO_BENCH_PLANTED_CRASH"  # "case-substring:impl": a worker exits there (tests)
MAX_WORKER_RESTARTS = 12
WORKER_GRACE_S = 60.0


def select_cases(all_cases, patterns):
    """Cases whose name contains a pattern, in the order of the patterns (each case once)."""
    if not patterns:
        return list(all_cases)
    chosen = []
    for pattern in patterns:
        chosen += [c for c in all_cases if pattern in c.name and c not in chosen]
    if not chosen:
        names = ", ".join(c.name for c in all_cases)
        raise SystemExit(f"--cases {patterns}: no case matches; cases are: {names}")
    return chosen


def _cases_for(config: dict):
    from benchmarks.cases import all_cases, smoke_cases

    pool = all_cases(config["quick"]) if config["on_gpu"] else smoke_cases()
    return select_cases(pool, config["patterns"])


def _budget(config: dict) -> float:
    if not config["on_gpu"]:
        return 1e9
    import torch

    total = torch.cuda.get_device_properties(0).total_memory
    return min(config["budget_gb"] * 1e9, 0.3 * total)


def _one_line(record: dict) -> str:
    from benchmarks import report

    if record.get("skipped"):
        return f"{record['name']}: skipped ({record['skipped']})"
    best = report.primary(record)
    if best is None:
        return f"{record['name']}: no implementation of ours ran"
    name, e = best
    return (f"{record['name']}: {name} {e['median_us']:.1f} µs, {e['frac_floor']:.2f} of floor "
            f"{record['floor_us']:.1f} µs")  # fmt: skip


def _run_cases(config: dict, ceilings: dict, start: int, skips: dict, emit) -> bool:
    """Run cases[start:] in this process; emit(event) after each step (see _run_isolated).

    Returns False when a worker stopped early because the next case needs a process without
    torchax (event "fresh_worker"); True when every case ran."""
    from tqdm import tqdm

    from benchmarks.peers import BenchEnv

    cases = _cases_for(config)
    env = BenchEnv(config["on_gpu"])
    budget = _budget(config)
    planted = os.environ.get(PLANTED_CRASH_ENV, "") if config.get("worker") else ""
    bar = tqdm(list(enumerate(cases))[start:], desc="cases", unit="case", file=sys.stderr,
               disable=not config["show_progress"], mininterval=2.0)  # fmt: skip
    for index, case in bar:
        deadline = config.get("deadline")
        if deadline is not None and time.time() > deadline:
            record = {"name": case.name, "kind": case.kind, "params": case.params(),
                      "bytes": case.bytes_needed(), "flops": case.flops(), "impls": {},
                      "skipped": f"time limit of {config['time_limit_s']:.0f} s reached"}  # fmt: skip
        elif config.get("worker") and needs_fresh_process(case, env, skips.get(case.name)):
            print(f"fresh worker for {case.name}: torchax is loaded in this one", flush=True)
            emit({"event": "fresh_worker", "index": index, "case": case.name})
            bar.close()
            return False
        else:

            def on_impl(impl, index=index, case=case):
                emit({"event": "impl_start", "index": index, "case": case.name, "impl": impl})
                print(f"{IMPL_MARKER} {case.name}:{impl}", file=sys.stderr, flush=True)
                crash_case, _, crash_impl = planted.partition(":")
                if planted and crash_case in case.name and impl == crash_impl:
                    os._exit(3)

            record = run_case(env, case, ceilings, samples=config["samples"], budget_bytes=budget,
                              l2_bytes=config["l2_bytes"], progress=bar,
                              skips=skips.get(case.name), on_impl=on_impl)  # fmt: skip
        print(f"[{index + 1}/{len(cases)}] {_one_line(record)}", flush=True)
        emit({"event": "case", "index": index, "record": record})
    bar.close()
    return True


IMPL_MARKER = "[xgo-bench] starting"
FRESH_WORKER_EXIT = 75  # a worker's exit status asking for a fresh process at its next case


def _crash_reason(stderr_text: str, returncode: int) -> str:
    """The assertion / last error the worker printed after its last implementation started."""
    stderr_text = stderr_text.rpartition(IMPL_MARKER)[2]
    lines = [ln.strip() for ln in stderr_text.splitlines() if ln.strip()]
    assertion = next((ln for ln in lines if "Assertion" in ln or "assert" in ln.lower()), "")
    errors = [ln for ln in lines if re.search(r"Error|error:|Segmentation|Aborted|core dumped", ln)]
    parts = [p for p in (assertion[:200], errors[-1][:200] if errors else "") if p]
    message = " | ".join(parts) if parts else "no error message on stderr"
    return f"worker process died (exit status {returncode}): {message}"


def _keep_worker_log(config: dict, attempt: int, returncode, stderr_text: str) -> None:
    """Append a worker's stderr (repeated lines dropped, at most 400 kept) to workers.log."""
    if not config.get("log_path"):
        return
    seen, kept = set(), []
    for line in stderr_text.replace("\r", "\n").splitlines():
        key = re.sub(r"\d+", "#", line.strip())
        if line.strip() and key not in seen and not line.lstrip().startswith("cases:"):
            seen.add(key)
            kept.append(line)
    with open(config["log_path"], "a") as log:
        log.write(f"== worker {attempt}: exit status {returncode}\n")
        log.write("\n".join(kept[-400:]) + "\n")


def _run_isolated(config: dict) -> tuple[dict, list[dict]]:
    """Run the cases in worker processes; when one dies (a device-side assert poisons the CUDA
    context for good), record the implementation it was running as failed and start a fresh
    worker at the same case, skipping that implementation."""
    cases = _cases_for(config)
    records: list[dict | None] = [None] * len(cases)
    skips: dict[str, dict[str, str]] = {}
    ceilings = None
    start = 0
    with tempfile.TemporaryDirectory(prefix="xgo-bench-") as tmp:
        tmp_dir = Path(tmp)
        for attempt in range(MAX_WORKER_RESTARTS + 1):
            state = tmp_dir / "state.json"
            events = tmp_dir / f"events{attempt}.jsonl"
            stderr_path = tmp_dir / f"worker{attempt}.err"
            state.write_text(json.dumps({"config": {**config, "worker": True}, "start": start,
                                         "skips": skips, "ceilings": ceilings,
                                         "events": str(events)}))  # fmt: skip
            # a hung worker must not eat the whole lease: past the deadline (+ grace for the case
            # in flight) it is killed and recorded like a crash
            timeout = None
            if config.get("deadline") is not None:
                timeout = max(10.0, config["deadline"] - time.time() + WORKER_GRACE_S)
            with stderr_path.open("w") as err:
                cmd = [sys.executable, "-m", "benchmarks.run", "--worker", str(state)]
                try:
                    proc = subprocess.run(cmd, stderr=err, cwd=ROOT, check=False, timeout=timeout)
                    returncode = proc.returncode
                except subprocess.TimeoutExpired:
                    returncode = None
            current = fresh_at = None
            for line in events.read_text().splitlines() if events.exists() else []:
                event = json.loads(line)
                if event["event"] == "fresh_worker":
                    fresh_at = event["index"]
                elif event["event"] == "ceilings":
                    ceilings = event["ceilings"]
                elif event["event"] == "impl_start":
                    current = event
                elif event["event"] == "case":
                    records[event["index"]] = event["record"]
                    current = None
            stderr_text = stderr_path.read_text(errors="replace")
            _keep_worker_log(config, attempt, returncode, stderr_text)
            if returncode == 0:
                break
            if returncode == FRESH_WORKER_EXIT and fresh_at is not None:
                start = fresh_at  # not a crash: the case needs a process without torchax
                continue
            if returncode is None:
                reason = f"killed: still running {WORKER_GRACE_S:.0f} s after the time limit"
            else:
                reason = _crash_reason(stderr_text, returncode)
            print(f"worker ended ({reason}); stderr tail:", flush=True)
            print("\n".join(stderr_text.splitlines()[-8:]), flush=True)
            if ceilings is None:
                raise RuntimeError(f"the worker died before measuring the ceilings: {reason}")
            if returncode is None:  # out of time: the case in flight and the rest are skipped
                if current is not None:
                    case = cases[current["index"]]
                    records[current["index"]] = {
                        "name": case.name, "kind": case.kind, "params": case.params(),
                        "bytes": case.bytes_needed(), "flops": case.flops(), "impls": {},
                        "skipped": f"{current['impl']}: {reason}",
                    }  # fmt: skip
                break
            if current is None:  # died between implementations: give up on the next case
                index = next((i for i, r in enumerate(records) if r is None), len(cases))
                if index >= len(cases):
                    break
                case = cases[index]
                records[index] = {"name": case.name, "kind": case.kind, "params": case.params(),
                                  "bytes": case.bytes_needed(), "flops": case.flops(),
                                  "impls": {}, "skipped": reason}  # fmt: skip
                start = index + 1
            else:
                skips.setdefault(current["case"], {})[current["impl"]] = reason
                start = current["index"]
                print(f"restarting at {current['case']} without {current['impl']}", flush=True)
            if start >= len(cases):
                break
        else:
            print(f"gave up after {MAX_WORKER_RESTARTS} worker restarts", flush=True)
    done = []
    for case, record in zip(cases, records, strict=True):
        done.append(record or {"name": case.name, "kind": case.kind, "params": case.params(),
                               "bytes": case.bytes_needed(), "flops": case.flops(), "impls": {},
                               "skipped": "not reached (out of time or worker restarts)"})  # fmt: skip
    return ceilings, done


def _measure_and_announce(config: dict) -> dict:
    print("measuring ceilings (read, copy, matmul) ...", flush=True)
    ceilings = measure_ceilings(config["on_gpu"], config["samples"])
    print(f"  read {ceilings['read_gbps']:.4g} GB/s, copy {ceilings['copy_gbps']:.4g} GB/s, "
          f"{ceilings['matmul_dtype']} matmul {ceilings['matmul_tflops']:.4g} TFLOP/s",
          flush=True)  # fmt: skip
    return ceilings


def worker_main(state_path: Path) -> int:
    state = json.loads(Path(state_path).read_text())
    config = state["config"]
    _prepare_process(config["on_gpu"])
    events = Path(state["events"])

    def emit(event: dict) -> None:
        with events.open("a") as f:
            f.write(json.dumps(event, default=str) + "\n")

    ceilings = state["ceilings"]
    if ceilings is None:
        ceilings = _measure_and_announce(config)
        emit({"event": "ceilings", "ceilings": ceilings})
    finished = _run_cases(config, ceilings, state["start"], state["skips"], emit)
    return 0 if finished else FRESH_WORKER_EXIT


def run_benchmark(out_dir: Path | None = None, *, quick: bool = False, patterns=(),
                  force_cpu: bool = False, samples: int | None = None,
                  budget_gb: float = DEFAULT_BUDGET_GB, show_progress: bool = True,
                  time_limit_s: float | None = None, isolate: bool | None = None) -> dict:  # fmt: skip
    """Run everything and write the result files; returns the results dict (also in JSON).

    isolate (default: on a GPU) runs the cases in worker processes, so that a device-side
    assert in one implementation costs that implementation only.
    """
    on_gpu = gpu_available() and not force_cpu
    _prepare_process(on_gpu)
    from benchmarks import report

    if not on_gpu:
        print(NO_GPU_MESSAGE, flush=True)
    isolate = on_gpu if isolate is None else isolate
    env_info = collect_env(on_gpu)
    env_info["mode"] = ("quick" if quick else "full") if on_gpu else "cpu-smoke"
    if out_dir is None:
        day = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d")
        out_dir = ROOT / "benchmarks" / "results" / f"{day}-{device_slug(env_info)}"
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    config = {
        "on_gpu": on_gpu,
        "quick": quick,
        "patterns": list(patterns),
        "samples": samples or (25 if on_gpu else 5),
        "budget_gb": budget_gb,
        "show_progress": show_progress,
        "time_limit_s": time_limit_s,
        "deadline": None if time_limit_s is None else time.time() + time_limit_s,
        "l2_bytes": ((env_info["gpu"] or {}).get("l2_bytes") or 60 * 2**20) if on_gpu else 2**20,
        "log_path": str(out_dir / "workers.log"),
    }
    _cases_for(config)  # fail fast on a --cases pattern that matches nothing
    results = {"env": env_info, "config": config, "ceilings": None, "cases": []}
    if isolate:
        results["ceilings"], results["cases"] = _run_isolated(config)
    else:
        results["ceilings"] = _measure_and_announce(config)

        def emit(event: dict) -> None:
            if event["event"] == "case":
                results["cases"].append(event["record"])
                # partial results after every case: a run cut short still leaves its numbers
                (out_dir / "results.json").write_text(json.dumps(results, indent=1, default=str))

        _run_cases(config, results["ceilings"], 0, {}, emit)
    results["verdicts"] = report.verdicts(results)
    table = report.markdown(results)
    (out_dir / "results.json").write_text(json.dumps(results, indent=1, default=str))
    (out_dir / "env.json").write_text(json.dumps(env_info, indent=1))
    (out_dir / "table.md").write_text(table)
    report.plot(results, out_dir / "plot.png")
    print(table, flush=True)
    print(f"results written to {out_dir}", flush=True)
    return results


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="reduced grid (keeps the anchor)")
    parser.add_argument("--cases", nargs="*", default=(), help="run cases whose name contains any")
    parser.add_argument("--out", type=Path, default=None, help="output folder")
    parser.add_argument("--cpu", action="store_true", help="force the CPU smoke run")
    parser.add_argument("--samples", type=int, default=None, help="timing samples per measurement")
    parser.add_argument("--budget-gb", type=float, default=DEFAULT_BUDGET_GB,
                        help="max KV cache bytes per case (x2 counted for peer layouts)")  # fmt: skip
    parser.add_argument("--no-progress", action="store_true")
    parser.add_argument("--time-limit", type=float, default=None,
                        help="seconds after which the remaining cases are skipped (recorded)")  # fmt: skip
    isolation = parser.add_mutually_exclusive_group()
    isolation.add_argument("--isolate", dest="isolate", action="store_true", default=None,
                           help="worker processes (default on a GPU)")  # fmt: skip
    isolation.add_argument("--no-isolate", dest="isolate", action="store_false",
                           help="everything in this process")  # fmt: skip
    parser.add_argument("--worker", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker is not None:
        return worker_main(args.worker)
    run_benchmark(args.out, quick=args.quick, patterns=tuple(args.cases), force_cpu=args.cpu,
                  samples=args.samples, budget_gb=args.budget_gb,
                  show_progress=not args.no_progress, time_limit_s=args.time_limit,
                  isolate=args.isolate)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
