"""Paged attention and KV cache writes sharded by KV head over several devices (JAX, and torchax
through it).

`jax.ffi.ffi_call` has no sharding rule: under `jax.jit` with sharded inputs XLA gathers every
operand onto every device before the custom call. Two ways around it, both with query heads and
KV heads split together on one mesh axis (rules and checks: `xla_gpu_ops.head_sharding`):

- `paged_attention(..., mesh=mesh, axis="heads")`: the call under `jax.shard_map`; query
  `P(None, axis, None)`, kv_cache `P(None, None, axis, None)`, every other operand `P()`
  (replicated), output `P(None, axis, None)`. Each device runs the op on its own heads; there is
  no collective. Inputs that arrive with another sharding are moved first (put them with
  `input_shardings` to avoid that).
- `partitioned_paged_attention(...)`: the call wrapped in `custom_partitioning` with a Shardy
  sharding rule, so a plain `jax.jit` partitions it by the shardings its inputs carry: the head
  axis of kv_cache (else of the query) is kept, everything else is replicated.

A head axis with more devices than KV heads, or a KV head count it does not divide, raises
ValueError naming kv_cache (KV heads are never replicated); under plain jit the partitioner raises
it while compiling and jax reports it as a runtime error (XlaRuntimeError, or JaxRuntimeError
in later jax) carrying that message. Attributes (`scale`, ... and any the
op table adds) pass through unchanged; `torchax_paged_attention` is the same call for a PyTorch
program under torchax. `kv_cache_update`, `partitioned_kv_cache_update` and
`torchax_kv_cache_update` split the cache write the same way (new_kv by its combined heads), so
a serving step's write and attention stay on each device's heads. docs/SHARDING.md.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from xla_gpu_ops import _jax_ffi, head_sharding, ops
from xla_gpu_ops.head_sharding import DEFAULT_AXIS

__all__ = [
    "DEFAULT_AXIS",
    "input_shardings",
    "kv_cache_update",
    "output_shardings",
    "paged_attention",
    "partitioned_call",
    "partitioned_kv_cache_update",
    "partitioned_paged_attention",
    "shard_map_call",
    "torchax_kv_cache_update",
    "torchax_paged_attention",
]

Axis = str | tuple[str, ...]


def _entry(axis: Axis) -> Axis:
    return axis if isinstance(axis, str) else tuple(axis)


def input_specs(op: ops.Op, axis: Axis = DEFAULT_AXIS) -> list[PartitionSpec]:
    """Partition spec of each operand (table order): heads split on `axis`, the rest replicated."""
    return [PartitionSpec(*e) for e in head_sharding.partition_entries(op, _entry(axis))]


def output_specs(op: ops.Op, axis: Axis = DEFAULT_AXIS) -> list[PartitionSpec]:
    """Partition spec of each returned result."""
    ranks = op.returned_ranks()
    return [PartitionSpec(*e) for e in head_sharding.result_entries(op, ranks, _entry(axis))]


def input_shardings(mesh: Mesh, axis: Axis = DEFAULT_AXIS, op: ops.Op | str = ops.PAGED_ATTENTION):
    """NamedSharding of each operand, to `jax.device_put` inputs where the call wants them."""
    return [NamedSharding(mesh, spec) for spec in input_specs(ops.get(op), axis)]


def output_shardings(mesh: Mesh, axis: Axis = DEFAULT_AXIS, op: ops.Op | str = ops.PAGED_ATTENTION):
    return [NamedSharding(mesh, spec) for spec in output_specs(ops.get(op), axis)]


def _check_mesh(op: ops.Op, operands: Sequence[Any], mesh: Any, axis: Axis) -> int:
    if not isinstance(mesh, Mesh):
        raise TypeError(f"{op.name}: mesh: must be a jax.sharding.Mesh, got {type(mesh).__name__}")
    if not isinstance(axis, str) and not (
        isinstance(axis, tuple) and axis and all(isinstance(a, str) for a in axis)
    ):
        raise TypeError(
            f"{op.name}: axis: must be a mesh axis name or a tuple of them, got {axis!r}"
        )
    try:
        size = head_sharding.axis_size(dict(mesh.shape), axis)
    except ValueError as error:
        raise ValueError(f"{op.name}: {error}") from None
    head_sharding.check_split(
        op, [np.shape(x) for x in operands], size, head_sharding.axis_text(axis)
    )
    return size


# ---------------------------------------------------------------------------- shard_map
def shard_map_call(
    op: ops.Op,
    operands: Sequence[Any],
    attrs: Mapping[str, Any],
    *,
    mesh: Mesh,
    axis: Axis = DEFAULT_AXIS,
    abi: str = "ffi",
):
    """`xla_gpu_ops.jax.call(op, ...)` run under `jax.shard_map` with heads split on `axis`."""
    op = ops.get(op)
    operands = op.complete(operands)
    head_sharding.check_layout(op, attrs)
    _check_mesh(op, _jax_ffi.present(operands), mesh, axis)
    # a result written into an optional operand left out is each shard's [0] stand-in: split
    # (still [0]; a replicated one would need a replication check shard_map cannot make)
    outs = [
        PartitionSpec(_entry(axis)) if operands[op.aliases.get(j, 0)] is None else spec
        for j, spec in enumerate(output_specs(op, axis))
    ]
    attrs = dict(attrs)
    # An optional operand left out stays out of the map: each shard's call makes its own empty
    # stand-in inside the body (_jax_ffi.present). An empty array entering the map (split, or as a
    # program of its own in an eager map) crashed XLA's GPU compiler on two GPUs (jax 0.11.2): the
    # map is jitted.
    given = [x is not None for x in operands]

    def local(*shards):
        it = iter(shards)
        return _jax_ffi.call(op, [next(it) if g else None for g in given], attrs, abi)

    mapped = jax.shard_map(
        local,
        mesh=mesh,
        in_specs=tuple(spec for spec, g in zip(input_specs(op, axis), given, strict=True) if g),
        out_specs=outs[0] if op.returned == 1 else tuple(outs),
    )
    return jax.jit(mapped)(*[x for x in operands if x is not None])


def paged_attention(
    *args: Any,
    mesh: Mesh,
    axis: Axis = DEFAULT_AXIS,
    abi: str = "ffi",
    return_lse: bool = False,
    **kwargs,
):
    """`xla_gpu_ops.jax.paged_attention` with query heads and KV heads split over `axis` of
    `mesh` (a name or a tuple of names), under `jax.shard_map`. Same operands and attributes
    (positional or by name; attributes by name); returns out [T, Hq, D] sharded
    `P(None, axis, None)` (with return_lse, and lse [T, Hq] sharded `P(None, axis)`). Jit-able.
    ValueError naming kv_cache when Hkv is smaller than or not divisible by the number of devices
    on `axis`."""
    op = ops.PAGED_ATTENTION
    operands, attrs = op.bind(args, kwargs)
    outs = shard_map_call(op, operands, attrs, mesh=mesh, axis=axis, abi=abi)
    return op.public_returns((return_lse,))(outs)


def kv_cache_update(*args: Any, mesh: Mesh, axis: Axis = DEFAULT_AXIS, abi: str = "ffi", **kwargs):
    """`xla_gpu_ops.jax.kv_cache_update` with the combined head axis of new_kv [N, 2*Hkv, D] and
    kv_cache split over `axis` of `mesh`, under `jax.shard_map`: each device writes its own K/V
    heads; slot_mapping is replicated. Returns the updated cache, sharded
    `P(None, None, axis, None)` and aliasing kv_cache (donate it under jit: no copy). Same
    operands and attributes, same errors as `paged_attention`."""
    op = ops.KV_CACHE_UPDATE
    operands, attrs = op.bind(args, kwargs)
    # the cache alone: the sharding wrappers refuse value_cache (check_split)
    return shard_map_call(op, operands, attrs, mesh=mesh, axis=axis, abi=abi)[0]


# ---------------------------------------------------------------------------- plain jit
def _sharding_rule(op: ops.Op, shapes: Sequence[Sequence[int]], mesh: Mesh):
    """Shardy rule. Every dimension is a factor of its own (nothing ties the replicated operands
    to each other), results share the factors of the operand they mirror, and the head
    dimensions share one factor `kv` (the KV heads; the major part of a compound (kv, group)
    factor), so a head sharding of kv_cache propagates to the query and the output.

    `kv` is shared only when every mesh axis of more than one device divides Hkv: Shardy would
    otherwise split an axis into sub-axes to fit the factor (K and V of one head on different
    devices, and shardings the partition callback cannot read). Unshared, the partition callback
    still sees the head axis the inputs carry and raises the ValueError of an invalid split."""
    # Imported here: the plain-jit path alone depends on these experimental names.
    from jax.experimental.custom_partitioning import ArrayMapping, CompoundFactor, SdyShardingRule

    layout = head_sharding.layout(op)
    by_name = dict(zip(op.operand_names, shapes, strict=True))
    kv_heads = layout.num_kv_heads(by_name)
    share = kv_heads > 1 and all(n == 1 or kv_heads % n == 0 for n in mesh.shape.values())
    sizes: dict[str, int] = {}
    mappings: dict[str, tuple] = {}
    factors: dict[str, list[Any]] = {}  # name -> its dimensions' factors
    kv_whole = False  # a factor that spans a whole dimension somewhere is given no size
    for name, shape in by_name.items():
        dims: list[Any] = [f"{name}_{j}" for j in range(len(shape))]
        entry = layout.dims.get(name)
        if entry is not None and share and shape[entry.dim] > 0:  # not an absent operand, [0]
            per_kv = shape[entry.dim] // kv_heads
            if per_kv == 1:  # Shardy rejects size-1 factors inside a compound
                dims[entry.dim] = "kv"
                kv_whole = True
            else:
                dims[entry.dim] = CompoundFactor("kv", f"{name}_per_kv")
                sizes[f"{name}_per_kv"] = per_kv
        mappings[name] = ArrayMapping(*dims)
        factors[name] = dims
    if share and not kv_whole:
        sizes["kv"] = kv_heads
    results = tuple(ArrayMapping(*factors[s.operand][: s.rank]) for s in op.returned_specs)
    return SdyShardingRule(tuple(mappings.values()), results, **sizes)


def _spec_entry(sharding: Any, dim: int) -> Any:
    spec = getattr(sharding, "spec", None)
    if spec is None or len(spec) <= dim:
        return None
    return spec[dim]


def _entry_size(mesh: Mesh, entry: Any) -> int:
    if entry is None:
        return 1
    names = (entry,) if isinstance(entry, str) else tuple(entry)
    return int(np.prod([mesh.shape[n] for n in names]))


@functools.cache
def _partitioned(op_name: str, abi: str):
    op = ops.get(op_name)
    layout = head_sharding.layout(op)
    operand_index = {name: i for i, name in enumerate(op.operand_names)}

    def call_whole(*args):
        *operands, attrs = args
        return _jax_ffi.call(op, operands, dict(attrs), abi)

    from jax.experimental.custom_partitioning import custom_partitioning

    wrapped = custom_partitioning(call_whole, static_argnums=(len(op.operands),))

    def rule(attrs, mesh, operand_types, result_types):
        del attrs, result_types
        return _sharding_rule(op, [tuple(t.shape) for t in operand_types], mesh)

    def partition(attrs, mesh, arg_shapes, result_shape):
        # The head axis the big operand carries wins; everything else becomes replicated.
        entry = None
        for name in (layout.kv_operand, *layout.dims):
            entry = _spec_entry(arg_shapes[operand_index[name]].sharding, layout.dims[name].dim)
            if entry is not None:
                break
        shapes = [tuple(a.shape) for a in arg_shapes]
        size = _entry_size(mesh, entry)
        where = "the inputs' head axis" if entry is None else head_sharding.axis_text(entry)
        head_sharding.check_split(op, shapes, size, where)
        arg_shardings = tuple(
            NamedSharding(mesh, PartitionSpec(*e))
            for e in head_sharding.partition_entries(op, entry)
        )
        ranks = [len(r.shape) for r in jax.tree.leaves(result_shape)]
        result_shardings = [
            NamedSharding(mesh, PartitionSpec(*e))
            for e in head_sharding.result_entries(op, ranks, entry)
        ]

        def lower(*shards):
            return _jax_ffi.call(op, shards, dict(attrs), abi)

        results = result_shardings[0] if op.returned == 1 else tuple(result_shardings)
        return mesh, lower, results, arg_shardings

    wrapped.def_partition(partition=partition, sharding_rule=rule)
    return wrapped


def partitioned_call(
    op: ops.Op, operands: Sequence[Any], attrs: Mapping[str, Any], abi: str = "ffi"
):
    """`xla_gpu_ops.jax.call(op, ...)` that `jax.jit` partitions by KV head from its inputs'
    shardings (custom_partitioning + Shardy rule) instead of gathering them. On one device it
    is the plain call."""
    op = ops.get(op)
    operands = _jax_ffi.present(op.complete(operands))
    # Errors here rather than inside the partitioner: an op without a rule, bad attributes,
    # head dimensions that do not fit the KV heads.
    head_sharding.check_split(op, [np.shape(x) for x in operands], 1, "one device")
    head_sharding.check_layout(op, attrs)
    op.encode_attrs(attrs)
    static = tuple(sorted(attrs.items()))
    return _partitioned(op.name, abi)(*operands, static)


def partitioned_paged_attention(*args: Any, abi: str = "ffi", return_lse: bool = False, **kwargs):
    """`xla_gpu_ops.jax.paged_attention` that plain `jax.jit` partitions by KV head: with
    kv_cache sharded `P(None, None, axis, None)` (and the query `P(None, axis, None)`) the
    compiled program runs the op per device on its heads, with no all-gather. Same operands and
    attributes. When the inputs' head axis has more devices than KV heads or does not divide
    them, the partitioner raises ValueError naming kv_cache while compiling; jax reports it as
    a runtime error (XlaRuntimeError; JaxRuntimeError in later jax) whose message ends with it.
    return_lse: (out, lse) as `xla_gpu_ops.jax.paged_attention`."""
    op = ops.PAGED_ATTENTION
    operands, attrs = op.bind(args, kwargs)
    return op.public_returns((return_lse,))(partitioned_call(op, operands, attrs, abi))


def partitioned_kv_cache_update(*args: Any, abi: str = "ffi", **kwargs):
    """`xla_gpu_ops.jax.kv_cache_update` that plain `jax.jit` partitions by KV head from the
    shardings of new_kv and kv_cache (`P(None, axis, None)`, `P(None, None, axis, None)`), as
    `partitioned_paged_attention` does."""
    op = ops.KV_CACHE_UPDATE
    operands, attrs = op.bind(args, kwargs)
    return partitioned_call(op, operands, attrs, abi)[0]  # the cache: value_cache is refused


# ---------------------------------------------------------------------------- torchax
def _torchax_call(
    op: ops.Op, args: Sequence[Any], kwargs: Mapping[str, Any], mesh: Mesh, axis: Axis, abi: str
):
    """`shard_map_call` for a PyTorch program under torchax, returning what the torch op
    returns: results written in place are stored into their operand (torchax tensors)."""
    from torchax import interop

    from xla_gpu_ops import _torchax

    def sharded(*call_args, **call_kwargs):
        operands, attrs = op.bind(call_args, call_kwargs)
        return shard_map_call(op, operands, attrs, mesh=mesh, axis=axis, abi=abi)

    # mesh goes in through the closure: torchax's argument conversion treats any callable (a
    # Mesh is one) as a torch function to wrap.
    outs = interop.call_jax(sharded, *args, **kwargs)
    if not op.aliases:
        return outs
    outs = outs if isinstance(outs, tuple) else (outs,)
    operands, _ = op.bind(args, kwargs)
    for result, operand in op.given_writes(operands):
        _torchax.store(operands[operand], outs[result].jax())
    return op.torch_result()(outs)


def torchax_paged_attention(
    *args: Any,
    mesh: Mesh,
    axis: Axis = DEFAULT_AXIS,
    abi: str = "ffi",
    return_lse: bool = False,
    **kwargs,
):
    """`paged_attention` for a PyTorch program under torchax: torchax tensors in (shard them with
    `tensor.apply_jax_(jax.device_put, sharding)`), a torchax tensor out (with return_lse, and
    the lse); eager or inside `jax.jit(torchax.interop.jax_view(fn))`."""
    op = ops.PAGED_ATTENTION
    return op.public_returns((return_lse,))(_torchax_call(op, args, kwargs, mesh, axis, abi))


def torchax_kv_cache_update(
    *args: Any, mesh: Mesh, axis: Axis = DEFAULT_AXIS, abi: str = "ffi", **kwargs
) -> None:
    """`kv_cache_update` for a PyTorch program under torchax: in place, as
    `torch.ops.xla_gpu.kv_cache_update`: the sharded result is stored into the kv_cache tensor
    (a view writes through to its base); returns None."""
    return _torchax_call(ops.KV_CACHE_UPDATE, args, kwargs, mesh, axis, abi)
