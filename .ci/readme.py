"""README.md's commands, as CI runs them: word for word, in order, then the checks they cannot make.

Usage: python3 .ci/readme.py list                   the commands and snippets CI runs, in order
       python3 .ci/readme.py run [--record FILE]    run them (CI: .ci/run), then the checks

What runs: every ```bash and ```python block of README.md, in the order README gives them. A block
whose info string has a second word (```bash gpu-host) is for another kind of machine and is not
run here (`list` shows it as skipped). One bash process runs every command (`set -euo pipefail`),
so `export` and `source` carry on as in a user's terminal; a python block runs there as a complete
program, `python - <<EOF`, with the interpreter README's commands put first on PATH.

Then the checks:
- pytest: every run passed tests and failed none; the host's `nox -s ... tests ... xla_cuda`
  gives the same counts as compose's `tests` and `tests-xla-cuda` services;
- the scaffold stays true: `nox -s new_op -- NAME --try` makes a throwaway op in a temporary copy,
  builds it and passes its tests (docs/ADDING_AN_OP.md);
- compose's test services have no network (their resolved config);
- the dev container README opened: a host edit to a kernel source is seen inside and `nox -s
  build` there compiles just that object; a host edit to a Python module is seen by the next
  import; the edits are undone (content and mtime);
- the sizes of the images compose names.
Afterwards the dev container is stopped (compose down). A record (JSON) gives each command's
time and exit status, the pytest summaries, the checks, the image sizes and the disk: free at
the start, the peak use above it (sampled every 2 s: other processes count too).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import secrets
import shlex
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import pytest_summaries  # beside this file

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
FENCE = re.compile(r"^```(\w+)(.*)$")
MARK = "::xgo-readme::"  # the runner's own lines in the output stream
PYTHON_PROBE_FILE = ROOT / "xla_gpu_ops" / "__init__.py"
KERNEL_PROBE_FILE = ROOT / "kernels" / "ops" / "simple_add" / "simple_add.cu"
NEW_OP_PROBE = "ci_scaffold_probe"  # the scaffold's throwaway op (check_new_op)
KERNEL_PROBE_OBJECT = "ops/simple_add/simple_add.cu.o"  # its object, below CMake's target folder


@dataclass
class Step:
    kind: str  # "bash" (one command line) or "python" (one snippet)
    text: str
    line: int  # README line where it starts
    runs: bool  # False: a block for another machine (```bash gpu-host)

    @property
    def words(self) -> list[str]:
        """A command's words as the shell reads them (its `# comment` dropped)."""
        return shlex.split(self.text, comments=True) if self.kind == "bash" else []

    @property
    def title(self) -> str:
        return self.text if self.kind == "bash" else f"python snippet, README line {self.line}"


def steps(readme: Path = README) -> list[Step]:
    """README's commands (one per line of a bash block; continuation lines joined) and python
    snippets (one per block), in order."""
    found: list[Step] = []
    lines = readme.read_text().splitlines()
    i = 0
    while i < len(lines):
        fence = FENCE.match(lines[i])
        if not fence or fence.group(1) not in {"bash", "python"}:
            i += 1
            continue
        kind, runs, start = fence.group(1), not fence.group(2).strip(), i + 2
        body: list[str] = []
        i += 1
        while i < len(lines) and not lines[i].startswith("```"):
            body.append(lines[i])
            i += 1
        i += 1
        if kind == "python":
            found.append(Step(kind, "\n".join(body) + "\n", start, runs))
            continue
        pending, first = "", start
        for offset, line in enumerate(body):
            if not pending:
                first = start + offset
            if line.rstrip().endswith("\\"):
                pending += line.rstrip()[:-1] + " "
                continue
            command = (pending + line).strip()
            pending = ""
            if command and not command.startswith("#"):
                found.append(Step(kind, command, first, runs))
    return found


def script(run: list[Step]) -> str:
    """One bash script: each step between two marker lines that carry its index and the time."""
    out = ["set -euo pipefail", "cd " + shlex.quote(str(ROOT))]
    for index, step in enumerate(run):
        out.append(f'echo "{MARK} start {index} $(date +%s.%N)"')
        if step.kind == "bash":
            out.append(step.text)
        else:
            delimiter = "XGO_README_SNIPPET"
            assert delimiter not in step.text
            out.append(f"python - <<'{delimiter}'\n{step.text}{delimiter}")
        out.append(f'echo "{MARK} end {index} $(date +%s.%N)"')
    return "\n".join(out) + "\n"


class Disk:
    """Free disk at the start and the peak use above it, sampled every 2 s."""

    def __init__(self) -> None:
        usage = shutil.disk_usage(ROOT)
        self.start_used, self.start_free, self.peak = usage.used, usage.free, usage.used
        self._on = True
        threading.Thread(target=self._sample, daemon=True).start()

    def _sample(self) -> None:
        while self._on:
            self.peak = max(self.peak, shutil.disk_usage(ROOT).used)
            time.sleep(2)

    def summary(self) -> dict[str, str]:
        self._on = False
        peak = max(0, self.peak - self.start_used)
        return {
            "free at the start": f"{self.start_free / 1e9:.1f} GB",
            "peak use above the start": f"{peak / 1e9:.1f} GB",
        }


