"""The single entry point: build, test, dump HLO, benchmark and lint xla-gpu-ops.

Main job on a fresh machine:  nox -s build kernels hlo
The tests (README, run by .ci/run):  nox -s lint tests xla_cuda
A machine without an image registry, before the container commands:  nox -s docker

Every install goes through the hash-locked files in locks/ (regenerate them with `nox -s lock`).
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import tomllib
from pathlib import Path

import nox

nox.needs_version = ">=2025.2.9"
nox.options.default_venv_backend = "uv|virtualenv"
# The image sets XLA_GPU_OPS_REUSE_VENVS=1: its venvs, made from the locks at build time, are kept
# (and checked against the locks) instead of made anew, so a container needs no download.
nox.options.reuse_venv = "yes" if os.environ.get("XLA_GPU_OPS_REUSE_VENVS") == "1" else "no"
# The images keep their venvs and CMake builds outside the checkout (/opt/nox, /opt/build), so a
# checkout bind-mounted over /work hides neither.
nox.options.envdir = os.environ.get("XLA_GPU_OPS_NOX_ENVDIR") or ".nox"
nox.options.sessions = ["build", "kernels", "hlo"]

ROOT = Path(__file__).parent
LOCKS = ROOT / "locks"
PYTHON = "3.11"  # CI's Python; the only one with wheels for both torch_xla 2.7 and torchax
ARTIFACTS = ROOT / "artifacts"
# Lock name -> the .in file it is compiled from; platform of every lock: CPython 3.11, manylinux x86_64.
LOCK_PLATFORM = "x86_64-manylinux_2_28"


# torch_xla 2.9.0's wheel also ships a top-level `torchax` package (its own copy, version 0.0.6),
# which overwrites torchax 0.0.13's files when both install in one step: install the locked torchax
# again afterwards, so the version the lock names is the one that imports (tests/test_environment.py).
REINSTALL_AFTER = {"default": ("torchax",)}


# Prints the first installed file of a distribution that differs from its RECORD (another wheel
# overwrote it), nothing when all are intact. Exit status 0 either way: an overwritten file is the
# expected outcome after a fresh install, not a failed command.
_RECORD_CHECK = """
import base64, csv, hashlib, importlib.metadata, pathlib, sys
dist = importlib.metadata.distribution(sys.argv[1])
for row in csv.reader(dist.read_text("RECORD").splitlines()):
    if len(row) > 1 and row[1].startswith("sha256="):
        path = pathlib.Path(str(dist.locate_file(row[0])))
        data = path.read_bytes() if path.is_file() else b""
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        if digest != row[1].removeprefix("sha256="):
            print(row[0])
            break
"""


def overwritten_file(session: nox.Session, package: str, python: str | None = None) -> str:
    """The first file of `package` another wheel overwrote, or "" (also when nox skips installs,
    `-R`). python: the interpreter of an environment outside nox's (the dev session)."""
    if python is None:
        out = session.run_install("python", "-c", _RECORD_CHECK, package, silent=True, log=False)
    else:
        out = session.run(
            python, "-c", _RECORD_CHECK, package, silent=True, log=False, external=True
        )
    return (out or "").strip()


def install_lock(session: nox.Session, name: str) -> None:
    """Install one hash-locked requirements file (uv checks every hash)."""
    lock_file = str(LOCKS / f"{name}.txt")
    session.install("--require-hashes", "-r", lock_file)
    for package in REINSTALL_AFTER.get(name, ()):
        overwritten = overwritten_file(session, package)
        if overwritten:  # put the locked wheel's files back
            session.log(f"{package}: another wheel overwrote {overwritten}; reinstalling")
            session.install("--require-hashes", "--reinstall-package", package, "-r", lock_file)


