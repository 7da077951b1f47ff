"""The installed stack is the locked one: versions match locks/default.txt and files match RECORD;
JAX starts without an ERROR on a machine without a GPU."""

from __future__ import annotations

import base64
import csv
import hashlib
import importlib.metadata
import importlib.util
import logging
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

LOCK = Path(__file__).parents[1] / "locks" / "default.txt"
# Pure-Python front ends whose code we call into; cheap to hash file by file.
HASHED_DISTRIBUTIONS = ("torchax", "jax")


def locked_versions() -> dict[str, str]:
    pins = re.findall(r"^([A-Za-z0-9_.\-]+)==([^\s\\;]+)", LOCK.read_text(), flags=re.MULTILINE)
    return {re.sub(r"[-_.]+", "-", name).lower(): version for name, version in pins}


@pytest.mark.parametrize("name", ["torch", "torch-xla", "jax", "jaxlib", "torchax"])
def test_installed_version_is_locked(name):
    try:
        installed = importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        pytest.skip(f"{name} is not installed in this environment (not the default stack)")
    expected = locked_versions()[name]
    if installed.split("+")[0] != expected:
        pytest.skip(f"{name} {installed} is not the default stack's {expected} (another stack)")
    assert installed.split("+")[0] == expected


@pytest.mark.parametrize("name", HASHED_DISTRIBUTIONS)
def test_installed_files_match_record(name):
    """A wheel's files must hash to its RECORD: catches another wheel overwriting them (torch_xla
    2.9.0 ships its own `torchax` package; noxfile.REINSTALL_AFTER puts the locked one back)."""
    try:
        dist = importlib.metadata.distribution(name)
    except importlib.metadata.PackageNotFoundError:
        pytest.skip(f"{name} is not installed")
    record = dist.read_text("RECORD")
    assert record, f"{name} has no RECORD"
    mismatched = []
    for row in csv.reader(record.splitlines()):
        if len(row) < 2 or not row[1].startswith("sha256="):
            continue
        path = Path(str(dist.locate_file(row[0])))
        digest = base64.urlsafe_b64encode(hashlib.sha256(path.read_bytes()).digest())
        if digest.rstrip(b"=").decode() != row[1].removeprefix("sha256="):
            mismatched.append(row[0])
    assert not mismatched, f"{name}: files differ from the wheel's RECORD: {mismatched[:5]}"


def _jax_start_log(prefer_cpu: bool) -> subprocess.CompletedProcess[str]:
    """A fresh interpreter that starts JAX, with or without the entry points' platform default."""
    code = (
        "from xla_gpu_ops._platform import prefer_cpu_without_gpu; prefer_cpu_without_gpu()\n"
        if prefer_cpu
        else ""
    ) + "import jax; print('platform:', jax.devices()[0].platform)"
    env = {key: value for key, value in os.environ.items() if key != "JAX_PLATFORMS"}
    return subprocess.run(
        [sys.executable, "-c", code],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        cwd=Path(__file__).parents[1],
    )


@pytest.mark.skipif(importlib.util.find_spec("jax") is None, reason="needs jax")
def test_no_jax_error_line_on_a_machine_without_gpu():
    """The CLI and the example call prefer_cpu_without_gpu() first: on a machine without an NVIDIA
    GPU, JAX then starts on its CPU without the CUDA plugin's ERROR (cuInit failed)."""
    from xla_gpu_ops._platform import has_nvidia_gpu

    if has_nvidia_gpu():
        pytest.skip("an NVIDIA GPU is present: JAX uses it, nothing to quiet")
    if importlib.util.find_spec("jax_plugins.xla_cuda12") is None:
        pytest.skip("no JAX CUDA 12 plugin installed: no ERROR to quiet")
    plain = _jax_start_log(prefer_cpu=False)
    assert "ERROR" in plain.stderr, "the CUDA plugin no longer logs an ERROR here: drop the filter"
    quiet = _jax_start_log(prefer_cpu=True)
    assert quiet.returncode == 0, quiet.stderr
    assert "platform: cpu" in quiet.stdout
    assert "ERROR" not in quiet.stderr, quiet.stderr


