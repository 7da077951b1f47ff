"""Eager PyTorch on CUDA: the `CUDA` kernels of torch.ops.xla_gpu.* run the library's `launch`
entry (c_api.h) on torch's current stream, with torch-allocated results and scratch space.

The host path of a call decides the speed of small eager calls, so it is kept short: one dict
lookup on the call's static key (shapes, dtypes, attributes) gives the XgoCall and the result
specs the library described the first time (its static checks then ran and raised, naming the
argument, if anything was wrong); after that a call is device checks, result allocation and one
foreign call that receives the buffer pointers packed into bytes. No host sync: metadata values
are never read here (the kernels guard them; `xla_gpu_ops.paged_attention(..., validate=True)`
checks them on request).

Layout: operands must be contiguous and 16-byte aligned (16-byte vector loads); other tensors are
copied to such ones first, which costs one device copy of that operand.
"""

from __future__ import annotations

import ctypes

import torch

from xla_gpu_ops import _library, ops

# Static keys kept per op: a serving loop pads to a few shapes, a ragged eager caller may not; past
# this many the cache starts over (a miss costs one describe, tens of microseconds).
MAX_PLANS = 4096


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def torch_dtype(name: str) -> torch.dtype:
    """The torch dtype of a name from the library's dtype list (it uses torch's names)."""
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise TypeError(f"the library's dtype {name!r} has no torch dtype of that name")
    return dtype


def _dense(tensor: torch.Tensor) -> torch.Tensor:
    """Contiguous and 16-byte aligned."""
    if not tensor.is_contiguous():
        return tensor.contiguous()
    return tensor.clone() if tensor.data_ptr() % 16 else tensor


class _Plan:
    """What a call with one static key needs: its XgoCall and the results to allocate."""

    __slots__ = ("call", "call_address", "results")

    def __init__(self, op: ops.Op, tensors: list[torch.Tensor], attrs: tuple):
        self.call, results = _library.describe_call(
            op, [t.shape for t in tensors], [dtype_name(t.dtype) for t in tensors],
            op.split_schema_args([*tensors, *attrs])[1],
        )  # fmt: skip
        self.call_address = ctypes.addressof(self.call)
        self.results = [(spec.shape, torch_dtype(spec.dtype)) for spec in results]


def make_kernel(op: ops.Op, functional: bool = False):
    """The CUDA kernel of torch.ops.xla_gpu.<op> (arguments in schema order). functional: the
    kernel of <op>_functional, whose in-place results get buffers of their own (the library
    copies the operand into them first)."""
    num_operands = len(op.operands)
    host_ok = tuple(i for i, o in enumerate(op.operands) if o.host_ok)
    pack = _library.pointer_packer(num_operands + len(op.results))
    plans: dict[tuple, _Plan] = {}
    # result index -> operand index: written in place
    aliases = {} if functional else dict(op.aliases)
    launch = None  # the library's launch entry, resolved on first use
    pick = op.torch_result(functional)

    def kernel(*args):
        nonlocal launch
        tensors = list(args[:num_operands])
        attrs = args[num_operands:]
        device = tensors[0].device
        for i in host_ok:  # e.g. num_seqs kept on the host by a serving loop
            if tensors[i].device.type == "cpu" and device.type == "cuda":
                tensors[i] = tensors[i].to(device, non_blocking=True)
        for i, t in enumerate(tensors):
            if t.device != device:
                raise ValueError(
                    f"{op.name}: {op.operands[i].name}: on {t.device}, "
                    f"{op.operands[0].name} is on {device}"
                )
        key = (attrs, *[t.shape for t in tensors], *[t.dtype for t in tensors])
        plan = plans.get(key)
        if plan is None:
            launch = _library.load().op(op).launch  # before the plan is visible to other threads
            if len(plans) >= MAX_PLANS:
                plans.clear()
            plan = plans[key] = _Plan(op, tensors, attrs)
        for i, t in enumerate(tensors):
            if not t.is_contiguous() or t.data_ptr() % 16:
                if i in aliases.values():
                    raise ValueError(
                        f"{op.name}: {op.operands[i].name}: must be contiguous and 16-byte aligned "
                        "(it is updated in place)"
                    )
                tensors[i] = _dense(t)
        results = [
            tensors[aliases[j]] if j in aliases else torch.empty(shape, dtype=dtype, device=device)
            for j, (shape, dtype) in enumerate(plan.results)
        ]
        buffers = pack(*[t.data_ptr() for t in tensors], *[r.data_ptr() for r in results])
        index = device.index
        if torch._C._cuda_getDevice() == index:
            status = launch(plan.call_address, buffers, torch._C._cuda_getCurrentRawStream(index))
        else:
            with torch.cuda.device(device):
                stream = torch._C._cuda_getCurrentRawStream(index)
                status = launch(plan.call_address, buffers, stream)
        if status:
            _library.load().raise_for_status(status)
        return pick(results)

    return kernel