# Editable install of xla_gpu_ops (its dependencies come from the lock): a .pth pointing at the
# source tree, no CMake run; the library is the one `nox -s build` put in xla_gpu_ops/_lib.
EDITABLE_ARGS = (
    "--no-deps",
    "--no-build-isolation",
    "-C",
    "wheel.cmake=false",
    "-C",
    "editable.mode=inplace",
    "-e",
    str(ROOT),
)


def kernel_sources() -> list[str]:
    """The C++/CUDA sources clang-format lays out (.clang-format)."""
    suffixes = {".h", ".cuh", ".cc", ".cu"}
    return sorted(str(p) for p in (ROOT / "kernels").rglob("*") if p.suffix in suffixes)


def install_package(session: nox.Session) -> None:
    session.install(*EDITABLE_ARGS)


def default_cuda_archs() -> str:
    """The arch list of every build (pyproject.toml's CMAKE_CUDA_ARCHITECTURES default)."""
    skbuild = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["scikit-build"]
    return skbuild["cmake"]["define"]["CMAKE_CUDA_ARCHITECTURES"]["default"]


def cuda_archs() -> str:
    return os.environ.get("XLA_GPU_OPS_CUDA_ARCHS") or default_cuda_archs()


def extra_cuda_flags() -> str:
    """XLA_GPU_OPS_CUDA_FLAGS: extra nvcc flags for a variant build, e.g. -lineinfo (a profiler's
    source view)."""
    return os.environ.get("XLA_GPU_OPS_CUDA_FLAGS", "").strip()


def cmake_build_dir() -> Path:
    """One build dir per arch list (and per compiler choice: CMake cannot switch inside one), and
    one per set of extra nvcc flags."""
    name = "sm_" + cuda_archs().replace(";", "-")
    if os.environ.get("XLA_GPU_OPS_NVCC"):
        name += "-system-nvcc"
    if extra_cuda_flags():
        name += "-flags-" + hashlib.sha256(extra_cuda_flags().encode()).hexdigest()[:8]
    return Path(os.environ.get("XLA_GPU_OPS_BUILD_ROOT") or ROOT / "build") / name


# The PEP 517 hook of pyproject.toml's backend, called in the build venv (no isolation: the
# toolchain is locks/build.txt, hash-checked) so that its CMake and Ninja output shows.
_BUILD_HOOK = """
import json, sys, tempfile
import scikit_build_core.build as backend
with tempfile.TemporaryDirectory() as wheel_dir:
    getattr(backend, sys.argv[1])(wheel_dir, config_settings=json.loads(sys.argv[2]))
"""


@nox.session(python=PYTHON)
def build(session: nox.Session) -> None:
    """Build libxla_gpu_ops.so into xla_gpu_ops/_lib: `pip install -e .`'s build, persistent dir.

    The same scikit-build-core + CMake build as `pip install .` (pyproject.toml,
    kernels/CMakeLists.txt), run with the toolchain of locks/build.txt; incremental: a second run
    with no change rebuilds nothing. Arch list: XLA_GPU_OPS_CUDA_ARCHS; compiler: XLA_GPU_OPS_NVCC
    (default: the CUDA 13 nvcc wheel). XLA_GPU_OPS_CUDA_FLAGS builds a variant in its own build
    dir and does not install it. Extra arguments are not read here: nox passes them to every
    session it runs, and they belong to the tests (`nox -s tests -- FILE`).
    """
    install_lock(session, "build")
    build_dir = cmake_build_dir()
    settings = {
        "build-dir": str(build_dir),
        "cmake.define.CMAKE_EXPORT_COMPILE_COMMANDS": "ON",  # for clangd in the dev container
    }
    if extra_cuda_flags():
        # only variants set it, so a CUDAFLAGS environment still reaches the default build
        settings["cmake.define.CMAKE_CUDA_FLAGS"] = extra_cuda_flags()
    session.chdir(ROOT)
    # A variant is built as a wheel (thrown away): only the editable build installs in place.
    hook = "build_wheel" if extra_cuda_flags() else "build_editable"
    session.run("python", "-c", _BUILD_HOOK, hook, json.dumps(settings))
    if extra_cuda_flags():  # a variant: the package keeps its library; point at this one instead
        session.log(f"variant library (XLA_GPU_OPS_LIBRARY): {build_dir / 'libxla_gpu_ops.so'}")


