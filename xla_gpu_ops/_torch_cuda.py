"""The CUDA kernel of each torch op torch.ops.xla_gpu.<op> (eager PyTorch on CUDA). Private: a
device kernel, not a front end; xla_gpu_ops._torch_library registers it for the CUDA dispatch key
and programs call the torch op. It runs the library's `launch` entry (c_api.h) on torch's current
stream, with torch-allocated results and scratch space.

The host path of a call decides the speed of small eager calls, so it is kept short: one pass
over the operands (device, layout, pointers), one dict lookup on the call's static key (shapes,
dtypes, attributes) that gives the XgoCall and the result specs the library described the first
time (its static checks then ran and raised, naming the argument, if anything was wrong), the
returned results' allocation (scratch results reuse a per-stream buffer) and one foreign call
that receives the buffer pointers packed into bytes. No host sync: metadata values
are never read here (the kernels guard them; `xla_gpu_ops.paged_attention(..., validate=True)`
checks them on request).

Layout: operands must be contiguous and 16-byte aligned (16-byte vector loads); other tensors are
copied to such ones first, which costs one device copy of that operand.
"""

from __future__ import annotations

import ctypes
import math
import operator
from typing import Any

import torch

from xla_gpu_ops import _library, ops
from xla_gpu_ops._torch import absent_operand, dtype_name, torch_dtype

# Static keys kept per op: a serving loop pads to a few shapes, a ragged eager caller may not; past
# this many the cache starts over (a miss costs one describe, tens of microseconds).
MAX_PLANS = 4096


def _dense(tensor: torch.Tensor) -> torch.Tensor:
    """Contiguous and 16-byte aligned."""
    if not tensor.is_contiguous():
        return tensor.contiguous()
    return tensor.clone() if tensor.data_ptr() % 16 else tensor


# Scratch results (those past op.returned: workspace the caller never sees) come from one buffer
# per device and stream, reused from call to call: a torch allocation costs a few microseconds of a
# small call's host time, and work on one stream runs in order, so a call's kernels start after
# the previous call's are done with the buffer. A buffer that grows is replaced; the old one stays
# referenced until the call that held it has enqueued its launch, and torch frees it in stream
# order (streams are told apart by handle, as torch's allocator does). Not while a CUDA graph is
# captured (the graph would keep the address; allocations then come from its pool), and not past
# this size (large calls do not notice an allocation).
MAX_CACHED_SCRATCH_BYTES = 16 << 20
_SCRATCH_ALIGN = 256
_scratch: dict[tuple[int, int], torch.Tensor] = {}


def _scratch_buffer(device: torch.device, stream: int, nbytes: int) -> torch.Tensor:
    """At least nbytes of device memory for scratch results, on `stream` (see above)."""
    if torch._C._cuda_isCurrentStreamCapturing():
        return torch.empty(nbytes, dtype=torch.uint8, device=device)
    key = (device.index, stream)
    buffer = _scratch.get(key)
    if buffer is None or buffer.numel() < nbytes:
        buffer = torch.empty(nbytes, dtype=torch.uint8, device=device)
        if nbytes <= MAX_CACHED_SCRATCH_BYTES:
            _scratch[key] = buffer
    return buffer


