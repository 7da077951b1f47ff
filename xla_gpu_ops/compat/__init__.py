"""Drop-in call sites: upstream signatures, our kernels. Swap one import and keep the call:

    from torch_xla.experimental.custom_kernel import ragged_paged_attention      # before
    from xla_gpu_ops.compat.torch_xla import ragged_paged_attention              # after

    from jax.experimental.pallas.ops.tpu.ragged_paged_attention import ragged_paged_attention
    from xla_gpu_ops.compat.jax import ragged_paged_attention

    from flashinfer import BatchPrefillWithPagedKVCacheWrapper     # and the decode wrapper
    from xla_gpu_ops.compat.flashinfer import BatchPrefillWithPagedKVCacheWrapper

Each takes its upstream function's parameters and defaults exactly (tests/test_compat.py compares
the signatures). Upstream's layout is ours (kv_pages [P, page_size, 2*Hkv, D], K at even heads;
FlashInfer's pair or [P, 2, ...] tensor), so nothing is copied. FlashInfer's wrappers: their
module's docstring. The tuning arguments (num_kv_pages_per_block, num_queries_per_block,
vmem_limit_bytes) size Pallas TPU blocks and VMEM: they are accepted and ignored, since our kernels
plan their own tiles from the shapes (kernels/ops/paged_attention/plan.h). mask_value: masked
logits take it upstream and are dropped here, the same softmax for any value whose exp underflows
to 0 (every value <= -1e30, upstream's default -0.7 * float32 max among them); another value is
refused. Rows past cu_q_lens[num_seqs] are zero here, undefined upstream. Each module imports its
framework only when imported.
"""

from __future__ import annotations

# The largest mask value that still masks exactly: exp(mask_value - max logit) is 0 in float32.
MASK_VALUE_LIMIT = -1e30


def check_mask_value(mask_value: float | None) -> None:
    """None or a value that masks as -inf does (ValueError naming mask_value otherwise)."""
    if mask_value is None:
        return
    if isinstance(mask_value, bool) or not isinstance(mask_value, (int, float)):
        raise TypeError(f"ragged_paged_attention: mask_value: must be a float, got {mask_value!r}")
    if not mask_value <= MASK_VALUE_LIMIT:
        raise ValueError(
            f"ragged_paged_attention: mask_value: {mask_value!r} does not mask: these kernels drop "
            f"masked keys, the same as any mask_value <= {MASK_VALUE_LIMIT:g} (or None)"
        )