def run_pytest(session: nox.Session, *args: str) -> None:
    ARTIFACTS.mkdir(exist_ok=True)
    env = {"XLA_GPU_OPS_ARTIFACTS": str(ARTIFACTS), "XLA_GPU_OPS_BUILD_DIR": str(cmake_build_dir())}
    session.run("pytest", *args, *session.posargs, env=env)


@nox.session(python=PYTHON, requires=["build"])
def kernels(session: nox.Session) -> None:
    """Kernel correctness: host handlers on XLA:CPU here; GPU tests run on a GPU, skip elsewhere."""
    install_lock(session, "default")
    install_package(session)
    run_pytest(session, "-m", "kernels")


@nox.session(python=PYTHON, requires=["build"])
def hlo(session: nox.Session) -> None:
    """HLO/StableHLO dumps: the custom call is present, unfolded, and survives dynamo and export.

    Dumps land in artifacts/hlo/.
    """
    install_lock(session, "default")
    install_package(session)
    run_pytest(session, "-m", "hlo")


@nox.session(python=PYTHON, requires=["build"])
def tests(session: nox.Session) -> None:
    """The whole suite (GPU tests skip with a reason where there is no GPU)."""
    install_lock(session, "default")
    install_package(session)
    run_pytest(session)


@nox.session(python=PYTHON, requires=["build"], default=False)
def bench(session: nox.Session) -> None:
    """Benchmarks against peers; on a CPU-only machine a smoke run of the harness."""
    install_lock(session, "default")
    install_package(session)
    session.run("python", "-m", "benchmarks", *session.posargs)


@nox.session(python=PYTHON)
def lint(session: nox.Session) -> None:
    """ruff (check + format), clang-format over kernels/, mypy on the package, hadolint on the
    Dockerfile, compose and dev container schemas.

    Runs every check, then fails if any did, so one run shows all findings. The same checks run
    before each commit with pre-commit (.pre-commit-config.yaml, docs/ADDING_AN_OP.md).
    """
    install_lock(session, "lint")
    checks = {
        "ruff check": ["ruff", "check", "."],
        "ruff format": ["ruff", "format", "--check", "."],
        "clang-format": ["clang-format", "--dry-run", "-Werror", *kernel_sources()],
        "mypy": ["mypy"],
        "containers": ["python", str(ROOT / ".ci" / "lint_containers.py"), str(ROOT)],
    }
    failed = []
    for name, command in checks.items():
        try:
            session.run(*command)
        except nox.command.CommandFailed:
            failed.append(name)
    if failed:
        session.error(f"lint failed: {', '.join(failed)}")


@nox.session(python=PYTHON, requires=["build"], default=False, venv_backend="none")
def dev(session: nox.Session) -> None:
    """A dev shell on the host: .venv with the default stack, the package (editable), the library.

    Then `source .venv/bin/activate`: README's snippets, `python -m xla_gpu_ops hlo ...` and
    examples/xla_gpu_attention.py run there; `nox -s build` rebuilds the library it loads.
    """
    venv = ROOT / ".venv"
    python = venv / "bin" / "python"
    if not python.is_file():
        session.run("uv", "venv", "--python", PYTHON, str(venv), external=True)
    install = ("uv", "pip", "install", "--python", str(python))
    lock_file = str(LOCKS / "default.txt")
    session.run(*install, "--require-hashes", "-r", lock_file, external=True)
    for package in REINSTALL_AFTER["default"]:
        overwritten = overwritten_file(session, package, str(python))
        if overwritten:  # overwritten by torch_xla's copy: the locked files back
            session.log(f"{package}: another wheel overwrote {overwritten}; reinstalling")
            session.run(
                *install,
                "--require-hashes",
                "--reinstall-package",
                package,
                "-r",
                lock_file,
                external=True,
            )
    session.run(*install, *EDITABLE_ARGS, external=True)
    session.log(f"ready: source {venv.relative_to(ROOT)}/bin/activate")


