"""HF transformers on our ops: an attention implementation for transformers' continuous batching.

    import xla_gpu_ops.transformers

    attn = xla_gpu_ops.transformers.register()  # "paged|xla_gpu_ops"
    model = AutoModelForCausalLM.from_pretrained(NAME, attn_implementation=attn)
    outputs = model.generate_batch(prompts, generation_config)        # continuous batching
    model.generate(input_ids, cache_implementation="paged", ...)      # goes the same way

Every attention call of the model then writes its new K and V rows with `kv_cache_store` and attends
with `paged_attention` (CUDA kernels on a GPU, the reference on a CPU): prefill, decode and
chunked prefill in one ragged call per layer, with the model's sliding window, logit soft cap
(Gemma 2) and sinks (gpt-oss) passed through.

The cache. transformers' `PagedAttentionCache` keeps per layer a K and a V tensor of
`(num_blocks + 2) * block_size` rows and hands out blocks of them; ours reads K and V interleaved
per head, `[num_blocks + 2, block_size, 2 * Hkv, D]`. On the first call the cache gets one such
tensor per layer (`PagedPages`), its K and V tensors become views of them (so their memory is
freed) and its block copy (`copy_cache`, for forked requests) copies ours. Every layer reads and
writes at the full-attention group's blocks: a sliding layer keeps all its positions and masks
the old ones, so a model with sliding layers holds a full cache for them too (what transformers
saves there by reusing blocks, we do not) and a model with no full-attention layer is refused.

Only transformers' continuous batching hands the attention function a paged cache; a plain
`generate` without `cache_implementation="paged"` gets a clear error naming it.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import AttentionInterface
from transformers.generation.continuous_batching.cache import PagedAttentionCache
from transformers.generation.continuous_batching.cache_manager import FullAttentionCacheAllocator

from xla_gpu_ops import torch_ops

NAME = "xla_gpu_ops"
IMPLEMENTATION = f"paged|{NAME}"  # what attn_implementation= takes

_paged_attention = torch_ops.PUBLIC["paged_attention"]
_kv_cache_store = torch_ops.PUBLIC["kv_cache_store"]


def register() -> str:
    """Registers the implementation with transformers' AttentionInterface (idempotent) and
    returns its name for `attn_implementation=`."""
    AttentionInterface.register(IMPLEMENTATION, paged_attention_forward)
    return IMPLEMENTATION


class PagedPages:
    """The cache our kernels read, kept on transformers' PagedAttentionCache: per layer
    `[num_blocks + 2, block_size, 2 * Hkv, D]` (K at even heads, V at odd), indexed by the
    full-attention group's blocks; and each forward step's metadata, made once for all layers."""

    def __init__(self, cache: PagedAttentionCache) -> None:
        groups = [
            g
            for g, manager in enumerate(cache.group_cache_managers)
            if isinstance(manager, FullAttentionCacheAllocator)
        ]
        if not groups:
            raise ValueError(
                f"{IMPLEMENTATION}: every layer of this model uses a sliding window; its paged "
                "cache needs at least one full-attention layer (use paged|sdpa for this model)"
            )
        self.group = groups[0]
        self.block_size = cache.block_size
        rows = cache.key_cache[0].shape[0]
        shape = (rows // self.block_size, self.block_size, 2 * cache.num_key_value_heads)
        self.layers: dict[int, torch.Tensor] = {}
        for layer, (group, index) in sorted(cache.layer_index_to_group_indices.items()):
            pages = torch.zeros(
                (*shape, cache.head_dim), dtype=cache.key_cache[index].dtype, device=cache.device
            )
            self.layers[layer] = pages
            if group == self.group:  # transformers' tensors become views of ours: no second copy
                cache.key_cache[index] = pages[:, :, 0::2].flatten(0, 1)
                cache.value_cache[index] = pages[:, :, 1::2].flatten(0, 1)
        cache.copy_cache = self.copy_blocks  # forked requests copy their blocks in our pages
        self._step: tuple[Any, dict[str, Any]] | None = None

    @classmethod
    def of(cls, cache: PagedAttentionCache) -> PagedPages:
        pages = getattr(cache, "_xla_gpu_ops_pages", None)
        if pages is None:
            pages = cls(cache)
            cache._xla_gpu_ops_pages = pages
        return pages

    def copy_blocks(self, sources: list[int], destinations: list[int]) -> None:
        device = next(iter(self.layers.values())).device
        src = torch.tensor(sources, dtype=torch.int64, device=device)
        dst = torch.tensor(destinations, dtype=torch.int64, device=device)
        for pages in self.layers.values():
            pages[dst] = pages[src]

    def step(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        """The ragged batch of this forward step, as paged_attention and kv_cache_store take it:
        made on the device (no host sync) at the first layer, reused by the others. transformers
        makes a new `write_index` list per step, so that list is the step's identity."""
        marker = kwargs["write_index"]
        if self._step is not None and self._step[0] is marker:
            return self._step[1]
        cu_q = kwargs["cu_seq_lens_q"].to(torch.int32)
        cu_k = kwargs["cu_seq_lens_k"]
        max_k = kwargs["max_seqlen_k"]
        if isinstance(cu_k, dict):
            cu_k, max_k = cu_k["full_attention"], max_k["full_attention"]
        cu_k = cu_k.to(torch.int64)
        num_seqs = cu_q.shape[0] - 1
        context_lens = cu_k[1:] - cu_k[:-1]
        bs = self.block_size
        slots = kwargs["write_index"][self.group]
        # Every position of a sequence, from 0: its read indices, or (a batch of first prefills,
        # which reads no cache) its write indices.
        positions = kwargs["read_index"][self.group]
        if positions.numel() == 0:
            positions = slots
        pages_per_seq = max(-(-int(max_k) // bs), 1)
        first = cu_k[:-1, None] + torch.arange(pages_per_seq, device=cu_k.device) * bs
        used = first < cu_k[1:, None]
        first = first.clamp(max=max(positions.numel() - 1, 0))
        tables = torch.where(used, positions[first] // bs, 0).to(torch.int32)
        step = {
            "context_lens": context_lens.to(torch.int32),
            "block_tables": tables,
            "query_start_loc": cu_q,
            "num_seqs": torch.full((1,), num_seqs, dtype=torch.int32, device=cu_q.device),
            "slots": slots,
        }
        self._step = (marker, step)
        return step


def paged_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: Any,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' attention function signature: query [1, Hq, T, D], key and value
    [1, Hkv, T, D] (the step's new tokens, packed), the paged cache and the batch in kwargs.
    Returns the output [T, Hq, D] and no weights."""
    del attention_mask  # the ragged batch says everything: sequences, causality, window
    cache = kwargs.get("cache")
    if not isinstance(cache, PagedAttentionCache):
        raise ValueError(
            f"{IMPLEMENTATION}: needs transformers' paged cache: use model.generate_batch(...) or "
            "model.generate(..., cache_implementation='paged'); for a plain forward or generate, "
            "load the model with another attn_implementation"
        )
    if dropout:
        raise ValueError(f"{IMPLEMENTATION}: dropout: {dropout!r}; inference only, must be 0")
    pages = PagedPages.of(cache)
    step = pages.step(kwargs)
    layer_pages = pages.layers[module.layer_idx]
    _kv_cache_store(
        key=key[0].transpose(0, 1),
        value=value[0].transpose(0, 1),
        slot_mapping=step["slots"],
        kv_cache=layer_pages,
    )
    sinks = kwargs.get("s_aux", getattr(module, "sinks", None))
    out = _paged_attention(
        query[0].transpose(0, 1).contiguous(),
        layer_pages,
        step["context_lens"],
        step["block_tables"],
        step["query_start_loc"],
        step["num_seqs"],
        scale=module.scaling if scaling is None else scaling,
        sliding_window=kwargs.get("sliding_window", getattr(module, "sliding_window", None)),
        soft_cap=kwargs.get("softcap"),
        sinks=None if sinks is None else sinks.detach(),
    )
    return out, None
