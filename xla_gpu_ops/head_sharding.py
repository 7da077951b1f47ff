"""Sharding an op by KV head: which operand dimensions hold heads, the split checks, and the
collectives of a compiled program. Framework-free (numpy only); the JAX wrapper is
`xla_gpu_ops.sharding`, the torch_xla one `xla_gpu_ops.torch_xla_sharding` (docs/SHARDING.md).

Query heads and KV heads are split together over one mesh axis of n devices: device d gets KV
heads [d*Hkv/n, (d+1)*Hkv/n) and the query heads that use them. A contiguous split of the
combined axis of kv_cache [P, page_size, 2*Hkv, D] into n blocks gives device d the combined
heads [2*d*Hkv/n, 2*(d+1)*Hkv/n): the K (even) and V (odd) halves of exactly those KV heads,
since each block is a whole number of (K, V) pairs when Hkv % n == 0. A contiguous split of the
query's head axis [T, Hq, D] gives device d the query heads [d*Hq/n, (d+1)*Hq/n), which with
g = Hq/Hkv are the heads j with j // g in d's KV heads. Locally q head j' uses kv head j' // g:
the op's own GQA rule, unchanged. Every other operand (page tables, lengths, offsets, num_seqs)
is replicated, and nothing crosses devices inside attention.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from xla_gpu_ops import ops

DEFAULT_AXIS = "heads"


@dataclass(frozen=True)
class HeadDim:
    """An operand dimension that holds heads: `dim`, with `per_kv_head` entries per KV head
    (None: Hq/Hkv, the GQA group of the query; 2: the K and V halves of a combined axis)."""

    dim: int
    per_kv_head: int | None


@dataclass(frozen=True)
class HeadLayout:
    """How an op splits by KV head: its head-carrying operands and where Hkv is read."""

    dims: Mapping[str, HeadDim]  # operand name -> its head dimension; the rest is replicated
    kv_operand: str  # the operand whose head dimension is 2 * Hkv
    combined: bool = True  # that dimension interleaves K and V: 2 entries per KV head

    def num_kv_heads(self, shapes: Mapping[str, Sequence[int]]) -> int:
        size = shapes[self.kv_operand][self.dims[self.kv_operand].dim]
        return size // 2 if self.combined else size


# Ops that can be split by KV head. Results are split like the operand they take their shape
# from (op.returned_like). An op missing here cannot be sharded by these wrappers.
LAYOUTS: dict[str, HeadLayout] = {
    # sinks [Hq] follows the query heads ([0], absent, splits into empty blocks).
    ops.PAGED_ATTENTION.name: HeadLayout(
        dims={"query": HeadDim(1, None), "kv_cache": HeadDim(2, 2), "sinks": HeadDim(0, None)},
        kv_operand="kv_cache",
    ),
    # new_kv [N, 2*Hkv, D] has the cache's combined head axis: device d writes its own K/V pairs.
    ops.KV_CACHE_UPDATE.name: HeadLayout(
        dims={"new_kv": HeadDim(1, 2), "kv_cache": HeadDim(2, 2)}, kv_operand="kv_cache"
    ),
}


def layout(op: ops.Op) -> HeadLayout:
    try:
        return LAYOUTS[op.name]
    except KeyError:
        raise ValueError(
            f"{op.name}: op: has no KV-head sharding rule; ops that have one: {tuple(LAYOUTS)}"
        ) from None


def head_dim(op: ops.Op, operand: str) -> int | None:
    """The dimension of `operand` split over the head axis, None when it is replicated."""
    entry = layout(op).dims.get(operand)
    return None if entry is None else entry.dim


def partition_entries(op: ops.Op, axis: object) -> list[tuple]:
    """Per operand (table order), its partition spec as a tuple of entries: `axis` at the head
    dimension, None elsewhere. `axis` is whatever the framework's spec takes there (a mesh axis
    name or a tuple of them)."""
    return [_entries(op, o.name, o.rank, axis) for o in op.operands]


def result_entries(op: ops.Op, ranks: Sequence[int], axis: object) -> list[tuple]:
    """Per returned result, its partition spec entries (split like the operand it mirrors,
    op.returned_like)."""
    return [
        _entries(op, like, rank, axis) for like, rank in zip(op.returned_like, ranks, strict=True)
    ]


def _entries(op: ops.Op, name: str, rank: int, axis: object) -> tuple:
    dim = head_dim(op, name)
    return tuple(axis if i == dim else None for i in range(rank))


def check_layout(op: ops.Op, attrs: Mapping[str, Any]) -> None:
    """ValueError naming kv_layout unless the caches are NHD, the layout whose head dimension
    (dim 2) the wrappers split."""
    layout = attrs.get("kv_layout", "NHD")
    if layout != "NHD":
        raise ValueError(
            f"{op.name}: kv_layout: {layout!r}; the sharding wrappers split NHD caches "
            "[P, page_size, heads, D] by their heads (pass kv_layout='NHD')"
        )


def check_split(
    op: ops.Op, shapes: Sequence[Sequence[int]], num_shards: int, axis_text: str
) -> None:
    """ValueError naming the argument unless every head dimension splits into `num_shards`
    blocks of whole KV heads (with their whole query groups). `axis_text` names the mesh axis in
    the message."""
    if num_shards < 1:
        raise ValueError(f"{op.name}: axis: {axis_text} has {num_shards} devices")
    rules = layout(op)
    by_name = {o.name: tuple(s) for o, s in zip(op.operands, shapes, strict=True)}
    if len(by_name.get("kv_cache", ())) == 5:
        raise ValueError(
            f"{op.name}: kv_cache: the sharding wrappers split the interleaved cache; K and V in "
            "one [P, 2, ...] tensor are not split yet (pass kv_cache interleaved)"
        )
    if len(by_name.get("value_cache", ())) > 1:  # given: not the absent [0]
        raise ValueError(
            f"{op.name}: value_cache: the sharding wrappers split the interleaved cache; K and V "
            "in caches of their own are not split yet (pass kv_cache interleaved)"
        )
    for name, entry in rules.dims.items():
        if len(by_name[name]) <= entry.dim:
            raise ValueError(
                f"{op.name}: {name}: rank {len(by_name[name])}, the head dimension is "
                f"{entry.dim} (shape {list(by_name[name])})"
            )
    kv_heads = rules.num_kv_heads(by_name)
    kv_dim = rules.dims[rules.kv_operand].dim
    kv_size = by_name[rules.kv_operand][kv_dim]
    for name, entry in rules.dims.items():
        size = by_name[name][entry.dim]
        if entry.per_kv_head is not None and size != entry.per_kv_head * max(kv_heads, 1):
            raise ValueError(
                f"{op.name}: {name}: dimension {entry.dim} has {size} entries, expected "
                f"{entry.per_kv_head} per KV head"
            )
        if entry.per_kv_head is None and (kv_heads < 1 or size % kv_heads):
            raise ValueError(
                f"{op.name}: {name}: {size} heads (dimension {entry.dim}) are not a multiple "
                f"of the {kv_heads} KV heads"
            )
    if num_shards == 1:
        return
    if kv_heads < num_shards:
        raise ValueError(
            f"{op.name}: {rules.kv_operand}: {kv_heads} KV heads (dimension {kv_dim} of size "
            f"{kv_size}) cannot be split over {num_shards} devices of {axis_text}: more devices "
            f"than KV heads; use at most {kv_heads} devices on that axis (KV heads are never "
            "replicated here)"
        )
    if kv_heads % num_shards:
        raise ValueError(
            f"{op.name}: {rules.kv_operand}: {kv_heads} KV heads (dimension {kv_dim} of size "
            f"{kv_size}) are not divisible by the {num_shards} devices of {axis_text}; each "
            "device must hold whole K/V pairs"
        )


def axis_size(mesh_shape: Mapping[str, int], axis: str | Sequence[str]) -> int:
    """Devices along `axis` (a mesh axis name or a tuple of them); ValueError naming `axis`."""
    names = (axis,) if isinstance(axis, str) else tuple(axis)
    if not names:
        raise ValueError("axis: empty")
    for name in names:
        if name not in mesh_shape:
            raise ValueError(f"axis: {name!r} is not an axis of the mesh {dict(mesh_shape)}")
    return math.prod(mesh_shape[name] for name in names)


def axis_text(axis: str | Sequence[str]) -> str:
    return f"mesh axis {axis!r}" if isinstance(axis, str) else f"mesh axes {tuple(axis)!r}"


# ---------------------------------------------------------------------------- collectives
# Cross-device opcodes of HLO (the async forms end in -start / -done).
COLLECTIVE_OPCODES = (
    "all-gather",
    "all-reduce",
    "all-to-all",
    "ragged-all-to-all",
    "collective-permute",
    "collective-broadcast",
    "reduce-scatter",
    "send",
    "recv",
)
_INSTRUCTION = re.compile(
    r"^\s*(?:ROOT\s+)?%?(?P<name>[\w.-]+)\s*=\s*(?P<shape>\([^=]*?\)|\S+)\s+(?P<opcode>[\w-]+)\("
)


@dataclass(frozen=True)
class Collective:
    name: str
    opcode: str  # without -start / -done
    shape: str  # the result shape as HLO writes it


def collectives_in_hlo(text: str) -> list[Collective]:
    """Every cross-device instruction of an HLO text module (e.g. after optimizations)."""
    found = []
    for line in text.splitlines():
        match = _INSTRUCTION.match(line)
        if match is None:
            continue
        opcode = match["opcode"].removesuffix("-start").removesuffix("-done")
        if opcode in COLLECTIVE_OPCODES:
            found.append(Collective(match["name"], opcode, match["shape"]))
    return found
