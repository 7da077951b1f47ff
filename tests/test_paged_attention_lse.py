"""paged_attention's LSE (`return_lse=True`): each row's log-sum-exp of its logits, natural log,
sink included, -inf on padding rows; equal on every front end to a dense float64 oracle written
here. And its use: attending to two halves of each sequence's keys and merging them with
merge_attention_states gives the call over all the keys (vLLM's decode context parallelism)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from paged_inputs import fresh_seed, make_paged_inputs, rel_l2

import xla_gpu_ops
from xla_gpu_ops import _library

pytestmark = [
    pytest.mark.kernels,
    pytest.mark.skipif(not _library.is_built(), reason="libxla_gpu_ops.so is not built"),
]
OPERANDS = ("query", "kv_cache", "context_lens", "block_tables", "query_start_loc", "num_seqs")
HQ, HKV, D, PAGE = 8, 2, 64, 16
MIXED = ((1, 100), (17, 17), (1, 1), (40, 257), (3, 64))
# attributes and whether the call has sinks
VARIANTS = {
    "plain": ({}, False),
    "window_cap": ({"sliding_window": 9, "soft_cap": 5.0}, False),
    "sinks_k_scale": ({"k_scale": 0.5}, True),
}
SCALE = 1.0 / math.sqrt(D)


def dense_lse(inputs: dict, attrs: dict, sinks: torch.Tensor | None) -> torch.Tensor:
    """[T, Hq] float64: per row, log(sum over its visible keys of exp(logit)) [+ exp(sink)],
    logits = q.k * scale * k_scale, soft-capped; -inf where no sequence owns the row."""
    q, kv = inputs["query"].double(), inputs["kv_cache"].double()
    lens, tables = inputs["context_lens"].tolist(), inputs["block_tables"]
    starts, n = inputs["query_start_loc"].tolist(), int(inputs["num_seqs"][0])
    window, cap = attrs.get("sliding_window"), attrs.get("soft_cap")
    lse = torch.full(q.shape[:2], -math.inf, dtype=torch.float64)
    for s in range(n):
        q_len, ctx = starts[s + 1] - starts[s], lens[s]
        for r in range(q_len):
            pos = ctx - q_len + r
            first = 0 if window is None else max(0, pos - window + 1)
            keys = torch.stack(
                [kv[tables[s, k // PAGE], k % PAGE, 0::2] for k in range(first, pos + 1)]
            )  # [keys, Hkv, D]
            for h in range(HQ):
                logits = keys[:, h // (HQ // HKV)] @ q[starts[s] + r, h]
                logits = logits * SCALE * attrs.get("k_scale", 1.0)
                if cap is not None:
                    logits = cap * torch.tanh(logits / cap)
                if sinks is not None:
                    logits = torch.cat([logits, sinks[h : h + 1].double()])
                lse[starts[s] + r, h] = torch.logsumexp(logits, dim=0)
    return lse


def check_lse(lse, expected: torch.Tensor, tolerance: float) -> None:
    if not isinstance(lse, torch.Tensor):  # a JAX array
        lse = torch.from_numpy(np.array(lse))
    lse = lse.detach().double().cpu()
    assert lse.shape == expected.shape
    padding = expected == -math.inf
    assert torch.equal(lse == -math.inf, padding), "-inf exactly on the rows no sequence owns"
    err = (lse[~padding] - expected[~padding]).abs().max().item()
    assert err < tolerance, f"max |lse error| {err:.2e}"


def case(variant: str, seed: int):
    attrs, with_sinks = VARIANTS[variant]
    inputs = make_paged_inputs(
        MIXED, HQ, HKV, D, PAGE, torch.float32, seed, pad_tokens=3, sinks=with_sinks
    )
    sinks = inputs.pop("sinks", None)
    return inputs, {"scale": SCALE, **attrs}, sinks


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_torch_cpu_and_jax_host_lse_equal_the_dense_oracle(variant):
    seed = fresh_seed()
    inputs, attrs, sinks = case(variant, seed)
    expected = dense_lse(inputs, attrs, sinks)
    args = [inputs[name] for name in OPERANDS]
    out, lse = xla_gpu_ops.paged_attention(*args, **attrs, sinks=sinks, return_lse=True)
    assert lse.dtype == torch.float32
    check_lse(lse, expected, 1e-4)
    assert torch.equal(out, xla_gpu_ops.paged_attention(*args, **attrs, sinks=sinks))

    import xla_gpu_ops.jax as xjax

    arrays = [np.asarray(t) for t in args]
    jax_sinks = None if sinks is None else np.asarray(sinks)
    jax_out, jax_lse = xjax.paged_attention(*arrays, **attrs, sinks=jax_sinks, return_lse=True)
    check_lse(jax_lse, expected, 1e-4)
    assert rel_l2(torch.from_numpy(np.array(jax_out)), out) < 1e-5, f"seed {seed}"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_cuda_lse_equals_the_dense_oracle(variant, dtype):
    """Every kernel path writes the LSE: decode tiles, split merges, the prefill kernels (the
    40-token sequence), f32, and the fill of padding rows."""
    inputs, attrs, sinks = case(variant, fresh_seed())
    inputs = {k: v.to(dtype) if v.is_floating_point() else v for k, v in inputs.items()}
    expected = dense_lse(inputs, attrs, sinks)
    args = [inputs[name].cuda() for name in OPERANDS]
    sinks = None if sinks is None else sinks.cuda()
    _, lse = xla_gpu_ops.paged_attention(*args, **attrs, sinks=sinks, return_lse=True)
    check_lse(lse, expected, 1e-3 if dtype == torch.float32 else 2e-2)


def split_keys(inputs: dict, split: list[int]) -> tuple[dict, dict]:
    """The same decode rows over keys [0, split[s]) and [split[s], ctx) of each sequence (splits
    are page multiples): the second part's block table starts at page split[s] / PAGE."""
    first, second = dict(inputs), dict(inputs)
    lens = inputs["context_lens"]
    cut = torch.tensor(
        split + [0] * (len(lens) - len(split)), dtype=torch.int32, device=lens.device
    )
    first["context_lens"] = torch.minimum(cut, lens).to(torch.int32)
    second["context_lens"] = (lens - first["context_lens"]).to(torch.int32)
    tables = inputs["block_tables"].clone()
    for s, at in enumerate(split):
        pages = at // PAGE
        tables[s, : tables.shape[1] - pages] = inputs["block_tables"][s, pages:].clone()
    second["block_tables"] = tables
    return first, second


