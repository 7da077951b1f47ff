"""The build: incremental (a second build with no change does nothing), self-contained, and the
same one `pip install .` runs (its wheel ships the library where the package loads it)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import tomllib
import zipfile
from pathlib import Path

import pytest

from xla_gpu_ops import _library

ROOT = Path(__file__).parents[1]
pytestmark = pytest.mark.build


def build_dir() -> Path | None:
    """The build dir `nox -s build` just used (nox passes it); None outside nox."""
    path = os.environ.get("XLA_GPU_OPS_BUILD_DIR")
    return Path(path) if path else None


def cached_program(variable: str) -> str | None:
    """A program the build dir's CMakeCache.txt names, if it still exists."""
    directory = build_dir()
    cache = directory / "CMakeCache.txt" if directory else None
    if cache is None or not cache.is_file():
        return None
    found = re.search(rf"^{variable}:\w+=(.+)$", cache.read_text(), flags=re.MULTILINE)
    return found[1].strip() if found and Path(found[1].strip()).is_file() else None


def ninja() -> str | None:
    """The ninja that made the build (CMAKE_MAKE_PROGRAM): another version hashes commands
    differently and would see every command line as changed."""
    return cached_program("CMAKE_MAKE_PROGRAM")


def locked_pins(lock: Path) -> dict[str, str]:
    pins = re.findall(r"^([A-Za-z0-9_.\-]+)==([^\s\\;]+)", lock.read_text(), flags=re.MULTILINE)
    return {re.sub(r"[-_.]+", "-", name).lower(): version for name, version in pins}


@pytest.mark.skipif(build_dir() is None, reason="run through nox (it passes XLA_GPU_OPS_BUILD_DIR)")
@pytest.mark.skipif(
    ninja() is None, reason="no CMAKE_MAKE_PROGRAM in the build dir: run `nox -s build`"
)
def test_second_build_rebuilds_nothing():
    dry_run = subprocess.run(
        [ninja(), "-C", str(build_dir()), "-n", "-d", "explain"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "no work to do" in dry_run.stdout, dry_run.stdout + dry_run.stderr


@pytest.mark.skipif(not _library.is_built(), reason="library not built: run `nox -s build`")
def test_library_needs_no_cuda_or_framework_libraries():
    """Static cudart and no libtorch: the .so links only the C/C++ runtime (any framework loads it)."""
    ldd = subprocess.run(["ldd", str(_library.library_path())], capture_output=True, text=True)
    needed = {line.split()[0] for line in ldd.stdout.splitlines() if "=>" in line}
    assert needed <= {"libstdc++.so.6", "libgcc_s.so.1", "libc.so.6", "libm.so.6", "libdl.so.2"}, (
        needed
    )
    lib = _library.load()  # also checks its op table against xla_gpu_ops.ops
    for name, entry in lib.ops.items():
        for handler in ("cuda_ffi", "host_ffi", "cuda_legacy"):
            assert getattr(entry.info, f"{handler}_handler"), f"{name}: no {handler} handler"


def test_pip_build_requirements_are_the_build_lock():
    """`pip install .` fetches the compiler and FFI headers pyproject.toml names (build.requires,
    also with a named system nvcc): the same versions as `nox -s build`'s locks/build.txt."""
    skbuild = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["scikit-build"]
    locked = locked_pins(ROOT / "locks" / "build.txt")
    requirement_lists = [skbuild["build"]["requires"]]
    requirement_lists += [o["build"]["requires"] for o in skbuild["overrides"] if "build" in o]
    for requirements in requirement_lists:
        for requirement in requirements:
            name, version = requirement.split("==")
            assert locked.get(re.sub(r"[-_.]+", "-", name).lower()) == version, requirement
    assert any("nvidia-cuda-nvcc" in r for r in requirement_lists[0])


@pytest.mark.skipif(build_dir() is None, reason="run through nox (it passes XLA_GPU_OPS_BUILD_DIR)")
@pytest.mark.skipif(
    cached_program("Python3_EXECUTABLE") is None,
    reason="no build venv in the build dir's cache: run `nox -s build`",
)
def test_pip_wheel_ships_the_library(tmp_path):
    """The wheel of `pip install .` (same backend and build dir, so nothing recompiles) holds the
    library at xla_gpu_ops/_lib/libxla_gpu_ops.so, the path the package loads."""
    hook = (
        "import json, sys, scikit_build_core.build as b; "
        "b.build_wheel(sys.argv[1], config_settings=json.loads(sys.argv[2]))"
    )
    settings = {"build-dir": str(build_dir()), "cmake.define.CMAKE_EXPORT_COMPILE_COMMANDS": "ON"}
    built = subprocess.run(
        [cached_program("Python3_EXECUTABLE"), "-c", hook, str(tmp_path), json.dumps(settings)],
        cwd=ROOT,
        check=False,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert built.returncode == 0, built.stdout + built.stderr
    assert "Building CUDA object" not in built.stdout, "the wheel build recompiled the kernels"
    (wheel,) = tmp_path.glob("xla_gpu_ops-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        library = archive.read("xla_gpu_ops/_lib/libxla_gpu_ops.so")
    assert library[:4] == b"\x7fELF"
    assert library == _library.library_path().read_bytes() or "XLA_GPU_OPS_LIBRARY" in os.environ
    assert {"xla_gpu_ops/__init__.py", "xla_gpu_ops/_library.py"} <= names
