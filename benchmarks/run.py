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
    try:
        out = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True,
                             text=True, timeout=10, check=True)  # fmt: skip
        dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--", "kernels",
                                "xla_gpu_ops", "benchmarks"], capture_output=True, text=True,
                               timeout=10).stdout.strip()  # fmt: skip
        return out.stdout.strip() + ("+dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return os.environ.get("XLA_GPU_OPS_GIT_COMMIT", "unknown")


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
            smi = subprocess.run(["nvidia-smi", "--query-gpu=driver_version,clocks.sm,clocks.mem,"
                                  "power.limit", "--format=csv,noheader"], capture_output=True,
                                 text=True, timeout=20).stdout.strip()  # fmt: skip
            env["nvidia_smi"] = smi
            env["driver"] = smi.split(",")[0].strip() if smi else None
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

    def make_copy():
        src = torch.randn(copy_elems, generator=gen, device=device)
        dst = torch.empty_like(src)
        return lambda: dst.copy_(src)

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
    matmul = timed(make_matmul)
    _free(on_gpu)
    return {
        "read_gbps": 4 * read_elems / read.median_us / 1e3,
        "copy_gbps": 2 * 4 * copy_elems / copy.median_us / 1e3,
        "matmul_tflops": 2 * n**3 / matmul.median_us / 1e6,
        "matmul_dtype": str(dtype).removeprefix("torch."),
        "read_method": f"torch.sum over {4 * read_elems >> 20} MiB float32; {read.method}",
        "copy_method": f"copy_ of {4 * copy_elems >> 20} MiB float32 (read + write); {copy.method}",
        "matmul_method": f"{n}x{n} @ {n}x{n}; {matmul.method}",
        "read_spread_us": [read.quantile(0.1), read.quantile(0.9)],
    }


def _free(on_gpu: bool) -> None:
    gc.collect()
    if on_gpu:
        import torch

        torch.cuda.synchronize()
        torch.cuda.empty_cache()


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


def command_buffer_evidence(runner) -> dict:
    """Compile the runner's program with --xla_dump_to and look for a command buffer (CUDA graph)."""
    with tempfile.TemporaryDirectory(prefix="xgo-dump-") as dump:
        runner.compile_for_dump({"xla_dump_to": dump, "xla_dump_hlo_as_text": True})
        hits, files = [], sorted(Path(dump).rglob("*"))
        pattern = re.compile(r"kCommandBuffer|command_buffer|CommandBuffer")
        for path in files:
            if not path.is_file() or "debug_options" in path.name:
                continue
            try:
                text = path.read_text(errors="replace")
            except OSError:
                continue
            for line in text.splitlines():
                if pattern.search(line) and "xla_gpu_enable_command_buffer" not in line:
                    hits.append(f"{path.name}: {line.strip()[:160]}")
                    break
        names = [p.name for p in files if p.is_file()]
    return {
        "captured": bool(hits),
        "evidence": hits[:4],
        "dump_files": len(names),
        "thunk_dumps": [n for n in names if "thunk" in n][:4],
    }


def run_case(env, case, ceilings: dict, *, samples: int, budget_bytes: float, l2_bytes: int,
             progress=None) -> dict:  # fmt: skip
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
    meta = {k: v for k, v in copies[0].items() if k not in ("query", "kv_cache", "a", "b")}
    for i in range(1, copies_n):
        copies.append(build_inputs(case, env.device, seed=1000 + case_seed(case) + i,
                                   metadata=meta or None))  # fmt: skip
    expected = _expected(case, copies[0], env.on_gpu)
    record["check_against"] = "reference (higher precision)" if expected is not None else None

    for spec in P.IMPLS:
        if case.kind not in spec.kinds:
            continue
        if progress is not None:
            progress.set_postfix_str(f"{case.name[:28]} {spec.name}")
        entry: dict = {"role": spec.role}
        record["impls"][spec.name] = entry
        if spec.slow and not case.slow_peers:
            entry.update(status="skipped", reason="slow peer: run on the anchor and key rows only")
            continue
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
            if spec.name in ("xgo_jax_graph", "xgo_jax_nograph") and (
                case.kind in ("simple_add", "overhead_decode") or case.name == ANCHOR_NAME
            ):
                try:
                    entry["command_buffer"] = command_buffer_evidence(runner)
                except Exception as error:
                    entry["command_buffer"] = {"captured": None, "error": _short(error, 300)}
        except Exception as error:
            entry.update(status="failed", reason=_short(error, 300))
        finally:
            del runner
            _free(env.on_gpu)
    del copies
    _free(env.on_gpu)
    return record


ANCHOR_NAME = "decode_B32_ctx4k_h32-8_d128_p16"


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
def select_cases(all_cases, patterns):
    if not patterns:
        return list(all_cases)
    chosen = [c for c in all_cases if any(p in c.name for p in patterns)]
    if not chosen:
        names = ", ".join(c.name for c in all_cases)
        raise SystemExit(f"--cases {patterns}: no case matches; cases are: {names}")
    return chosen


def run_benchmark(out_dir: Path | None = None, *, quick: bool = False, patterns=(),
                  force_cpu: bool = False, samples: int | None = None,
                  budget_gb: float = DEFAULT_BUDGET_GB, show_progress: bool = True,
                  time_limit_s: float | None = None) -> dict:  # fmt: skip
    """Run everything and write the result files; returns the results dict (also in JSON)."""
    on_gpu = gpu_available() and not force_cpu
    _prepare_process(on_gpu)
    from tqdm import tqdm

    from benchmarks import report
    from benchmarks.cases import all_cases, smoke_cases
    from benchmarks.peers import BenchEnv

    if not on_gpu:
        print(NO_GPU_MESSAGE, flush=True)
    samples = samples or (25 if on_gpu else 5)
    env_info = collect_env(on_gpu)
    env_info["mode"] = ("quick" if quick else "full") if on_gpu else "cpu-smoke"
    if out_dir is None:
        day = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d")
        out_dir = ROOT / "benchmarks" / "results" / f"{day}-{device_slug(env_info)}"
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)

    print("measuring ceilings (read, copy, matmul) ...", flush=True)
    ceilings = measure_ceilings(on_gpu, samples)
    print(f"  read {ceilings['read_gbps']:.4g} GB/s, copy {ceilings['copy_gbps']:.4g} GB/s, "
          f"{ceilings['matmul_dtype']} matmul {ceilings['matmul_tflops']:.4g} TFLOP/s",
          flush=True)  # fmt: skip
    l2 = ((env_info["gpu"] or {}).get("l2_bytes") or 60 * 2**20) if on_gpu else 2**20
    if on_gpu:
        import torch

        total = torch.cuda.get_device_properties(0).total_memory
        budget = min(budget_gb * 1e9, 0.3 * total)
    else:
        budget = 1e9
    cases = select_cases(smoke_cases() if not on_gpu else all_cases(quick), patterns)
    env = BenchEnv(on_gpu)
    records = []
    results = {
        "env": env_info,
        "ceilings": ceilings,
        "budget_bytes": budget,
        "l2_bytes": l2,
        "samples_per_measurement": samples,
        "cases": records,
    }
    started = time.monotonic()
    bar = tqdm(cases, desc="cases", unit="case", disable=not show_progress, file=sys.stderr,
               mininterval=2.0)  # fmt: skip
    for case in bar:
        if time_limit_s is not None and time.monotonic() - started > time_limit_s:
            records.append({"name": case.name, "kind": case.kind, "params": case.params(),
                            "bytes": case.bytes_needed(), "flops": case.flops(), "impls": {},
                            "skipped": f"time limit of {time_limit_s:.0f} s reached"})  # fmt: skip
            continue
        records.append(run_case(env, case, ceilings, samples=samples, budget_bytes=budget,
                                l2_bytes=l2, progress=bar))  # fmt: skip
        # partial results after every case: a run cut short still leaves its numbers
        (out_dir / "results.json").write_text(json.dumps(results, indent=1, default=str))
    bar.close()
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
    args = parser.parse_args(argv)
    run_benchmark(args.out, quick=args.quick, patterns=tuple(args.cases), force_cpu=args.cpu,
                  samples=args.samples, budget_gb=args.budget_gb,
                  show_progress=not args.no_progress, time_limit_s=args.time_limit)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
