"""Shared fixtures. Artefacts (dumps, logs) go under $XLA_GPU_OPS_ARTIFACTS (default: artifacts/)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

# Set in the fresh interpreter a `dynamo` test reruns in (pytest_pyfunc_call below).
FRESH_ENV = "XLA_GPU_OPS_FRESH_DYNAMO"


def artifacts_root() -> Path:
    return Path(os.environ.get("XLA_GPU_OPS_ARTIFACTS", "artifacts"))


@pytest.fixture
def artifacts_dir(request: pytest.FixtureRequest) -> Path:
    """A folder for this test's artefacts: $XLA_GPU_OPS_ARTIFACTS/<test module>/<test name>."""
    module = request.node.module.__name__.rsplit(".", 1)[-1].removeprefix("test_")
    name = "".join(c if c.isalnum() or c in "-_." else "_" for c in request.node.name)
    path = artifacts_root() / module / name
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    """A test marked `dynamo` (torch.compile in this process) runs in a fresh interpreter when
    torchax is already imported here: torchax renames torch's PrivateUse1 backend to "jax", and
    dynamo on torch 2.11 with CUDA then fails reading that accelerator's stream, whatever the
    function (under pytest-xdist, which tests a worker ran first is chance). The test passes or
    fails as it does there."""
    if (
        pyfuncitem.get_closest_marker("dynamo") is None
        or "torchax" not in sys.modules
        or os.environ.get(FRESH_ENV)
    ):
        return None
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", pyfuncitem.nodeid]
    result = subprocess.run(
        command,
        cwd=pyfuncitem.config.rootpath,
        env={**os.environ, FRESH_ENV: "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=900,
        check=False,
    )
    if result.returncode != 0 or " passed" not in result.stdout:
        pytest.fail(f"in a fresh interpreter (torchax imported here):\n{result.stdout[-4000:]}")
    return True
