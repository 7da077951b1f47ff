"""The command line of the benchmarks: `python -m benchmarks [COMMAND] [ARGS]` (`nox -s bench`).

Every command is a thin layer over the library modules beside this one (benchmarks/README.md);
`run` is the default command.
"""

from __future__ import annotations

import argparse
import faulthandler
import signal
import sys
from pathlib import Path

from benchmarks import (
    flashinfer_peer,
    fp8_decode,
    library_ab,
    multi_gpu,
    ncu_peers,
    probes,
    record,
    report,
    run,
    workers,
)
from benchmarks.cases import all_cases, select_cases


def _run(argv: list[str]) -> int:
    # importing xla_gpu_ops loads torch where it is installed: only the commands that measure do
    from xla_gpu_ops._platform import prefer_cpu_without_gpu

    prefer_cpu_without_gpu()  # on a CPU machine JAX starts on the CPU, without the CUDA plugin's ERROR
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks run", description=run.__doc__.splitlines()[0]
    )
    parser.add_argument("--quick", action="store_true", help="reduced grid (keeps the anchor)")
    parser.add_argument("--cases", nargs="*", default=(), help="run cases whose name contains any")
    parser.add_argument("--out", type=Path, default=None, help="output folder")
    parser.add_argument("--cpu", action="store_true", help="force the CPU smoke run")
    parser.add_argument("--samples", type=int, default=None, help="timing samples per measurement")
    parser.add_argument(
        "--budget-gb",
        type=float,
        default=run.DEFAULT_BUDGET_GB,
        help="max KV cache bytes per case (x2 counted for peer layouts)",
    )
    parser.add_argument("--no-progress", action="store_true")
    parser.add_argument(
        "--time-limit",
        type=float,
        default=None,
        help="seconds after which the remaining cases are skipped (recorded)",
    )
    parser.add_argument(
        "--skip-impls",
        nargs="*",
        default=(),
        metavar="IMPL",
        help="implementations to leave out, e.g. flashinfer_decode",
    )
    parser.add_argument(
        "--baseline",
        type=Path,
        default=None,
        help="results.json to compare with (default: the committed record)",
    )
    isolation = parser.add_mutually_exclusive_group()
    isolation.add_argument(
        "--isolate",
        dest="isolate",
        action="store_true",
        default=None,
        help="worker processes (default on a GPU)",
    )
    isolation.add_argument(
        "--no-isolate", dest="isolate", action="store_false", help="everything in this process"
    )
    args = parser.parse_args(argv)
    run.run_benchmark(
        args.out,
        quick=args.quick,
        patterns=tuple(args.cases),
        force_cpu=args.cpu,
        samples=args.samples,
        budget_gb=args.budget_gb,
        show_progress=not args.no_progress,
        time_limit_s=args.time_limit,
        isolate=args.isolate,
        skip_impls=tuple(args.skip_impls),
        baseline=args.baseline,
    )
    return 0


def _report(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks report", description="print the table of a run or a record"
    )
    parser.add_argument(
        "results", type=Path, help="a run's or a record's folder, or its results.json"
    )
    args = parser.parse_args(argv)
    path = args.results / "results.json" if args.results.is_dir() else args.results
    print(report.table(report.load(path)))
    return 0


def _publish(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks publish", description=record.__doc__.splitlines()[0]
    )
    parser.add_argument("run_dir", type=Path, help="the folder of a GPU run")
    parser.add_argument(
        "--fill-skipped",
        type=Path,
        default=None,
        metavar="RUN_DIR2",
        help="a run of the same commit with the cases RUN_DIR skipped at its time limit",
    )
    parser.add_argument(
        "--results-dir",
        type=Path,
        default=record.RESULTS_DIR,
        help="where the records are (default: benchmarks/results)",
    )
    args = parser.parse_args(argv)
    dest = record.publish(args.run_dir, args.results_dir, fill_dir=args.fill_skipped)
    print(f"record written to {dest}; {args.results_dir / 'RESULTS.md'} made again")
    return 0


