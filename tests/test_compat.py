"""The drop-in call sites (xla_gpu_ops.compat): upstream's exact signatures, and upstream's own
reference functions on the same inputs (torch_xla's non-kernel path on XLA:CPU, JAX's
ref_ragged_paged_attention on the CPU) against ours."""

from __future__ import annotations

import ast
import inspect
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from paged_inputs import make_paged_inputs

import xla_gpu_ops
from xla_gpu_ops import _library

needs_library = pytest.mark.skipif(not _library.is_built(), reason="libxla_gpu_ops.so is not built")
OPERANDS = ("query", "kv_cache", "context_lens", "block_tables", "query_start_loc", "num_seqs")
# (seq specs (q_len, kv_len), Hq, Hkv, D, page size, keyword arguments of the call)
CASES = {
    "mixed": (((1, 37), (17, 17), (3, 64)), 8, 2, 64, 16, {"sm_scale": 0.125}),
    "window_cap": (((5, 40), (1, 23)), 4, 4, 64, 8, {"sliding_window": 9, "soft_cap": 5.0}),
}
UPSTREAM = {
    "torch_xla": ("torch_xla.experimental.custom_kernel", "ragged_paged_attention"),
    "jax": ("jax.experimental.pallas.ops.tpu.ragged_paged_attention", "ragged_paged_attention"),
}


def inputs(case: str) -> tuple[list[torch.Tensor], dict, int]:
    specs, hq, hkv, d, page, kwargs = CASES[case]
    made = make_paged_inputs(specs, hq, hkv, d, page, torch.float32, seed=3, pad_tokens=2)
    return [made[name] for name in OPERANDS], kwargs, sum(q for q, _ in specs)


def parameters(fn) -> list[tuple]:
    return [(p.name, p.kind, p.default) for p in inspect.signature(fn).parameters.values()]


@pytest.mark.parametrize("frontend", UPSTREAM)
def test_the_signature_is_upstreams(frontend):
    module, name = UPSTREAM[frontend]
    upstream = getattr(pytest.importorskip(module, reason=f"needs {module}"), name)
    ours = getattr(__import__(f"xla_gpu_ops.compat.{frontend}", fromlist=["_"]), name)
    assert parameters(ours) == parameters(upstream)


def test_each_adapter_imports_one_front_end():
    """compat modules sit on top of one front end each and import nothing else of the package."""
    folder = Path(xla_gpu_ops.__file__).parent / "compat"
    for frontend, front_end in (
        ("torch_xla", "torch_ops"),
        ("jax", "jax"),
        ("flashinfer", "torch_ops"),
    ):
        tree = ast.parse((folder / f"{frontend}.py").read_text())
        imported = {
            alias.name
            for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom) and node.module == "xla_gpu_ops"
            for alias in node.names
        }
        assert imported == {front_end}, frontend


@needs_library
@pytest.mark.torch_xla
@pytest.mark.parametrize("case", CASES)
def test_torch_xla_swap_matches_upstreams_reference(case):
    """One import swapped, the same call: upstream's non-kernel path (use_kernel=False) and ours
    on the same XLA:CPU tensors, and ours on CPU tensors."""
    torch_xla = pytest.importorskip("torch_xla", reason="needs torch_xla")
    from torch_xla.experimental.custom_kernel import ragged_paged_attention as upstream

    from xla_gpu_ops import _torch_xla_version as version

    if version.torch_xla_version() < version.FIRST_RELEASE_WITHOUT_CUDA:
        pytest.skip(
            "compat.torch_xla takes torch_xla 2.9's ragged_paged_attention; the 2.7 stack's is an "
            "older function with other arguments (no num_seqs, no sliding_window)"
        )

    from xla_gpu_ops.compat.torch_xla import ragged_paged_attention

    operands, kwargs, tokens = inputs(case)
    on_xla = [t.to(torch_xla.device()) for t in operands]
    want = upstream(*on_xla, **kwargs, use_kernel=False).cpu()[:tokens]
    got_xla = ragged_paged_attention(*on_xla, **kwargs).cpu()
    got_cpu = ragged_paged_attention(*operands, **kwargs, num_queries_per_block=8)
    for got in (got_xla, got_cpu):
        torch.testing.assert_close(got[:tokens], want, rtol=1e-5, atol=1e-5)
        assert (got[tokens:] == 0).all()


