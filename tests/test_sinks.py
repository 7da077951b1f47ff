"""Attention sinks (gpt-oss) on the front ends that run on a CPU: the reference against the
formula written out, the torch op and its wrapper (CPU reference, opcheck), JAX on the XLA:CPU
host handler, both with an fp8 cache too, torch_xla's composite and custom call, and the errors
that name `sinks`. Elsewhere: the CUDA kernels (tests/test_kernels_cuda.py), torchax (tests/test_torchax.py),
torch.compile (tests/test_compile_wrappers.py), the split by KV head (tests/test_sharding.py).

Semantics (docs/DESIGN.md): head h's sink is one more logit in each of h's rows, after scale,
soft cap and mask, that joins the softmax and is dropped after it:
out = sum_k exp(s_k - m) v_k / (sum_k exp(s_k - m) + exp(sink_h - m)), m = max(max_k s_k, sink_h).
"""

from __future__ import annotations

import functools
import importlib.util
import math

import numpy as np
import pytest
import torch
from paged_inputs import (
    DECODE,
    MIXED,
    PREFILL,
    fresh_seed,
    make_paged_inputs,
    rel_l2,
    to_jax_arrays,
)

import xla_gpu_ops
from xla_gpu_ops import _library, ops, reference

needs_library = pytest.mark.skipif(
    not _library.is_built(), reason="libxla_gpu_ops.so is not built (nox -s build)"
)
SPECS = {"decode": DECODE, "prefill": PREFILL, "mixed": MIXED}
REQUIRED = ops.PAGED_ATTENTION.operand_names[: ops.PAGED_ATTENTION.num_required]