# What a user runs on a machine without a GPU: JAX after `import xla_gpu_ops`, and an op of ours
# through JAX on XLA:CPU (the host handler).
QUIET_JAX_SCRIPTS = {
    "package-then-jax": """
        import os, xla_gpu_ops, jax
        jax.numpy.ones(3).block_until_ready()
        print("JAX_PLATFORMS:", os.environ.get("JAX_PLATFORMS"))
    """,
    "jax-front-end": """
        import xla_gpu_ops.jax, jax
        jax.numpy.ones(3).block_until_ready()
    """,
    "op-on-xla-cpu": """
        import functools, jax, numpy as np
        import xla_gpu_ops.jax as xjax
        from xla_gpu_ops import ops
        sample = ops.PAGED_ATTENTION.sample(False)
        out = jax.jit(functools.partial(xjax.paged_attention, scale=0.125))(**sample)
        assert np.isfinite(np.asarray(out.block_until_ready())).all()
        print("platform:", jax.devices()[0].platform)
    """,
}


@pytest.mark.skipif(importlib.util.find_spec("jax") is None, reason="needs jax")
@pytest.mark.parametrize("jax_platforms", [None, "cpu"], ids=["JAX_PLATFORMS-unset", "cpu"])
@pytest.mark.parametrize("script", QUIET_JAX_SCRIPTS)
def test_jax_after_import_prints_no_error_without_gpu(script, jax_platforms):
    """`import xla_gpu_ops` drops the CUDA plugin's start-up ERROR and traceback where there is
    no GPU (test_no_jax_error_line_on_a_machine_without_gpu shows plain JAX still prints it), and
    leaves JAX_PLATFORMS as the user set it."""
    from xla_gpu_ops._platform import has_nvidia_gpu

    if has_nvidia_gpu():
        pytest.skip("an NVIDIA GPU is present: JAX starts its CUDA plugin, nothing to quiet")
    env = {key: value for key, value in os.environ.items() if key != "JAX_PLATFORMS"}
    if jax_platforms is not None:
        env["JAX_PLATFORMS"] = jax_platforms
    code = "\n".join(line.strip() for line in QUIET_JAX_SCRIPTS[script].strip().splitlines())
    run = subprocess.run(
        [sys.executable, "-c", code],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        cwd=Path(__file__).parents[1],
    )
    assert run.returncode == 0, run.stdout + run.stderr
    output = run.stdout + run.stderr
    assert "ERROR" not in output, output
    assert "Traceback" not in output, output
    if script == "package-then-jax":
        assert f"JAX_PLATFORMS: {jax_platforms}" in run.stdout, "the import must not pick platforms"
    if script == "op-on-xla-cpu":
        assert "platform: cpu" in run.stdout


def _record(message: str, *args) -> logging.LogRecord:
    return logging.LogRecord(
        "jax._src.xla_bridge", logging.ERROR, "xla_bridge.py", 487, message, args, None
    )


def test_cuda_plugin_filter_drops_that_record_alone():
    from xla_gpu_ops._platform import _NoCudaPluginErrorWithoutGpu

    keep = _NoCudaPluginErrorWithoutGpu().filter
    plugin_error = "Jax plugin configuration error: Exception when calling %s.initialize()"
    assert not keep(_record(plugin_error, "jax_plugins.xla_cuda12"))
    assert not keep(_record(plugin_error, "jax_plugins.xla_cuda13"))
    assert keep(_record(plugin_error, "jax_plugins.xla_tpu"))
    assert keep(
        _record(
            "Jax plugin configuration error: Plugin module %s could not be loaded",
            "jax_plugins.xla_cuda12",
        )
    )
    assert keep(_record("Unable to initialize backend 'cpu'"))


def test_gpu_host_keeps_jax_plugin_errors(monkeypatch):
    """With a GPU a failing CUDA plugin is a real error: nothing is filtered."""
    from xla_gpu_ops import _platform

    logger = logging.getLogger("jax._src.xla_bridge")
    monkeypatch.setattr(logger, "filters", [])
    monkeypatch.setattr(_platform, "has_nvidia_gpu", lambda: True)
    _platform.quiet_cuda_plugin_without_gpu()
    assert logger.filters == []
    monkeypatch.setattr(_platform, "has_nvidia_gpu", lambda: False)
    _platform.quiet_cuda_plugin_without_gpu()
    _platform.quiet_cuda_plugin_without_gpu()
    assert len(logger.filters) == 1, "one filter, however often the package sets it"
