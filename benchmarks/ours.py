"""Every call from the benchmarks into xla_gpu_ops, in one place.

The harness measures the package through these functions only, so a change of the package's
internals is followed here and nowhere else. Public API where it suffices; the launcher row of the
eager host-cost measurement is the one place that reaches below it on purpose.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


# ------------------------------------------------------------------------------ the library
def library_path() -> Path:
    from xla_gpu_ops import _library

    return _library.library_path()


def library_built() -> bool:
    from xla_gpu_ops import _library

    return _library.is_built()


def library_abi_version() -> int:
    from xla_gpu_ops import _library

    return int(_library.load().cdll.xla_gpu_ops_abi_version())


def force_prefill_kernel(kernel: str) -> None:
    """The library's test hook: "sm90" or "mma" forces that prefill kernel in this process
    (sm90 only where the device has it), "auto" gives the choice back to the launcher."""
    from xla_gpu_ops import _library

    _library.load().cdll.xgo_debug_force_prefill_kernel({"auto": -1, "mma": 0, "sm90": 1}[kernel])


def sm90_prefill_available() -> bool:
    """Whether this device runs the sm_90a prefill kernel of this library."""
    from xla_gpu_ops import _library

    return _library.load().cdll.xgo_debug_sm90_prefill_available() == 1


# ------------------------------------------------------------------------------ torch
def op_paged_attention(
    query,
    kv_cache,
    context_lens,
    block_tables,
    query_start_loc,
    num_seqs,
    *,
    scale: float,
    sliding_window=None,
    k_scale=None,
    v_scale=None,
    sinks=None,
    k_scales=None,
    v_scales=None,
    value_cache=None,
    kv_layout="NHD",
):
    """torch.ops.xla_gpu.paged_attention: the registered op (CPU reference, CUDA kernel);
    k_scales / v_scales: the scale tensors (probe scales); value_cache: V in a cache of its own,
    kv_cache then holds K, and kv_layout (probe layouts)."""
    import torch

    import xla_gpu_ops  # noqa: F401  (registers torch.ops.xla_gpu.*)

    args = [
        query,
        kv_cache,
        context_lens,
        block_tables,
        query_start_loc,
        num_seqs,
        scale,
        sliding_window,
    ]
    if k_scale is not None or v_scale is not None:  # else the call the host-cost row times
        args += [None, k_scale, v_scale]  # soft_cap, k_scale, v_scale
    tensors = (
        {}
        if k_scales is None and v_scales is None
        else {"k_scales": k_scales, "v_scales": v_scales}
    )
    if value_cache is not None:
        tensors["value_cache"] = value_cache
    if kv_layout != "NHD":
        tensors["kv_layout"] = kv_layout
    return torch.ops.xla_gpu.paged_attention(*args, sinks=sinks, **tensors)[0]


def op_simple_add(a, b):
    import torch

    import xla_gpu_ops  # noqa: F401

    return torch.ops.xla_gpu.simple_add(a, b)


def wrapper_paged_attention(
    query, kv_cache, context_lens, block_tables, query_start_loc, num_seqs, *, scale: float
):
    """xla_gpu_ops.paged_attention with its default arguments (what a user calls first)."""
    import xla_gpu_ops

    return xla_gpu_ops.paged_attention(
        query, kv_cache, context_lens, block_tables, query_start_loc, num_seqs, scale=scale
    )


def launcher_paged_attention(
    query, kv_cache, context_lens, block_tables, query_start_loc, num_seqs, *, scale: float
):
    """The CUDA kernel function alone (what torch.library dispatches to), without the dispatcher
    above it."""
    return _cuda_kernel()(
        query, kv_cache, context_lens, block_tables, query_start_loc, num_seqs, scale
    )


_KERNELS: dict = {}


def _cuda_kernel():
    if "paged_attention" not in _KERNELS:
        from xla_gpu_ops import _torch_cuda, ops

        _KERNELS["paged_attention"] = _torch_cuda.make_kernel(ops.PAGED_ATTENTION)
    return _KERNELS["paged_attention"]


# ------------------------------------------------------------------------------ JAX, torchax
def jax_paged_attention(
    query,
    kv_cache,
    context_lens,
    block_tables,
    query_start_loc,
    num_seqs,
    *,
    scale: float,
    sliding_window=None,
    k_scale=None,
    v_scale=None,
    sinks=None,
) -> Any:
    from xla_gpu_ops import jax as xgo_jax

    return xgo_jax.paged_attention(
        query,
        kv_cache,
        context_lens,
        block_tables,
        query_start_loc,
        num_seqs,
        scale=scale,
        sliding_window=sliding_window,
        k_scale=k_scale,
        v_scale=v_scale,
        sinks=sinks,
    )


def jax_simple_add(a, b) -> Any:
    from xla_gpu_ops import jax as xgo_jax

    return xgo_jax.simple_add(a, b)


def torchax_register() -> None:
    """Register the torchax lowerings of torch.ops.xla_gpu.* (idempotent)."""
    from xla_gpu_ops import torchax as xgo_torchax

    xgo_torchax.register()


# ------------------------------------------------------------------------------ reference
def reference_paged_attention(
    query,
    kv_cache,
    context_lens,
    block_tables,
    query_start_loc,
    num_seqs,
    *,
    scale: float,
    compute_dtype=None,
    sliding_window=None,
    k_scale=None,
    v_scale=None,
    sinks=None,
):
    from xla_gpu_ops import reference

    kwargs = {} if compute_dtype is None else {"compute_dtype": compute_dtype}
    return reference.paged_attention(
        query,
        kv_cache,
        context_lens,
        block_tables,
        query_start_loc,
        num_seqs,
        scale,
        sliding_window=sliding_window,
        k_scale=k_scale,
        v_scale=v_scale,
        sinks=sinks,
        **kwargs,
    )


def reference_simple_add(a, b):
    from xla_gpu_ops import reference

    return reference.simple_add(a, b)
