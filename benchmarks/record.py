"""Publishing a GPU run as the record of its GPU kind: `python -m benchmarks publish RUN_DIR`.

A run writes everything it measured into its own folder, git-ignored (artifacts/bench/<date>-
<device>-<commit>/ by default). Publishing writes the record of the run's GPU kind,
benchmarks/results/<device>/ (the GPU's name as a slug, e.g. nvidia-h100-80gb-hbm3): results.json
(compact: the run's environment, then one case per line), table.md, plot.png and a short
README.md, all made from that results.json; the record it replaces stays in git history. Then it
makes benchmarks/results/RESULTS.md again: the current record of each GPU kind.

--fill-skipped RUN_DIR2: the cases RUN_DIR skipped at its time limit come from RUN_DIR2, a run of
the same commit and library on the same device (`run --cases ...`); each such case says so
("filled_from") and the README lists them.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from benchmarks import report
from benchmarks.environment import ROOT, device_slug

RESULTS_DIR = ROOT / "benchmarks" / "results"
RECORD_FILES = ("README.md", "results.json", "table.md", "plot.png")
# The kind's GPU checks outside the benchmark (test runs, sanitizers, probes), written by hand;
# publishing keeps it and the README links it.
CHECKS_FILE = "checks.md"
# What a record keeps of a run: everything the table, the plot and the verdicts use, the numbers
# the docs quote, and where the run happened; not the run's local paths, logs or method strings.
CONFIG_KEYS = ("quick", "patterns", "skip_impls", "samples", "budget_gb", "time_limit_s")
CASE_KEYS = (
    "name",
    "kind",
    "params",
    "bytes",
    "flops",
    "floor_us",
    "input_copies",
    "check_against",
    "skipped",
    "filled_from",
    "cross_check",
)
ENTRY_KEYS = (
    "role",
    "status",
    "reason",
    "median_us",
    "median_us_repeat",
    "p10_us",
    "p90_us",
    "check",
    "rel_l2_err",
    "slope_us",
)
# the per-call evidence of the anchor and overhead rows (the overhead verdict reads it)
COMMAND_BUFFER_KEYS = (
    "captured",
    "custom_calls_in_command_buffer",
    "custom_calls_outside",
    "file",
    "error",
)
DEVICE_TRACE_KEYS = ("span_us", "busy_us", "idle_us", "names", "error")
BASELINE_KEYS = ("device", "commit", "date_utc", "read_gbps", "rows")


def _rounded(value):
    """Floats to 7 significant digits (0.1 ns of a 100 µs row): the shown numbers stay exact."""
    if isinstance(value, float):
        return float(f"{value:.7g}")
    if isinstance(value, dict):
        return {k: _rounded(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_rounded(v) for v in value]
    return value


def _pick(mapping: dict, keys) -> dict:
    return {k: mapping[k] for k in keys if k in mapping}


def _compact_entry(entry: dict) -> dict:
    out = _pick(entry, ENTRY_KEYS)
    if "command_buffer" in entry:
        out["command_buffer"] = _pick(entry["command_buffer"], COMMAND_BUFFER_KEYS)
    if "device" in entry:
        out["device"] = _pick(entry["device"], DEVICE_TRACE_KEYS)
    return out


def compact(results: dict) -> dict:
    """The record form of a run's results (compact(compact(r)) == compact(r))."""
    env = {k: v for k, v in results["env"].items() if k != "host"}
    env["library"] = {k: v for k, v in (env.get("library") or {}).items() if k != "path"}
    prebuild = results.get("flashinfer_prebuild") or {}
    record = {
        "env": env,
        "config": _pick(results.get("config") or {}, CONFIG_KEYS),
        "wall_s": results.get("wall_s"),
        "flashinfer_prebuild": _pick(prebuild, ("seconds", "exit_status", "unavailable")),
        "ceilings": results["ceilings"],
        "methods": results.get("methods") or report.methods(results),
        "baseline": _pick(results.get("baseline") or {}, BASELINE_KEYS) or None,
        "filled": results.get("filled"),
        "verdicts": report.verdict_counts(report.verdicts(results)),
        "cases": [
            {
                **_pick(case, CASE_KEYS),
                "impls": {n: _compact_entry(e) for n, e in case.get("impls", {}).items()},
            }
            for case in results["cases"]
        ],
    }
    return _rounded({k: v for k, v in record.items() if v is not None})