@needs_library
@pytest.mark.parametrize("case", CASES)
def test_jax_swap_matches_upstreams_reference(case):
    jax = pytest.importorskip("jax", reason="needs jax")
    from jax.experimental.pallas.ops.tpu import ragged_paged_attention as upstream

    from xla_gpu_ops.compat.jax import ragged_paged_attention

    operands, kwargs, tokens = inputs(case)
    arrays = [jax.device_put(t.numpy(), jax.devices("cpu")[0]) for t in operands]
    want = np.asarray(upstream.ref_ragged_paged_attention(*arrays, **kwargs))[:tokens]
    got = np.asarray(jax.jit(lambda *a: ragged_paged_attention(*a, **kwargs))(*arrays))
    np.testing.assert_allclose(got[:tokens], want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("mask_value", [0.0, -1.0, -1e20, float("nan")])
def test_a_mask_value_that_does_not_mask_is_refused(mask_value):
    from xla_gpu_ops.compat.torch_xla import ragged_paged_attention

    operands, kwargs, _ = inputs("mixed")
    with pytest.raises(ValueError, match=r"ragged_paged_attention: mask_value: .* does not mask"):
        ragged_paged_attention(*operands, **kwargs, mask_value=mask_value)


# ---------------------------------------------------------------------------- FlashInfer's wrappers
FI_WRAPPERS = ("BatchDecodeWithPagedKVCacheWrapper", "BatchPrefillWithPagedKVCacheWrapper")


def csr_batch(seed: int, q_lens, kv_lens, hq=8, hkv=2, d=64, page=16, dtype=torch.float32):
    """A batch in FlashInfer's form: q [rows, Hq, D], K and V caches [P, page, Hkv, D] (NHD),
    qo_indptr, and the page table in CSR form (indptr, shuffled indices, last_page_len)."""
    gen = torch.Generator().manual_seed(seed)
    pages = [-(-n // page) for n in kv_lens]
    num_pages = sum(pages) + 3  # and spare pages nobody reads
    order = torch.randperm(num_pages, generator=gen).to(torch.int32)
    indptr = torch.tensor([0, *np.cumsum(pages)], dtype=torch.int32)
    last = torch.tensor(
        [n - (p - 1) * page for n, p in zip(kv_lens, pages, strict=True)], dtype=torch.int32
    )
    k, v = (torch.randn(num_pages, page, hkv, d, generator=gen).to(dtype) for _ in range(2))
    q = torch.randn(sum(q_lens), hq, d, generator=gen).to(dtype)
    qo = torch.tensor([0, *np.cumsum(q_lens)], dtype=torch.int32)
    return q, k, v, qo, indptr, order[: int(indptr[-1])], last


def csr_attention(q, k, v, qo, indptr, indices, last, scale, window_left=-1, cap=None, sinks=None):
    """out [rows, Hq, D] and the natural-log LSE [rows, Hq] in float64, read from the CSR page
    table directly (request b's keys: pages indices[indptr[b]:indptr[b + 1]], the last one
    last[b] rows long), causal, each request's queries its last keys."""
    page, hkv = k.shape[1], k.shape[2]
    group = q.shape[1] // hkv
    out = torch.zeros(q.shape, dtype=torch.float64)
    lse = torch.zeros(q.shape[:2], dtype=torch.float64)
    for b in range(len(qo) - 1):
        pages = indices[indptr[b] : indptr[b + 1]].long()
        kv_len = (len(pages) - 1) * page + int(last[b])
        keys = k[pages].reshape(-1, hkv, k.shape[-1])[:kv_len].double().repeat_interleave(group, 1)
        vals = v[pages].reshape(-1, hkv, v.shape[-1])[:kv_len].double().repeat_interleave(group, 1)
        rows = q[qo[b] : qo[b + 1]].double()
        logits = torch.einsum("rhd,khd->hrk", rows, keys) * scale
        if cap:
            logits = cap * torch.tanh(logits / cap)
        pos = torch.arange(kv_len - len(rows), kv_len)[:, None]
        key = torch.arange(kv_len)[None, :]
        hidden = (key > pos) | ((pos - key > window_left) if window_left >= 0 else False)
        logits = logits.masked_fill(hidden, -torch.inf)
        if sinks is not None:
            logits = torch.cat([logits, sinks.double()[:, None, None].expand(-1, len(rows), 1)], 2)
        probs = torch.softmax(logits, dim=-1)[..., :kv_len]
        out[qo[b] : qo[b + 1]] = torch.einsum("hrk,khd->rhd", probs, vals)
        lse[qo[b] : qo[b + 1]] = torch.logsumexp(logits, dim=-1).T
    return out, lse


@pytest.mark.parametrize("wrapper", FI_WRAPPERS)
def test_flashinfer_signatures_are_upstreams(wrapper):
    flashinfer = pytest.importorskip("flashinfer", reason="needs flashinfer")
    from xla_gpu_ops.compat import flashinfer as ours

    for method in ("__init__", "plan", "run"):
        mine = getattr(getattr(ours, wrapper), method)
        theirs = inspect.unwrap(getattr(getattr(flashinfer, wrapper), method))
        assert parameters(mine) == parameters(theirs), f"{wrapper}.{method}"


def _caches(k, v, form: str):
    """The pair as FlashInfer takes it: a (k, v) tuple or one [P, 2, ...] tensor, NHD or HND."""
    if form.endswith("hnd"):
        k, v = k.transpose(1, 2).contiguous(), v.transpose(1, 2).contiguous()
    if form.startswith("tuple"):
        return (k, v)
    return torch.stack([k, v], dim=1)


@needs_library
@pytest.mark.parametrize("form", ["tuple", "one", "tuple-hnd", "one-hnd"])
@pytest.mark.parametrize("options", [{}, {"window_left": 20, "logits_soft_cap": 8.0}])
def test_flashinfer_prefill_wrapper_matches_the_csr_reference(options, form):
    from xla_gpu_ops.compat.flashinfer import BatchPrefillWithPagedKVCacheWrapper

    q, k, v, qo, indptr, indices, last = csr_batch(
        1, q_lens=(5, 1, 17, 40), kv_lens=(37, 16, 17, 90)
    )
    sinks = torch.randn(8, generator=torch.Generator().manual_seed(2))
    wrapper = BatchPrefillWithPagedKVCacheWrapper(torch.empty(0), "HND" if "hnd" in form else "NHD")
    wrapper.plan(qo, indptr, indices, last, 8, 2, 64, 16, causal=True, sm_scale=0.1, **options)
    out, lse = wrapper.run(q, _caches(k, v, form), sinks=sinks, return_lse=True)
    want, want_lse = csr_attention(
        q, k, v, qo, indptr, indices, last, 0.1, options.get("window_left", -1),
        options.get("logits_soft_cap"), sinks,
    )  # fmt: skip
    torch.testing.assert_close(out.double(), want, rtol=1e-5, atol=1e-5)
    # FlashInfer's LSE is in base 2
    torch.testing.assert_close(lse.double(), want_lse / math.log(2.0), rtol=1e-5, atol=1e-5)


@needs_library
@pytest.mark.parametrize("q_len_per_req", [1, 3])
def test_flashinfer_decode_wrapper_matches_the_csr_reference(q_len_per_req):
    """One token per request, and speculative decoding's q_len_per_req tokens; out= and lse=
    filled in place; a per-call window_left overrides the plan's."""
    from xla_gpu_ops.compat.flashinfer import BatchDecodeWithPagedKVCacheWrapper

    kv_lens = (37, 16, 4, 200)
    q_lens = (q_len_per_req,) * 4
    q, k, v, qo, indptr, indices, last = csr_batch(3, q_lens=q_lens, kv_lens=kv_lens)
    wrapper = BatchDecodeWithPagedKVCacheWrapper(torch.empty(0))
    wrapper.plan(indptr, indices, last, 8, 2, 64, 16, q_len_per_req=q_len_per_req)
    out, lse = torch.empty_like(q), torch.empty(q.shape[:2])
    got = wrapper.run(q, (k, v), out=out, lse=lse, return_lse=True, window_left=7)
    assert got[0] is out
    assert got[1] is lse
    want, want_lse = csr_attention(q, k, v, qo, indptr, indices, last, 1 / 8, window_left=7)
    torch.testing.assert_close(out.double(), want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(lse.double(), want_lse / math.log(2.0), rtol=1e-5, atol=1e-5)


@needs_library
def test_flashinfer_wrappers_refuse_what_the_kernels_do_not_compute():
    from xla_gpu_ops.compat.flashinfer import (
        BatchDecodeWithPagedKVCacheWrapper,
        BatchPrefillWithPagedKVCacheWrapper,
    )

    q, k, v, qo, indptr, indices, last = csr_batch(4, q_lens=(5, 1), kv_lens=(37, 16))
    prefill = BatchPrefillWithPagedKVCacheWrapper(torch.empty(0))
    with pytest.raises(RuntimeError, match=r"run\(\) before plan\(\)"):
        prefill.run(q, (k, v))
    plan = (qo, indptr, indices, last, 8, 2, 64, 16)
    with pytest.raises(ValueError, match="causal: False with requests of several query rows"):
        prefill.plan(*plan)
    with pytest.raises(ValueError, match="pos_encoding_mode: RoPE inside attention"):
        prefill.plan(*plan, causal=True, pos_encoding_mode="ROPE_LLAMA")
    with pytest.raises(ValueError, match="custom_mask: a custom mask"):
        prefill.plan(*plan, causal=True, custom_mask=torch.ones(3, dtype=torch.bool))
    with pytest.raises(ValueError, match="head_dim_vo: a V head dim other than K's"):
        prefill.plan(*plan, causal=True, head_dim_vo=128)
    prefill.plan(*plan, causal=True)
    with pytest.raises(ValueError, match="q_scale: a query scale"):
        prefill.run(q, (k, v), q_scale=0.5)
    with pytest.raises(ValueError, match="kv_layout: 'NDH' is neither"):
        BatchDecodeWithPagedKVCacheWrapper(torch.empty(0), "NDH")
    decode = BatchDecodeWithPagedKVCacheWrapper(torch.empty(0))
    with pytest.raises(ValueError, match=r"indptr: requests \[1\] have no page"):
        decode.plan(torch.tensor([0, 3, 3], dtype=torch.int32), indices, last, 8, 2, 64, 16)
    with pytest.raises(ValueError, match=r"last_page_len: entries must be in \[1, 16\]"):
        decode.plan(indptr, indices, last * 0, 8, 2, 64, 16)


@needs_library
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("wrapper", FI_WRAPPERS)
def test_flashinfer_swap_matches_flashinfer_on_cuda(wrapper):
    """The same plan() and run() calls on FlashInfer's wrapper and ours, bf16 on the GPU: the
    outputs and the base-2 LSEs agree (FlashInfer builds its kernel on first use)."""
    flashinfer = pytest.importorskip("flashinfer", reason="needs flashinfer")
    from xla_gpu_ops.compat import flashinfer as ours

    decode = wrapper.startswith("BatchDecode")
    q_lens = (1, 1, 1, 1) if decode else (5, 1, 17, 40)
    batch = csr_batch(5, q_lens=q_lens, kv_lens=(37, 16, 17, 300), d=128, dtype=torch.bfloat16)
    q, k, v, qo, indptr, indices, last = (t.cuda() for t in batch)
    options = {"window_left": 50, "logits_soft_cap": 30.0, "sm_scale": 0.09}
    plan = (
        (indptr, indices, last, 8, 2, 128, 16)
        if decode
        else (qo, indptr, indices, last, 8, 2, 128, 16)
    )
    results = []
    for module in (flashinfer, ours):
        workspace = torch.zeros(128 * 1024 * 1024, dtype=torch.uint8, device="cuda")
        instance = getattr(module, wrapper)(workspace, "NHD")
        extra = (
            {"q_data_type": torch.bfloat16}
            if decode
            else {"causal": True, "q_data_type": torch.bfloat16}
        )
        instance.plan(*plan, **options, **extra)
        results.append(instance.run(q, (k, v), return_lse=True))
    (theirs, their_lse), (mine, my_lse) = results
    err = ((mine.float() - theirs.float()).norm() / theirs.float().norm()).item()
    assert err < 1e-2, f"rel L2 {err:.2e}"
    torch.testing.assert_close(my_lse, their_lse, rtol=1e-3, atol=1e-2)
