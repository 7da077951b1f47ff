"""torch_xla binding: the XLA kernel of each torch op torch.ops.xla_gpu.<op>, registered for the
XLA dispatch key by xla_gpu_ops._torch_library (programs call the torch op, or its wrappers in
xla_gpu_ops.torch_ops, on XLA tensors). A device kernel like xla_gpu_ops._torch_cuda, but public:
its switches below (implementation, ABI) and composites are part of the torch_xla interface.

Two implementations, picked per call by `XLA_GPU_OPS_XLA_IMPL` (see `xla_impl`):
- `custom_call`: one XLA custom call with the op's target, operands and results in the library's
  order (xla_gpu_ops.ops; scratch results such as paged_attention's workspace included). Typed FFI
  (api_version 4, attributes as an MLIR dictionary in backend_config) or legacy (api_version 2,
  the XgoCall bytes as the opaque), see `custom_call_abi`.
- `composite`: the same semantics as plain XLA ops (for paged_attention: gather pages, masked
  softmax), for XLA devices where no handler of ours can be registered (XLA:CPU and TPU under
  torch_xla 2.9). Pure tensor ops with static shapes: no `.item()`, no host sync, so it lowers into
  the surrounding graph.

On a GPU XLA device the custom-call targets are registered first through
xla_gpu_ops._pjrt_plugin, the plumbing of both GPU routes (xla_gpu_ops.xla_cuda for torch_xla 2.7,
xla_gpu_ops.torch_xla_plugin for 2.9). Importing this module needs torch only; torch_xla is
imported when a function runs.
"""

from __future__ import annotations

import functools
import hashlib
import os
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from xla_gpu_ops import _library, _pjrt_plugin, _torch_xla_version, ops, reference
from xla_gpu_ops._torch import absent_operand, dtype_name, torch_dtype

# Part of this module's interface: the installed release decides the ABI (custom_call_abi).
from xla_gpu_ops._torch_xla_version import torch_xla_version as torch_xla_version

ABI_ENV = "XLA_GPU_OPS_TORCH_XLA_ABI"  # "ffi" | "legacy": override the custom-call ABI
IMPL_ENV = "XLA_GPU_OPS_XLA_IMPL"  # "custom_call" | "composite": override the implementation
ABIS = ("ffi", "legacy")
IMPLS = ("custom_call", "composite")
API_VERSION = {"legacy": 2, "ffi": 4}  # XLA CustomCallApiVersion: STATUS_RETURNING, TYPED_FFI
# XLA device hardware that runs our CUDA handlers: torch_xla 2.7's CUDA device, and the generic
# plugin device of xla_gpu_ops.torch_xla_plugin (torch_xla 2.9).
GPU_HARDWARE = (_pjrt_plugin.CUDA_DEVICE_TYPE, _pjrt_plugin.PLUGIN_DEVICE_TYPE)


# ---------------------------------------------------------------------------- runtime facts
def custom_call_abi() -> str:
    """ "ffi" (typed FFI, api_version 4) or "legacy" (api_version 2 + opaque config bytes).

    Legacy where the runtime only takes legacy targets: torch_xla < 2.9 registers custom calls
    through the PJRT GPU extension, which accepts untyped (legacy) handlers only (2.7 is the last
    release with XLA:CUDA; xla_gpu_ops.xla_cuda registers the targets there). From 2.9 on: typed
    FFI. Override with XLA_GPU_OPS_TORCH_XLA_ABI=ffi|legacy.
    """
    override = os.environ.get(ABI_ENV, "").strip().lower()
    if override:
        if override not in ABIS:
            raise ValueError(f"{ABI_ENV}={override!r}: expected one of {ABIS}")
        return override
    release = _torch_xla_version.torch_xla_version()
    return "legacy" if release < _torch_xla_version.FIRST_RELEASE_WITHOUT_CUDA else "ffi"


def device_hardware(device: torch.device) -> str:
    """ "CPU", "CUDA", "TPU", ... : the PJRT hardware behind an XLA device."""
    import torch_xla.core.xla_model as xm

    return xm.xla_device_hw(device)


