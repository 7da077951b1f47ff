"""A benchmark run (`python -m benchmarks run`): ceilings, then every case for every implementation.

On a GPU: measures the device's read / copy bandwidth and bf16 matrix rate, then every case for
every implementation available (benchmarks/peers.py, FlashInfer where installed), and writes
results.json (everything it measured and where), table.md, plot.png and workers.log to the run's
folder, git-ignored: artifacts/bench/<date>-<device>-<commit>/ by default (`python -m benchmarks
publish` makes a run the record of its GPU kind: benchmarks/record.py). Without a GPU it says so
and runs the CPU smoke run (tiny shapes, host timings, no verdicts) into artifacts/bench-smoke/,
so every harness code path is exercised. Timing method: benchmarks/timing.py.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from benchmarks import flashinfer_peer, record, report, workers
from benchmarks.environment import ROOT, collect_env, prepare_process, run_name

NO_GPU_MESSAGE = (
    "No GPU: torch.cuda.is_available() is False. Running the CPU smoke run of the harness "
    "(tiny shapes; host handler, reference and composite on the CPU). Its timings are host "
    "timings of the harness code paths, not kernel performance, and it judges no target."
)
DEFAULT_BUDGET_GB = 24.0  # KV cache bytes per case (all copies) the harness may allocate
SMOKE_DIR = ROOT / "artifacts" / "bench-smoke"


def gpu_available() -> bool:
    import torch

    return torch.cuda.is_available()


def write_run(results: dict, out_dir: Path) -> None:
    """results.json (everything), table.md and plot.png of a run."""
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "results.json").write_text(json.dumps(results, indent=1, default=str))
    (out_dir / "table.md").write_text(report.table(results))
    report.plot(results, out_dir / "plot.png")


# The prebuild gets at most this share of what is left of the time limit: past it, the peers whose
# kernels are not ready sit the run out, and every case still measures ours and the other peers.
PREBUILD_SHARE = 0.5
STACK_WAIT_S = 2.0  # for a stopped process's stacks to arrive
# A stopped prebuild's second pass, which builds nothing: it loads what the stopped shared build
# linked (23 cached modules loaded within a second on an H200)
CACHED_PASS_S = 60.0


def prebuild_flashinfer(config: dict) -> dict | None:
    """Build FlashInfer's kernels for the selected cases before any timing (a subprocess, so that
    this process keeps no FlashInfer state; its lines go to this process's output as they come);
    None where FlashInfer is not installed. A prebuild stopped at its share of the time limit
    leaves a peer out of the cases whose module it did not finish (config["left_out"], keyed
    "impl:case")."""
    if set(flashinfer_peer.PEERS) <= set(config["skip_impls"]):
        return None
    reason = flashinfer_peer.unavailable()
    if reason is not None:
        print(f"FlashInfer {reason}: its rows say so", flush=True)
        return {"unavailable": reason}
    cmd = [
        sys.executable,
        "-m",
        "benchmarks",
        "flashinfer",
        "prebuild",
        *(["--quick"] if config["quick"] else []),
        "--cases",
        *config["patterns"],
        "--skip-impls",
        *config["skip_impls"],
    ]
    cases = workers.cases_for(config)
    print("FlashInfer: loading or JIT-building its kernels for these cases ...", flush=True)
    start = time.time()
    timeout = None
    if config["deadline"] is not None:
        timeout = max(30.0, (config["deadline"] - start) * PREBUILD_SHARE)
    # stopped, it prints where each thread is: still compiling, or waiting on a load
    lines, status = stream_process(cmd, timeout, stack_signal=signal.SIGUSR1)
    if status is None:  # the modules its shared build finished are whole: load them
        lines += stream_process([*cmd, "--cached-only"], CACHED_PASS_S, signal.SIGUSR1)[0]
    result = {
        "seconds": time.time() - start,
        "exit_status": status,
        "output_tail": "\n".join(lines)[-2000:],
    }
    if status is None:
        # ready lines name the module by its one-page case: "ready IMPL one_page_of_CASE ..."
        ready = {
            tuple(line.split()[1:3])
            for line in lines
            if line.startswith(flashinfer_peer.READY + " ") and len(line.split()) > 2
        }
        late = [
            (impl, small)
            for impl, small in flashinfer_peer.modules_needed(cases, config["skip_impls"])
            if (impl, small.name.replace(" ", "_")) not in ready
        ]
        keys = {flashinfer_peer.module_key(impl, small) for impl, small in late}
        why = f"its FlashInfer kernels were not built within {timeout:.0f} s (prebuild stopped)"
        config["left_out"] = {
            f"{impl}:{case.name}": why
            for case in cases
            for impl in flashinfer_peer.PEERS
            if impl not in config["skip_impls"] and flashinfer_peer.module_key(impl, case) in keys
        }
        result["left_out"] = [f"{impl} for {small.name}" for impl, small in late]
        print(
            f"FlashInfer: prebuild stopped after {timeout:.0f} s; not ready: "
            f"{', '.join(result['left_out']) or 'none'}",
            flush=True,
        )
    return result


def stream_process(
    cmd: list[str], timeout: float | None, stack_signal: int | None = None
) -> tuple[list[str], int | None]:
    """Run cmd, printing its output lines as they come; (lines, exit status), status None when
    stopped at the timeout. The process runs in a session of its own, so that stopping it stops
    the compilers it started too (they would otherwise run beside the timings). stack_signal: sent
    first, for a process that then prints its threads' stacks (faulthandler.register)."""
    lines: list[str] = []
    proc = subprocess.Popen(
        cmd,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )

    def read() -> None:
        for line in proc.stdout:
            lines.append(line.rstrip())
            print("  " + lines[-1], flush=True)

    def stop() -> None:
        with contextlib.suppress(ProcessLookupError):  # the group is gone already
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        status = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        if stack_signal is not None:
            os.kill(proc.pid, stack_signal)
            time.sleep(STACK_WAIT_S)
        stop()
        status = None
    except BaseException:  # e.g. Ctrl-C: its own session would keep it and its compilers running
        stop()
        raise
    # A process that left the group may hold the pipe open: then the reader keeps it (closing a
    # pipe under a blocked read would wait for that process).
    reader.join(timeout=5.0)
    if not reader.is_alive():
        proc.stdout.close()
    return lines, status


