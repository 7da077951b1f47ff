"""Serving features: the in-place KV-cache write (kv_cache_update), fp8 KV caches and the
dequantisation scales of paged_attention, on every front end that runs here; the CUDA halves
skip without a GPU.

The write's oracle is a plain loop over tokens (independent of the vectorised reference); fp8
rounding is torch's float -> float8_e4m3fn conversion after clamping to +-448, compared bit for
bit."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
import torch
from paged_inputs import (
    MIXED,
    fresh_seed,
    make_cache_write_inputs,
    make_paged_inputs,
    rel_l2,
    to_jax_arrays,
)

import xla_gpu_ops
from xla_gpu_ops import _library, ops, reference

pytestmark = pytest.mark.skipif(not _library.is_built(), reason="needs the built library")
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
needs_jax = pytest.mark.skipif(importlib.util.find_spec("jax") is None, reason="needs jax")
needs_torch_xla = pytest.mark.skipif(
    importlib.util.find_spec("torch_xla") is None, reason="needs torch_xla"
)
FP8 = torch.float8_e4m3fn


cache_case = make_cache_write_inputs  # (new_kv, slot_mapping, kv_cache) with padding slots


def loop_oracle(new_kv, slots, cache, k_scale=None, v_scale=None):
    """Token by token, head by head: what the op must write."""
    out = cache.clone()
    rows = out.view(-1, *out.shape[2:])
    for n, slot in enumerate(slots.tolist()):
        if slot < 0:
            continue
        for h in range(new_kv.shape[1]):
            scale = (k_scale or 1.0) if h % 2 == 0 else (v_scale or 1.0)
            value = new_kv[n, h].float() / scale
            if cache.dtype == FP8:
                value = value.clamp(-448.0, 448.0)
            rows[slot, h] = value.to(cache.dtype)
    return out


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.dtype == FP8:
        a, b = a.view(torch.uint8), b.view(torch.uint8)
    return torch.equal(a.cpu(), b.cpu())


# ---------------------------------------------------------------------------- torch, CPU
@pytest.mark.parametrize(
    ("dtype", "cache_dtype", "slot_dtype", "scales"),
    [
        (torch.float32, None, torch.int32, (None, None)),
        (torch.bfloat16, None, torch.int64, (None, None)),
        (torch.float16, None, torch.int32, (2.0, 0.25)),
        (torch.bfloat16, FP8, torch.int32, (0.5, 4.0)),
        (torch.float32, FP8, torch.int64, (None, None)),
    ],
)
def test_kv_cache_update_writes_only_its_slots_in_place(dtype, cache_dtype, slot_dtype, scales):
    seed = fresh_seed()
    new_kv, slots, cache = cache_case(seed, dtype, cache_dtype, slot_dtype, scale=300.0)
    expected = loop_oracle(new_kv, slots, cache, *scales)
    pointer = cache.data_ptr()
    returned = xla_gpu_ops.kv_cache_update(
        new_kv, slots, cache, k_scale=scales[0], v_scale=scales[1]
    )
    assert returned is None
    assert cache.data_ptr() == pointer
    assert same_bits(cache, expected), f"seed {seed}"


def test_kv_cache_update_rejects_a_slot_past_the_cache():
    new_kv, slots, cache = cache_case(fresh_seed())
    slots[3] = cache.shape[0] * cache.shape[1]
    before = cache.clone()
    with pytest.raises(
        ValueError, match=r"slot_mapping: token 3 goes to slot 112, outside \[0, 112\)"
    ):
        xla_gpu_ops.kv_cache_update(new_kv, slots, cache)
    assert torch.equal(cache, before), "a rejected call wrote nothing"


@pytest.mark.parametrize(
    ("change", "error", "match"),
    [
        (lambda a: {**a, "new_kv": a["new_kv"].to(FP8)}, TypeError, "new_kv: dtype float8_e4m3fn"),
        (lambda a: {**a, "kv_cache": a["kv_cache"].half()}, TypeError, "kv_cache: dtype float16"),
        (lambda a: {**a, "slot_mapping": a["slot_mapping"].float()}, TypeError, "slot_mapping"),
        (lambda a: {**a, "slot_mapping": a["slot_mapping"][:-1]}, ValueError, "slot_mapping: 39"),
        (lambda a: {**a, "new_kv": a["new_kv"][:, :4]}, ValueError, "new_kv: rows of shape"),
        (lambda a: {**a, "kv_cache": a["kv_cache"][0]}, ValueError, "kv_cache: expected rank 4"),
        (lambda a: {**a, "k_scale": 0.0}, ValueError, "k_scale: must be > 0"),
        # 3 KV heads here: a scale tensor has 1 or 3 entries
        (lambda a: {**a, "v_scale": torch.ones(2)}, ValueError, "v_scale: a tensor must have 1"),
    ],
)
def test_kv_cache_update_rejects_bad_input(change, error, match):
    new_kv, slots, cache = cache_case(fresh_seed())
    args = change({"new_kv": new_kv, "slot_mapping": slots, "kv_cache": cache})
    with pytest.raises(error, match=match):
        xla_gpu_ops.kv_cache_update(**args)


def test_opcheck_kv_cache_update():
    new_kv, slots, cache = cache_case(fresh_seed(), torch.float32)
    torch.library.opcheck(torch.ops.xla_gpu.kv_cache_update.default, (new_kv, slots, cache, 2.0))


# ---------------------------------------------------------------------------- attention scales
def test_scales_mean_scaled_keys_and_values():
    """k_scale and v_scale are the dequantisation of K and V: the same as scaling them."""
    inputs = make_paged_inputs(MIXED, 8, 2, 64, 16, torch.float64, seed=fresh_seed())
    kv = inputs["kv_cache"].clone()
    kv[:, :, 0::2] *= 3.0
    kv[:, :, 1::2] *= 0.5
    scaled = reference.paged_attention(
        **{**inputs, "kv_cache": kv}, scale=0.1, compute_dtype=torch.float64
    )
    with_attrs = reference.paged_attention(
        **inputs, scale=0.1, k_scale=3.0, v_scale=0.5, compute_dtype=torch.float64
    )
    torch.testing.assert_close(with_attrs, scaled, rtol=1e-12, atol=1e-12)


def fp8_case(seed):
    inputs = make_paged_inputs(MIXED, 8, 2, 64, 16, torch.bfloat16, seed=seed, pad_tokens=2)
    inputs["kv_cache"] = (inputs["kv_cache"].float() * 40.0).to(FP8)
    return inputs


def test_fp8_cache_through_the_torch_cpu_op():
    seed = fresh_seed()
    inputs = fp8_case(seed)
    expected = reference.paged_attention(
        **inputs, scale=0.1, k_scale=0.025, v_scale=0.025, compute_dtype=torch.float64
    )
    out = xla_gpu_ops.paged_attention(**inputs, scale=0.1, k_scale=0.025, v_scale=0.025)
    assert out.dtype == torch.bfloat16
    error = ((out.double() - expected.double()).norm() / expected.double().norm()).item()
    assert error < 1e-2, f"seed {seed}: {error}"


def test_fp8_query_is_rejected_naming_it():
    inputs = fp8_case(fresh_seed())
    inputs["query"] = inputs["query"].float().to(FP8)
    with pytest.raises(TypeError, match="paged_attention: query: dtype float8_e4m3fn"):
        xla_gpu_ops.paged_attention(**inputs, scale=0.1)


# ---------------------------------------------------------------------------- JAX
def jax_gpus() -> list:
    if importlib.util.find_spec("jax") is None:
        return []
    import jax

    try:
        return jax.devices("gpu")
    except RuntimeError:  # no GPU platform
        return []


@needs_jax
@pytest.mark.gpu
@pytest.mark.skipif(not jax_gpus(), reason="needs a CUDA GPU visible to jax")
def test_jax_gpu_fp8_attention_equals_the_host_handler():
    """The same fp8 bytes through the CUDA handler and the XLA:CPU handler."""
    import jax
    import jax.numpy as jnp

    from xla_gpu_ops import jax as xgo_jax

    seed = fresh_seed()
    inputs = fp8_case(seed)
    attrs = {"scale": 0.1, "k_scale": 0.025, "v_scale": 0.5}
    outs = [
        np.array(xgo_jax.paged_attention(*to_jax_arrays(inputs, d), **attrs).astype(jnp.float32))
        for d in (jax_gpus()[0], jax.devices("cpu")[0])
    ]
    error = np.linalg.norm(outs[0] - outs[1]) / np.linalg.norm(outs[1])
    assert error < 1e-2, f"seed {seed}: {error}"


@needs_jax
def test_jax_host_handler_fp8_attention_and_cache_write():
    import jax
    import jax.numpy as jnp

    from xla_gpu_ops import jax as xgo_jax

    seed = fresh_seed()
    inputs = fp8_case(seed)
    cpu = jax.devices("cpu")[0]
    arrays = to_jax_arrays(inputs, cpu)
    out = xgo_jax.paged_attention(*arrays, scale=0.1, k_scale=0.025, v_scale=0.5)
    expected = reference.paged_attention(
        **inputs, scale=0.1, k_scale=0.025, v_scale=0.5, compute_dtype=torch.float64
    )
    actual = torch.from_numpy(np.array(out.astype(jnp.float32)))
    error = ((actual.double() - expected.double()).norm() / expected.double().norm()).item()
    assert error < 1e-2, f"seed {seed}: {error}"

    new_kv, slots, cache = cache_case(seed, torch.bfloat16, FP8, scale=300.0)
    expected_cache = loop_oracle(new_kv, slots, cache, 0.5, 4.0)
    operands = to_jax_arrays({"new_kv": new_kv, "slots": slots, "cache": cache}, cpu)
    written = xgo_jax.kv_cache_update(*operands, k_scale=0.5, v_scale=4.0)
    assert np.array_equal(
        np.asarray(written).view(np.uint8), expected_cache.view(torch.uint8).numpy()
    )


@needs_jax
def test_jax_cache_write_aliases_and_with_donation_copies_nothing():
    import jax

    from xla_gpu_ops import jax as xgo_jax

    arrays = ops.KV_CACHE_UPDATE.sample(False)
    sample = [arrays[name] for name in ("new_kv", "slot_mapping", "kv_cache")]
    fn = jax.jit(lambda a, b, c: xgo_jax.kv_cache_update(a, b, c), donate_argnums=2)
    text = fn.lower(*sample).compile().as_text()
    call = next(line for line in text.splitlines() if "xla_gpu_kv_cache_update" in line)
    # the cache (result 0) aliases its operand; value_cache, left out, is no operand to alias
    assert "output_to_operand_aliasing={{0}: (2, {})}" in call, call
    assert "input_output_alias" in text  # the donated cache is the program's output buffer
    assert not [line for line in text.splitlines() if " copy(" in line or "copy-start" in line], (
        text
    )


@needs_jax
def test_jax_host_handler_rejects_a_slot_past_the_cache():
    import jax

    from xla_gpu_ops import jax as xgo_jax

    new_kv, slots, cache = (np.asarray(t) for t in cache_case(fresh_seed(), torch.float32))
    slots = slots.copy()
    slots[5] = 10_000
    # on the host device even where a GPU is present: the GPU kernel skips such a slot instead
    cpu = jax.devices("cpu")[0]
    new_kv, slots, cache = (jax.device_put(a, cpu) for a in (new_kv, slots, cache))
    with pytest.raises(
        Exception, match="kv_cache_update: slot_mapping: token 5 goes to slot 10000"
    ):
        jax.block_until_ready(xgo_jax.kv_cache_update(new_kv, slots, cache))


# ---------------------------------------------------------------------------- torchax, torch_xla
@pytest.mark.torchax
@pytest.mark.skipif(importlib.util.find_spec("torchax") is None, reason="needs torchax")
def test_torchax_cache_write_updates_the_tensor_in_place():
    import torchax

    from xla_gpu_ops import torchax as xgo_torchax

    xgo_torchax.register()
    new_kv, slots, cache = cache_case(fresh_seed(), torch.float32)
    expected = loop_oracle(new_kv, slots, cache, 2.0, None)
    env = torchax.default_env()
    with env:
        device_cache = cache.to("jax")
        torch.ops.xla_gpu.kv_cache_update(new_kv.to("jax"), slots.to("jax"), device_cache, 2.0)
        written = torch.from_numpy(np.array(device_cache.jax()))
    assert torch.equal(written, expected)


@pytest.mark.torchax
@pytest.mark.skipif(importlib.util.find_spec("torchax") is None, reason="needs torchax")
def test_torchax_fp8_attention_equals_the_reference():
    """fp8 attention through torchax on jax's default device (XLA:CPU here, CUDA on a GPU host)."""
    import jax.numpy as jnp
    import torchax

    from xla_gpu_ops import torchax as xgo_torchax

    xgo_torchax.register()
    seed = fresh_seed()
    inputs = fp8_case(seed)
    expected = reference.paged_attention(
        **inputs, scale=0.1, k_scale=0.025, v_scale=0.5, compute_dtype=torch.float64
    )
    with torchax.default_env():
        operands = [t.to("jax") for t in inputs.values()]
        out = torch.ops.xla_gpu.paged_attention(*operands, 0.1, None, None, 0.025, 0.5)[0]
        actual = torch.from_numpy(np.array(out.jax().astype(jnp.float32)))
    assert rel_l2(actual, expected) < 1e-2, f"seed {seed}"


