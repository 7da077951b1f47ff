"""torch.ops.xla_gpu.*: schema once, per-device kernels, a fake impl, and keyword wrappers.

CPU runs the pure-PyTorch reference (the test oracle), CUDA the C launcher on the current stream
(xla_gpu_ops.torch_cuda), XLA an XLA custom call (xla_gpu_ops.torch_xla), and the fake impl serves
torch.compile / torch.export. Importing this module needs torch only.
"""

from __future__ import annotations

import torch

from xla_gpu_ops import _validation, reference
from xla_gpu_ops._registry import PAGED_ATTENTION, SIMPLE_ADD

_METADATA_ARGS = ("context_lens", "block_tables", "query_start_loc", "num_seqs")
_ALL_ARGS = ("query", "kv_cache", *_METADATA_ARGS)


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def check_paged_attention_tensors(
    tensors: dict[str, torch.Tensor],
    scale: float,
    sliding_window: int | None,
    soft_cap: float | None,
) -> _validation.PagedAttentionDims:
    """Static checks on torch tensors (types, devices, shapes, dtypes, attributes); reads no data."""
    for name, value in tensors.items():
        if not isinstance(value, torch.Tensor):
            raise TypeError(
                f"paged_attention: {name}: expected a torch.Tensor, got {type(value).__name__}"
            )
    device_type = tensors["query"].device.type
    for name, value in tensors.items():
        if value.device.type != device_type and not (
            name == "num_seqs" and value.device.type == "cpu"
        ):
            raise ValueError(
                f"paged_attention: {name}: on device {value.device}, query is on {tensors['query'].device}"
            )
    return paged_attention_static_dims(tensors, scale, sliding_window, soft_cap)


def paged_attention_static_dims(
    tensors: dict[str, torch.Tensor],
    scale: float,
    sliding_window: int | None,
    soft_cap: float | None,
) -> _validation.PagedAttentionDims:
    """Shapes, dtypes and attributes of torch tensors through the shared checks; reads no data.

    Device rules differ per backend (CUDA, XLA) and stay with them; this part is the same.
    """
    return _validation.check_paged_attention_static(
        {name: tuple(t.shape) for name, t in tensors.items()},
        {name: dtype_name(t.dtype) for name, t in tensors.items()},
        scale,
        sliding_window,
        soft_cap,
    )


def check_paged_attention_metadata(
    dims: _validation.PagedAttentionDims, tensors: dict[str, torch.Tensor]
) -> None:
    """Value checks on the metadata; copies it to the host (a sync for device tensors)."""
    host = {name: tensors[name].detach().cpu().numpy() for name in _METADATA_ARGS}
    _validation.check_paged_attention_metadata(dims, **host)