class _Plan:
    """What a call with one static key needs: its XgoCall, the returned results to allocate and
    the scratch results' offsets in one scratch buffer."""

    __slots__ = ("call", "call_address", "returned", "scratch_bytes", "scratch_offsets")

    def __init__(self, op: ops.Op, tensors: list[torch.Tensor], attrs: tuple):
        self.call, results = _library.describe_call(
            op,
            [t.shape for t in tensors],
            [dtype_name(t.dtype) for t in tensors],
            op.attrs_from(attrs),
        )
        self.call_address = ctypes.addressof(self.call)
        specs = [(spec.shape, torch_dtype(spec.dtype)) for spec in results]
        self.returned = specs[: op.returned]
        self.scratch_offsets = []
        offset = 0
        for shape, dtype in specs[op.returned :]:
            self.scratch_offsets.append(offset)
            nbytes = math.prod(shape) * dtype.itemsize
            offset += -(-nbytes // _SCRATCH_ALIGN) * _SCRATCH_ALIGN
        self.scratch_bytes = max(offset, 1)  # a buffer even when every scratch result is empty


def make_kernel(op: ops.Op, functional: bool = False):
    """The CUDA kernel of torch.ops.xla_gpu.<op> (arguments in schema order). functional: the
    kernel of <op>_functional, whose in-place results get buffers of their own (the library
    copies the operand into them first)."""
    num_operands = len(op.operands)
    num_required, num_attrs = op.num_required, len(op.attrs)
    optional = range(num_operands - num_required)
    # device -> the empty float32 tensor that stands for an optional operand left out (None)
    absent: dict[torch.device, torch.Tensor] = {}
    host_ok = tuple(i for i, o in enumerate(op.operands) if o.host_ok)
    pack = _library.pointer_packer(num_operands + len(op.results))
    plans: dict[tuple, _Plan] = {}
    # result index -> operand index: written in place
    aliases = {} if functional else dict(op.aliases)
    launch: Any = None  # the library's launch entry, resolved on first use
    pick = op.torch_result(functional)
    shape_of, dtype_of = operator.attrgetter("shape"), operator.attrgetter("dtype")

    def checked(tensors, device) -> list[torch.Tensor]:
        """The operands on `device`, contiguous and 16-byte aligned (copies where they are not,
        except for operands written in place or read in place), or ValueError naming the
        operand."""
        tensors = list(tensors)
        for i in host_ok:  # e.g. num_seqs kept on the host by a serving loop
            if tensors[i].device.type == "cpu" and device.type == "cuda":
                tensors[i] = tensors[i].to(device, non_blocking=True)
        for i, t in enumerate(tensors):
            if t.device != device:
                raise ValueError(
                    f"{op.name}: {op.operands[i].name}: on {t.device}, "
                    f"{op.operands[0].name} is on {device}"
                )
        for i, t in enumerate(tensors):
            if not t.is_contiguous() or t.data_ptr() % 16:
                if i in aliases.values():
                    raise ValueError(
                        f"{op.name}: {op.operands[i].name}: must be contiguous and 16-byte aligned "
                        "(it is updated in place)"
                    )
                if op.operands[i].in_place:
                    raise ValueError(
                        f"{op.name}: {op.operands[i].name}: strides {tuple(t.stride())} at offset "
                        f"{t.data_ptr() % 16} mod 16 bytes cannot be read in place; a copy per "
                        "call would move the whole cache. The kernels read a contiguous, 16-byte "
                        "aligned cache: [P, page_size, heads, D], or [P, heads, page_size, D] "
                        "with kv_layout='HND' (vLLM's cache.unbind(0) halves are such caches); "
                        "for FlashInfer's [P, 2, ...] cache, pass the whole tensor, not its halves"
                    )
                tensors[i] = _dense(t)
        return tensors

    def kernel(*args):
        nonlocal launch
        # schema order: required operands, attributes (trailing defaults may be left out),
        # optional operands
        tensors = args[:num_required]
        attrs = args[num_required : num_required + num_attrs]
        device = tensors[0].device
        if optional:
            given = args[num_required + num_attrs :]
            extra = []
            for i in optional:
                t = given[i] if i < len(given) else None
                if t is None:
                    t = absent.get(device)
                    if t is None:
                        t = absent[device] = absent_operand(device)
                extra.append(t)
            tensors = (*tensors, *extra)
        # One pass over the operands for the common case; anything else takes `checked`.
        pointers = []
        for t in tensors:
            pointer = t.data_ptr()
            if t.device != device or pointer % 16 or not t.is_contiguous():
                tensors = checked(tensors, device)
                pointers = [t.data_ptr() for t in tensors]
                break
            pointers.append(pointer)
        key = (attrs, *map(shape_of, tensors), *map(dtype_of, tensors))
        plan = plans.get(key)
        if plan is None:
            launch = _library.load().op(op).launch  # before the plan is visible to other threads
            if len(plans) >= MAX_PLANS:
                plans.clear()
            plan = plans[key] = _Plan(op, tensors, attrs)
        results = [
            tensors[aliases[j]] if j in aliases else torch.empty(shape, dtype=dtype, device=device)
            for j, (shape, dtype) in enumerate(plan.returned)
        ]
        if torch._C._cuda_getDevice() == device.index:
            enqueue(plan, device, pointers, results)
        else:
            with torch.cuda.device(device):
                enqueue(plan, device, pointers, results)
        return pick(results)

    def enqueue(plan: _Plan, device, pointers: list[int], results: list[torch.Tensor]) -> None:
        """One foreign call that enqueues the op on `device`'s current stream (device current)."""
        stream = torch._C._cuda_getCurrentRawStream(device.index)
        buffer = None  # the scratch buffer: referenced here until the op is enqueued
        scratch = []
        if plan.scratch_offsets:
            buffer = _scratch_buffer(device, stream, plan.scratch_bytes)
            scratch = [buffer.data_ptr() + offset for offset in plan.scratch_offsets]
        buffers = pack(*pointers, *[r.data_ptr() for r in results], *scratch)
        status = launch(plan.call_address, buffers, stream)
        if status:
            _library.load().raise_for_status(status)

    return kernel