def xla_impl(device: torch.device) -> str:
    """ "custom_call" or "composite" for a call on this XLA device.

    Default: custom_call on a CUDA XLA device (the point of the library), composite elsewhere,
    since torch_xla offers no way to register a Host or TPU handler of ours (a custom call there
    fails at run time with "No FFI handler registered"). Override with
    XLA_GPU_OPS_XLA_IMPL=custom_call|composite; custom_call on XLA:CPU still lowers, which is how
    the HLO tooling inspects the call.
    """
    override = os.environ.get(IMPL_ENV, "").strip().lower()
    if override:
        if override not in IMPLS:
            raise ValueError(f"{IMPL_ENV}={override!r}: expected one of {IMPLS}")
        return override
    return "custom_call" if device_hardware(device) in GPU_HARDWARE else "composite"


def _prepare_runtime(device: torch.device) -> None:
    """Make sure a custom call on `device` can run; raise a clear error where it cannot."""
    hardware = device_hardware(device)
    if hardware not in GPU_HARDWARE:
        return  # XLA:CPU/TPU: lowering only (HLO inspection); execution fails cleanly in XLA
    if hardware == _pjrt_plugin.PLUGIN_DEVICE_TYPE:  # 2.9: through the plugin's own extension
        _pjrt_plugin.register_custom_call_targets()
        return
    version = _torch_xla_version.torch_xla_version()
    if version >= _torch_xla_version.FIRST_RELEASE_WITHOUT_CUDA:
        raise RuntimeError(
            f"torch_xla {version[0]}.{version[1]} cannot run xla_gpu custom calls on a CUDA XLA "
            "device: it dropped XLA:CUDA and its _xla_register_custom_call_target is a stub. Use "
            "xla_gpu_ops.torch_xla_plugin.register_plugin() (the GPU plugin device), torch_xla "
            "2.7 with the CUDA PJRT plugin (locks/xla-cuda.txt), torchax or JAX (xla_gpu_ops.jax) "
            f"on CUDA, or set {IMPL_ENV}=composite for plain XLA ops."
        )
    _pjrt_plugin.register_legacy_targets()  # 2.7: through torch_xla's registration call


# ---------------------------------------------------------------------------- attributes
def mlir_float(value: float) -> str:
    """A float32 attribute value as MLIR text that parses back to exactly the same float32.

    The f32 value is printed as the shortest decimal of its exact double, so it round-trips
    whether the parser rounds decimal -> f32 directly or through f64; MLIR needs a '.' in it.
    """
    text = repr(float(np.float32(value)))
    mantissa, _, exponent = text.partition("e")
    if "." not in mantissa:
        mantissa += ".0"
    return mantissa + ("e" + exponent if exponent else "")


def attributes_text(op: ops.Op, values: tuple[float | int, ...]) -> str:
    """The typed-FFI attribute dictionary of a call, e.g. "{scale = 0.125 : f32, n = 0 : i64}"
    (values as `Op.encode_attrs` gives them: None already turned into the off value)."""
    items = [
        f"{a.name} = {mlir_float(v)} : f32" if a.kind is float else f"{a.name} = {int(v)} : i64"
        for a, v in zip(op.attrs, values, strict=True)
    ]
    return "{" + ", ".join(items) + "}"


# ---------------------------------------------------------------------------- custom call
def config_digest(backend_config: bytes) -> int:
    """A signed 63-bit digest of a backend_config, used to make it part of the graph's cache key."""
    return int.from_bytes(hashlib.blake2b(backend_config, digest_size=8).digest(), "little") >> 1