def written_out(inputs, scale, sliding_window=None, soft_cap=None):
    """The formula above, one row at a time in float64 (no softmax call, no concatenation)."""
    q, kv, sinks = inputs["query"].double(), inputs["kv_cache"].double(), inputs["sinks"].double()
    num_kv_heads = kv.shape[2] // 2
    group = q.shape[1] // num_kv_heads
    out = torch.zeros_like(q)
    starts = inputs["query_start_loc"].tolist()
    for seq in range(int(inputs["num_seqs"][0])):
        kv_len = int(inputs["context_lens"][seq])
        rows = kv[inputs["block_tables"][seq].long()].reshape(-1, 2 * num_kv_heads, q.shape[2])
        q_len = starts[seq + 1] - starts[seq]
        for r in range(q_len):
            pos = kv_len - q_len + r
            first = 0 if sliding_window is None else max(0, pos - sliding_window + 1)
            for h in range(q.shape[1]):
                keys = rows[first : pos + 1, 2 * (h // group)]
                values = rows[first : pos + 1, 2 * (h // group) + 1]
                logits = keys @ q[starts[seq] + r, h] * scale
                if soft_cap is not None:
                    logits = soft_cap * torch.tanh(logits / soft_cap)
                m = max(logits.max().item(), sinks[h].item())
                weights = torch.exp(logits - m)
                denominator = weights.sum() + math.exp(sinks[h].item() - m)
                out[starts[seq] + r, h] = weights @ values / denominator
    return out


@pytest.mark.parametrize(("sliding_window", "soft_cap"), [(None, None), (5, None), (None, 3.0)])
@pytest.mark.parametrize("kind", list(SPECS))
def test_reference_is_the_formula(kind, sliding_window, soft_cap):
    seed = fresh_seed()
    inputs = make_paged_inputs(SPECS[kind], 4, 2, 64, 8, torch.float64, seed, sinks=True)
    attrs = {"scale": 0.125, "sliding_window": sliding_window, "soft_cap": soft_cap}
    got = reference.paged_attention(**inputs, **attrs, compute_dtype=torch.float64)
    want = written_out(inputs, **attrs)
    assert rel_l2(got, want) < 1e-12, f"seed {seed}"
    without = reference.paged_attention(**{**inputs, "sinks": None}, **attrs)
    assert rel_l2(got, without.double()) > 1e-3, "the sinks changed nothing (seed {seed})"


@needs_library
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("kind", list(SPECS))
def test_torch_cpu_op_and_wrapper(kind, dtype):
    seed = fresh_seed()
    inputs = make_paged_inputs(SPECS[kind], 8, 2, 64, 16, dtype, seed, pad_tokens=2, sinks=True)
    expected = reference.paged_attention(**inputs, scale=0.1, compute_dtype=torch.float64)
    op = torch.ops.xla_gpu.paged_attention(**inputs, scale=0.1)[0]
    wrapper = xla_gpu_ops.paged_attention(
        *(inputs[n] for n in REQUIRED), scale=0.1, sinks=inputs["sinks"], validate=True
    )
    assert torch.equal(op, wrapper)
    assert rel_l2(op, expected) < (1e-6 if dtype == torch.float32 else 1e-2), f"seed {seed}"
    # sinks=None and an empty sinks tensor are "no sinks"
    plain = xla_gpu_ops.paged_attention(*(inputs[n] for n in REQUIRED), scale=0.1)
    assert torch.equal(
        plain, xla_gpu_ops.paged_attention(*(inputs[n] for n in REQUIRED), scale=0.1, sinks=None)
    )
    assert torch.equal(
        plain,
        torch.ops.xla_gpu.paged_attention(
            *(inputs[n] for n in REQUIRED), 0.1, sinks=torch.empty(0)
        )[0],
    )


@needs_library
def test_opcheck_with_sinks():
    inputs = make_paged_inputs(MIXED, 8, 2, 64, 16, torch.float32, fresh_seed(), sinks=True)
    args = [*(inputs[n] for n in REQUIRED), 0.125, None, 4.0, None, None, "NHD", inputs["sinks"]]
    torch.library.opcheck(torch.ops.xla_gpu.paged_attention.default, args)


@needs_library
@pytest.mark.parametrize(
    ("sinks", "error", "match"),
    [
        (torch.zeros(8, dtype=torch.float64), TypeError, "paged_attention: sinks: dtype"),
        (torch.zeros(5), ValueError, r"paged_attention: sinks: shape must be \(8,\)"),
        (
            torch.zeros(1, 8),
            ValueError,
            r"paged_attention: sinks: expected rank 1, got shape \(1, 8\)",
        ),
        ("no", TypeError, "paged_attention: sinks: expected a torch.Tensor"),
    ],
    ids=["dtype", "shape", "rank", "not_a_tensor"],
)
def test_bad_sinks_are_named(sinks, error, match):
    inputs = make_paged_inputs(DECODE, 8, 2, 64, 16, torch.float32, fresh_seed())
    with pytest.raises(error, match=match):
        xla_gpu_ops.paged_attention(*(inputs[n] for n in REQUIRED), scale=0.1, sinks=sinks)


@needs_library
@pytest.mark.skipif(importlib.util.find_spec("jax") is None, reason="needs jax")
@pytest.mark.parametrize("kind", list(SPECS))
def test_jax_host_handler(kind):
    import jax

    from xla_gpu_ops import jax as xgo_jax

    seed = fresh_seed()
    inputs = make_paged_inputs(
        SPECS[kind], 8, 2, 64, 16, torch.float32, seed, pad_tokens=2, sinks=True
    )
    arrays = {k: jax.numpy.asarray(v.numpy()) for k, v in inputs.items()}
    fn = jax.jit(functools.partial(xgo_jax.paged_attention, scale=0.1, soft_cap=5.0))
    out = torch.from_numpy(np.array(fn(**arrays)))
    expected = reference.paged_attention(
        **inputs, scale=0.1, soft_cap=5.0, compute_dtype=torch.float64
    )
    assert rel_l2(out, expected) < 1e-5, f"seed {seed}"
    text = fn.lower(**arrays).as_text()
    assert "tensor<8xf32>" in text, "the sinks operand of the custom call"
    with pytest.raises(ValueError, match=r"paged_attention: sinks: shape must be \(8,\)"):
        fn(**{**arrays, "sinks": jax.numpy.zeros(3)})


@needs_library
@pytest.mark.skipif(importlib.util.find_spec("torch_xla") is None, reason="needs torch_xla")
def test_torch_xla_composite_and_custom_call(monkeypatch):
    """On XLA:CPU the composite runs (equal to the reference); the custom call carries sinks as
    its seventh operand, f32[Hq] (f32[0] without)."""
    import torch_xla

    from xla_gpu_ops import torch_xla as xgo_torch_xla

    seed = fresh_seed()
    inputs = make_paged_inputs(MIXED, 8, 2, 64, 16, torch.float32, seed, pad_tokens=2, sinks=True)
    device = torch_xla.device()
    on_xla = {k: v.to(device) for k, v in inputs.items()}
    monkeypatch.setenv(xgo_torch_xla.IMPL_ENV, "composite")
    out = xla_gpu_ops.paged_attention(
        *(on_xla[n] for n in REQUIRED), scale=0.1, sinks=on_xla["sinks"]
    ).cpu()
    expected = reference.paged_attention(**inputs, scale=0.1, compute_dtype=torch.float64)
    assert rel_l2(out, expected) < 1e-5, f"seed {seed}"
    monkeypatch.setenv(xgo_torch_xla.IMPL_ENV, "custom_call")
    monkeypatch.setenv(xgo_torch_xla.ABI_ENV, "ffi")
    for sinks, operand in ((on_xla["sinks"], "f32[8]"), (None, "f32[0]")):
        lazy = torch.ops.xla_gpu.paged_attention(*(on_xla[n] for n in REQUIRED), 0.1, sinks=sinks)[
            0
        ]
        hlo = torch_xla._XLAC._get_xla_tensors_hlo([lazy])
        line = next(x for x in hlo.splitlines() if ops.PAGED_ATTENTION.ffi_target in x)
        assert f"{operand}" in line.split("custom-call(")[1], line


@needs_library
@pytest.mark.parametrize("front_end", ["torch", "jax"])
def test_fp8_cache_with_sinks(front_end):
    """An fp8 cache with k_scale / v_scale and sinks together: the torch CPU op and JAX's XLA:CPU
    host handler against the reference (which dequantises the same bytes)."""
    seed = fresh_seed()
    inputs = make_paged_inputs(MIXED, 8, 2, 64, 16, torch.bfloat16, seed, pad_tokens=2, sinks=True)
    inputs["kv_cache"] = (inputs["kv_cache"].float() * 40.0).to(torch.float8_e4m3fn)
    attrs = {"scale": 0.1, "k_scale": 0.025, "v_scale": 0.5}
    expected = reference.paged_attention(**inputs, **attrs, compute_dtype=torch.float64)
    plain = reference.paged_attention(
        **{**inputs, "sinks": None}, **attrs, compute_dtype=torch.float64
    )
    assert rel_l2(expected, plain) > 1e-2, f"the sinks changed nothing (seed {seed})"
    if front_end == "torch":
        out = xla_gpu_ops.paged_attention(**inputs, **attrs).float()
    else:
        if importlib.util.find_spec("jax") is None:
            pytest.skip("needs jax")
        import jax
        import jax.numpy as jnp

        from xla_gpu_ops import jax as xgo_jax

        arrays = dict(zip(inputs, to_jax_arrays(inputs, jax.devices("cpu")[0]), strict=True))
        out = xgo_jax.paged_attention(**arrays, **attrs)
        out = torch.from_numpy(np.array(out.astype(jnp.float32)))
    assert rel_l2(out, expected) < 1e-2, f"seed {seed}"