def torch_xla_version() -> tuple[int, int]:
    from xla_gpu_ops import torch_xla as binding

    return binding.torch_xla_version()


@needs_torch_xla
@pytest.mark.torch_xla
@pytest.mark.parametrize("dtype", [torch.float32, FP8])
def test_torch_xla_composite_cache_write_in_place(dtype):
    import torch_xla

    if dtype == FP8 and torch_xla_version() < (2, 9):
        pytest.skip("fp8 caches need torch_xla >= 2.9 (the refusal is tested below)")
    device = torch_xla.device()
    seed = fresh_seed()
    new_kv, slots, cache = cache_case(seed, torch.float32, dtype, scale=300.0)
    expected = loop_oracle(new_kv, slots, cache, 0.5, None)
    on_device = cache.to(device)
    torch.ops.xla_gpu.kv_cache_update(new_kv.to(device), slots.to(device), on_device, 0.5)
    assert same_bits(on_device.cpu(), expected), f"seed {seed}"


@needs_torch_xla
@pytest.mark.torch_xla
def test_torch_xla_before_2_9_refuses_an_fp8_cache_write():
    import torch_xla

    if torch_xla_version() >= (2, 9):
        pytest.skip("torch_xla >= 2.9 writes fp8 caches (tested above)")
    device = torch_xla.device()
    new_kv, slots, cache = cache_case(fresh_seed(), torch.float32, FP8)
    with pytest.raises(TypeError, match=r"kv_cache: float8_e4m3fn needs torch_xla >= 2\.9"):
        torch.ops.xla_gpu.kv_cache_update(new_kv.to(device), slots.to(device), cache.to(device))


