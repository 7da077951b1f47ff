"""torchax front end: torch.ops.xla_gpu.* run as XLA custom calls through xla_gpu_ops.jax.

Eager (torchax tensors) and under `jax.jit(torchax.interop.jax_view(fn))`, against the float64
reference. Here jax runs on XLA:CPU (the host handlers); on a GPU machine the same tests run the
CUDA handlers, and the `gpu` tests check explicitly that the call ran on the GPU.
"""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch
from paged_inputs import (
    DECODE,
    MIXED,
    PREFILL,
    default_scale,
    fresh_seed,
    make_paged_inputs,
    rel_l2,
)

from xla_gpu_ops import _library, reference
from xla_gpu_ops.ops import PAGED_ATTENTION, SIMPLE_ADD

torchax = pytest.importorskip("torchax", reason="needs torchax")
jax = pytest.importorskip("jax", reason="needs jax")
jnp = jax.numpy

import xla_gpu_ops.torchax as xgo_torchax  # noqa: E402  (after the importorskip guards)

pytestmark = [
    pytest.mark.torchax,
    pytest.mark.skipif(
        not _library.is_built(), reason="libxla_gpu_ops.so is not built (nox -s build)"
    ),
]

# Largest relative L2 error vs the float64 reference, per dtype of the inputs and output.
REL_L2_TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2}
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
DTYPE_IDS = lambda dtype: str(dtype).removeprefix("torch.")  # noqa: E731
OPERANDS = ("query", "kv_cache", "context_lens", "block_tables", "query_start_loc", "num_seqs")


def jax_gpu_devices() -> list:
    try:
        return jax.devices("gpu")
    except RuntimeError:  # no GPU backend in this jax
        return []


needs_jax_gpu = pytest.mark.skipif(not jax_gpu_devices(), reason="needs jax with a CUDA GPU")


@pytest.fixture(scope="module")
def env():
    xgo_torchax.register()
    return torchax.default_env()


def to_jax(t: torch.Tensor, device=None) -> jax.Array:
    # through float32: numpy has no bfloat16, and float32 holds every f16/bf16 value exactly
    host = t.float().numpy() if t.is_floating_point() else t.numpy()
    dtype = {torch.float32: jnp.float32, torch.float16: jnp.float16, torch.bfloat16: jnp.bfloat16}
    return jax.device_put(jnp.asarray(host, dtype=dtype.get(t.dtype, host.dtype)), device)


def to_torch64(x) -> torch.Tensor:
    """A jax array or torchax tensor as a float64 CPU torch tensor."""
    if isinstance(x, torchax.tensor.Tensor):
        x = x.jax()
    return torch.from_numpy(np.array(x.astype(jnp.float32))).double()  # a writable copy


CASES = {
    # name: (seq_specs, Hq, Hkv, head_dim, page_size, make_paged_inputs extras, op attributes)
    "decode_gqa4": (DECODE, 8, 2, 128, 16, {}, {}),
    "prefill_window_cap": (PREFILL, 4, 4, 64, 8, {}, {"sliding_window": 19, "soft_cap": 4.0}),
    "mixed_prefix_pad": (
        MIXED,
        8,
        1,
        64,
        16,
        {"shared_prefix": True, "pad_tokens": 3, "extra_seqs": 2},
        {},
    ),
}


@pytest.fixture
def jax_calls(monkeypatch) -> list[str]:
    """Names of the ops the JAX binding's call ran (xla_gpu_ops._jax_ffi.call, the one
    xla_gpu_ops.jax.call is): proves torchax took our lowering."""
    from xla_gpu_ops import _jax_ffi

    calls: list[str] = []
    original = _jax_ffi.call

    def spy(op, *args, **kwargs):
        calls.append(op.name)
        return original(op, *args, **kwargs)

    monkeypatch.setattr(_jax_ffi, "call", spy)
    return calls


