"""Scaffold a new op: `nox -s new_op -- NAME` (docs/ADDING_AN_OP.md).

Writes the three pieces an op is made of, from the templates beside this file, as a working
elementwise op (out = x * scale, float32/float16/bfloat16):
  kernels/ops/NAME/NAME.cu    description, CUDA kernel and launch, host implementation, XGO_DEFINE_OP
  xla_gpu_ops/ops.py          its table entry and sample call (added to OPS)
  xla_gpu_ops/reference.py    its reference in plain torch ops
Everything else (the torch op and its kernels, the public functions of torch and JAX, the torchax
lowering, the torch_xla custom call and composite, the HLO checks, the tests over the table)
derives from the table. Then `nox -s build` and `nox -s tests -- tests/test_every_op.py -k NAME`.

`--try NAME` proves the scaffold: it makes NAME in a throwaway copy of the checkout, builds the
library there with this checkout's nox environments, runs NAME's tests, and removes the copy
(CI runs it; nothing here changes).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TEMPLATES = Path(__file__).resolve().parent / "new_op"
# The table's list of ops, on one line or (as ruff formats a long one) one name a line.
TABLE_LINE = re.compile(r"^OPS: tuple\[Op, \.\.\.\] = \((?P<ops>[^)]*)\)$", re.MULTILINE)
NAME = re.compile(r"[a-z][a-z0-9]*(_[a-z0-9]+)*")
UNEDITABLE = """import sys
sys.meta_path[:] = [f for f in sys.meta_path if not type(f).__module__.startswith("_editable_")]
"""


def fill(template: str, name: str) -> str:
    camel = "".join(part.capitalize() for part in name.split("_"))
    return template.replace("@name@", name).replace("@Name@", camel).replace("@NAME@", name.upper())


def scaffold(root: Path, name: str) -> list[Path]:
    """Writes op `name` into the checkout at `root`; returns the files written or changed."""
    if not NAME.fullmatch(name) or len(name) >= 24:
        raise SystemExit(f"new_op: {name!r}: use a short snake_case name (a C++ and Python name)")
    folder = root / "kernels" / "ops" / name
    table, references = root / "xla_gpu_ops" / "ops.py", root / "xla_gpu_ops" / "reference.py"
    text = table.read_text()
    if folder.exists() or re.search(rf'^\s*name="{name}",$', text, re.MULTILINE):
        raise SystemExit(f"new_op: {name}: an op of that name exists ({folder} or {table})")
    match = TABLE_LINE.search(text)
    if match is None:
        raise SystemExit(f"new_op: {table}: no `OPS: tuple[Op, ...] = (...)` line to add to")
    entry = fill((TEMPLATES / "entry.py.in").read_text(), name)
    # one name a line with a trailing comma: the layout ruff format keeps, however many ops
    names = [*re.findall(r"[A-Z][A-Z0-9_]*", match["ops"]), name.upper()]
    listed = "".join(f"    {n},\n" for n in names)
    before, after = text[: match.start()].rstrip("\n"), text[match.end() :]
    table.write_text(
        f"{before}\n\n\n{entry.strip()}\n\n\nOPS: tuple[Op, ...] = (\n{listed}){after}"
    )
    references.write_text(
        references.read_text() + fill((TEMPLATES / "reference.py.in").read_text(), name)
    )
    folder.mkdir(parents=True)
    source = folder / f"{name}.cu"
    source.write_text(fill((TEMPLATES / "op.cu.in").read_text(), name))
    # The name changes where lines break: lay the source out as nox -s lint checks it, where
    # clang-format is installed (the lint session's, or one on PATH).
    clang_format = shutil.which("clang-format") or root / ".nox" / "lint" / "bin" / "clang-format"
    if Path(clang_format).is_file():
        subprocess.run(
            [str(clang_format), "-i", f"--style=file:{root / '.clang-format'}", str(source)],
            check=True,
        )
    return [source, table, references]


def try_in_copy(name: str) -> int:
    """Scaffold `name` in a throwaway copy of this checkout, build it and run its tests there."""
    nox_dir = Path(os.environ.get("XLA_GPU_OPS_NOX_ENVDIR") or ROOT / ".nox")
    # any environment of the default stack: the copy's package comes first on PYTHONPATH
    pythons = [nox_dir / session / "bin" / "python" for session in ("tests", "kernels", "hlo")]
    python = next((p for p in pythons if p.is_file()), None)
    if python is None:
        raise SystemExit(
            f"new_op --try: needs an environment of the default stack in {nox_dir}: "
            "run nox -s tests (or kernels) first"
        )
    with tempfile.TemporaryDirectory(prefix="xgo-new-op-") as scratch:
        copy = Path(scratch) / "repo"
        files = subprocess.run(
            ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
            cwd=ROOT,
            check=True,
            capture_output=True,
            text=True,
        ).stdout.split("\0")
        for relative in filter(None, files):
            if (ROOT / relative).is_file():
                (copy / relative).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(ROOT / relative, copy / relative)
        for path in scaffold(copy, name):
            print(f"new_op --try: wrote {path.relative_to(copy)}", flush=True)
        env = {**os.environ, "XLA_GPU_OPS_BUILD_ROOT": str(copy / "build")}
        # this checkout's environments, as they are (-R): only the copy's library is built
        nox = [
            shutil.which("nox") or str(nox_dir / "_bootstrap" / "bin" / "nox"),
            "-R",
            "-f",
            str(copy / "noxfile.py"),
        ]
        subprocess.run(
            [*nox, "--envdir", str(nox_dir), "-s", "build"], cwd=copy, env=env, check=True
        )
        # The environment's editable install finds this checkout's package through a finder
        # ahead of sys.path: drop it, in every process the tests start, so the copy's is found.
        site = Path(scratch) / "site"
        site.mkdir()
        (site / "sitecustomize.py").write_text(UNEDITABLE)
        tests = ["tests/test_every_op.py", "tests/test_op_table.py", "tests/test_hlo.py"]
        return subprocess.run(
            [str(python), "-m", "pytest", "-p", "no:cacheprovider", *tests, "-k", name],
            cwd=copy,
            env={**env, "PYTHONPATH": f"{site}:{copy}"},
            check=False,
        ).returncode


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("name", help="the op's name, snake_case (e.g. rms_norm)")
    parser.add_argument(
        "--try",
        dest="try_",
        action="store_true",
        help="make it in a throwaway copy, build and test it there",
    )
    args = parser.parse_args()
    if args.try_:
        return try_in_copy(args.name)
    for path in scaffold(ROOT, args.name):
        print(f"new_op: wrote {path.relative_to(ROOT)}")
    print(f"next: nox -s build && nox -s tests -- tests/test_every_op.py -k {args.name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
