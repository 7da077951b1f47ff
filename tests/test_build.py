"""The CMake build: incremental (a second build with no change does nothing) and self-contained."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from xla_gpu_ops import _library

ROOT = Path(__file__).parents[1]
pytestmark = pytest.mark.build


def build_dir() -> Path | None:
    """The build dir `nox -s build` just used (nox passes it); None outside nox."""
    path = os.environ.get("XLA_GPU_OPS_BUILD_DIR")
    return Path(path) if path else None


def ninja() -> str | None:
    """The ninja that made the build (CMAKE_MAKE_PROGRAM): another version hashes commands
    differently and would see every command line as changed."""
    directory = build_dir()
    cache = directory / "CMakeCache.txt" if directory else None
    if cache is None or not cache.is_file():
        return None
    found = re.search(r"^CMAKE_MAKE_PROGRAM:\w+=(.+)$", cache.read_text(), flags=re.MULTILINE)
    return found[1].strip() if found and Path(found[1].strip()).is_file() else None


@pytest.mark.skipif(build_dir() is None, reason="run through nox (it passes XLA_GPU_OPS_BUILD_DIR)")
@pytest.mark.skipif(
    ninja() is None, reason="no CMAKE_MAKE_PROGRAM in the build dir: run `nox -s build`"
)
def test_second_build_rebuilds_nothing():
    dry_run = subprocess.run(
        [ninja(), "-C", str(build_dir()), "-n", "-d", "explain"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
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
