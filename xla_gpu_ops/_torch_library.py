"""torch.ops.xla_gpu.*: every op of the table (xla_gpu_ops.ops) defined once with torch.library,
with its per-device kernels, a fake kernel and functionalization. Private: the torch op itself,
shared by the front ends that call or lower it (xla_gpu_ops.torch_ops, the public wrappers;
xla_gpu_ops.torchax; xla_gpu_ops.torch_xla_sharding); importing it defines the ops.

This is the one place that gathers the device kernels of a torch op: CPU runs the pure-PyTorch
reference (xla_gpu_ops.reference, the test oracle) after the library's static and value checks;
CUDA the library's launch on the current stream (xla_gpu_ops._torch_cuda); XLA an XLA custom call
or its composite (xla_gpu_ops.torch_xla); the fake kernel serves torch.compile / torch.export. The
ops are registered below the Python `custom_op` layers (torch.library.Library.impl): eager calls
pay for one dispatch and the kernel, nothing else. Importing this module needs torch only.
"""

from __future__ import annotations

from typing import Any

import torch

from xla_gpu_ops import _library, _torch_cuda, ops, reference, torch_xla
from xla_gpu_ops._torch import dtype_name

_LIBRARY = torch.library.Library(ops.NAMESPACE, "DEF")


def _static_checks(op: ops.Op, operands: list[torch.Tensor | None], attrs: dict[str, Any]):
    """The library's static checks (TypeError / ValueError naming the argument) and its XgoCall;
    None when a shape is symbolic (torch.compile with dynamic shapes: checked at run time). An
    optional operand left out (None) is described as what the library gets for it, float32 [0]."""
    shapes = [(0,) if t is None else tuple(t.shape) for t in operands]
    if not all(isinstance(d, int) for shape in shapes for d in shape):
        op.encode_attrs(attrs)
        return None
    dtypes = [ops.ABSENT_DTYPE if t is None else dtype_name(t.dtype) for t in operands]
    call, _ = _library.describe_call(op, shapes, dtypes, attrs)
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
    """The public wrappers' optional validation: the library's value checks on host copies of the
    operands it reads (a device-to-host copy, one sync, for device tensors)."""
    host = [
        t.detach().to("cpu") if operand.values_checked else t
        for operand, t in zip(op.operands, operands, strict=True)
    ]
    _check_host_values(op, host, attrs)


def _define(op: ops.Op) -> None:
    _LIBRARY.define(op.name + op.schema())
    reference_of_op = reference.of(op)

    def cpu_kernel(*args):
        operands, attrs = op.split_schema_args(args)
        for i in op.aliases.values():
            if operands[i] is not None and not operands[i].is_contiguous():
                raise ValueError(
                    f"{op.name}: {op.operands[i].name}: must be contiguous (it is updated in place)"
                )
        _check_host_values(op, operands, attrs)  # host tensors: no sync involved
        required, optional = op.split_optional(operands)
        # in place for mutating ops
        return reference_of_op(*required, **attrs, **optional)

    def fake_kernel(*args):
        operands, attrs = op.split_schema_args(args)
        _static_checks(op, operands, attrs)
        by_name = dict(zip(op.operand_names, operands, strict=True))
        results = []
        for i, spec in enumerate(op.returned_specs):
            if i in op.aliases:
                continue  # written in place: the torch op does not return it
            like = by_name[spec.operand]
            dtype = like.dtype if spec.dtype is None else getattr(torch, spec.dtype)
            results.append(like.new_empty(like.shape[: spec.rank], dtype=dtype))
        if not results:
            return None
        return results[0] if len(results) == 1 else tuple(results)

    _LIBRARY.impl(op.name, cpu_kernel, "CPU")
    _LIBRARY.impl(op.name, _torch_cuda.make_kernel(op), "CUDA")
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
    reference_of_op = reference.of(op)
    written = tuple(op.aliases.values())

    def results(operands, make):
        """make(operand) per in-place result; an optional operand left out gets the empty
        float32 [0] that stands for it (what the library returns there)."""
        outs = [
            operands[0].new_empty((0,), dtype=getattr(torch, ops.ABSENT_DTYPE))
            if operands[op.aliases[j]] is None
            else make(operands[op.aliases[j]])
            for j in range(op.returned)
        ]
        return outs[0] if op.returned == 1 else tuple(outs)

    def cpu_kernel(*args):
        operands, attrs = op.split_schema_args(args)
        operands = [
            t.clone() if i in written and t is not None else t for i, t in enumerate(operands)
        ]
        _check_host_values(op, operands, attrs)
        required, optional = op.split_optional(operands)
        reference_of_op(*required, **attrs, **optional)
        return results(operands, lambda t: t)

    def fake_kernel(*args):
        operands, attrs = op.split_schema_args(args)
        _static_checks(op, operands, attrs)
        return results(operands, torch.empty_like)

    _LIBRARY.impl(name, cpu_kernel, "CPU")
    _LIBRARY.impl(name, _torch_cuda.make_kernel(op, functional=True), "CUDA")
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
            if t is not None and torch._is_functional_tensor(t):
                torch._sync(t)
                t = torch._from_functional_tensor(t)
            inner.append(t)
        with hide(torch._C.DispatchKeySet(torch._C.DispatchKey.Functionalize)):
            outs = functional(*op.schema_args(inner, attrs))
        outs = list(outs) if isinstance(outs, tuple) else [outs]
        for result, operand in op.given_writes(operands):
            torch._functionalize_replace(operands[operand], outs[result])
            torch._functionalize_commit_update(operands[operand])
        # in-place results became the operands' values above; the rest are returned, wrapped
        return pick(
            [o if i in op.aliases else torch._to_functional_tensor(o) for i, o in enumerate(outs)]
        )

    return kernel


for _op in ops.OPS:
    _define(_op)
