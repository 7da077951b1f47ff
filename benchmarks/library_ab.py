r"""A / B of library builds: one probe command run under each build in turn, rounds alternating.

usage: python3 -m benchmarks ab [--rounds N] [--out DIR] [--timeout S] [--pattern RE]
           NAME=LIBRARY NAME=LIBRARY [...] -- COMMAND [ARG ...]

Each round runs COMMAND once per build, in the order given, each in its own process with
XLA_GPU_OPS_LIBRARY=LIBRARY (the library loads once per process, so builds never share one).
Alternating the builds spreads the GPU's clock and thermal drift over all of them; a build's
range over the rounds is its noise. From each run's output every benchmark case name (decode_...,
prefill_..., mixed_...) followed, past spaces, '|' or ':', by a number is read as that case's
time in µs (the first timing of each row of `python -m benchmarks probe`). --pattern RE reads
other lines instead: a regular expression with the groups `case` and `us`.
The table printed last gives, per case and build, the min-max over the rounds and the median's
ratio to the first build's. With --out DIR: each run's output as DIR/<NAME>-<round>.txt and the
table with every time as DIR/library_ab.json.

Example (the library of another checkout against this one's, on a GPU host):
    python3 -m benchmarks ab --rounds 3 --out ab this=xla_gpu_ops/_lib/libxla_gpu_ops.so \
        other=../other/xla_gpu_ops/_lib/libxla_gpu_ops.so -- python3 -m benchmarks probe prefill --ours-only
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path

CASE_TIME = re.compile(
    r"\b(?P<case>(?:decode|prefill|mixed)_[A-Za-z0-9_\-]+)[ \t|:]+(?P<us>[0-9]+(?:\.[0-9]+)?)\b"
)


def parse_times(output: str, pattern: re.Pattern = CASE_TIME) -> dict[str, float]:
    """Case -> time from every line the pattern matches (the last line naming a case wins)."""
    times = {}
    for line in output.splitlines():
        match = pattern.search(line)
        if match:
            times[match.group("case").strip()] = float(match.group("us"))
    return times


def compile_pattern(text: str | None) -> re.Pattern:
    if text is None:
        return CASE_TIME
    try:
        pattern = re.compile(text)
    except re.error as error:
        raise SystemExit(f"library_ab: --pattern {text!r}: {error}") from None
    if not {"case", "us"} <= set(pattern.groupindex):
        raise SystemExit(
            f"library_ab: --pattern {text!r}: needs the groups (?P<case>) and (?P<us>)"
        )
    return pattern


def parse_builds(specs: list[str]) -> dict[str, Path]:
    builds: dict[str, Path] = {}
    for spec in specs:
        name, sep, path = spec.partition("=")
        if not sep or not name or not path:
            raise SystemExit(f"library_ab: build {spec!r}: expected NAME=LIBRARY")
        if name in builds:
            raise SystemExit(f"library_ab: build name {name!r} given twice")
        if not Path(path).is_file():
            raise SystemExit(f"library_ab: build {name}: no library file at {path}")
        builds[name] = Path(path).resolve()
    if len(builds) < 2:
        raise SystemExit("library_ab: needs at least two builds (NAME=LIBRARY each)")
    return builds


def run_rounds(
    builds: dict[str, Path],
    command: list[str],
    rounds: int,
    timeout: float,
    out_dir: Path | None,
    pattern: re.Pattern = CASE_TIME,
) -> tuple[dict[str, dict[str, list[float]]], list[str]]:
    """times[build][case] over the rounds, and the runs that failed (exit status or timeout)."""
    times: dict[str, dict[str, list[float]]] = {name: {} for name in builds}
    failures = []
    for round_index in range(1, rounds + 1):
        for name, library in builds.items():
            env = dict(os.environ, XLA_GPU_OPS_LIBRARY=str(library))
            try:
                done = subprocess.run(
                    command, env=env, capture_output=True, text=True, timeout=timeout, check=False
                )
                output, status = done.stdout + done.stderr, done.returncode
            except subprocess.TimeoutExpired as expired:
                partial = expired.stdout or ""
                output = partial.decode(errors="replace") if isinstance(partial, bytes) else partial
                status = f"timed out after {timeout:g} s"
            if out_dir is not None:
                (out_dir / f"{name}-{round_index}.txt").write_text(output)
            if status != 0:
                failures.append(f"{name} round {round_index}: {status}")
            found = parse_times(output, pattern)
            for case, value in found.items():
                times[name].setdefault(case, []).append(value)
            print(f"round {round_index} {name}: {len(found)} cases", flush=True)
    return times, failures


def table(times: dict[str, dict[str, list[float]]]) -> str:
    names = list(times)
    first = names[0]
    cases = list(dict.fromkeys(case for name in names for case in times[name]))
    lines = ["| case | " + " | ".join(names) + " |", "|---|" + "---:|" * len(names)]
    for case in cases:
        base = times[first].get(case)
        cells = []
        for name in names:
            values = times[name].get(case)
            if not values:
                cells.append("-")
                continue
            cell = f"{min(values):.1f}-{max(values):.1f}"
            if name != first and base:
                cell += f" ({statistics.median(values) / statistics.median(base):.3f}x)"
            cells.append(cell)
        lines.append(f"| {case} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if "--" not in argv:
        raise SystemExit(__doc__)
    split = argv.index("--")
    parser = argparse.ArgumentParser(prog="python -m benchmarks ab")
    parser.add_argument("builds", nargs="+", help="NAME=LIBRARY, two or more")
    parser.add_argument("--rounds", type=int, default=3, help="runs per build (default 3)")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per run")
    parser.add_argument("--out", type=Path, help="keeps each run's output and the JSON here")
    parser.add_argument("--pattern", help="regular expression with groups case and us")
    args = parser.parse_args(argv[:split])
    command = argv[split + 1 :]
    if not command:
        raise SystemExit("library_ab: no command after --")
    if args.rounds < 1:
        raise SystemExit(f"library_ab: --rounds must be >= 1, got {args.rounds}")
    pattern = compile_pattern(args.pattern)
    builds = parse_builds(args.builds)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
    times, failures = run_rounds(builds, command, args.rounds, args.timeout, args.out, pattern)
    text = table(times)
    print(text)
    if args.out is not None:
        (args.out / "library_ab.json").write_text(
            json.dumps(
                {
                    "command": command,
                    "rounds": args.rounds,
                    "builds": {name: str(path) for name, path in builds.items()},
                    "times_us": times,
                    "failures": failures,
                },
                indent=1,
            )
        )
    for failure in failures:
        print(f"failed: {failure}", file=sys.stderr)
    return 1 if failures else 0