# ---------------------------------------------------------------------------- simple_add
@torch.library.custom_op(SIMPLE_ADD.torch_qualname, mutates_args=(), device_types="cpu")
def simple_add_op(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    _validation.check_simple_add(a.shape, dtype_name(a.dtype), b.shape, dtype_name(b.dtype))
    return reference.simple_add(a, b)


@simple_add_op.register_fake
def _(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    _validation.check_simple_add(a.shape, dtype_name(a.dtype), b.shape, dtype_name(b.dtype))
    return torch.empty_like(a)


@simple_add_op.register_kernel("cuda")
def _(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    from xla_gpu_ops import torch_cuda

    return torch_cuda.simple_add_cuda(a, b)


@simple_add_op.register_kernel("xla")
def _(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    from xla_gpu_ops import torch_xla

    return torch_xla.simple_add_xla(a, b)


# ---------------------------------------------------------------------------- paged_attention
@torch.library.custom_op(PAGED_ATTENTION.torch_qualname, mutates_args=(), device_types="cpu")
def paged_attention_op(
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
    tensors = dict(
        zip(
            _ALL_ARGS,
            (query, kv_cache, context_lens, block_tables, query_start_loc, num_seqs),
            strict=True,
        )
    )
    dims = check_paged_attention_tensors(tensors, scale, sliding_window, soft_cap)
    check_paged_attention_metadata(dims, tensors)  # host tensors: no sync involved
    return reference.paged_attention(
        query, kv_cache, context_lens, block_tables, query_start_loc, num_seqs,
        scale, sliding_window, soft_cap,
    )  # fmt: skip


@paged_attention_op.register_fake
def _(query, kv_cache, context_lens, block_tables, query_start_loc, num_seqs, scale,
      sliding_window=None, soft_cap=None):  # fmt: skip
    tensors = dict(
        zip(
            _ALL_ARGS,
            (query, kv_cache, context_lens, block_tables, query_start_loc, num_seqs),
            strict=True,
        )
    )
    check_paged_attention_tensors(tensors, scale, sliding_window, soft_cap)
    return torch.empty_like(query)


@paged_attention_op.register_kernel("cuda")
def _(query, kv_cache, context_lens, block_tables, query_start_loc, num_seqs, scale,
      sliding_window=None, soft_cap=None):  # fmt: skip
    from xla_gpu_ops import torch_cuda

    return torch_cuda.paged_attention_cuda(
        query, kv_cache, context_lens, block_tables, query_start_loc, num_seqs,
        scale, sliding_window, soft_cap,
    )  # fmt: skip


@paged_attention_op.register_kernel("xla")
def _(query, kv_cache, context_lens, block_tables, query_start_loc, num_seqs, scale,
      sliding_window=None, soft_cap=None):  # fmt: skip
    from xla_gpu_ops import torch_xla

    return torch_xla.paged_attention_xla(
        query, kv_cache, context_lens, block_tables, query_start_loc, num_seqs,
        scale, sliding_window, soft_cap,
    )  # fmt: skip


# ---------------------------------------------------------------------------- wrappers
def simple_add(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a + b through the xla_gpu kernel of a's device (f32, f16, bf16; same shape and dtype)."""
    for name, value in (("a", a), ("b", b)):
        if not isinstance(value, torch.Tensor):
            raise TypeError(
                f"simple_add: {name}: expected a torch.Tensor, got {type(value).__name__}"
            )
    if a.device != b.device:
        raise ValueError(f"simple_add: b: on device {b.device}, a is on {a.device}")
    _validation.check_simple_add(a.shape, dtype_name(a.dtype), b.shape, dtype_name(b.dtype))
    return torch.ops.xla_gpu.simple_add(a, b)


def paged_attention(
    query: torch.Tensor,
    kv_cache: torch.Tensor,
    context_lens: torch.Tensor,
    block_tables: torch.Tensor,
    query_start_loc: torch.Tensor,
    num_seqs: torch.Tensor,
    *,
    scale: float,
    sliding_window: int | None = None,
    soft_cap: float | None = None,
    validate: bool = True,
) -> torch.Tensor:
    """Ragged paged attention (torch_xla ragged_paged_attention semantics; docs/DESIGN.md).

    Static checks always run (no sync). With `validate=True` the metadata values are checked on
    the host too — one device-to-host copy for CUDA tensors; pass `validate=False` in hot loops
    (the CUDA kernel then guards bad metadata with NaN rows). Skipped under torch.compile and on
    XLA devices, where reading values would force a sync or break the graph.
    """
    tensors = dict(
        zip(
            _ALL_ARGS,
            (query, kv_cache, context_lens, block_tables, query_start_loc, num_seqs),
            strict=True,
        )
    )
    dims = check_paged_attention_tensors(tensors, scale, sliding_window, soft_cap)
    if validate and query.device.type in ("cpu", "cuda") and not torch.compiler.is_compiling():
        check_paged_attention_metadata(dims, tensors)
    return torch.ops.xla_gpu.paged_attention(
        query, kv_cache, context_lens, block_tables, query_start_loc, num_seqs,
        float(scale), sliding_window, None if soft_cap is None else float(soft_cap),
    )  # fmt: skip