def dumps(record: dict) -> str:
    """JSON with one top-level key per line and one case per line."""
    lines = ["{"]
    for i, (key, value) in enumerate(record.items()):
        comma = "," if i < len(record) - 1 else ""
        if key == "cases":
            lines.append('"cases": [')
            lines += [
                json.dumps(case, ensure_ascii=False) + ("," if j < len(value) - 1 else "")
                for j, case in enumerate(value)
            ]
            lines.append("]" + comma)
        else:
            lines.append(f"{json.dumps(key)}: {json.dumps(value, ensure_ascii=False)}{comma}")
    return "\n".join([*lines, "}", ""])


def fill_skipped(results: dict, other: dict) -> list[str]:
    """Cases `results` skipped at its time limit, taken from `other` where it reached them.
    Returns the names filled in."""
    env, other_env = results["env"], other["env"]
    for what, get in (
        ("commit", lambda e: e.get("git_commit")),
        ("device", lambda e: (e.get("gpu") or {}).get("name")),
        ("library", lambda e: (e.get("library") or {}).get("sha256")),
    ):
        if get(env) != get(other_env):
            raise SystemExit(
                f"--fill-skipped: the runs differ in {what}: {get(env)!r} and {get(other_env)!r}"
            )
    # Measured there, or skipped there for a reason other than time (e.g. the memory budget).
    measured = {c["name"]: c for c in other["cases"] if not report.skipped_for_time(c)}
    source = {
        "date_utc": other_env.get("date_utc"),
        "read_gbps": (other.get("ceilings") or {}).get("read_gbps"),
    }
    filled = []
    for i, case in enumerate(results["cases"]):
        if report.skipped_for_time(case) and case["name"] in measured:
            results["cases"][i] = {**measured[case["name"]], "filled_from": source}
            filled.append(case["name"])
    if filled:
        results["filled"] = {**source, "cases": filled}
    return filled


def readme(record: dict, checks: bool = False) -> str:
    env, ceil, config = record["env"], record["ceilings"], record.get("config") or {}
    gpu, lib, smi = env.get("gpu") or {}, env.get("library") or {}, env.get("nvidia_smi") or {}
    counts = record["verdicts"]
    cases = record["cases"]
    skipped = [c for c in cases if c.get("skipped")]
    grid = "quick grid" if config.get("quick") else "full grid"
    if config.get("patterns"):
        grid += f", cases matching {config['patterns']}"
    limit = config.get("time_limit_s")
    base = record.get("baseline") or {}
    compared = next((v for v in report.verdicts(record) if v["case"] == "all rows"), None)
    lines = [
        f"# Benchmark record: {gpu.get('name')}",
        "",
        f"- Run {env['date_utc']} at commit {env['git_commit']}, the checkout its library was "
        f"built from (sha256 {str(lib.get('sha256'))[:12]}, {', '.join(lib.get('cuda_archs') or ['?'])}).",
        f"- Device: {gpu.get('name')} ({gpu.get('sm_count')} SMs, {gpu.get('memory_gb')} GB, "
        f"compute capability {gpu.get('capability')}), driver {env.get('driver')}, max clocks "
        f"{smi.get('clocks.max.sm')} / {smi.get('clocks.max.mem')}, power limit "
        f"{smi.get('power.limit')}; measured in the run: read {ceil['read_gbps']:.0f} GB/s, copy "
        f"{ceil['copy_gbps']:.0f} GB/s, {ceil['matmul_dtype']} matmul "
        f"{ceil['matmul_tflops']:.0f} TFLOP/s.",
        f"- Software: Python {env.get('python')}, torch {env.get('torch')} (CUDA "
        f"{env.get('torch_cuda')}), jax {env.get('jax')} (CUDA plugin {env.get('jax_cuda_plugin')}), "
        f"triton {env.get('triton')}, torchax {env.get('torchax')}, FlashInfer "
        f"{env.get('flashinfer') or 'not installed'}.",
        f"- How: `python -m benchmarks run` ({grid}, {config.get('samples')} samples per timing"
        + (f", time limit {limit:.0f} s" if limit else "")
        + f"; {record.get('wall_s', 0):.0f} s), published with `python -m benchmarks publish`.",
        f"- {len(cases) - len(skipped)} of {len(cases)} cases measured"
        + (f" ({len(skipped)} skipped: table.md says why)" if skipped else "")
        + f"; verdicts {counts['met']} met, {counts['missed']} missed"
        + (f", {counts['other']} not judged" if counts["other"] else "")
        + ".",
    ]
    if compared is not None and not base:
        lines.append(f"- The first record of this GPU kind: {compared['verdict']}.")
    elif compared is not None:
        lines.append(
            f"- Against the record before it (commit {str(base.get('commit'))[:7]}, "
            f"{str(base.get('date_utc'))[:10]}): {compared['verdict']}."
        )
    filled = record.get("filled")
    if filled:
        lines.append(
            f"- {len(filled['cases'])} cases this run skipped at its time limit come "
            f"from a second run of the same commit, library and device "
            f"({filled['date_utc']}): " + ", ".join(filled["cases"]) + "."
        )
    if checks:
        lines.append(
            f"- GPU checks on this kind outside the benchmark (tests, sanitizers, "
            f"probes): [{CHECKS_FILE}]({CHECKS_FILE})."
        )
    lines += [
        "- Files: [table.md](table.md) (every case and implementation, the verdicts), "
        "[results.json](results.json) (the numbers, one case per line), [plot.png](plot.png); "
        "how they are made: [benchmarks/README.md](../../README.md).",
        "",
    ]
    return "\n".join(lines)