def paged_case(name: str, dtype: torch.dtype, seed: int):
    specs, hq, hkv, head_dim, page_size, extras, attrs = CASES[name]
    inputs = make_paged_inputs(specs, hq, hkv, head_dim, page_size, dtype, seed, **extras)
    attrs = {"scale": default_scale(head_dim), **attrs}
    expected = reference.paged_attention(**inputs, **attrs, compute_dtype=torch.float64)
    return inputs, attrs, expected


def test_register_is_idempotent_and_reaches_existing_envs(caplog):
    from torchax.ops import ops_registry

    existing = torchax.tensor.Environment()  # built before register(): holds no lowering yet
    xgo_torchax.register(existing)
    assert xgo_torchax.is_registered()
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        xgo_torchax.register(existing)
    assert "Duplicate op registration" not in caplog.text
    for op, lowering in xgo_torchax.LOWERINGS.items():
        overload = xgo_torchax.torch_overload(op)
        assert ops_registry.all_aten_ops[overload].func is lowering
        assert existing._ops[overload].func is lowering
        assert torchax.default_env()._ops[overload].func is lowering


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_simple_add_eager(env, jax_calls, dtype):
    a, b = torch.randn(3, 257).to(dtype), torch.randn(3, 257).to(dtype)
    with env:
        out = torch.ops.xla_gpu.simple_add(a.to("jax"), b.to("jax"))
        assert isinstance(out, torchax.tensor.Tensor)
        assert out.dtype == dtype
    assert jax_calls == ["simple_add"]
    expected = reference.simple_add(a.double(), b.double())
    assert rel_l2(to_torch64(out), expected) < REL_L2_TOL[dtype]


def test_simple_add_jit_emits_custom_call(env):
    a, b = torch.randn(1000), torch.randn(1000)
    fn = jax.jit(torchax.interop.jax_view(lambda x, y: torch.ops.xla_gpu.simple_add(x, y) * 2))
    ja, jb = to_jax(a), to_jax(b)
    hlo = fn.lower(ja, jb).as_text()
    assert f"stablehlo.custom_call @{SIMPLE_ADD.ffi_target}(" in hlo, hlo
    expected = 2 * reference.simple_add(a.double(), b.double())
    assert rel_l2(to_torch64(fn(ja, jb)), expected) < REL_L2_TOL[torch.float32]


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_paged_attention_eager(env, jax_calls, case, dtype):
    seed = fresh_seed()
    inputs, attrs, expected = paged_case(case, dtype, seed)
    with env:
        jax_inputs = {name: t.to("jax") for name, t in inputs.items()}
        out = torch.ops.xla_gpu.paged_attention(
            *(jax_inputs[name] for name in OPERANDS),
            attrs["scale"],
            sliding_window=attrs.get("sliding_window"),
            soft_cap=attrs.get("soft_cap"),
        )[0]
        assert isinstance(out, torchax.tensor.Tensor)
        assert out.dtype == dtype
        assert tuple(out.shape) == tuple(inputs["query"].shape)
    assert jax_calls == ["paged_attention"]
    err = rel_l2(to_torch64(out), expected)
    assert err < REL_L2_TOL[dtype], f"rel L2 {err:.2e} (seed {seed})"
    num_real = int(inputs["query_start_loc"][int(inputs["num_seqs"][0])])
    assert (to_torch64(out)[num_real:] == 0).all(), f"padding rows must be zeros (seed {seed})"


def test_paged_attention_wrapper_under_torchax(env):
    """The keyword wrapper xla_gpu_ops.paged_attention accepts torchax tensors too."""
    import xla_gpu_ops

    seed = fresh_seed()
    inputs, attrs, expected = paged_case("prefill_window_cap", torch.float32, seed)
    with env:
        out = xla_gpu_ops.paged_attention(**{k: t.to("jax") for k, t in inputs.items()}, **attrs)
    assert rel_l2(to_torch64(out), expected) < REL_L2_TOL[torch.float32], f"seed {seed}"