@pytest.mark.parametrize("device", ["cpu", "cuda"])
@pytest.mark.parametrize("with_sinks", [False, True], ids=["plain", "sinks"])
def test_merging_two_halves_of_the_keys_equals_one_call_over_all(device, with_sinks):
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    seed = fresh_seed()
    seqs = ((1, 100), (1, 300), (1, 48), (1, 129))
    split = [64, 160, 16, 128]
    inputs = make_paged_inputs(seqs, HQ, HKV, D, PAGE, torch.float32, seed, sinks=with_sinks)
    sinks = inputs.pop("sinks", None)
    inputs = {k: v.to(device) for k, v in inputs.items()}
    sinks = None if sinks is None else sinks.to(device)
    attrs = {"scale": SCALE, "soft_cap": 20.0}
    first, second = split_keys(inputs, split)

    def attend(parts: dict, sinks):
        args = [parts[name] for name in OPERANDS]
        return xla_gpu_ops.paged_attention(*args, **attrs, sinks=sinks, return_lse=True)

    out, lse = attend(inputs, sinks)
    out_a, lse_a = attend(first, sinks)  # the sink belongs to one part only
    out_b, lse_b = attend(second, None)
    merged, merged_lse = xla_gpu_ops.merge_attention_states(out_a, lse_a, out_b, lse_b)
    err = rel_l2(merged, out)
    assert err < 1e-5, f"rel L2 {err:.2e} (seed {seed})"
    assert (merged_lse - lse).abs().max().item() < 1e-4
    # each part alone is far from the whole: the merge did the work
    assert rel_l2(out_a, out) > 1e-2
    assert rel_l2(out_b, out) > 1e-2


def test_lse_is_asked_for_and_named():
    inputs, attrs, _ = case("plain", 0)
    args = [inputs[name] for name in OPERANDS]
    assert isinstance(xla_gpu_ops.paged_attention(*args, **attrs), torch.Tensor)
    out, lse = torch.ops.xla_gpu.paged_attention(*args, attrs["scale"])  # the op: both, always
    assert lse.shape == (out.shape[0], HQ)
    assert lse.dtype == torch.float32
    assert "return_lse (default False)" in xla_gpu_ops.paged_attention.__doc__
    # upstream's drop-in signature has no LSE: asking for one names the argument
    from xla_gpu_ops.compat.torch_xla import ragged_paged_attention

    with pytest.raises(TypeError, match="return_lse"):
        ragged_paged_attention(*args, sm_scale=SCALE, return_lse=True)
