"""Eager PyTorch on CUDA: the `cuda` kernels of torch.ops.xla_gpu.* call the C launchers of
libxla_gpu_ops.so through ctypes, on torch's current stream, with torch-allocated outputs and
workspace. No host sync: metadata values are never read here (the kernel guards them).

Layout: inputs must be contiguous; non-contiguous (or not 16-byte aligned) tensors are copied to
contiguous ones first, which costs one extra device copy of that input.
"""

from __future__ import annotations

import ctypes

import torch

from xla_gpu_ops import _library, _validation
from xla_gpu_ops._registry import PAGED_ATTENTION, SIMPLE_ADD
from xla_gpu_ops.torch_ops import dtype_name, paged_attention_static_dims

_PAGED_ARGS = ("query", "kv_cache", "context_lens", "block_tables", "query_start_loc", "num_seqs")


def _dense(tensor: torch.Tensor) -> torch.Tensor:
    """Contiguous and 16-byte aligned (the kernels use 16-byte vector loads)."""
    if not tensor.is_contiguous() or tensor.data_ptr() % 16:
        tensor = tensor.contiguous() if not tensor.is_contiguous() else tensor.clone()
    return tensor


def _check_cuda(op: str, tensors: dict[str, torch.Tensor]) -> torch.device:
    device = None
    for name, tensor in tensors.items():
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"{op}: {name}: expected a torch.Tensor, got {type(tensor).__name__}")
        if tensor.device.type != "cuda":
            raise ValueError(f"{op}: {name}: must be a CUDA tensor, got device {tensor.device}")
        if device is None:
            device = tensor.device
        elif tensor.device != device:
            raise ValueError(f"{op}: {name}: on {tensor.device}, the other inputs are on {device}")
    return device


def _stream(device: torch.device) -> ctypes.c_void_p:
    return ctypes.c_void_p(torch.cuda.current_stream(device).cuda_stream)


def simple_add_cuda(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a + b on the GPU (f32, f16, bf16; same shape and dtype; any size)."""
    device = _check_cuda("simple_add", {"a": a, "b": b})
    _validation.check_simple_add(a.shape, dtype_name(a.dtype), b.shape, dtype_name(b.dtype))
    a, b = a.contiguous(), b.contiguous()
    out = torch.empty_like(a, memory_format=torch.contiguous_format)
    config = _library.simple_add_config(dtype_name(a.dtype), a.numel())
    lib = _library.load()
    with torch.cuda.device(device):
        status = getattr(lib, SIMPLE_ADD.launch_symbol)(
            ctypes.byref(config),
            ctypes.c_void_p(a.data_ptr()),
            ctypes.c_void_p(b.data_ptr()),
            ctypes.c_void_p(out.data_ptr()),
            _stream(device),
        )
    _library.check_status(status, "simple_add")
    return out


def paged_attention_cuda(
    query: torch.Tensor,
    kv_cache: torch.Tensor,
    context_lens: torch.Tensor,
    block_tables: torch.Tensor,
    query_start_loc: torch.Tensor,
    num_seqs: torch.Tensor,
    scale: float,
    sliding_window: int | None = None,
    soft_cap: float | None = None,
) -> torch.Tensor:
    """Ragged paged attention on the GPU (docs/DESIGN.md). Static checks only; no sync.

    num_seqs may live on the CPU (torch_ops allows it): it is copied to the query's device, since
    the kernel reads it there.
    """
    if (
        isinstance(num_seqs, torch.Tensor)
        and num_seqs.device.type == "cpu"
        and isinstance(query, torch.Tensor)
        and query.device.type == "cuda"
    ):
        num_seqs = num_seqs.to(query.device)
    tensors = dict(
        zip(_PAGED_ARGS, (query, kv_cache, context_lens, block_tables, query_start_loc, num_seqs),
            strict=True)
    )  # fmt: skip
    device = _check_cuda("paged_attention", tensors)
    dims = paged_attention_static_dims(tensors, scale, sliding_window, soft_cap)
    tensors = {name: _dense(t) for name, t in tensors.items()}
    config = _library.paged_attention_config(
        dims, dtype_name(query.dtype), scale, sliding_window, soft_cap
    )
    workspace_elems = _library.paged_attention_workspace_elems(config)
    out = torch.empty(query.shape, dtype=query.dtype, device=device)
    workspace = torch.empty(workspace_elems, dtype=torch.float32, device=device)
    lib = _library.load()
    with torch.cuda.device(device):
        status = getattr(lib, PAGED_ATTENTION.launch_symbol)(
            ctypes.byref(config),
            *(ctypes.c_void_p(tensors[name].data_ptr()) for name in _PAGED_ARGS),
            ctypes.c_void_p(out.data_ptr()),
            ctypes.c_void_p(workspace.data_ptr()),
            ctypes.c_int64(workspace_elems),
            _stream(device),
        )
    _library.check_status(status, "paged_attention")
    return out
