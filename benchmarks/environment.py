"""Where a run happened: commit, library build, versions, GPU, driver (a run's "env")."""

from __future__ import annotations

import datetime as dt
import os
import platform
import re
import subprocess
from pathlib import Path

from benchmarks import ours

ROOT = Path(__file__).resolve().parent.parent


def prepare_process(on_gpu: bool) -> None:
    """Environment every benchmark process sets before jax is imported."""
    # JAX must not grab 75% of the GPU up front: torch allocates the inputs it shares through
    # DLPack.
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    if not on_gpu:
        os.environ.setdefault("JAX_PLATFORMS", "cpu")


def git_commit() -> str:
    """XLA_GPU_OPS_GIT_COMMIT when set (a copy of the working tree without .git, e.g. on a GPU
    host), else HEAD (+dirty) of the checkout."""
    given = os.environ.get("XLA_GPU_OPS_GIT_COMMIT")
    if given:
        return given
    if not (ROOT / ".git").exists():
        return "unknown (no .git; set XLA_GPU_OPS_GIT_COMMIT)"
    try:
        out = subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        )
        dirty = subprocess.run(
            [
                "git",
                "-C",
                str(ROOT),
                "status",
                "--porcelain",
                "--",
                "kernels",
                "xla_gpu_ops",
                "benchmarks",
            ],
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
        return out.stdout.strip() + ("+dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def library_info() -> dict | None:
    """Which build of libxla_gpu_ops.so ran: path, size, mtime, sha256, ABI version, and the
    CUDA architectures its fatbinary holds (cuobjdump, where available)."""
    import hashlib

    try:
        path = ours.library_path()
    except Exception as error:
        return {"error": f"xla_gpu_ops does not import: {error}"}
    if not path.is_file():
        return None
    data = path.read_bytes()
    info = {
        "path": str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path),
        "bytes": len(data),
        "mtime_utc": dt.datetime.fromtimestamp(path.stat().st_mtime, dt.UTC).strftime(
            "%Y-%m-%dT%H:%M:%SZ"
        ),
        "sha256": hashlib.sha256(data).hexdigest(),
    }
    try:
        info["abi_version"] = ours.library_abi_version()
    except Exception as error:  # a CPU-only box still loads it; say why if not
        info["abi_version"] = f"not loadable: {error}"
    try:
        listing = subprocess.run(
            ["cuobjdump", "--list-elf", str(path)], capture_output=True, text=True, timeout=30
        ).stdout
        archs = sorted(set(re.findall(r"sm_\d+[a-z]?", listing)))
        if archs:
            info["cuda_archs"] = archs
    except (OSError, subprocess.SubprocessError):
        pass
    return info


def package_version(module: str) -> str | None:
    try:
        from importlib.metadata import version

        return version(module)
    except Exception:
        return None


def collect_env(on_gpu: bool) -> dict:
    import torch

    env = {
        "date_utc": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "git_commit": git_commit(),
        "python": platform.python_version(),
        "host": platform.node(),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "jax": package_version("jax"),
        "jaxlib": package_version("jaxlib"),
        "jax_cuda_plugin": package_version("jax-cuda13-plugin")
        or package_version("jax-cuda12-plugin"),
        "triton": package_version("triton"),
        "torchax": package_version("torchax"),
        "flashinfer": package_version("flashinfer-python"),
        "library": library_info(),
        "gpu": None,
    }
    if on_gpu:
        props = torch.cuda.get_device_properties(0)
        env["gpu"] = {
            "name": props.name,
            "memory_gb": round(props.total_memory / 1e9, 1),
            "sm_count": props.multi_processor_count,
            "capability": f"{props.major}.{props.minor}",
            "l2_bytes": getattr(props, "L2_cache_size", None),
        }
        try:
            fields = (
                "driver_version",
                "clocks.max.sm",
                "clocks.max.mem",
                "power.limit",
                "persistence_mode",
                "compute_mode",
            )
            smi = subprocess.run(
                ["nvidia-smi", f"--query-gpu={','.join(fields)}", "--format=csv,noheader"],
                capture_output=True,
                text=True,
                timeout=20,
            ).stdout.strip()
            # max clocks, not current ones: at query time the GPU idles (345 MHz read as if
            # it were the clock the run used)
            values = [v.strip() for v in smi.splitlines()[0].split(",")] if smi else []
            env["nvidia_smi"] = dict(zip(fields, values, strict=False))
            env["driver"] = values[0] if values else None
        except (OSError, subprocess.SubprocessError) as error:
            env["driver"] = f"unknown ({error})"
    else:
        env["cpu"] = platform.processor() or platform.machine()
    return env


def device_slug(env: dict) -> str:
    name = env["gpu"]["name"] if env.get("gpu") else "cpu-smoke"
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def run_name(env: dict) -> str:
    """<date>-<device>-<commit>: the name of a run's folder."""
    commit = re.sub(r"[^0-9a-f]", "", str(env.get("git_commit", "")).split("+")[0])[:7] or "unknown"
    return f"{env['date_utc'][:10]}-{device_slug(env)}-{commit}"