def run_benchmark(
    out_dir: Path | None = None,
    *,
    quick: bool = False,
    patterns=(),
    force_cpu: bool = False,
    samples: int | None = None,
    budget_gb: float = DEFAULT_BUDGET_GB,
    show_progress: bool = True,
    time_limit_s: float | None = None,
    isolate: bool | None = None,
    skip_impls=(),
    baseline: Path | None = None,
) -> dict:
    """Run everything and write the result files; returns the results dict (also in JSON).

    isolate (default: on a GPU) runs the cases in worker processes, so that a device-side
    assert in one implementation costs that implementation only. baseline: results.json of the
    record to compare with (default: the committed record of this GPU kind).
    """
    start = time.time()
    on_gpu = gpu_available() and not force_cpu
    prepare_process(on_gpu)
    if not on_gpu:
        print(NO_GPU_MESSAGE, flush=True)
    isolate = on_gpu if isolate is None else isolate
    env_info = collect_env(on_gpu)
    env_info["mode"] = ("quick" if quick else "full") if on_gpu else "cpu-smoke"
    if out_dir is None:
        out_dir = SMOKE_DIR
        if on_gpu:
            out_dir = ROOT / "artifacts" / "bench" / run_name(env_info)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    config = {
        "on_gpu": on_gpu,
        "quick": quick,
        "patterns": list(patterns),
        "skip_impls": sorted(skip_impls),
        "samples": samples or (25 if on_gpu else 5),
        "budget_gb": budget_gb,
        "show_progress": show_progress,
        "time_limit_s": time_limit_s,
        "deadline": None if time_limit_s is None else start + time_limit_s,
        "l2_bytes": ((env_info["gpu"] or {}).get("l2_bytes") or 60 * 2**20) if on_gpu else 2**20,
        "log_path": str(out_dir / "workers.log"),
    }
    workers.cases_for(config)  # fail fast on a --cases pattern that matches nothing
    results = {"env": env_info, "config": config, "ceilings": None, "cases": []}
    if on_gpu:
        results["flashinfer_prebuild"] = prebuild_flashinfer(config)
        baseline = baseline or record.current_record(env_info)
        if baseline is not None and baseline.is_file():
            results["baseline"] = report.baseline_rows(baseline)
    if isolate:
        results["ceilings"], results["cases"] = workers.run_isolated(config)
    else:
        results["ceilings"] = workers.measure_and_announce(config)

        def emit(event: dict) -> None:
            if event["event"] == "case":
                results["cases"].append(event["record"])
                # partial results after every case: a run cut short still leaves its numbers
                (out_dir / "results.json").write_text(json.dumps(results, indent=1, default=str))

        workers.run_cases(config, results["ceilings"], 0, {}, emit)
    results["wall_s"] = time.time() - start
    write_run(results, out_dir)
    print("\n".join(report.summary(results)), flush=True)
    print(
        f"results in {out_dir} after {results['wall_s']:.0f} s (table.md: every number)", flush=True
    )
    return results