@needs_torch_xla
@pytest.mark.torch_xla
def test_torch_xla_composite_cache_write_with_only_padding_changes_nothing():
    import torch_xla

    device = torch_xla.device()
    new_kv, slots, cache = cache_case(fresh_seed(), torch.float32)
    slots[:] = -1
    on_device = cache.to(device)
    torch.ops.xla_gpu.kv_cache_update(new_kv.to(device), slots.to(device), on_device)
    assert torch.equal(on_device.cpu(), cache)


@needs_torch_xla
@pytest.mark.torch_xla
def test_torch_xla_attention_scales_composite():
    import torch_xla

    device = torch_xla.device()
    inputs = make_paged_inputs(MIXED, 8, 2, 64, 16, torch.float32, seed=fresh_seed(), pad_tokens=2)
    expected = reference.paged_attention(
        **inputs, scale=0.1, k_scale=2.0, v_scale=0.5, compute_dtype=torch.float64
    )
    out = torch.ops.xla_gpu.paged_attention(
        *[t.to(device) for t in inputs.values()], 0.1, None, None, 2.0, 0.5
    )[0].cpu()
    torch.testing.assert_close(out.double(), expected.double(), rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------------------- CUDA
@needs_cuda
@pytest.mark.gpu
@pytest.mark.parametrize(
    ("dtype", "cache_dtype", "slot_dtype"),
    [
        (torch.bfloat16, None, torch.int32),
        (torch.float32, FP8, torch.int64),
        (torch.float16, FP8, torch.int32),
    ],
)
def test_cuda_cache_write_equals_cpu_bit_for_bit(dtype, cache_dtype, slot_dtype):
    seed = fresh_seed()
    new_kv, slots, cache = cache_case(seed, dtype, cache_dtype, slot_dtype, scale=300.0)
    expected = loop_oracle(new_kv, slots, cache, 0.5, 2.0)
    on_gpu = cache.cuda()
    pointer = on_gpu.data_ptr()
    xla_gpu_ops.kv_cache_update(new_kv.cuda(), slots.cuda(), on_gpu, k_scale=0.5, v_scale=2.0)
    assert on_gpu.data_ptr() == pointer
    assert same_bits(on_gpu, expected), f"seed {seed}"


@needs_cuda
@pytest.mark.gpu
def test_cuda_cache_write_skips_a_slot_past_the_cache_and_validation_names_it():
    new_kv, slots, cache = cache_case(fresh_seed(), torch.float32)
    slots[2] = 10_000
    expected = loop_oracle(new_kv, torch.where(slots >= 112, -1, slots), cache)
    on_gpu = cache.cuda()
    xla_gpu_ops.kv_cache_update(new_kv.cuda(), slots.cuda(), on_gpu)
    assert torch.equal(on_gpu.cpu(), expected)
    with pytest.raises(ValueError, match="slot_mapping: token 2 goes to slot 10000"):
        xla_gpu_ops.kv_cache_update(new_kv.cuda(), slots.cuda(), on_gpu, validate=True)


@needs_cuda
@pytest.mark.gpu
def test_cuda_attention_scales():
    seed = fresh_seed()
    inputs = make_paged_inputs(MIXED, 8, 2, 128, 16, torch.bfloat16, seed=seed, pad_tokens=2)
    expected = reference.paged_attention(
        **inputs, scale=0.1, k_scale=2.0, v_scale=0.5, compute_dtype=torch.float64
    )
    out = xla_gpu_ops.paged_attention(
        **{k: t.cuda() for k, t in inputs.items()}, scale=0.1, k_scale=2.0, v_scale=0.5
    ).cpu()
    error = ((out.double() - expected).norm() / expected.norm()).item()
    assert error < 1e-2, f"seed {seed}: {error}"


def compile_check() -> None:
    """torch.compile of a step that writes the cache and reads it back equals eager."""
    seed = fresh_seed()
    new_kv, slots, cache = cache_case(seed, torch.float32)

    def step(new_kv, slots, cache):
        torch.ops.xla_gpu.kv_cache_update(new_kv, slots, cache, 2.0)
        return cache.sum(dim=(1, 2, 3))

    eager_cache, compiled_cache = cache.clone(), cache.clone()
    expected = step(new_kv, slots, eager_cache)
    actual = torch.compile(step, fullgraph=True)(new_kv, slots, compiled_cache)
    assert torch.equal(compiled_cache, eager_cache), f"seed {seed}"  # the write: exact
    # the read-back sums 6k floats in another order (inductor's reduction): float32 rounding
    torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-4)