def fold_config_into_cache_key(tensor: torch.Tensor, backend_config: bytes) -> torch.Tensor:
    """The same values as `tensor`, in an IR node whose hash depends on backend_config.

    torch_xla hashes a custom-call IR node by its target name and operands only, not by its
    backend_config (torch_xla/csrc/ops/custom_call.cpp, 2.7-2.9): two calls differing only in
    attributes (scale, ...) get the same graph hash, so the second reuses the executable compiled
    for the first. roll's hash includes its shift, and rolling a new size-1 leading dimension is
    the identity (XLA simplifies it away), so the digest of the config rides on one operand.
    """
    shift = config_digest(backend_config)
    return torch.roll(tensor.unsqueeze(0), shifts=shift, dims=0).squeeze(0)


def emit_custom_call(
    op: ops.Op,
    inputs: list[torch.Tensor],
    output_shapes: list[tuple[int, ...]],
    output_dtypes: list[torch.dtype],
    abi: str,
    backend_config: str | bytes,
) -> list[torch.Tensor]:
    """One custom call of `op` on XLA tensors (lazy: it runs at the next sync)."""
    import torch_xla

    target = op.ffi_target if abi == "ffi" else op.legacy_target
    # pybind11 turns bytes into std::string with its NULs intact; XLA keeps the opaque as is.
    return torch_xla._XLAC._xla_custom_call(
        inputs,
        target,
        [list(s) for s in output_shapes],
        output_dtypes,
        False,
        backend_config,
        API_VERSION[abi],
        {},
    )


# ---------------------------------------------------------------------------- kernels
def functional_results(op: ops.Op, operands: list[torch.Tensor], attrs: dict) -> list:
    """The op's outputs as new tensors (an in-place result is the operand's new value), on an
    XLA device: the custom call or the composite. Static checks run here through the library
    (shapes, dtypes, attributes); values stay on the device."""
    operands = op.complete(operands)
    left_out = [t is None for t in operands]  # the composite takes these as None
    device = operands[0].device
    for i, operand in enumerate(op.operands):
        if operands[i] is None:  # an optional operand left out: the library reads [0] as absent
            operands[i] = absent_operand(device)
        # e.g. num_seqs may come from the host (vLLM keeps it there)
        if operand.host_ok and operands[i].device.type == "cpu":
            operands[i] = operands[i].to(device)
        if operands[i].device != device:
            raise ValueError(
                f"{op.name}: {operand.name}: on device {operands[i].device}, "
                f"{op.operands[0].name} is on {device}"
            )
    call, results = _library.describe_call(
        op, [t.shape for t in operands], [dtype_name(t.dtype) for t in operands], attrs
    )
    if _impl_for(op, device) == "composite":
        given = [None if out else t for t, out in zip(operands, left_out, strict=True)]
        return composite_results(op, given, attrs)
    _prepare_runtime(device)
    abi = custom_call_abi()
    encoded = tuple(
        call.attrs[a].f64 if attr.kind is float else call.attrs[a].i64
        for a, attr in enumerate(op.attrs)
    )
    backend_config: str | bytes
    if abi == "ffi":
        backend_config = attributes_text(op, encoded)
        key = backend_config.encode()
    else:
        backend_config = key = bytes(call)
    if op.attrs:
        last = op.num_required - 1  # never an optional operand: that one may be empty
        operands[last] = fold_config_into_cache_key(operands[last], key)
    outs = emit_custom_call(
        op,
        operands,
        [r.shape for r in results],
        [torch_dtype(r.dtype) for r in results],
        abi,
        backend_config,
    )
    return outs[: op.returned]


def composite_results(op: ops.Op, operands: list[torch.Tensor], attrs: dict) -> list:
    """The op's outputs from its composite (plain tensor ops, any device, functional)."""
    required, optional = op.split_optional(operands)
    outs = composite_of(op)(*required, **attrs, **optional)
    return list(outs) if isinstance(outs, tuple) else [outs]


def make_kernel(op: ops.Op, functional: bool = False):
    """The XLA kernel of torch.ops.xla_gpu.<op> (arguments in schema order). In-place results
    are copied into their operand (on XLA an IR update, not a device copy); functional: the
    kernel of <op>_functional, which returns them instead."""

    pick = op.torch_result(functional)

    def kernel(*args):
        operands, attrs = op.split_schema_args(args)
        outs = functional_results(op, operands, attrs)
        if not functional:
            for result, operand in op.given_writes(operands):
                operands[operand].copy_(outs[result])
        return pick(outs)

    return kernel


