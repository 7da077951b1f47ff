"""FlashInfer's paged-KV wrappers (flashinfer 0.6: BatchPrefillWithPagedKVCacheWrapper,
BatchDecodeWithPagedKVCacheWrapper) on our kernels; see xla_gpu_ops.compat. Swap the import:

    from flashinfer import BatchDecodeWithPagedKVCacheWrapper                 # before
    from xla_gpu_ops.compat.flashinfer import BatchDecodeWithPagedKVCacheWrapper  # after

The constructors, plan() and run() take FlashInfer's parameters and defaults. plan() turns its
page table in CSR form (indptr, indices, last_page_len: read on the host, as FlashInfer's plan
does) into ours (context_lens, block_tables, query_start_loc, num_seqs on the indices' device),
once per batch; run() calls xla_gpu_ops.paged_attention on the cache as given, a (k_cache,
v_cache) pair or one [P, 2, ...] tensor, NHD or HND, so nothing is copied. The LSE is in base 2,
as FlashInfer's. Arguments that only tune FlashInfer (workspace and CUDA-graph buffers, backend,
split sizes, data types that the tensors already carry) are accepted and ignored; what FlashInfer
computes and our kernels do not (custom masks, RoPE, non-causal prefill, q_scale, NVFP4 scale
factors, skip-softmax, a V head dim other than K's) is refused, naming the argument.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from xla_gpu_ops import torch_ops

LOG2E = 1.0 / math.log(2.0)  # natural-log LSE -> FlashInfer's base-2 LSE
_REFUSED_IN_RUN = {
    "q_scale": "a query scale (fp8 queries)",
    "kv_cache_sf": "NVFP4 scale factors",
    "skip_softmax_threshold_scale_factor": "skip-softmax sparsity",
}


class _PagedKVWrapper:
    """plan()'s metadata in our form, and run() for both wrappers."""

    _name = ""

    def __init__(self, kv_layout: str) -> None:
        if kv_layout not in ("NHD", "HND"):
            raise ValueError(f"{self._name}: kv_layout: {kv_layout!r} is neither 'NHD' nor 'HND'")
        self._kv_layout = kv_layout
        self._plan: dict[str, Any] | None = None

    def _refuse(self, argument: str, value: Any, default: Any, what: str) -> None:
        """ValueError naming the argument unless it has its default (what FlashInfer would do with
        another value: `what`)."""
        given = value is not None if default is None else value != default
        if given:
            raise ValueError(f"{self._name}: {argument}: {what}; these kernels do not take it")

    def _plan_pages(
        self,
        query_start_loc: torch.Tensor,
        indptr: torch.Tensor,
        indices: torch.Tensor,
        last_page_len: torch.Tensor,
        head_dim: int,
        page_size: int,
        sm_scale: float | None,
        window_left: int,
        logits_soft_cap: float | None,
    ) -> None:
        """context_lens [B], block_tables [B, max pages] (unused entries 0, never read),
        query_start_loc [B + 1] and num_seqs [1], int32 on the indices' device."""
        pointers = indptr.detach().to("cpu", torch.int64)
        last = last_page_len.detach().to("cpu", torch.int64)
        pages = pointers[1:] - pointers[:-1]
        batch = pages.shape[0]
        if last.shape != (batch,):
            raise ValueError(
                f"{self._name}: last_page_len: shape {tuple(last.shape)}, expected ({batch},) for "
                f"{batch} requests (indptr has {batch + 1} entries)"
            )
        empty = (pages < 1).nonzero().flatten().tolist()
        if empty:
            raise ValueError(f"{self._name}: indptr: requests {empty} have no page")
        if ((last < 1) | (last > page_size)).any():
            raise ValueError(f"{self._name}: last_page_len: entries must be in [1, {page_size}]")
        device = indices.device
        width = max(int(pages.max()), 1) if batch else 1
        column = torch.arange(width)
        used = column[None, :] < pages[:, None]
        where = torch.where(used, pointers[:-1, None] + column[None, :], 0).to(device)
        tables = torch.where(used.to(device), indices[where], 0).to(torch.int32)
        self._plan = {
            "context_lens": ((pages - 1) * page_size + last).to(device, torch.int32),
            "block_tables": tables,
            "query_start_loc": query_start_loc.to(device, torch.int32),
            "num_seqs": torch.tensor([batch], dtype=torch.int32, device=device),
            "scale": 1.0 / math.sqrt(head_dim) if sm_scale is None else sm_scale,
            "window_left": window_left,
            "soft_cap": logits_soft_cap if logits_soft_cap else None,
        }

    def _run(
        self,
        q: torch.Tensor,
        paged_kv_cache: torch.Tensor | tuple[torch.Tensor, torch.Tensor],
        args: tuple,
        k_scale: Any,
        v_scale: Any,
        out: torch.Tensor | None,
        lse: torch.Tensor | None,
        refused: dict[str, Any],
        options: dict[str, Any],
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """out [rows, Hq, D] (and the base-2 LSE [rows, Hq], float32, with options' return_lse)
        of q over the planned batch; out= / lse= are filled and returned where given. `refused`:
        run()'s arguments these kernels do not take, each to be None."""
        plan = self._plan
        if plan is None:
            raise RuntimeError(f"{self._name}: run() before plan()")
        if args:
            raise TypeError(f"{self._name}: run: extra positional arguments {len(args)}")
        for name, value in refused.items():
            self._refuse(name, value, None, _REFUSED_IN_RUN[name])
        window_left, return_lse = options["window_left"], options["return_lse"]
        if isinstance(paged_kv_cache, (tuple, list)):
            kv_cache, value_cache = paged_kv_cache
        else:
            kv_cache, value_cache = paged_kv_cache, None
        window = plan["window_left"] if window_left is None else window_left
        result = torch_ops.PUBLIC["paged_attention"](
            q,
            kv_cache,
            plan["context_lens"],
            plan["block_tables"],
            plan["query_start_loc"],
            plan["num_seqs"],
            scale=plan["scale"],
            sliding_window=window + 1 if window >= 0 else None,
            soft_cap=plan["soft_cap"],
            k_scale=k_scale,
            v_scale=v_scale,
            sinks=options["sinks"],
            value_cache=value_cache,
            kv_layout=self._kv_layout,
            return_lse=return_lse,
        )
        if not return_lse:
            return _into(out, result)
        attended, natural = result
        return _into(out, attended), _into(lse, natural * LOG2E)


def _into(target: torch.Tensor | None, value: torch.Tensor) -> torch.Tensor:
    if target is None:
        return value
    target.copy_(value)
    return target


class BatchDecodeWithPagedKVCacheWrapper(_PagedKVWrapper):
    """flashinfer.BatchDecodeWithPagedKVCacheWrapper: one query token per request (q [B, Hq, D]),
    or q_len_per_req tokens each (speculative decoding's verify step), causal among them."""

    _name = "BatchDecodeWithPagedKVCacheWrapper"

    def __init__(
        self,
        float_workspace_buffer: torch.Tensor,
        kv_layout: str = "NHD",
        use_cuda_graph: bool = False,
        use_tensor_cores: bool = False,
        paged_kv_indptr_buffer: torch.Tensor | None = None,
        paged_kv_indices_buffer: torch.Tensor | None = None,
        paged_kv_last_page_len_buffer: torch.Tensor | None = None,
        backend: str = "auto",
        jit_args: list[Any] | None = None,
    ) -> None:
        del float_workspace_buffer, use_cuda_graph, use_tensor_cores, backend  # FlashInfer's
        del paged_kv_indptr_buffer, paged_kv_indices_buffer, paged_kv_last_page_len_buffer
        self._refuse("jit_args", jit_args, None, "arguments of a FlashInfer JIT kernel")
        super().__init__(kv_layout)

    def plan(
        self,
        indptr: torch.Tensor,
        indices: torch.Tensor,
        last_page_len: torch.Tensor,
        num_qo_heads: int,
        num_kv_heads: int,
        head_dim: int,
        page_size: int,
        pos_encoding_mode: str = "NONE",
        window_left: int = -1,
        logits_soft_cap: float | None = None,
        q_data_type: Any = "float16",
        kv_data_type: Any = None,
        o_data_type: Any = None,
        data_type: Any = None,
        sm_scale: float | None = None,
        rope_scale: float | None = None,
        rope_theta: float | None = None,
        non_blocking: bool = True,
        block_tables: torch.Tensor | None = None,
        seq_lens: torch.Tensor | None = None,
        fixed_split_size: int | None = None,
        disable_split_kv: bool = False,
        q_len_per_req: int = 1,
    ) -> None:
        """The batch's page table (CSR) and attention options, for the run() calls that follow."""
        del q_data_type, kv_data_type, o_data_type, data_type, non_blocking  # the tensors carry
        del num_qo_heads, num_kv_heads  # so do q and the cache (the op checks both)
        del fixed_split_size, disable_split_kv  # FlashInfer's split choice; ours is planned
        self._refuse("pos_encoding_mode", pos_encoding_mode, "NONE", "RoPE inside attention")
        self._refuse("rope_scale", rope_scale, None, "RoPE inside attention")
        self._refuse("rope_theta", rope_theta, None, "RoPE inside attention")
        self._refuse("block_tables", block_tables, None, "the trtllm-gen backend's page table")
        self._refuse("seq_lens", seq_lens, None, "the trtllm-gen backend's lengths")
        batch = indptr.shape[0] - 1
        starts = torch.arange(batch + 1, dtype=torch.int32) * q_len_per_req
        self._plan_pages(
            starts,
            indptr,
            indices,
            last_page_len,
            head_dim,
            page_size,
            sm_scale,
            window_left,
            logits_soft_cap,
        )

    def run(
        self,
        q: torch.Tensor,
        paged_kv_cache: torch.Tensor | tuple[torch.Tensor, torch.Tensor],
        *args: Any,
        q_scale: float | None = None,
        k_scale: Any = None,
        v_scale: Any = None,
        out: torch.Tensor | None = None,
        lse: torch.Tensor | None = None,
        return_lse: bool = False,
        enable_pdl: bool | None = None,
        window_left: int | None = None,
        sinks: torch.Tensor | None = None,
        q_len_per_req: int | None = None,
        skip_softmax_threshold_scale_factor: float | None = None,
        kv_cache_sf: Any = None,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Attention of q [B * q_len_per_req, Hq, D] over the planned batch (_PagedKVWrapper)."""
        del enable_pdl, q_len_per_req  # a launch detail; the plan has the query rows
        refused = {"q_scale": q_scale, "kv_cache_sf": kv_cache_sf}
        refused["skip_softmax_threshold_scale_factor"] = skip_softmax_threshold_scale_factor
        options = {"window_left": window_left, "sinks": sinks, "return_lse": return_lse}
        return self._run(q, paged_kv_cache, args, k_scale, v_scale, out, lse, refused, options)


class BatchPrefillWithPagedKVCacheWrapper(_PagedKVWrapper):
    """flashinfer.BatchPrefillWithPagedKVCacheWrapper: qo_indptr's query rows per request, the
    last of each request's keys (append attention), causal."""

    _name = "BatchPrefillWithPagedKVCacheWrapper"

    def __init__(
        self,
        float_workspace_buffer: torch.Tensor,
        kv_layout: str = "NHD",
        use_cuda_graph: bool = False,
        qo_indptr_buf: torch.Tensor | None = None,
        paged_kv_indptr_buf: torch.Tensor | None = None,
        paged_kv_indices_buf: torch.Tensor | None = None,
        paged_kv_last_page_len_buf: torch.Tensor | None = None,
        custom_mask_buf: torch.Tensor | None = None,
        mask_indptr_buf: torch.Tensor | None = None,
        backend: str = "auto",
        jit_args: list[Any] | None = None,
        jit_kwargs: dict[str, Any] | None = None,
    ) -> None:
        del float_workspace_buffer, use_cuda_graph, backend, qo_indptr_buf  # FlashInfer's
        del paged_kv_indptr_buf, paged_kv_indices_buf, paged_kv_last_page_len_buf, mask_indptr_buf
        self._refuse("custom_mask_buf", custom_mask_buf, None, "a custom mask")
        self._refuse("jit_args", jit_args, None, "arguments of a FlashInfer JIT kernel")
        self._refuse("jit_kwargs", jit_kwargs, None, "arguments of a FlashInfer JIT kernel")
        super().__init__(kv_layout)

    def plan(
        self,
        qo_indptr: torch.Tensor,
        paged_kv_indptr: torch.Tensor,
        paged_kv_indices: torch.Tensor,
        paged_kv_last_page_len: torch.Tensor,
        num_qo_heads: int,
        num_kv_heads: int,
        head_dim_qk: int,
        page_size: int,
        head_dim_vo: int | None = None,
        custom_mask: torch.Tensor | None = None,
        packed_custom_mask: torch.Tensor | None = None,
        causal: bool = False,
        pos_encoding_mode: str = "NONE",
        use_fp16_qk_reduction: bool = False,
        sm_scale: float | None = None,
        window_left: int = -1,
        logits_soft_cap: float | None = None,
        rope_scale: float | None = None,
        rope_theta: float | None = None,
        q_data_type: Any = "float16",
        kv_data_type: Any = None,
        o_data_type: Any = None,
        non_blocking: bool = True,
        prefix_len_ptr: torch.Tensor | None = None,
        token_pos_in_items_ptr: torch.Tensor | None = None,
        token_pos_in_items_len: int = 0,
        max_item_len_ptr: torch.Tensor | None = None,
        seq_lens: torch.Tensor | None = None,
        seq_lens_q: torch.Tensor | None = None,
        block_tables: torch.Tensor | None = None,
        max_token_per_sequence: int | None = None,
        max_sequence_kv: int | None = None,
        fixed_split_size: int | None = None,
        disable_split_kv: bool = False,
    ) -> None:
        """The batch's query rows, page table (CSR) and attention options, for run(). causal
        False is taken where every request has one query row (then both mean the same)."""
        del q_data_type, kv_data_type, o_data_type, non_blocking  # the tensors carry them
        del num_qo_heads, num_kv_heads  # so do q and the cache (the op checks both)
        del fixed_split_size, disable_split_kv, max_token_per_sequence, max_sequence_kv
        for name, value in (
            ("custom_mask", custom_mask),
            ("packed_custom_mask", packed_custom_mask),
        ):
            self._refuse(name, value, None, "a custom mask")
        for name, value in (
            ("prefix_len_ptr", prefix_len_ptr),
            ("token_pos_in_items_ptr", token_pos_in_items_ptr),
            ("max_item_len_ptr", max_item_len_ptr),
        ):
            self._refuse(name, value, None, "multi-item scoring")
        self._refuse("token_pos_in_items_len", token_pos_in_items_len, 0, "multi-item scoring")
        if head_dim_vo is not None:
            self._refuse("head_dim_vo", head_dim_vo, head_dim_qk, "a V head dim other than K's")
        self._refuse("pos_encoding_mode", pos_encoding_mode, "NONE", "RoPE inside attention")
        self._refuse("rope_scale", rope_scale, None, "RoPE inside attention")
        self._refuse("rope_theta", rope_theta, None, "RoPE inside attention")
        self._refuse("use_fp16_qk_reduction", use_fp16_qk_reduction, False, "float16 QK sums")
        for name, value in (("seq_lens", seq_lens), ("seq_lens_q", seq_lens_q)):
            self._refuse(name, value, None, "the trtllm-gen backend's lengths")
        self._refuse("block_tables", block_tables, None, "the trtllm-gen backend's page table")
        starts = qo_indptr.detach().to("cpu", torch.int64)
        if not causal and bool(((starts[1:] - starts[:-1]) > 1).any()):
            raise ValueError(
                f"{self._name}: causal: False with requests of several query rows: these kernels "
                "mask causally (pass causal=True)"
            )
        self._plan_pages(
            starts,
            paged_kv_indptr,
            paged_kv_indices,
            paged_kv_last_page_len,
            head_dim_qk,
            page_size,
            sm_scale,
            window_left,
            logits_soft_cap,
        )

    def run(
        self,
        q: torch.Tensor,
        paged_kv_cache: torch.Tensor | tuple[torch.Tensor, torch.Tensor],
        *args: Any,
        q_scale: float | None = None,
        k_scale: Any = None,
        v_scale: Any = None,
        out: torch.Tensor | None = None,
        lse: torch.Tensor | None = None,
        return_lse: bool = False,
        enable_pdl: bool | None = None,
        window_left: int | None = None,
        sinks: torch.Tensor | None = None,
        kv_cache_sf: Any = None,
        skip_softmax_threshold_scale_factor: float | None = None,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Attention of q [qo_indptr[-1], Hq, D] over the planned batch (_PagedKVWrapper)."""
        del enable_pdl  # a launch detail
        refused = {"q_scale": q_scale, "kv_cache_sf": kv_cache_sf}
        refused["skip_softmax_threshold_scale_factor"] = skip_softmax_threshold_scale_factor
        options = {"window_left": window_left, "sinks": sinks, "return_lse": return_lse}
        return self._run(q, paged_kv_cache, args, k_scale, v_scale, out, lse, refused, options)
