"""torch.ops.xla_gpu.*: every op of the table (xla_gpu_ops.ops) defined once with torch.library,
with per-device kernels, a fake kernel, and the public keyword wrappers.

Kernels: CPU runs the pure-PyTorch reference (the test oracle) after the library's static and
value checks; CUDA the library's launch on the current stream (torch_cuda); XLA an XLA custom call
or its composite (torch_xla); the fake kernel serves torch.compile / torch.export. The ops are
registered below the Python `custom_op` layers (torch.library.Library.impl): eager calls pay for
one dispatch and the kernel, nothing else. Importing this module needs torch only.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from typing import Any

import torch

from xla_gpu_ops import _library, ops, reference, torch_cuda, torch_xla
from xla_gpu_ops.torch_cuda import dtype_name

VALIDATE_ENV = "XLA_GPU_OPS_VALIDATE"
# What the public wrappers do when `validate` is None: XLA_GPU_OPS_VALIDATE=1 (read at import)
# makes them check metadata values by default.
VALIDATE_DEFAULT = os.environ.get(VALIDATE_ENV, "") not in ("", "0")

_LIBRARY = torch.library.Library(ops.NAMESPACE, "DEF")


def _static_checks(op: ops.Op, operands: list[torch.Tensor], attrs: dict[str, Any]):
    """The library's static checks (TypeError / ValueError naming the argument) and its XgoCall;
    None when a shape is symbolic (torch.compile with dynamic shapes: checked at run time)."""
    shapes = [tuple(t.shape) for t in operands]
    if not all(isinstance(d, int) for shape in shapes for d in shape):
        op.encode_attrs(attrs)
        return None
    call, _ = _library.describe_call(op, shapes, [dtype_name(t.dtype) for t in operands], attrs)
    return call


def _check_host_values(op: ops.Op, operands: list[torch.Tensor], attrs: dict[str, Any]) -> None:
    """The library's value checks (e.g. metadata in range) on host tensors."""
    call = _static_checks(op, operands, attrs)
    if call is None:
        return
    host = [
        t.contiguous() if operand.values_checked else None
        for operand, t in zip(op.operands, operands, strict=True)
    ]
    _library.check_host_values(op, call, [None if t is None else t.data_ptr() for t in host])


def check_values(op: ops.Op, operands: list[torch.Tensor], attrs: dict[str, Any]) -> None:
    """The wrapper's optional validation: the library's value checks on host copies of the
    operands it reads (a device-to-host copy, one sync, for device tensors)."""
    host = [
        t.detach().to("cpu") if operand.values_checked else t
        for operand, t in zip(op.operands, operands, strict=True)
    ]
    _check_host_values(op, host, attrs)


def _define(op: ops.Op) -> None:
    _LIBRARY.define(op.name + op.schema())

    def cpu_kernel(*args):
        operands, attrs = op.split_schema_args(args)
        for i in op.aliases.values():
            if not operands[i].is_contiguous():
                raise ValueError(
                    f"{op.name}: {op.operands[i].name}: must be contiguous (it is updated in place)"
                )
        _check_host_values(op, operands, attrs)  # host tensors: no sync involved
        return getattr(reference, op.name)(*operands, **attrs)  # in place for mutating ops

    def fake_kernel(*args):
        operands, attrs = op.split_schema_args(args)
        _static_checks(op, operands, attrs)
        by_name = dict(zip(op.operand_names, operands, strict=True))
        results = [torch.empty_like(by_name[name]) for name in op.result_like]
        if not results:
            return None
        return results[0] if len(results) == 1 else tuple(results)

    _LIBRARY.impl(op.name, cpu_kernel, "CPU")
    _LIBRARY.impl(op.name, torch_cuda.make_kernel(op), "CUDA")
    _LIBRARY.impl(op.name, torch_xla.make_kernel(op), "XLA")
    torch.library.register_fake(op.qualname, fake_kernel, lib=_LIBRARY)
    if op.aliases:
        _define_functional(op)
        _LIBRARY.impl(op.name, _functionalize_kernel(op), "Functionalize")


