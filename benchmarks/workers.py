"""Running the cases: in this process, or in worker processes that a crash cannot take down.

A device-side assert poisons the CUDA context for good; on a GPU the cases therefore run in worker
processes (`python -m benchmarks worker STATE`), and when one dies the implementation it was
running is recorded as failed and a fresh worker resumes the same case without it. A case that
needs a process without torchax (torch.compile peers) also moves to a fresh worker.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tqdm import tqdm

from benchmarks import report
from benchmarks.case_runner import needs_fresh_process, run_case
from benchmarks.cases import all_cases, select_cases, smoke_cases
from benchmarks.ceilings import measure_ceilings
from benchmarks.environment import ROOT, prepare_process
from benchmarks.report import NOT_REACHED_SKIP, TIME_LIMIT_SKIP
from benchmarks.runners import BenchEnv

PLANTED_CRASH_ENV = "XGO_BENCH_PLANTED_CRASH"  # "case-substring:impl": a worker exits there (tests)
MAX_WORKER_RESTARTS = 12
WORKER_GRACE_S = 60.0


def cases_for(config: dict):
    pool = all_cases(config["quick"]) if config["on_gpu"] else smoke_cases()
    return select_cases(pool, config["patterns"])


def left_out(config: dict) -> dict[str, str]:
    """{impl, or "impl:case": why this run leaves it out}: --skip-impls, and a FlashInfer peer on
    the cases whose module the prebuild did not finish within its share of the time limit
    (run.prebuild_flashinfer)."""
    reasons = {name: "left out of this run (--skip-impls)" for name in config.get("skip_impls", ())}
    return reasons | config.get("left_out", {})


def _budget(config: dict) -> float:
    if not config["on_gpu"]:
        return 1e9
    import torch

    total = torch.cuda.get_device_properties(0).total_memory
    return min(config["budget_gb"] * 1e9, 0.3 * total)


def _one_line(record: dict) -> str:
    if record.get("skipped"):
        return f"{record['name']}: skipped ({record['skipped']})"
    best = report.primary(record)
    if best is None:
        return f"{record['name']}: no implementation of ours ran"
    name, e = best
    if "frac_floor" not in e:  # host cost: µs of host time per call
        return f"{record['name']}: {name} {e['median_us']:.1f} µs per call"
    return (
        f"{record['name']}: {name} {e['median_us']:.1f} µs, {e['frac_floor']:.2f} of floor "
        f"{record['floor_us']:.1f} µs"
    )


def run_cases(config: dict, ceilings: dict, start: int, skips: dict, emit) -> bool:
    """Run cases[start:] in this process; emit(event) after each step (see _run_isolated).

    Returns False when a worker stopped early because the next case needs a process without
    torchax (event "fresh_worker"); True when every case ran."""
    cases = cases_for(config)
    skip_impls = left_out(config)
    env = BenchEnv(config["on_gpu"])
    budget = _budget(config)
    planted = os.environ.get(PLANTED_CRASH_ENV, "") if config.get("worker") else ""
    bar = tqdm(
        list(enumerate(cases))[start:],
        desc="cases",
        unit="case",
        file=sys.stderr,
        disable=not config["show_progress"],
        mininterval=2.0,
    )
    for index, case in bar:
        case_start = time.time()
        deadline = config.get("deadline")
        if deadline is not None and time.time() > deadline:
            record = {
                "name": case.name,
                "kind": case.kind,
                "params": case.params(),
                "bytes": case.bytes_needed(),
                "flops": case.flops(),
                "impls": {},
                "skipped": f"{TIME_LIMIT_SKIP} of {config['time_limit_s']:.0f} s reached",
            }
        elif config.get("worker") and needs_fresh_process(
            case, env, skips.get(case.name), skip_impls
        ):
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

            record = run_case(
                env,
                case,
                ceilings,
                samples=config["samples"],
                budget_bytes=budget,
                l2_bytes=config["l2_bytes"],
                progress=bar,
                skips=skips.get(case.name),
                on_impl=on_impl,
                skip_impls=skip_impls,
            )
        took = time.time() - case_start
        print(f"[{index + 1}/{len(cases)}] {_one_line(record)} ({took:.0f} s)", flush=True)
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


def run_isolated(config: dict) -> tuple[dict, list[dict]]:
    """Run the cases in worker processes; when one dies (a device-side assert poisons the CUDA
    context for good), record the implementation it was running as failed and start a fresh
    worker at the same case, skipping that implementation."""
    cases = cases_for(config)
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
            state.write_text(
                json.dumps(
                    {
                        "config": {**config, "worker": True},
                        "start": start,
                        "skips": skips,
                        "ceilings": ceilings,
                        "events": str(events),
                    }
                )
            )
            # a hung worker must not run on: past the deadline (+ grace for the case
            # in flight) it is killed and recorded like a crash
            timeout = None
            if config.get("deadline") is not None:
                timeout = max(10.0, config["deadline"] - time.time() + WORKER_GRACE_S)
            with stderr_path.open("w") as err:
                cmd = [sys.executable, "-m", "benchmarks", "worker", str(state)]
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
                        "name": case.name,
                        "kind": case.kind,
                        "params": case.params(),
                        "bytes": case.bytes_needed(),
                        "flops": case.flops(),
                        "impls": {},
                        "skipped": f"{current['impl']}: {reason}",
                    }
                break
            if current is None:  # died between implementations: give up on the next case
                index = next((i for i, r in enumerate(records) if r is None), len(cases))
                if index >= len(cases):
                    break
                case = cases[index]
                records[index] = {
                    "name": case.name,
                    "kind": case.kind,
                    "params": case.params(),
                    "bytes": case.bytes_needed(),
                    "flops": case.flops(),
                    "impls": {},
                    "skipped": reason,
                }
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
        done.append(
            record
            or {
                "name": case.name,
                "kind": case.kind,
                "params": case.params(),
                "bytes": case.bytes_needed(),
                "flops": case.flops(),
                "impls": {},
                "skipped": f"{NOT_REACHED_SKIP} (out of time or worker restarts)",
            }
        )
    return ceilings, done


def measure_and_announce(config: dict) -> dict:
    print("measuring ceilings (read, copy, matmul) ...", flush=True)
    ceilings = measure_ceilings(config["on_gpu"], config["samples"])
    print(
        f"  read {ceilings['read_gbps']:.4g} GB/s, copy {ceilings['copy_gbps']:.4g} GB/s, "
        f"{ceilings['matmul_dtype']} matmul {ceilings['matmul_tflops']:.4g} TFLOP/s",
        flush=True,
    )
    return ceilings


def worker_main(state_path: Path) -> int:
    state = json.loads(Path(state_path).read_text())
    config = state["config"]
    prepare_process(config["on_gpu"])
    events = Path(state["events"])

    def emit(event: dict) -> None:
        with events.open("a") as f:
            f.write(json.dumps(event, default=str) + "\n")

    ceilings = state["ceilings"]
    if ceilings is None:
        ceilings = measure_and_announce(config)
        emit({"event": "ceilings", "ceilings": ceilings})
    finished = run_cases(config, ceilings, state["start"], state["skips"], emit)
    return 0 if finished else FRESH_WORKER_EXIT