@nox.session(python=PYTHON, default=False)
def docker(session: nox.Session) -> None:
    """Make a machine without an image registry ready for README's container commands.

    Installs docker.io and debootstrap when missing (apt-get, as root), starts dockerd when no
    daemon answers, adds Compose v2 (locks/compose.txt) as the docker CLI plugin when `docker
    compose` is missing, makes a local Debian 12 base image (XLA_GPU_OPS_BASE_IMAGE names another)
    and builds the images compose.yaml names; each step is skipped when its result is there
    (tools/prepare_docker.py). `nox -s docker -- --rebuild` builds every image again.
    """
    install_lock(session, "compose")
    session.run(
        "python",
        str(ROOT / "tools" / "prepare_docker.py"),
        "--compose",
        str(Path(session.bin) / "docker-compose"),
        *session.posargs,
    )


@nox.session(venv_backend="none", default=False)
def new_op(session: nox.Session) -> None:
    """Scaffold a new op: `nox -s new_op -- NAME` (docs/ADDING_AN_OP.md, tools/new_op.py).

    Writes kernels/ops/NAME/NAME.cu, NAME's entry in xla_gpu_ops/ops.py and its reference in
    xla_gpu_ops/reference.py: a working elementwise op on every route. `-- NAME --try` makes it
    in a throwaway copy instead, builds it there and runs its tests (CI does).
    """
    if not session.posargs:
        session.error("usage: nox -s new_op -- NAME [--try]")
    session.run(sys.executable, str(ROOT / "tools" / "new_op.py"), *session.posargs, external=True)


@nox.session(python=PYTHON, default=False)
def lock(session: nox.Session) -> None:
    """Regenerate every locks/*.txt (with hashes) from its locks/*.in.

    Existing pins are kept (uv prefers the versions already in the .txt); to move one, edit its
    .in or delete the .txt first.
    """
    install_lock(session, "bootstrap")  # uv itself, hash-checked
    session.chdir(ROOT)  # relative paths: the command in each lock's header stays the same
    for source in sorted(path.relative_to(ROOT) for path in LOCKS.glob("*.in")):
        session.run(
            "uv",
            "pip",
            "compile",
            "--quiet",
            "--generate-hashes",
            "--python-version",
            PYTHON,
            "--python-platform",
            LOCK_PLATFORM,
            str(source),
            "-o",
            str(source.with_suffix(".txt")),
        )


# ---------------------------------------------------------------------------------------------
# torch_xla on XLA:CUDA, the pinned legacy stack (docs/TORCH_XLA_GPU.md)
@nox.session(python=PYTHON, requires=["build"], default=False)
def xla_cuda(session: nox.Session) -> None:
    """torch_xla 2.7 + its CUDA PJRT plugin (locks/xla-cuda.txt): the xla_cuda and torch_xla tests.

    With `nox -s tests` (torch_xla 2.9, default lock) the same torch_xla tests cover both torch_xla
    versions. PJRT_DEVICE=CPU keeps the XLA:CPU tests on XLA:CPU on a GPU host (torch_xla 2.7
    would otherwise pick CUDA on its own); the GPU tests start their own process on the plugin.
    """
    install_lock(session, "xla-cuda")
    install_package(session)
    ARTIFACTS.mkdir(exist_ok=True)
    session.run(
        "pytest",
        "-m",
        "xla_cuda or torch_xla",
        *session.posargs,
        env={"XLA_GPU_OPS_ARTIFACTS": str(ARTIFACTS), "PJRT_DEVICE": "CPU"},
    )


if __name__ == "__main__":
    nox.main()