@pytest.mark.parametrize("jitted", [False, True], ids=["eager", "jit"])
def test_paged_attention_with_sinks(env, jitted):
    """sinks reach the custom call through the lowering, eager and under jax.jit."""
    import xla_gpu_ops

    seed = fresh_seed()
    inputs = make_paged_inputs(MIXED, 8, 2, 64, 16, torch.float32, seed, pad_tokens=2, sinks=True)
    expected = reference.paged_attention(**inputs, scale=0.1, compute_dtype=torch.float64)

    def fn(*tensors):
        return xla_gpu_ops.paged_attention(*tensors[:6], scale=0.1, sinks=tensors[6])

    tensors = [inputs[name] for name in (*OPERANDS, "sinks")]
    if jitted:
        out = jax.jit(torchax.interop.jax_view(fn))(*(to_jax(t) for t in tensors))
    else:
        with env:
            out = fn(*(t.to("jax") for t in tensors))
    assert rel_l2(to_torch64(out), expected) < 1e-5, f"seed {seed}"


def jitted_paged_attention(attrs: dict):
    """jax.jit of a PyTorch function: paged attention followed by an ordinary torch op."""

    def torch_fn(query, kv_cache, context_lens, block_tables, query_start_loc, num_seqs):
        out = torch.ops.xla_gpu.paged_attention(
            query,
            kv_cache,
            context_lens,
            block_tables,
            query_start_loc,
            num_seqs,
            attrs["scale"],
            attrs.get("sliding_window"),
            attrs.get("soft_cap"),
        )[0]
        return out.float() * 3.0

    return jax.jit(torchax.interop.jax_view(torch_fn))


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=DTYPE_IDS)
def test_paged_attention_jit_emits_custom_call(env, case, dtype):
    seed = fresh_seed()
    inputs, attrs, expected = paged_case(case, dtype, seed)
    args = [to_jax(inputs[name]) for name in OPERANDS]
    fn = jitted_paged_attention(attrs)
    hlo = fn.lower(*args).as_text()
    assert f"stablehlo.custom_call @{PAGED_ATTENTION.ffi_target}(" in hlo, hlo
    err = rel_l2(to_torch64(fn(*args)), 3.0 * expected)
    assert err < REL_L2_TOL[dtype], f"rel L2 {err:.2e} (seed {seed})"


def test_paged_attention_bad_input_names_argument(env):
    inputs, attrs, _ = paged_case("decode_gqa4", torch.float32, fresh_seed())
    inputs["kv_cache"] = inputs["kv_cache"].to(torch.float16)  # query is float32
    with env, pytest.raises(TypeError, match="kv_cache"):
        torch.ops.xla_gpu.paged_attention(
            *(inputs[name].to("jax") for name in OPERANDS), attrs["scale"]
        )[0]


@pytest.mark.gpu
@needs_jax_gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=DTYPE_IDS)
def test_paged_attention_runs_on_jax_gpu(env, dtype):
    gpu = jax_gpu_devices()[0]
    seed = fresh_seed()
    inputs, attrs, expected = paged_case("mixed_prefix_pad", dtype, seed)
    args = [to_jax(inputs[name], gpu) for name in OPERANDS]
    fn = jitted_paged_attention(attrs)
    compiled_hlo = fn.lower(*args).compile().as_text()
    assert f'custom_call_target="{PAGED_ATTENTION.ffi_target}"' in compiled_hlo
    out = fn(*args)
    assert out.devices() == {gpu}
    err = rel_l2(to_torch64(out), 3.0 * expected)
    assert err < REL_L2_TOL[dtype], f"rel L2 {err:.2e} (seed {seed})"


@pytest.mark.gpu
@needs_jax_gpu
def test_simple_add_eager_on_jax_gpu(env):
    gpu = jax_gpu_devices()[0]
    a, b = torch.randn(4099), torch.randn(4099)
    with env:
        out = torch.ops.xla_gpu.simple_add(
            torchax.tensor.Tensor(to_jax(a, gpu), env), torchax.tensor.Tensor(to_jax(b, gpu), env)
        )
    assert out.jax().devices() == {gpu}
    assert rel_l2(to_torch64(out), a.double() + b.double()) < REL_L2_TOL[torch.float32]
