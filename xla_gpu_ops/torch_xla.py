"""torch_xla binding: the XLA-device kernels of torch.ops.xla_gpu.* (called by xla_gpu_ops.torch_ops).

Two implementations, picked per call by `XLA_GPU_OPS_XLA_IMPL` (see `xla_impl`):
- `custom_call`: one XLA custom call with the library's target, operands in the launcher's order
  (query, kv_cache, context_lens, block_tables, query_start_loc, num_seqs) and outputs
  (out, float32 workspace). Typed FFI (api_version 4, attributes as an MLIR dictionary in
  backend_config) or legacy (api_version 2, the packed config struct as the opaque), see
  `custom_call_abi`.
- `composite`: the same semantics as plain XLA ops (gather pages, masked softmax), for XLA devices
  where no handler of ours can be registered (XLA:CPU and TPU under torch_xla 2.9). Pure tensor
  ops with static shapes: no `.item()`, no host sync, so it lowers into the surrounding graph.

Importing this module needs torch only; torch_xla is imported when a function runs.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import os

import numpy as np
import torch

from xla_gpu_ops import _library, _validation
from xla_gpu_ops._registry import PAGED_ATTENTION, SIMPLE_ADD, OpSpec
from xla_gpu_ops.torch_ops import dtype_name, paged_attention_static_dims

ABI_ENV = "XLA_GPU_OPS_TORCH_XLA_ABI"  # "ffi" | "legacy": override the custom-call ABI
IMPL_ENV = "XLA_GPU_OPS_XLA_IMPL"  # "custom_call" | "composite": override the implementation
ABIS = ("ffi", "legacy")
IMPLS = ("custom_call", "composite")
API_VERSION = {"legacy": 2, "ffi": 4}  # XLA CustomCallApiVersion: STATUS_RETURNING, TYPED_FFI
_FIRST_FFI_ONLY_VERSION = (
    2,
    9,
)  # torch_xla < 2.9 registers legacy targets only (PJRT GPU extension)


# ---------------------------------------------------------------------------- runtime facts
@functools.cache
def torch_xla_version() -> tuple[int, int]:
    """(major, minor) of the installed torch_xla, read without importing it."""
    major, minor, *_ = importlib.metadata.version("torch_xla").split(".")
    return int(major), int(minor)


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
    return "legacy" if torch_xla_version() < _FIRST_FFI_ONLY_VERSION else "ffi"


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
    return "custom_call" if device_hardware(device) == "CUDA" else "composite"


def _prepare_runtime(device: torch.device) -> None:
    """Make sure a custom call on `device` can run; raise a clear error where it cannot."""
    if device_hardware(device) != "CUDA":
        return  # XLA:CPU/TPU: lowering only (HLO inspection); execution fails cleanly in XLA
    version = torch_xla_version()
    if version >= _FIRST_FFI_ONLY_VERSION:
        raise RuntimeError(
            f"torch_xla {version[0]}.{version[1]} cannot run xla_gpu custom calls on a CUDA XLA "
            "device: it dropped XLA:CUDA and its _xla_register_custom_call_target is a stub. Use "
            "torch_xla 2.7 with the CUDA PJRT plugin (locks/xla-cuda.txt), torchax or JAX "
            f"(xla_gpu_ops.jax) on CUDA, or set {IMPL_ENV}=composite for plain XLA ops."
        )
    from xla_gpu_ops import xla_cuda

    xla_cuda.register_custom_call_targets()


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


def paged_attention_attributes(
    scale: float, sliding_window: int | None, soft_cap: float | None
) -> str:
    """The typed-FFI attribute dictionary (0 disables sliding_window / soft_cap, as in c_api.h)."""
    return (
        f"{{scale = {mlir_float(scale)} : f32, sliding_window = {int(sliding_window or 0)} : i64, "
        f"soft_cap = {mlir_float(soft_cap or 0.0)} : f32}}"
    )


# ---------------------------------------------------------------------------- custom call
def config_digest(backend_config: bytes) -> int:
    """A signed 63-bit digest of a backend_config, used to make it part of the graph's cache key."""
    return int.from_bytes(hashlib.blake2b(backend_config, digest_size=8).digest(), "little") >> 1


def fold_config_into_cache_key(tensor: torch.Tensor, backend_config: bytes) -> torch.Tensor:
    """The same values as `tensor` (shape [1]), in an IR node whose hash depends on backend_config.

    torch_xla hashes a custom-call IR node by its target name and operands only, not by its
    backend_config (torch_xla/csrc/ops/custom_call.cpp, 2.7-2.9): two calls differing only in
    attributes (scale, ...) get the same graph hash, so the second reuses the executable compiled
    for the first. roll's hash includes its shift, and rolling a size-1 dimension is the identity
    (XLA simplifies it away), so the digest of the config rides on one operand.
    """
    if tuple(tensor.shape) != (1,):
        raise ValueError(
            f"fold_config_into_cache_key: needs a [1] tensor, got {tuple(tensor.shape)}"
        )
    return torch.roll(tensor, shifts=config_digest(backend_config), dims=0)


