"""torch_xla SPMD: paged attention and KV cache writes sharded by KV head, with manual sharding
around the call.

    import torch_xla.runtime as xr, torch_xla.distributed.spmd as xs
    xr.use_spmd()
    mesh = xs.Mesh(np.arange(n), (n,), ("heads",))
    out = xla_gpu_ops.torch_xla_sharding.paged_attention(q, kv, ..., mesh=mesh, scale=0.125)

Each operand is marked with its partition spec (query `(None, axis, None)`, kv_cache
`(None, None, axis, None)`, the rest replicated) and switched to manual sharding
(`xs.enable_manual_sharding`: XLA's SPMDFullToShardShape), so the op sees one device's heads and
the partitioner leaves it alone; the output goes back to an SPMD tensor sharded
`(None, axis, None)` (`xs.disable_manual_sharding`). What runs per device is
`torch.ops.xla_gpu.<op>` on XLA tensors: the custom call, or the composite where no handler of
ours can run (XLA:CPU; xla_gpu_ops.torch_xla). Without manual sharding, GSPMD treats the custom
call as opaque and gathers every sharded operand in front of it. Rules and errors:
xla_gpu_ops.head_sharding; docs/SHARDING.md.

Importing this module needs torch only; torch_xla is imported when a function runs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

import xla_gpu_ops._torch_library  # noqa: F401  (defines torch.ops.xla_gpu.*)
from xla_gpu_ops import head_sharding, ops
from xla_gpu_ops._torch import absent_operand
from xla_gpu_ops.head_sharding import DEFAULT_AXIS

__all__ = ["DEFAULT_AXIS", "call", "kv_cache_update", "paged_attention", "partition_specs"]

Axis = str | tuple[str, ...]


def partition_specs(op: ops.Op | str = ops.PAGED_ATTENTION, axis: Axis = DEFAULT_AXIS):
    """(operand specs, result specs) as torch_xla partition-spec tuples."""
    op = ops.get(op)
    ranks = op.returned_ranks()
    return (
        head_sharding.partition_entries(op, axis),
        head_sharding.result_entries(op, ranks, axis),
    )


def _mesh_shape(mesh: Any) -> dict[str, int]:
    import torch_xla.distributed.spmd as xs

    if not isinstance(mesh, xs.Mesh):
        raise TypeError(
            f"mesh: must be a torch_xla.distributed.spmd.Mesh, got {type(mesh).__name__}"
        )
    if mesh.axis_names is None:
        raise ValueError("mesh: has no axis names; name its axes, e.g. ('heads',)")
    return dict(zip(mesh.axis_names, mesh.mesh_shape, strict=True))


def call(
    op: ops.Op | str,
    operands: Sequence[torch.Tensor],
    attrs: Mapping[str, Any],
    *,
    mesh: Any,
    axis: Axis = DEFAULT_AXIS,
) -> torch.Tensor | tuple[torch.Tensor, ...] | None:
    """`torch.ops.xla_gpu.<op>` on XLA tensors, per device on its heads (manual sharding); returns
    what the torch op returns (an operand written in place is updated, sharded as it was)."""
    import torch_xla.distributed.spmd as xs
    import torch_xla.runtime as xr

    op = ops.get(op)
    if not xr.is_spmd():
        raise RuntimeError(
            f"{op.name}: sharding needs torch_xla's SPMD mode: call torch_xla.runtime.use_spmd() "
            "before creating XLA tensors"
        )
    if not isinstance(axis, str):
        axis = tuple(axis)
    try:
        size = head_sharding.axis_size(_mesh_shape(mesh), axis)
    except ValueError as error:
        raise ValueError(f"{op.name}: {error}") from None
    operands = op.complete(operands)
    device = operands[0].device
    for i, operand in enumerate(op.operands):
        if operands[i] is None:  # an optional operand left out: [0], which the library ignores
            operands[i] = absent_operand(device)
        # e.g. num_seqs may live on the host: it has to be an XLA tensor to be marked
        if operand.host_ok and operands[i].device.type == "cpu":
            operands[i] = operands[i].to(device)
        if operands[i].device.type != "xla":
            raise ValueError(
                f"{op.name}: {operand.name}: on device {operands[i].device}, needs an XLA device"
            )
    head_sharding.check_split(
        op, [tuple(t.shape) for t in operands], size, head_sharding.axis_text(axis)
    )
    head_sharding.check_layout(op, attrs)
    in_specs, out_specs = partition_specs(op, axis)
    # an absent optional operand is the [0] stand-in, replicated whatever the operand's rank
    in_specs = [
        spec if t.dim() == len(spec) else (None,)
        for t, spec in zip(operands, in_specs, strict=True)
    ]
    local = [
        xs.enable_manual_sharding(t, spec, mesh=mesh).global_tensor
        for t, spec in zip(operands, in_specs, strict=True)
    ]
    # An op that writes in place runs as its functional twin on the local shards; its result
    # then goes back into the caller's operand, as the torch op would have written it.
    name = op.functional_name if op.aliases else op.name
    outs = getattr(getattr(torch.ops, ops.NAMESPACE), name)(*op.schema_args(local, attrs))
    outs = (outs,) if op.returned == 1 else tuple(outs)
    full_shapes = [
        operands[op.operand_names.index(spec.operand)].shape[: spec.rank]
        for spec in op.returned_specs
    ]
    results = tuple(
        xs.disable_manual_sharding(out, spec, shape, mesh=mesh).global_tensor
        for out, spec, shape in zip(outs, out_specs, full_shapes, strict=True)
    )
    for result, index in op.given_writes(operands):
        operands[index].copy_(results[result])
    return op.torch_result()(results)


def paged_attention(
    *args: Any, mesh: Any, axis: Axis = DEFAULT_AXIS, return_lse: bool = False, **kwargs
) -> Any:
    """torch.ops.xla_gpu.paged_attention on XLA tensors in SPMD mode, query heads and KV heads
    split over `axis` of `mesh` (an xs.Mesh with named axes). Same operands and attributes
    (positional or by name; attributes by name). Returns out [T, Hq, D] sharded
    `(None, axis, None)` (with return_lse, and lse [T, Hq] sharded `(None, axis)`). ValueError
    naming kv_cache when Hkv is smaller than or not divisible by the devices on `axis`."""
    op = ops.PAGED_ATTENTION
    operands, attrs = op.bind(args, kwargs)
    return op.public_returns((return_lse,))(call(op, operands, attrs, mesh=mesh, axis=axis))


def kv_cache_update(*args: Any, mesh: Any, axis: Axis = DEFAULT_AXIS, **kwargs) -> None:
    """torch.ops.xla_gpu.kv_cache_update on XLA tensors in SPMD mode, in place: new_kv
    `(None, axis, None)` and kv_cache `(None, None, axis, None)` split by their combined heads,
    slot_mapping replicated; each device writes its own K/V heads. Same operands, attributes and
    errors as `paged_attention`."""
    op = ops.KV_CACHE_UPDATE
    operands, attrs = op.bind(args, kwargs)
    call(op, operands, attrs, mesh=mesh, axis=axis)