def _impl_for(op: ops.Op, device: torch.device) -> str:
    """xla_impl, except that ops writing in place default to their composite: torch_xla's
    custom-call binding cannot alias a result to an operand, so the handler would copy the whole
    operand (e.g. the KV cache) on every call, while the composite's scatter updates it in place
    (with buffer donation). XLA_GPU_OPS_XLA_IMPL=custom_call still forces the custom call."""
    if op.aliases and not os.environ.get(IMPL_ENV, "").strip():
        return "composite"
    return xla_impl(device)


def kv_cache_update_composite(
    new_kv: torch.Tensor,
    slot_mapping: torch.Tensor,
    kv_cache: torch.Tensor,
    k_scale: float | None = None,
    v_scale: float | None = None,
    kv_layout: str = "NHD",
    *,
    k_scales: torch.Tensor | None = None,
    v_scales: torch.Tensor | None = None,
    value_cache: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The updated caches (new tensors; without value_cache, the second is the empty float32 [0]
    that stands for it), each as one scatter with static shapes: no host sync, no data-dependent
    shape."""
    return kv_cache_store_composite(
        new_kv[:, 0::2],
        new_kv[:, 1::2],
        slot_mapping,
        kv_cache,
        k_scale,
        v_scale,
        kv_layout,
        k_scales=k_scales,
        v_scales=v_scales,
        value_cache=value_cache,
    )


def kv_cache_store_composite(
    key: torch.Tensor,
    value: torch.Tensor,
    slot_mapping: torch.Tensor,
    kv_cache: torch.Tensor,
    k_scale: float | None = None,
    v_scale: float | None = None,
    kv_layout: str = "NHD",
    *,
    k_scales: torch.Tensor | None = None,
    v_scales: torch.Tensor | None = None,
    value_cache: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """kv_cache_update's composite with K and V apart (one fused gather under XLA)."""
    writes = reference.cache_writes(
        key, value, kv_cache, value_cache, k_scale, v_scale, k_scales=k_scales, v_scales=v_scales
    )
    updated = [_scatter_rows(cache, slot_mapping, rows, kv_layout) for cache, rows in writes]
    if kv_cache.dim() == 5:  # K and V in one tensor: its halves, written, stacked again
        updated = [torch.stack(updated, dim=1)]
    if len(updated) == 1:  # value_cache left out: its result is the [0] stand-in
        updated.append(kv_cache.new_empty((0,), dtype=getattr(torch, ops.ABSENT_DTYPE)))
    return updated[0], updated[1]


def _scatter_rows(
    cache: torch.Tensor, slot_mapping: torch.Tensor, scaled: torch.Tensor, kv_layout: str = "NHD"
) -> torch.Tensor:
    """_scatter_nhd on an HND cache [P, heads, page_size, D]: through its NHD transpose."""
    if kv_layout == "HND":
        nhd = _scatter_nhd(cache.transpose(1, 2).contiguous(), slot_mapping, scaled)
        return nhd.transpose(1, 2).contiguous()
    return _scatter_nhd(cache, slot_mapping, scaled)


def _scatter_nhd(cache: torch.Tensor, slot_mapping: torch.Tensor, scaled: torch.Tensor):
    """cache (a new tensor) with row slot_mapping[n] of its [P * page_size, ...] rows set to
    scaled[n], rounded to the cache dtype (fp8: saturated). An fp8 cache on an XLA device needs
    torch_xla >= 2.9: 2.7's XLA rounds float32 -> float8_e4m3fn off by one step for some values
    (37 of 43k in a test), so it is refused there rather than written differently from every
    other path.

    Tokens whose slot is negative (padding) or past the cache write a copy of a valid token's row
    to that token's slot instead (or, with no valid token, row 0 back onto itself): duplicate
    writes of equal values, so every real slot gets exactly its new row and nothing else moves.
    """
    rows = cache.reshape(-1, *cache.shape[2:])  # a copy for a [P, 2, ...] cache's half
    capacity = rows.shape[0]
    if (
        cache.dtype == torch.float8_e4m3fn
        and cache.device.type == "xla"
        and _torch_xla_version.torch_xla_version() < _torch_xla_version.FIRST_RELEASE_WITHOUT_CUDA
    ):
        major, minor = _torch_xla_version.torch_xla_version()
        raise TypeError(
            f"kv_cache_update: kv_cache: float8_e4m3fn needs torch_xla >= 2.9 on XLA devices "
            f"(torch_xla {major}.{minor} rounds float32 -> float8 differently)"
        )
    if slot_mapping.shape[0] == 0:  # an empty batch (a static shape): nothing to write
        return cache.clone()
    if cache.dtype == torch.float8_e4m3fn:
        scaled = scaled.clamp(-reference.FP8_MAX, reference.FP8_MAX)
    slots = slot_mapping.long()
    valid = (slots >= 0) & (slots < capacity)
    any_valid = valid.any()
    first = torch.argmax(valid.to(torch.int32)).view(1)  # a valid token, if any
    token = torch.arange(slots.shape[0], device=slots.device)
    source = torch.where(valid, token, first)
    fallback = torch.where(any_valid, slots.index_select(0, first), torch.zeros_like(first))
    target = torch.where(valid, slots, fallback)
    values = torch.where(any_valid, scaled[source].to(cache.dtype), rows[0:1])
    return rows.index_put((target,), values).view(cache.shape)


def paged_attention_composite(
    query: torch.Tensor,
    kv_cache: torch.Tensor,
    context_lens: torch.Tensor,
    block_tables: torch.Tensor,
    query_start_loc: torch.Tensor,
    num_seqs: torch.Tensor,
    scale: float,
    sliding_window: int | None = None,
    soft_cap: float | None = None,
    k_scale: float | None = None,
    v_scale: float | None = None,
    kv_layout: str = "NHD",
    *,
    sinks: torch.Tensor | None = None,
    k_scales: torch.Tensor | None = None,
    v_scales: torch.Tensor | None = None,
    value_cache: torch.Tensor | None = None,
    return_lse: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """paged_attention (out, and lse with return_lse) as plain tensor ops with static shapes (one
    XLA graph, no host sync).

    Every query row gathers the whole page list of its sequence (pages_per_seq * page_size keys)
    and masks: memory grows as num_tokens * pages_per_seq * page_size * num_kv_heads * head_dim,
    fine for a fallback on CPU/TPU, not a fast path. Rows at or past query_start_loc[num_seqs] are
    zeros. Inputs must already be checked (static shapes); bad metadata gives unspecified rows.
    """
    num_tokens, num_q_heads, head_dim = query.shape
    kv_cache, value_cache = reference.cache_pair(kv_cache, value_cache)
    if kv_layout == "HND":  # as NHD: [P, page_size, heads, D] (a transpose of the graph)
        kv_cache = kv_cache.transpose(1, 2).contiguous()
        if value_cache is not None:
            value_cache = value_cache.transpose(1, 2).contiguous()
    _, page_size, cache_heads, _ = kv_cache.shape
    # value_cache None: K and V interleaved in kv_cache
    num_kv_heads = cache_heads if value_cache is not None else cache_heads // 2
    group = num_q_heads // num_kv_heads
    max_num_seqs, pages_per_seq = block_tables.shape
    max_kv_len = pages_per_seq * page_size
    device = query.device

    # Sequence of each token: how many live sequences end at or before it.
    token = torch.arange(num_tokens, device=device, dtype=torch.int32)
    live_seq = torch.arange(max_num_seqs, device=device, dtype=torch.int32) < num_seqs  # [S]
    ends = query_start_loc[1:]  # [S]
    ended = (ends[None, :] <= token[:, None]) & live_seq[None, :]  # [T, S]
    seq = ended.to(torch.int32).sum(dim=1)  # [T]; == num_seqs for padding rows
    valid_token = seq < num_seqs  # [T]
    seq = torch.clamp(seq, max=max_num_seqs - 1).long()

    q_start = query_start_loc[seq]
    q_len = query_start_loc[seq + 1] - q_start
    kv_len = context_lens[seq]
    position = kv_len - q_len + (token - q_start)  # absolute position of each query row, [T]

    # Keys and values of each token's sequence: [T, L, Hkv, D], L = pages_per_seq * page_size.
    pages = block_tables[seq].long()  # [T, pages_per_seq]
    if value_cache is not None:
        keys = kv_cache[pages].reshape(num_tokens, max_kv_len, num_kv_heads, head_dim).float()
        values = value_cache[pages].reshape(num_tokens, max_kv_len, num_kv_heads, head_dim).float()
    else:
        kv = kv_cache[pages].reshape(num_tokens, max_kv_len, cache_heads, head_dim)
        keys = kv[:, :, 0::2].float()
        values = kv[:, :, 1::2].float()

    q = query.float().reshape(num_tokens, num_kv_heads, group, head_dim)
    k_per_head = reference.per_kv_head(k_scales, k_scale, num_kv_heads, torch.float32, device)
    v_per_head = reference.per_q_head(v_scales, v_scale, num_kv_heads, group, torch.float32, device)
    logits = torch.einsum("tkgd,tlkd->tkgl", q, keys) * (scale * k_per_head[:, None, None])
    if soft_cap is not None:
        logits = soft_cap * torch.tanh(logits / soft_cap)
    key_pos = torch.arange(max_kv_len, device=device, dtype=torch.int32)[None, :]
    visible = key_pos <= position[:, None]  # causal; also keeps p < kv_len
    if sliding_window is not None:
        visible = visible & (key_pos > position[:, None] - sliding_window)
    visible = visible & valid_token[:, None]
    # A row with nothing visible (padding) would be NaN after softmax: give it one harmless key
    # and zero it below, so no NaN is ever produced.
    visible_or_first = visible | (~visible.any(dim=1, keepdim=True) & (key_pos == 0))
    logits = logits.masked_fill(~visible_or_first[:, None, None, :], float("-inf"))
    if sinks is not None and sinks.numel():  # one more logit per head, dropped after the softmax
        sink = sinks.float().reshape(1, num_kv_heads, group, 1).expand(num_tokens, -1, -1, 1)
        logits = torch.cat([logits, sink], dim=-1)
        probs = torch.softmax(logits, dim=-1)[..., :-1]
    else:
        probs = torch.softmax(logits, dim=-1)
    out = torch.einsum("tkgl,tlkd->tkgd", probs, values).reshape(num_tokens, num_q_heads, head_dim)
    out = out * v_per_head[:, None]
    out = torch.where(valid_token[:, None, None], out, torch.zeros((), device=device))
    lse = torch.logsumexp(logits, dim=-1).reshape(num_tokens, num_q_heads)
    lse = torch.where(valid_token[:, None], lse, torch.full((), -torch.inf, device=device))
    return (out.to(query.dtype), lse) if return_lse else out.to(query.dtype)


# Composites of the ops whose reference cannot serve: one that reads values on the host
# (paged_attention's loops over sequences) or writes in place (the KV cache writes).
COMPOSITES: dict[str, Callable[..., Any]] = {
    "paged_attention": paged_attention_composite,
    "kv_cache_update": kv_cache_update_composite,
    "kv_cache_store": kv_cache_store_composite,
}


def composite_of(op: ops.Op):
    """The op's composite: COMPOSITES' entry, else its reference (plain torch ops, functional);
    either returns every returned result, the on_request ones included."""
    composite = COMPOSITES.get(op.name)
    if composite is None:
        return reference.of(op)
    if op.on_request:
        return functools.partial(composite, **{f"return_{n}": True for n in op.on_request})
    return composite