def _define_functional(op: ops.Op) -> None:
    """<op>_functional: the same op returning its in-place results as new tensors. Graphs that
    must stay functional (torch_xla, torch.compile, torch.export) record it in place of <op>."""
    name = op.functional_name
    _LIBRARY.define(name + op.functional_schema())
    written = tuple(op.aliases.values())

    def cpu_kernel(*args):
        operands, attrs = op.split_schema_args(args)
        operands = [t.clone() if i in written else t for i, t in enumerate(operands)]
        _check_host_values(op, operands, attrs)
        getattr(reference, op.name)(*operands, **attrs)
        outs = [operands[op.aliases[j]] for j in range(op.returned)]
        return outs[0] if op.returned == 1 else tuple(outs)

    def fake_kernel(*args):
        operands, attrs = op.split_schema_args(args)
        _static_checks(op, operands, attrs)
        outs = [torch.empty_like(operands[op.aliases[j]]) for j in range(op.returned)]
        return outs[0] if op.returned == 1 else tuple(outs)

    _LIBRARY.impl(name, cpu_kernel, "CPU")
    _LIBRARY.impl(name, torch_cuda.make_kernel(op, functional=True), "CUDA")
    _LIBRARY.impl(name, torch_xla.make_kernel(op, functional=True), "XLA")
    torch.library.register_fake(f"{ops.NAMESPACE}::{name}", fake_kernel, lib=_LIBRARY)


def _functionalize_kernel(op: ops.Op):
    """Functionalization of an op that writes an operand in place (torch_xla runs every op
    through it; torch.compile, torch.export and torch.func.functionalize too): <op>_functional
    computes the operand's new value, which becomes the functional tensor's value, so graphs
    stay functional and hold the custom op."""
    hide = torch._C._ExcludeDispatchKeyGuard
    functional = getattr(getattr(torch.ops, ops.NAMESPACE), op.functional_name).default
    pick = op.torch_result()

    def kernel(*args):
        operands, attrs = op.split_schema_args(args)
        inner = []
        for t in operands:
            if torch._is_functional_tensor(t):
                torch._sync(t)
                t = torch._from_functional_tensor(t)
            inner.append(t)
        with hide(torch._C.DispatchKeySet(torch._C.DispatchKey.Functionalize)):
            outs = functional(*inner, *[attrs[name] for name in op.attr_names])
        outs = list(outs) if isinstance(outs, tuple) else [outs]
        for result, operand in op.aliases.items():
            torch._functionalize_replace(operands[operand], outs[result])
            torch._functionalize_commit_update(operands[operand])
        # in-place results became the operands' values above; the rest are returned, wrapped
        return pick(
            [o if i in op.aliases else torch._to_functional_tensor(o) for i, o in enumerate(outs)]
        )

    return kernel


for _op in ops.OPS:
    _define(_op)


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
                and all(isinstance(t, torch.Tensor) for t in operands)
                and operands[0].device.type in ("cpu", "cuda")
            ):
                check_values(op, operands, attrs)
            try:
                return overload(*operands, *[attrs[name] for name in op.attr_names])
            except RuntimeError:
                # The dispatcher's schema check ("Expected a value of type 'Tensor' for argument
                # 'query' ..."): the same as a TypeError / ValueError naming the argument, without
                # the dump. Only on this error path, so a good call pays nothing for it.
                for i, value in enumerate(operands):
                    if not isinstance(value, torch.Tensor):
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
    scales k_scale (logits * k_scale) and v_scale (out * v_scale), None: 1.

    Static checks (shapes, dtypes, attributes) always run and never sync. validate=True (or
    XLA_GPU_OPS_VALIDATE=1 at import, when validate is None) also checks the metadata values on
    the host: one device-to-host copy for CUDA tensors. Without it the CUDA kernels guard bad metadata
    with NaN rows, never out-of-bounds reads. Skipped under torch.compile and on XLA devices.
    """