def emit_custom_call(
    op: OpSpec,
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
        inputs, target, [list(s) for s in output_shapes], output_dtypes,
        False, backend_config, API_VERSION[abi], {},
    )  # fmt: skip


# ---------------------------------------------------------------------------- simple_add
def simple_add_xla(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a + b on an XLA device: custom call xla_gpu_simple_add, or plain XLA add (composite)."""
    _validation.check_simple_add(a.shape, dtype_name(a.dtype), b.shape, dtype_name(b.dtype))
    if a.device != b.device:
        raise ValueError(f"simple_add: b: on device {b.device}, a is on {a.device}")
    if xla_impl(a.device) == "composite":
        return a + b
    _prepare_runtime(a.device)
    abi = custom_call_abi()
    # No attributes: the typed handler reads shapes from its buffers; the legacy one from the opaque.
    backend_config = (
        "{}" if abi == "ffi" else bytes(_library.simple_add_config(dtype_name(a.dtype), a.numel()))
    )
    (out,) = emit_custom_call(SIMPLE_ADD, [a, b], [tuple(a.shape)], [a.dtype], abi, backend_config)
    return out


# ---------------------------------------------------------------------------- paged_attention
def paged_attention_xla(
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
    """Ragged paged attention on an XLA device (semantics: docs/DESIGN.md). Returns out only.

    Static checks run here (shapes, dtypes, attributes); metadata values stay on the device.
    """
    tensors = {"query": query, "kv_cache": kv_cache, "context_lens": context_lens,
               "block_tables": block_tables, "query_start_loc": query_start_loc,
               "num_seqs": num_seqs}  # fmt: skip
    for name, value in tensors.items():
        if not isinstance(value, torch.Tensor):
            raise TypeError(
                f"paged_attention: {name}: expected a torch.Tensor, got {type(value).__name__}"
            )
    device = query.device
    # num_seqs may come from the host (vLLM keeps it there); everything else must be on `device`.
    if num_seqs.device != device and num_seqs.device.type == "cpu":
        num_seqs = tensors["num_seqs"] = num_seqs.to(device)
    for name, value in tensors.items():
        if value.device != device:
            raise ValueError(
                f"paged_attention: {name}: on device {value.device}, query is on {device}"
            )
    query_dtype = dtype_name(query.dtype)
    dims = paged_attention_static_dims(tensors, scale, sliding_window, soft_cap)
    if xla_impl(device) == "composite":
        return paged_attention_composite(
            query, kv_cache, context_lens, block_tables, query_start_loc, num_seqs,
            scale, sliding_window, soft_cap,
        )  # fmt: skip
    _prepare_runtime(device)
    abi = custom_call_abi()
    config = _library.paged_attention_config(dims, query_dtype, scale, sliding_window, soft_cap)
    workspace_elems = _library.paged_attention_workspace_elems(config)
    if abi == "ffi":
        backend_config = paged_attention_attributes(scale, sliding_window, soft_cap)
        key = backend_config.encode()
    else:
        backend_config = key = bytes(config)
    out, _workspace = emit_custom_call(
        PAGED_ATTENTION,
        [query, kv_cache, context_lens, block_tables, query_start_loc,
         fold_config_into_cache_key(num_seqs, key)],
        [tuple(query.shape), (workspace_elems,)],
        [query.dtype, torch.float32],
        abi, backend_config,
    )  # fmt: skip
    return out


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
) -> torch.Tensor:
    """paged_attention as plain tensor ops with static shapes (one XLA graph, no host sync).

    Every query row gathers the whole page list of its sequence (pages_per_seq * page_size keys)
    and masks: memory grows as num_tokens * pages_per_seq * page_size * num_kv_heads * head_dim,
    fine for a fallback on CPU/TPU, not a fast path. Rows at or past query_start_loc[num_seqs] are
    zeros. Inputs must already be checked (static shapes); bad metadata gives unspecified rows.
    """
    num_tokens, num_q_heads, head_dim = query.shape
    _, page_size, combined_heads, _ = kv_cache.shape
    num_kv_heads = combined_heads // 2
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
    kv = kv_cache[pages].reshape(num_tokens, max_kv_len, combined_heads, head_dim)
    keys = kv[:, :, 0::2].float()
    values = kv[:, :, 1::2].float()

    q = query.float().reshape(num_tokens, num_kv_heads, group, head_dim)
    logits = torch.einsum("tkgd,tlkd->tkgl", q, keys) * scale
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
    probs = torch.softmax(logits, dim=-1)
    out = torch.einsum("tkgl,tlkd->tkgd", probs, values).reshape(num_tokens, num_q_heads, head_dim)
    out = torch.where(valid_token[:, None, None], out, torch.zeros((), device=device))
    return out.to(query.dtype)