def run_steps(run: list[Step], log: Path) -> tuple[int, list[dict]]:
    """Runs the script, streaming its output; per step: its output, time and whether it ended."""
    results = [
        {"step": step.title, "words": step.words, "line": step.line, "output": []} for step in run
    ]
    current = None
    with (
        log.open("w") as log_file,
        subprocess.Popen(
            ["bash", "-c", script(run)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
        ) as process,
    ):
        assert process.stdout is not None
        for line in process.stdout:
            log_file.write(line)
            if line.startswith(MARK):
                _, what, index, stamp = line.split()
                entry = results[int(index)]
                if what == "start":
                    current, entry["started"] = entry, float(stamp)
                    print(f"readme: $ {run[int(index)].title.splitlines()[0][:150]}", flush=True)
                else:
                    entry["seconds"] = round(float(stamp) - entry.pop("started"), 1)
                    current = None
                continue
            sys.stdout.write(line)
            if current is not None:
                current["output"].append(line)
        process.wait()
    for entry in results:
        entry["output"] = "".join(entry["output"])
        entry["ended"] = "seconds" in entry
        entry.pop("started", None)
    return process.returncode, results


def stop_problems(exit_code: int, results: list[dict]) -> list[str]:
    """The step that stopped README's commands, and the steps after it, which did not run."""
    if exit_code == 0:
        return []
    stopped = [entry["step"] for entry in results if not entry["ended"]]
    problems = [f"README's commands stopped with exit {exit_code} at: {(stopped or ['?'])[0]}"]
    if len(stopped) > 1:
        problems.append(f"not run: {'; '.join(stopped[1:])}")
    return problems


def counts(summary: str) -> dict[str, int]:
    return {
        word: int(n) for n, word in re.findall(r"(\d+) (passed|failed|skipped|errors?)", summary)
    }


def check_pytest(results: list[dict], problems: list[str]) -> dict[str, list[str]]:
    """Every pytest run passed tests and failed none; compose's runs equal the host's. After a
    step that stopped, only the runs that happened are judged: the steps that never ran are
    reported as such by the caller, not as runs without pytest."""
    found: dict[str, list[str]] = {}
    words: dict[str, list[str]] = {}
    for entry in results:
        lines = pytest_summaries.summaries(entry["output"])
        if lines:
            found[entry["step"]], words[entry["step"]] = lines, entry["words"]
            problems += [f"{entry['step']}: {p}" for p in pytest_summaries.problems(lines)]
    if not all(entry["ended"] for entry in results):
        return found
    host = next(
        (
            lines
            for step, lines in found.items()
            if words[step][:1] == ["nox"] and "xla_cuda" in words[step]
        ),
        None,
    )
    if host is None or len(host) != 2:
        problems.append(f"the host's `nox -s ... tests ... xla_cuda` gave summaries {host}")
        return found
    for service, expected in (("tests", host[0]), ("tests-xla-cuda", host[1])):
        runs = [
            lines
            for step, lines in found.items()
            if words[step][:2] == ["docker", "compose"] and words[step][-1] == service
        ]
        if not runs:
            problems.append(f"no `docker compose ... run --rm {service}` in README ran pytest")
        for lines in runs:
            if [counts(line) for line in lines] != [counts(expected)]:
                problems.append(f"compose {service}: {lines} != the host's {expected!r}")
    return found


def compose_command(run: list[Step]) -> list[str]:
    """`docker compose` with README's file arguments (those of its `run --rm tests`)."""
    for step in run:
        if step.words[:2] == ["docker", "compose"] and step.words[-3:] == ["run", "--rm", "tests"]:
            return step.words[:-3]
    raise RuntimeError("README runs no `docker compose ... run --rm tests`")


def check_no_network(compose: list[str], problems: list[str]) -> None:
    config = subprocess.run(
        [*compose, "config", "--format", "json"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    services = json.loads(config.stdout)["services"]
    for name in ("tests", "tests-xla-cuda"):
        if services[name].get("network_mode") != "none":
            problems.append(
                f"compose service {name} has network {services[name].get('network_mode')!r}"
            )


def devcontainer_args(run: list[Step]) -> list[str]:
    """The arguments of README's `devcontainer up` (workspace folder, configuration)."""
    for step in run:
        if step.words[:2] == ["devcontainer", "up"]:
            return step.words[2:]
    raise RuntimeError("README runs no `devcontainer up`")


def check_edit_in_place(args: list[str], problems: list[str]) -> dict[str, object]:
    def inside(*command: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["devcontainer", "exec", *args, *command],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=False,
        )

    token = secrets.token_hex(6)
    originals = {
        path: (path.read_bytes(), path.stat()) for path in (PYTHON_PROBE_FILE, KERNEL_PROBE_FILE)
    }
    check: dict[str, object] = {}
    try:
        with PYTHON_PROBE_FILE.open("a") as handle:
            handle.write(f'\n_EDIT_IN_PLACE_PROBE = "{token}"\n')
        with KERNEL_PROBE_FILE.open("a") as handle:
            handle.write(f"\n// edit-in-place probe {token}\n")
        relative = KERNEL_PROBE_FILE.relative_to(ROOT)
        check["kernel edit seen inside"] = (
            inside("grep", "-c", token, f"/work/{relative}").returncode == 0
        )
        rebuilt = inside("nox", "-s", "build")
        compiled = re.findall(r"\[\d+/\d+\] Building \w+ object (\S+)", rebuilt.stdout)
        check["nox -s build compiled"] = [p.split(".dir/", 1)[-1] for p in compiled]
        check["nox -s build linked"] = "Linking CXX shared library" in rebuilt.stdout
        imported = inside(
            "sh",
            "-c",
            '"$XLA_GPU_OPS_NOX_ENVDIR/tests/bin/python" -c '
            '"import xla_gpu_ops; print(xla_gpu_ops._EDIT_IN_PLACE_PROBE)"',
        )
        check["python edit seen by an import"] = token in imported.stdout
    finally:
        for path, (content, stat) in originals.items():
            path.write_bytes(content)
            os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    expected = {
        "kernel edit seen inside": True,
        "nox -s build compiled": [KERNEL_PROBE_OBJECT],
        "nox -s build linked": True,
        "python edit seen by an import": True,
    }
    for key, value in expected.items():
        if check.get(key) != value:
            problems.append(f"dev container: {key}: {check.get(key)!r}, expected {value!r}")
    return check


def check_new_op(problems: list[str]) -> dict[str, object]:
    """The scaffold and its guide stay true (docs/ADDING_AN_OP.md): a throwaway op, made in a
    temporary copy with the environments README's commands made, builds and passes its tests."""
    started = time.monotonic()
    nox = ROOT / ".nox" / "_bootstrap" / "bin" / "nox"
    command = [str(nox), "-s", "new_op", "--", NEW_OP_PROBE, "--try"]
    print(f"{MARK} {' '.join(command[1:])}", flush=True)
    code = subprocess.run(command, cwd=ROOT, check=False).returncode
    if code != 0:
        problems.append(f"nox -s new_op -- {NEW_OP_PROBE} --try exited {code}")
    return {"exit": code, "seconds": round(time.monotonic() - started)}


def image_sizes(compose: list[str]) -> dict[str, str]:
    config = subprocess.run(
        [*compose, "config", "--images"], cwd=ROOT, capture_output=True, text=True, check=True
    )
    sizes = {}
    for image in sorted(set(config.stdout.split())):
        size = subprocess.run(
            ["docker", "image", "inspect", "--format", "{{.Size}}", image],
            capture_output=True,
            text=True,
            check=False,
        )
        if size.returncode == 0:
            sizes[image] = f"{int(size.stdout) / 1e9:.2f} GB"
    return sizes


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=["list", "run"])
    parser.add_argument("--record", type=Path, help="write the record (JSON) here")
    args = parser.parse_args()
    all_steps = steps()
    if args.action == "list":
        for step in all_steps:
            print(f"{'run ' if step.runs else 'skip'} README:{step.line}: {step.title}")
        return 0

    run = [step for step in all_steps if step.runs]
    started, disk = time.monotonic(), Disk()
    log = (args.record.parent if args.record else ROOT / "artifacts" / "ci") / "readme-run.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    exit_code, results = run_steps(run, log)
    problems: list[str] = []
    problems += stop_problems(exit_code, results)
    record: dict[str, object] = {
        "commands": [
            {key: entry[key] for key in ("step", "line", "seconds") if key in entry}
            for entry in results
        ]
    }
    record["pytest"] = check_pytest(results, problems)
    if exit_code == 0:
        record["new op scaffold"] = check_new_op(problems)
        compose = compose_command(run)
        check_no_network(compose, problems)
        dev_args = devcontainer_args(run)
        try:
            record["dev container"] = check_edit_in_place(dev_args, problems)
        finally:
            subprocess.run(
                [*compose, "down", "--remove-orphans"], cwd=ROOT, capture_output=True, check=False
            )
        record["images"] = image_sizes(compose)
    record["disk"] = disk.summary()
    record["total"] = f"{(time.monotonic() - started) / 60:.1f} min"
    record["result"] = "FAILED: " + "; ".join(problems) if problems else "ok"
    text = json.dumps(record, indent=2)
    print(text)
    if args.record:
        args.record.parent.mkdir(parents=True, exist_ok=True)
        args.record.write_text(text + "\n")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
