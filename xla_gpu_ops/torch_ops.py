"""The torch front end: the public keyword wrappers (`xla_gpu_ops.paged_attention`, ...) of the
torch ops torch.ops.xla_gpu.*, which work on every device the ops have a kernel for.

The torch ops themselves (schema, per-device kernels, fake kernel) are defined by
xla_gpu_ops._torch_library, which this module imports. Importing this module needs torch only.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable

import torch

from xla_gpu_ops import ops
from xla_gpu_ops._torch_library import check_values

VALIDATE_ENV = "XLA_GPU_OPS_VALIDATE"
# What the public wrappers do when `validate` is None: XLA_GPU_OPS_VALIDATE=1 (read at import)
# makes them check metadata values by default.
VALIDATE_DEFAULT = os.environ.get(VALIDATE_ENV, "") not in ("", "0")


def wrapper(op: ops.Op) -> Callable[[Callable], Callable]:
    """Turns a hand-written declaration (signature + docstring) into the public wrapper: its
    signature is checked against the table at import, and calls forward to torch.ops.xla_gpu.<op>
    with the table's argument binding; `validate` adds the library's value checks."""
    overload = getattr(getattr(torch.ops, ops.NAMESPACE), op.name).default

    def decorate(declared: Callable) -> Callable:
        ops.public_signature(op, extra=("validate",))(declared)

        @functools.wraps(declared)
        def forward(*args, validate: bool | None = None, **kwargs):
            operands, attrs = op.bind(args, kwargs)
            for name, value in attrs.items():  # the dispatcher would .item() a tensor: a sync
                if isinstance(value, torch.Tensor):
                    raise TypeError(
                        f"{op.name}: {name}: must be a static Python number, got a tensor"
                    )
            # Reading values would sync a GPU, or break a graph under torch.compile / on XLA.
            if (
                (VALIDATE_DEFAULT if validate is None else validate)
                and not torch.compiler.is_compiling()
                and all(isinstance(t, torch.Tensor) for t in operands[: op.num_required])
                and operands[0].device.type in ("cpu", "cuda")
            ):
                check_values(op, operands, attrs)
            try:
                return overload(*op.schema_args(operands, attrs))
            except RuntimeError:
                # The dispatcher's schema check ("Expected a value of type 'Tensor' for argument
                # 'query' ..."): the same as a TypeError / ValueError naming the argument, without
                # the dump. Only on this error path, so a good call pays nothing for it.
                for i, value in enumerate(operands):
                    if not isinstance(value, torch.Tensor) and (
                        i < op.num_required or value is not None
                    ):
                        raise TypeError(
                            f"{op.name}: {op.operands[i].name}: expected a torch.Tensor, "
                            f"got {type(value).__name__}"
                        ) from None
                op.encode_attrs(attrs)  # raises, naming the attribute, if one is out of range
                raise

        return forward

    return decorate


@wrapper(ops.KV_CACHE_UPDATE)
def kv_cache_update(
    new_kv: torch.Tensor,
    slot_mapping: torch.Tensor,
    kv_cache: torch.Tensor,
    *,
    k_scale: float | None = None,
    v_scale: float | None = None,
    validate: bool | None = None,
) -> None:
    """Writes new K/V rows into the paged cache in place (vLLM's reshape_and_cache_flash slots).

    new_kv [N, 2*Hkv, D] (float32, float16 or bfloat16; K at even, V at odd heads, the layout of
    a cache row); slot_mapping int32/int64 [N]: token n goes to page slot // page_size, row
    slot % page_size, and a negative slot is padding (skipped); kv_cache [P, page_size, 2*Hkv, D]
    in new_kv's dtype or float8_e4m3fn, contiguous, updated in place (no copy). K is stored
    divided by k_scale and V by v_scale (None: 1), rounded to the cache dtype; an fp8 cache
    saturates at +-448, so paged_attention(..., k_scale=, v_scale=) reads it back.

    A slot >= P * page_size is never written: the CUDA kernel skips it; validate=True (or
    XLA_GPU_OPS_VALIDATE=1) raises instead, naming the token (one device-to-host copy of
    slot_mapping on CUDA). The CPU path always raises.
    """


@wrapper(ops.SIMPLE_ADD)
def simple_add(a: torch.Tensor, b: torch.Tensor, *, validate: bool | None = None) -> torch.Tensor:
    """a + b through the xla_gpu kernel of a's device (float32, float16 or bfloat16; same shape
    and dtype), rounded once to the input dtype. `validate` has nothing to check here."""


@wrapper(ops.PAGED_ATTENTION)
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
    k_scale: float | None = None,
    v_scale: float | None = None,
    sinks: torch.Tensor | None = None,
    validate: bool | None = None,
) -> torch.Tensor:
    """Ragged paged attention, torch_xla `ragged_paged_attention` semantics (docs/DESIGN.md).

    query [T, Hq, D] (float32, float16 or bfloat16); kv_cache [P, page_size, 2*Hkv, D], K at even
    and V at odd combined heads; context_lens int32 [S]; block_tables int32 [S, pages_per_seq];
    query_start_loc int32 [S + 1]; num_seqs int32 [1] (may stay on the host). Returns out
    [T, Hq, D]; rows at or past query_start_loc[num_seqs] are zero.

    scale multiplies the logits; sliding_window (None: off) masks keys older than that many
    positions; soft_cap (None: off) maps logits to soft_cap * tanh(logits / soft_cap). kv_cache
    may be float8_e4m3fn (on CUDA with a float16 or bfloat16 query) with the dequantisation
    scales k_scale (logits * k_scale) and v_scale (out * v_scale), None: 1. sinks: float32 [Hq]
    on query's device, or None: one logit per query head that joins each row's softmax and adds
    no value (gpt-oss attention sinks; not scaled, not capped).

    Static checks (shapes, dtypes, attributes) always run and never sync. validate=True (or
    XLA_GPU_OPS_VALIDATE=1 at import, when validate is None) also checks the metadata values on
    the host: one device-to-host copy for CUDA tensors. Without it the CUDA kernels guard bad metadata
    with NaN rows, never out-of-bounds reads. Skipped under torch.compile and on XLA devices.
    """
