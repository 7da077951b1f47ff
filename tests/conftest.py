"""Shared fixtures. Artefacts (dumps, logs) go under $XLA_GPU_OPS_ARTIFACTS (default: artifacts/)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest


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
