"""The files of a run, and filing a GPU run as the repository's benchmark record.

`write_run` writes a run's results.json, env.json, table.md and plot.png. Filing, from the
repository root:

    python -m benchmarks record RUN_DIR [--fill-skipped RUN_DIR2]

copies a GPU run's files (results.json, env.json, table.md, plot.png, run.log, workers.log) into
benchmarks/results/<date>-<device>-<commit>/ with a generated README.md, removes the previous
record folders (git history keeps them; RESULTS.md says at which commit they were last in the
tree) and puts the new record at the top of benchmarks/results/RESULTS.md.

--fill-skipped RUN_DIR2: the cases RUN_DIR skipped at its time limit come from RUN_DIR2, a run of
the same commit and library on the same device (`benchmarks.run --cases ...`): each such case
says so in results.json ("filled_from"), the verdicts, table and plot are made again from the
joined cases, the README lists them, and RUN_DIR2's logs travel as fill-run.log and
fill-workers.log.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

from benchmarks import report
from benchmarks.environment import ROOT, run_name
from benchmarks.report import skipped_for_time

RESULTS_DIR = ROOT / "benchmarks" / "results"
RESULTS_MD = "RESULTS.md"
RUN_FILES = ("results.json", "env.json", "table.md", "plot.png")  # what write_run writes
LOG_FILES = ("run.log", "workers.log")
RECORD_FILES = RUN_FILES + LOG_FILES
TABLE_HEAD = "| record | device | commit | summary | where |"


def write_run(results: dict, out_dir: Path) -> None:
    """results.json (everything), env.json, table.md and plot.png of a run."""
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "results.json").write_text(json.dumps(results, indent=1, default=str))
    (out_dir / "env.json").write_text(json.dumps(results["env"], indent=1))
    (out_dir / "table.md").write_text(report.markdown(results))
    report.plot(results, out_dir / "plot.png")


def record_name(results: dict) -> str:
    return run_name(results["env"])


def summary_line(results: dict) -> str:
    verdicts = [v for v in results.get("verdicts", []) if v["case"] != "all rows"]
    met = sum(v["verdict"].startswith("met") for v in verdicts)
    missed = sum(v["verdict"].startswith("MISSED") for v in verdicts)
    cases = sum(not r.get("skipped") for r in results["cases"])
    return f"{results['env'].get('mode')} run, {cases} cases; verdicts {met} met, {missed} missed"


def fill_skipped(results: dict, other: dict) -> list[str]:
    """Cases `results` skipped at its time limit, taken from `other` where it reached them; the
    verdicts follow the joined cases. Returns the names filled in."""
    env, other_env = results["env"], other["env"]
    for what, get in (("commit", lambda e: e.get("git_commit")),
                      ("device", lambda e: (e.get("gpu") or {}).get("name")),
                      ("library", lambda e: (e.get("library") or {}).get("sha256"))):  # fmt: skip
        if get(env) != get(other_env):
            raise SystemExit(f"--fill-skipped: the runs differ in {what}: "
                             f"{get(env)!r} and {get(other_env)!r}")  # fmt: skip
    # Measured there, or skipped there for a reason other than time (e.g. the memory budget).
    measured = {c["name"]: c for c in other["cases"] if not skipped_for_time(c)}
    source = {"date_utc": other_env.get("date_utc"),
              "read_gbps": (other.get("ceilings") or {}).get("read_gbps")}  # fmt: skip
    filled = []
    for i, case in enumerate(results["cases"]):
        if skipped_for_time(case) and case["name"] in measured:
            results["cases"][i] = {**measured[case["name"]], "filled_from": source}
            filled.append(case["name"])
    if filled:
        results["filled"] = {**source, "cases": filled}
        results["verdicts"] = report.verdicts(results)
    return filled


def readme(results: dict) -> str:
    env = results["env"]
    gpu = env.get("gpu") or {}
    lib = env.get("library") or {}
    versions = (f"Python {env.get('python')}, torch {env.get('torch')}, jax {env.get('jax')} "
                f"(plugin {env.get('jax_cuda_plugin')}), torchax {env.get('torchax')}, "
                f"FlashInfer {env.get('flashinfer') or 'not installed'}")  # fmt: skip
    lines = [
        f"# GPU run record: {gpu.get('name')}, {env['date_utc'][:10]}, commit {str(env['git_commit'])[:7]}",
        "",
        f"- Device: {gpu.get('name')} ({gpu.get('sm_count')} SMs, {gpu.get('memory_gb')} GB), "
        f"driver {env.get('driver')}; measured read bandwidth {results['ceilings']['read_gbps']:.0f} GB/s.",
        f"- Software: {versions}.",
        f"- Library: sha256 {str(lib.get('sha256'))[:12]}…, CUDA archs {lib.get('cuda_archs')}.",
        f"- Commit {env['git_commit']}, {env['date_utc']}, mode {env.get('mode')}.",
        f"- {summary_line(results)}. Files: `table.md` (every measurement and verdict), "
        "`results.json`, `plot.png`, `env.json`, `run.log`.",
        "- FlashInfer plans on the host (`plan()`, untimed: its design); ours has no host plan.",
        *_filled_lines(results),
        "",
        "## Summary",
        "",
        report.compact(results),
        "",
    ]
    return "\n".join(lines)


def _filled_lines(results: dict) -> list[str]:
    filled = results.get("filled")
    if not filled:
        return []
    return [f"- {len(filled['cases'])} cases this run skipped at its time limit are a second run's "
            f"(same commit, library and device; {filled['date_utc']}, read "
            f"{filled['read_gbps']:.0f} GB/s; measured there or skipped there for another reason; "
            f"its logs: `fill-run.log`, `fill-workers.log`): " + ", ".join(filled["cases"]) + "."]  # fmt: skip


def _head_commit() -> str:
    try:
        out = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short=7", "HEAD"],
                             capture_output=True, text=True, timeout=10, check=True)  # fmt: skip
        return out.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def _table_rows(text: str) -> list[str]:
    return [ln for ln in text.splitlines() if ln.startswith("| ") and ln != TABLE_HEAD
            and not ln.startswith("|---")]  # fmt: skip


def results_md(rows: list[str]) -> str:
    return "\n".join([
        "# Benchmark records",
        "",
        "The latest GPU record is the one folder beside this file; the table lists every record.",
        "Older records left the tree and stay in git history: one \"removed in C\" is",
        "`git show C^:benchmarks/results/<record>/README.md`, one \"last in the tree at C\" is",
        "`git show C:benchmarks/results/<record>/README.md` (a one-file record: its name instead",
        "of `<record>/README.md`). Codes such as d7 or m6 name kernel revisions of the performance",
        "log in docs/. A new record is filed with `python -m benchmarks record RUN_DIR`",
        "(benchmarks/README.md).",
        "",
        TABLE_HEAD,
        "|---|---|---|---|---|",
        *rows,
        "",
    ])  # fmt: skip


def retire(rows: list[str], name: str, last_commit: str) -> list[str]:
    """Point the row of record `name` at git history (its folder leaves the tree)."""
    out = []
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        if cells and cells[0] == name and len(cells) == 5:
            cells[4] = f"git history, last in the tree at {last_commit}"
            row = "| " + " | ".join(cells) + " |"
        out.append(row)
    return out


def file_record(
    run_dir: Path, results_dir: Path = RESULTS_DIR, fill_dir: Path | None = None
) -> Path:
    """Copy a GPU run into results_dir/<record>/ and make it the only record in the tree."""
    results = json.loads((run_dir / "results.json").read_text())
    if not (results.get("env") or {}).get("gpu"):
        raise SystemExit(f"{run_dir}: a CPU smoke run is not a record")
    filled = []
    if fill_dir is not None:
        filled = fill_skipped(results, json.loads((fill_dir / "results.json").read_text()))
        if not filled:
            raise SystemExit(f"--fill-skipped: {fill_dir} measured none of the cases {run_dir} "
                             "skipped at its time limit")  # fmt: skip
    name = record_name(results)
    dest = results_dir / name
    md_path = results_dir / RESULTS_MD
    rows = _table_rows(md_path.read_text()) if md_path.exists() else []
    last_commit = _head_commit()
    for old in sorted(p for p in results_dir.iterdir() if p.name not in (name, RESULTS_MD)):
        rows = retire(rows, old.name, last_commit)
        shutil.rmtree(old) if old.is_dir() else old.unlink()
        print(f"removed {old.relative_to(ROOT) if old.is_relative_to(ROOT) else old}")
    dest.mkdir(parents=True, exist_ok=True)
    if filled:
        write_run(results, dest)  # the run's files made from the joined cases
        copies = [(run_dir, file, file) for file in LOG_FILES]
        copies += [(fill_dir, file, f"fill-{file}") for file in LOG_FILES]
    else:
        copies = [(run_dir, file, file) for file in RECORD_FILES]
    for source, file, target in copies:
        if (source / file).is_file():
            shutil.copy2(source / file, dest / target)
    (dest / "README.md").write_text(readme(results))
    env = results["env"]
    rows = [r for r in rows if not r.startswith(f"| {name} |")]
    row = (f"| {name} | {(env.get('gpu') or {}).get('name')} | {str(env['git_commit'])[:7]} | "
           f"{summary_line(results)} | [{name}/]({name}/) |")  # fmt: skip
    md_path.write_text(results_md([row, *rows]))
    return dest