def compile_fp8_check() -> None:
    """torch.compile of an fp8-cache attention call equals the eager op and the reference, on
    CUDA where present (the fp8 tile kernels), else on the CPU op."""
    seed = fresh_seed()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    inputs = {k: t.to(device) for k, t in fp8_case(seed).items()}

    def attend(*operands):
        return torch.ops.xla_gpu.paged_attention(*operands, 0.1, None, None, 0.025, 0.5)[0]

    eager = attend(*inputs.values())
    compiled = torch.compile(attend, fullgraph=True)(*inputs.values())
    assert torch.equal(compiled, eager), f"seed {seed}"
    expected = reference.paged_attention(
        **fp8_case(seed), scale=0.1, k_scale=0.025, v_scale=0.5, compute_dtype=torch.float64
    )
    assert rel_l2(compiled.cpu(), expected) < 1e-2, f"seed {seed}"


def run_in_fresh_interpreter(check: str) -> None:
    """test_serving.<check>() in a fresh interpreter: torchax (imported by another test here)
    breaks dynamo."""
    import subprocess
    import sys
    from pathlib import Path

    tests_dir = Path(__file__).parent
    script = (
        "import sys; sys.path[:0] = [sys.argv[1], sys.argv[2]];"
        f"import test_serving; test_serving.{check}()"
    )
    result = subprocess.run(
        [sys.executable, "-c", script, str(tests_dir), str(tests_dir.parent)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]


def test_torch_compile_fp8_attention():
    run_in_fresh_interpreter("compile_fp8_check")


def test_torch_compile_keeps_the_in_place_write():
    run_in_fresh_interpreter("compile_check")


# ---------------------------------------------------------------------------- edge cases
def test_cpu_cache_write_needs_a_contiguous_cache():
    new_kv, slots, cache = cache_case(fresh_seed(), torch.float32)
    strided = cache.transpose(0, 1)
    with pytest.raises(ValueError, match="kv_cache: must be contiguous"):
        xla_gpu_ops.kv_cache_update(new_kv, slots, strided)


def test_validate_with_a_non_tensor_operand_names_it():
    new_kv, slots, cache = cache_case(fresh_seed(), torch.float32)
    with pytest.raises(TypeError, match=r"slot_mapping: expected a torch\.Tensor, got list"):
        xla_gpu_ops.kv_cache_update(new_kv, slots.tolist(), cache, validate=True)


@pytest.mark.parametrize(
    ("attrs", "match"),
    [({"k_scale": 1e39}, "k_scale: must be finite"), ({"v_scale": float("inf")}, "v_scale")],
)
def test_scales_must_be_finite_float32(attrs, match):
    new_kv, slots, cache = cache_case(fresh_seed(), torch.float32)
    with pytest.raises(ValueError, match=match):
        xla_gpu_ops.kv_cache_update(new_kv, slots, cache, **attrs)


def test_integer_attributes_must_fit_int64():
    inputs = make_paged_inputs(MIXED, 4, 2, 64, 16, torch.float32, seed=fresh_seed())
    with pytest.raises(ValueError, match="sliding_window: must fit in int64"):
        xla_gpu_ops.paged_attention(**inputs, scale=0.1, sliding_window=2**64 + 5)


def test_scale_times_k_scale_must_stay_finite_in_float32():
    inputs = make_paged_inputs(MIXED, 4, 2, 64, 16, torch.float32, seed=fresh_seed())
    with pytest.raises(ValueError, match=r"k_scale: scale \* k_scale"):
        xla_gpu_ops.paged_attention(**inputs, scale=1e30, k_scale=1e30)


@needs_jax
def test_jax_host_cache_write_with_int64_slots_without_x64():
    from xla_gpu_ops import jax as xgo_jax

    seed = fresh_seed()
    new_kv, slots, cache = cache_case(seed, torch.float32, slot_dtype=torch.int64)
    expected = loop_oracle(new_kv, slots, cache)
    written = xgo_jax.kv_cache_update(new_kv.numpy(), slots.numpy(), cache.numpy())
    assert np.array_equal(np.asarray(written), expected.numpy()), f"seed {seed}"


@pytest.mark.torchax
@pytest.mark.skipif(importlib.util.find_spec("torchax") is None, reason="needs torchax")
def test_torchax_cache_write_through_a_view():
    import torchax

    from xla_gpu_ops import torchax as xgo_torchax

    xgo_torchax.register()
    new_kv, slots, cache = cache_case(fresh_seed(), torch.float32)
    pages = cache.shape[0]
    two_caches = torch.cat([cache, torch.zeros_like(cache)])  # the cache is the first half
    expected = loop_oracle(new_kv, slots, cache, None, 0.5)
    env = torchax.default_env()
    with env:
        both = two_caches.to("jax")
        torch.ops.xla_gpu.kv_cache_update(
            new_kv.to("jax"), slots.to("jax"), both[:pages], None, 0.5
        )
        written = torch.from_numpy(np.array(both.jax()))
    assert torch.equal(written[:pages], expected)
    assert torch.equal(written[pages:], torch.zeros_like(cache))


@needs_torch_xla
@pytest.mark.torch_xla
def test_torch_xla_composite_cache_write_of_an_empty_batch():
    import torch_xla

    device = torch_xla.device()
    new_kv, slots, cache = cache_case(fresh_seed(), torch.float32)
    on_device = cache.to(device)
    torch.ops.xla_gpu.kv_cache_update(new_kv[:0].to(device), slots[:0].to(device), on_device)
    assert torch.equal(on_device.cpu(), cache)