def _flashinfer(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks flashinfer", description=flashinfer_peer.__doc__.splitlines()[0]
    )
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("status", help="print whether FlashInfer imports, and its version")
    build = sub.add_parser("prebuild", help="build the modules of the benchmark's cases")
    build.add_argument("--quick", action="store_true", help="the cases of --quick")
    build.add_argument("--cases", nargs="*", default=(), help="case name substrings")
    build.add_argument(
        "--skip-impls",
        nargs="*",
        default=(),
        metavar="IMPL",
        help="FlashInfer peers the run leaves out, e.g. flashinfer_xqa",
    )
    build.add_argument(
        "--cached-only",
        action="store_true",
        help="build nothing: place what a stopped build linked, load what is there",
    )
    export = sub.add_parser("export-cache", help="pack the built modules into FILE")
    export.add_argument("file", type=Path)
    load = sub.add_parser("import-cache", help="unpack FILE (or FILE.part0, ...) for FlashInfer")
    load.add_argument("file", type=Path)
    args = parser.parse_args(argv)
    reason = flashinfer_peer.unavailable()
    if args.command == "status":
        print(
            f"FlashInfer {flashinfer_peer.version()}" if reason is None else f"FlashInfer {reason}"
        )
        return 0
    if reason is not None:
        print(f"FlashInfer {reason}: nothing to do", flush=True)
        return 0
    if args.command == "prebuild":
        # a run that stops the prebuild asks for every thread's stack first (run.stream_process)
        faulthandler.register(signal.SIGUSR1, all_threads=True)
        cases = select_cases(all_cases(args.quick), args.cases)
        result = flashinfer_peer.prebuild(
            flashinfer_peer.modules_needed(cases, args.skip_impls), build=not args.cached_only
        )
        print(
            f"FlashInfer modules ready: {result.get('ready', 0)} of {result['modules']}, "
            f"{result.get('built', 0)} of them built, in {result['seconds']:.0f} s",
            flush=True,
        )
        return 1 if result["errors"] else 0
    if args.command == "export-cache":
        files = flashinfer_peer.export_cache(args.file)
        sizes = ", ".join(f"{p.name} {p.stat().st_size / 2**20:.1f} MiB" for p in files)
        print(f"FlashInfer kernel cache: {sizes}", flush=True)
        return 0
    print(f"FlashInfer kernel cache: {flashinfer_peer.import_cache(args.file)}", flush=True)
    return 0


def _worker(argv: list[str]) -> int:
    return workers.worker_main(Path(argv[0]))


# name: (what it does, handler); "run" is the default. The worker is the runner's own process.
COMMANDS = {
    "run": ("the benchmark (a CPU smoke run without a GPU)", _run),
    "publish": ("make a GPU run the record of its GPU kind (benchmarks/results/)", _publish),
    "report": ("print the table of a run or a record", _report),
    "flashinfer": ("FlashInfer's kernels: status, prebuild, export- / import-cache", _flashinfer),
    "fp8-decode": ("fp8 against 16-bit KV cache decode, ours and FlashInfer's", fp8_decode.main),
    "multi-gpu": ("paged attention sharded by KV head on 1, 2, 4 GPUs", multi_gpu.main),
    "probe": ("kernel probes: decode shapes, the sm_90a prefill against mma.sync", probes.main),
    "ab": ("A/B of library builds: a probe command under each in turn", library_ab.main),
    "ncu": ("one call of ours and FlashInfer's per case, for ncu", ncu_peers.main),
}
HIDDEN = {"worker": _worker}


def usage() -> str:
    width = max(map(len, COMMANDS))
    lines = [
        "usage: python -m benchmarks [COMMAND] [ARGS]  (COMMAND -h for its options)",
        "",
        "commands:",
    ]
    lines += [f"  {name:{width}}  {text}" for name, (text, _) in COMMANDS.items()]
    lines += ["", "Without a command (or with options only): run. How to: benchmarks/README.md."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] in (["-h"], ["--help"]):
        print(usage())
        return 0
    if not argv or argv[0].startswith("-"):
        argv = ["run", *argv]
    name, rest = argv[0], argv[1:]
    if name in HIDDEN:
        return HIDDEN[name](rest)
    if name not in COMMANDS:
        print(f"python -m benchmarks: unknown command {name!r}\n\n{usage()}", file=sys.stderr)
        return 2
    return COMMANDS[name][1](rest)