def records(results_dir: Path = RESULTS_DIR) -> list[tuple[Path, dict]]:
    """(folder, results) of each GPU kind's record: folders named after their device."""
    found = []
    for path in sorted(results_dir.glob("*/results.json")):
        data = report.load(path)
        if (data.get("env") or {}).get("gpu") and path.parent.name == device_slug(data["env"]):
            found.append((path.parent, data))
    return found


def results_md(results_dir: Path = RESULTS_DIR) -> str:
    rows = []
    for folder, data in records(results_dir):
        env, counts = data["env"], data["verdicts"]
        measured = sum(not c.get("skipped") for c in data["cases"])
        rows.append(
            f"| {env['gpu']['name']} | {env['date_utc'][:10]} | "
            f"{str(env['git_commit'])[:7]} | {measured} of {len(data['cases'])} | "
            f"{counts['met']} met, {counts['missed']} missed | "
            f"[{folder.name}/]({folder.name}/README.md) |"
        )
    checks = [
        f"- [{path.parent.name}/]({path.parent.name}/{CHECKS_FILE}): "
        f"{path.read_text().splitlines()[0].lstrip('# ')}"
        for path in sorted(results_dir.glob(f"*/{CHECKS_FILE}"))
        if not (path.parent / "results.json").exists()
    ]
    return "\n".join(
        [
            "# Benchmark records",
            "",
            "The current record of each GPU kind; `python -m benchmarks publish RUN_DIR` writes one",
            "and this file (benchmarks/README.md). Earlier records are in git history: `git log",
            "--oneline -- benchmarks/results/` lists the commits that published them, each naming its",
            "record.",
            "",
            "| GPU | run | commit | cases measured | verdicts | record |",
            "|---|---|---|---|---|---|",
            *rows,
            *(
                ["", "GPU kinds with tests and probes but no benchmark run yet:", "", *checks]
                if checks
                else []
            ),
            "",
        ]
    )


def current_record(env: dict, results_dir: Path = RESULTS_DIR) -> Path | None:
    """results.json of the record of this run's GPU kind, if there is one."""
    path = results_dir / device_slug(env) / "results.json"
    return path if env.get("gpu") and path.is_file() else None


def publish(run_dir: Path, results_dir: Path = RESULTS_DIR, fill_dir: Path | None = None) -> Path:
    """Write the record of the run's GPU kind and RESULTS.md; returns the record's folder."""
    results = report.load(Path(run_dir) / "results.json")
    if not (results.get("env") or {}).get("gpu"):
        raise SystemExit(f"{run_dir}: a CPU smoke run is not a record")
    fill = None if fill_dir is None else report.load(Path(fill_dir) / "results.json")
    if fill is not None and not fill_skipped(results, fill):
        raise SystemExit(
            f"--fill-skipped: {fill_dir} measured none of the cases {run_dir} "
            "skipped at its time limit"
        )
    record = compact(results)
    dest = Path(results_dir) / device_slug(record["env"])
    dest.mkdir(parents=True, exist_ok=True)
    for old in dest.iterdir():
        if old.name not in (*RECORD_FILES, CHECKS_FILE):
            shutil.rmtree(old) if old.is_dir() else old.unlink()
    (dest / "results.json").write_text(dumps(record))
    (dest / "table.md").write_text(report.table(record))
    report.plot(record, dest / "plot.png")
    (dest / "README.md").write_text(readme(record, checks=(dest / CHECKS_FILE).is_file()))
    (Path(results_dir) / "RESULTS.md").write_text(results_md(results_dir))
    return dest
