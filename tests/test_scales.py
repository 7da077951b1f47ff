"""k_scale / v_scale as float32 tensors (vLLM keeps them as device tensors that change at run time):
a scalar ([] or [1]) or one per KV head ([Hkv]). They are operands (k_scales, v_scales) read by
the kernels, so a new value neither retraces jax.jit nor recompiles torch.compile. Checked here
against an oracle that applies the scales to the cache itself, for attention and both cache writes,
on the torch CPU and XLA:CPU routes (CUDA where there is a GPU)."""

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
MIXED = ((1, 100), (17, 17), (40, 57), (3, 64))
SCALE = 1.0 / math.sqrt(D)
DEVICES = [
    "cpu",
    pytest.param(
        "cuda",
        marks=[
            pytest.mark.gpu,
            pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
        ],
    ),
]


def inputs(seed: int, dtype=torch.float32, device="cpu") -> dict:
    made = make_paged_inputs(MIXED, HQ, HKV, D, PAGE, dtype, seed, pad_tokens=2)
    return {name: made[name].to(device) for name in OPERANDS}


def scaled_cache(kv_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """The cache with its K heads times k [Hkv] and V heads times v: what attention with those
    dequantisation scales reads."""
    factors = torch.stack([k, v], dim=1).reshape(-1).to(kv_cache.device)  # K0, V0, K1, V1, ...
    return (kv_cache.double() * factors[None, None, :, None]).to(kv_cache.dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape", [(), (1,), (HKV,)], ids=["0d", "one", "per_head"])
def test_tensor_scales_read_as_scaling_the_cache(shape, device):
    seed = fresh_seed()
    data = inputs(seed, device=device)
    generator = torch.Generator().manual_seed(seed)
    k = torch.rand(shape, generator=generator) * 1.5 + 0.5
    v = torch.rand(shape, generator=generator) * 1.5 + 0.5
    args = [data[name] for name in OPERANDS]
    out = xla_gpu_ops.paged_attention(
        *args, scale=SCALE, k_scale=k.to(device), v_scale=v.to(device)
    )
    oracle_args = list(args)
    oracle_args[1] = scaled_cache(data["kv_cache"], k.expand(HKV), v.expand(HKV))
    expected = xla_gpu_ops.reference.paged_attention(
        *[a.cpu() for a in oracle_args], SCALE, compute_dtype=torch.float64
    )
    err = rel_l2(out, expected)
    assert err < 1e-5, f"rel L2 {err:.2e} (seed {seed})"
    if shape == ():  # a 0-d tensor is the float it holds
        same = xla_gpu_ops.paged_attention(*args, scale=SCALE, k_scale=k.item(), v_scale=v.item())
        assert rel_l2(out, same) < 1e-6


def test_jax_host_handler_takes_per_head_scales_and_jit_does_not_retrace():
    jax = pytest.importorskip("jax")
    import xla_gpu_ops.jax as xjax

    seed = fresh_seed()
    data = inputs(seed)
    arrays = [np.asarray(data[name]) for name in OPERANDS]
    traces = []

    @jax.jit
    def attend(k, v, *arrays):
        traces.append(1)
        return xjax.paged_attention(*arrays, scale=SCALE, k_scale=k, v_scale=v)

    first = np.array([0.5, 1.5], np.float32), np.array([2.0, 0.75], np.float32)
    second = np.array([1.25, 0.5], np.float32), np.array([0.5, 1.0], np.float32)
    for k, v in (first, second):
        out = attend(k, v, *arrays)
        cache = scaled_cache(data["kv_cache"], torch.from_numpy(k), torch.from_numpy(v))
        expected = xla_gpu_ops.reference.paged_attention(
            data["query"], cache, *[data[n] for n in OPERANDS[2:]], SCALE
        )
        assert rel_l2(torch.from_numpy(np.array(out)), expected) < 1e-5, f"seed {seed}"
    assert len(traces) == 1, "a new scale value retraced"


@pytest.mark.dynamo
def test_torch_compile_does_not_recompile_for_a_new_scale_value():
    data = inputs(fresh_seed())
    args = [data[name] for name in OPERANDS]
    torch._dynamo.reset()
    frames = torch._dynamo.utils.counters["stats"]
    before = frames["unique_graphs"]  # the counters add up over the whole session

    def attend(k, v, *args):
        return xla_gpu_ops.paged_attention(*args, scale=SCALE, k_scale=k, v_scale=v)

    compiled = torch.compile(attend, fullgraph=True, backend="eager")
    outs = []
    for values in ((0.5, 1.5), (1.25, 0.75)):
        k, v = torch.tensor(values), torch.tensor(values[::-1])
        outs.append(compiled(k, v, *args))
        torch.testing.assert_close(outs[-1], attend(k, v, *args))
    assert frames["unique_graphs"] - before == 1, "a new scale value recompiled"
    assert rel_l2(outs[0], outs[1]) > 1e-2  # the values were read


@pytest.mark.parametrize("op", ["kv_cache_update", "kv_cache_store"])
def test_cache_writes_divide_by_the_tensor_scales_per_head(op):
    seed = fresh_seed()
    generator = torch.Generator().manual_seed(seed)
    key, value = (torch.randn(5, HKV, D, generator=generator) for _ in range(2))
    slots = torch.tensor([3, 17, -1, 40, 9], dtype=torch.int32)
    k, v = torch.tensor([0.5, 2.0]), torch.tensor([4.0, 0.25])
    cache = torch.zeros(4, PAGE, 2 * HKV, D)
    if op == "kv_cache_update":
        new_kv = torch.stack([key, value], dim=2).reshape(5, 2 * HKV, D)
        xla_gpu_ops.kv_cache_update(new_kv, slots, cache, k_scale=k, v_scale=v)
    else:
        xla_gpu_ops.kv_cache_store(
            key=key, value=value, slot_mapping=slots, kv_cache=cache, k_scale=k, v_scale=v
        )
    rows = cache.view(-1, 2 * HKV, D)
    for n, slot in enumerate(slots.tolist()):
        if slot < 0:
            continue
        torch.testing.assert_close(rows[slot, 0::2], key[n] / k[:, None])
        torch.testing.assert_close(rows[slot, 1::2], value[n] / v[:, None])
    assert not rows[slots.max() + 1 :].any(), "wrote outside the slots"


def test_fp8_cache_round_trip_with_per_head_tensor_scales():
    """Write with per-head scales into an fp8 cache, read it back with the same tensors. The write
    rounds each value to the nearest e4m3 value of value / scale (the scales come from each head's
    amax, so none saturates); attention then reads exactly that dequantised cache."""
    seed = fresh_seed()
    data = inputs(seed)
    generator = torch.Generator().manual_seed(seed)
    # heads of different magnitudes (K0, V0, K1, V1), so per-head scales differ by 4x and more
    magnitudes = torch.tensor([1.0, 0.5, 0.25, 2.0])
    original = data["kv_cache"] * magnitudes[None, None, :, None]
    amax = original.abs().amax(dim=(0, 1, 3))
    fp8_max = torch.finfo(torch.float8_e4m3fn).max
    headroom = 1 + torch.rand(4, generator=generator)  # the amax lands in [fp8_max / 2, fp8_max]
    k, v = (amax / fp8_max * headroom)[0::2], (amax / fp8_max * headroom)[1::2]
    fp8 = torch.zeros_like(original, dtype=torch.float8_e4m3fn)
    rows = original.view(-1, 2 * HKV, D)
    slots = torch.arange(rows.shape[0], dtype=torch.int32)
    xla_gpu_ops.kv_cache_update(rows, slots, fp8, k_scale=k, v_scale=v)

    dequantised = scaled_cache(fp8.float(), k, v)
    factors = torch.stack([k, v], dim=1).reshape(-1)[None, None, :, None]
    # round to nearest: half an ulp, 2^-4 relative for normals, 2^-10 * scale below 2^-6 * scale
    bound = (original.abs() * 2**-4 + factors * 2**-10) * (1 + 1e-5)
    excess = ((dequantised - original).abs() - bound).max().item()
    assert excess <= 0, (
        f"a written value is off by {excess:.3e} more than fp8 rounding (seed {seed})"
    )

    args = [data[name] for name in OPERANDS]
    args[1] = fp8
    out = xla_gpu_ops.paged_attention(*args, scale=SCALE, k_scale=k, v_scale=v)
    args[1] = dequantised
    expected = xla_gpu_ops.reference.paged_attention(*args, SCALE, compute_dtype=torch.float64)
    err = rel_l2(out, expected)
    assert err < 1e-5, f"rel L2 {err:.2e} (seed {seed})"
    # the same cache read with scales swapped between the heads is far off: per head matters
    args[1] = fp8
    wrong = xla_gpu_ops.paged_attention(*args, scale=SCALE, k_scale=k.flip(0), v_scale=v.flip(0))
    assert rel_l2(wrong, expected) > 0.1


def test_bad_scale_tensors_name_the_argument():
    data = inputs(0)
    args = [data[name] for name in OPERANDS]
    with pytest.raises(ValueError, match=r"k_scale: a tensor must have 1 or num_kv_heads = 2"):
        xla_gpu_ops.paged_attention(*args, scale=SCALE, k_scale=torch.ones(3))
    with pytest.raises(ValueError, match=r"v_scale: a tensor must be float32"):
        xla_gpu_ops.paged_attention(*args, scale=SCALE, v_scale=torch.ones(2, dtype=torch.float16))
    with pytest.raises(TypeError, match=r"k_scale: a tensor here and k_scales as well"):
        xla_gpu_ops.paged_attention(
            *args, scale=SCALE, k_scale=torch.ones(2), k_scales=torch.ones(2)
        )
    cache = torch.zeros(4, PAGE, 2 * HKV, D)
    with pytest.raises(ValueError, match=r"kv_cache_update: v_scale: a tensor must have 1 or"):
        xla_gpu_ops.kv_cache_update(
            torch.zeros(1, 2 * HKV, D),
            torch.zeros(1, dtype=torch.int32),
            cache,
            v_scale=torch.ones(4),
        )
