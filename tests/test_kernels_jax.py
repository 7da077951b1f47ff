"""JAX binding and XLA handlers: host (XLA:CPU) handlers against the float64 reference, input
checks at every layer, jit / vmap, and the same suite on a GPU for both ABIs (typed FFI, legacy).

Inputs are fresh random values each run (the seed is in every failure message).
"""

from __future__ import annotations

import functools

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

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402
import ml_dtypes  # noqa: E402  (ships with jaxlib)
from paged_inputs import library_call, with_absent  # noqa: E402

from xla_gpu_ops import jax as xgo_jax  # noqa: E402
from xla_gpu_ops import reference  # noqa: E402
from xla_gpu_ops.ops import PAGED_ATTENTION, SIMPLE_ADD  # noqa: E402

pytestmark = [pytest.mark.kernels, pytest.mark.jax]

OPERANDS = ("query", "kv_cache", "context_lens", "block_tables", "query_start_loc", "num_seqs")
TOLERANCE = {torch.float32: 1e-5, torch.float16: 1e-2, torch.bfloat16: 1e-2}
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
DTYPE_IDS = ["f32", "f16", "bf16"]


def _devices(platform: str) -> list:
    try:
        return jax.devices(platform)
    except RuntimeError:  # platform not present
        return []


CPU = jax.devices("cpu")[0]
GPUS = _devices("gpu")
needs_gpu = pytest.mark.skipif(not GPUS, reason="needs a CUDA GPU visible to jax")
# A handler's error surfaces as ValueError for INVALID_ARGUMENT (jaxlib maps that status to it)
# and as JaxRuntimeError for the others (e.g. a failed legacy custom call is INTERNAL).
HANDLER_ERRORS = (ValueError, jax.errors.JaxRuntimeError)


# ------------------------------------------------------------------------------------ helpers
def to_jax(t: torch.Tensor, device) -> jax.Array:
    # numpy has no bfloat16 of torch's: go through float32 (exact) to ml_dtypes' bfloat16
    bf16 = t.dtype == torch.bfloat16
    return jax.device_put(
        t.float().numpy().astype(ml_dtypes.bfloat16) if bf16 else t.numpy(), device
    )


def to_torch(x: jax.Array) -> torch.Tensor:
    return torch.from_numpy(np.array(x, dtype=np.float64))


def jax_inputs(inputs: dict[str, torch.Tensor], device) -> list[jax.Array]:
    return [to_jax(inputs[name], device) for name in OPERANDS]


def check_against_reference(
    inputs, out, *, seed, scale, sliding_window=None, soft_cap=None, dtype=None
) -> None:
    dtype = dtype or inputs["query"].dtype
    expected = reference.paged_attention(
        **inputs,
        scale=scale,
        sliding_window=sliding_window,
        soft_cap=soft_cap,
        compute_dtype=torch.float64,
    )
    actual = to_torch(out)
    assert out.shape == inputs["query"].shape
    assert out.dtype == to_jax(inputs["query"][:1], CPU).dtype
    error = rel_l2(actual, expected)
    assert error <= TOLERANCE[dtype], f"relative L2 error {error:.3e} (seed {seed})"
    num_real = int(inputs["query_start_loc"][int(inputs["num_seqs"][0])])
    assert (actual[num_real:] == 0).all(), f"padding rows must be zeros (seed {seed})"


def run_case(
    device,
    specs,
    *,
    dtype=torch.float32,
    num_q_heads=8,
    num_kv_heads=2,
    head_dim=128,
    page_size=16,
    sliding_window=None,
    soft_cap=None,
    abi="ffi",
    **make_kwargs,
):
    seed = fresh_seed()
    inputs = make_paged_inputs(
        specs, num_q_heads, num_kv_heads, head_dim, page_size, dtype, seed, **make_kwargs
    )
    scale = default_scale(head_dim)
    out = xgo_jax.paged_attention(
        *jax_inputs(inputs, device),
        scale=scale,
        sliding_window=sliding_window,
        soft_cap=soft_cap,
        abi=abi,
    )
    assert out.devices() == {device}
    check_against_reference(
        inputs, out, seed=seed, scale=scale, sliding_window=sliding_window, soft_cap=soft_cap
    )


def host_ffi_call(arrays, *, scale=0.125, sliding_window=0, soft_cap=0.0):
    """The host FFI target called directly (no Python validation), on XLA:CPU. The workspace
    result has the library's size where the static inputs are valid; where they are not, the
    handler rejects them before it looks at the results."""
    xgo_jax.register()
    arrays = [jax.device_put(a, CPU) for a in arrays]
    try:
        attrs = {
            "scale": scale,
            "sliding_window": sliding_window or None,
            "soft_cap": soft_cap or None,
        }
        (workspace_elems,) = library_call(PAGED_ATTENTION, arrays, attrs)[1][-1].shape
    except (TypeError, ValueError):
        workspace_elems = 1
    call = jax.ffi.ffi_call(
        PAGED_ATTENTION.ffi_target,
        (
            jax.ShapeDtypeStruct(arrays[0].shape, arrays[0].dtype),
            jax.ShapeDtypeStruct(arrays[0].shape[:2], np.float32),  # lse
            jax.ShapeDtypeStruct((workspace_elems,), np.float32),
        ),
    )
    out, _, _ = call(
        *with_absent(PAGED_ATTENTION, arrays),
        scale=np.float32(scale),
        sliding_window=np.int64(sliding_window),
        soft_cap=np.float32(soft_cap),
        k_scale=np.float32(1.0),
        v_scale=np.float32(1.0),
        kv_layout=np.int64(0),  # NHD
    )
    return out.block_until_ready()


def small_inputs(dtype=torch.float32, **kwargs):
    return make_paged_inputs(((1, 20), (5, 9), (3, 40)), 4, 2, 64, 8, dtype, fresh_seed(), **kwargs)


# ------------------------------------------------------------------------------------ simple_add
@pytest.mark.parametrize("dtype", [np.float32, np.float16, ml_dtypes.bfloat16], ids=DTYPE_IDS)
@pytest.mark.parametrize("shape", [(0,), (1,), (1000,), (3, 5, 7)], ids=str)
def test_simple_add_host_is_correctly_rounded(dtype, shape):
    rng = np.random.default_rng(fresh_seed())
    a = (rng.standard_normal(shape) * 100).astype(dtype)
    b = (rng.standard_normal(shape)).astype(dtype)
    out = np.asarray(xgo_jax.simple_add(jax.device_put(a, CPU), jax.device_put(b, CPU)))
    # f32 carries more than 2p+2 bits of f16/bf16, so this is the correctly rounded sum.
    expected = (a.astype(np.float32) + b.astype(np.float32)).astype(dtype)
    assert out.dtype == dtype
    assert out.shape == shape
    np.testing.assert_array_equal(out.view(np.uint8), expected.view(np.uint8))


def test_simple_add_jit_and_vmap():
    rng = np.random.default_rng(fresh_seed())
    a = jax.device_put(rng.standard_normal((4, 33)).astype(np.float32), CPU)
    b = jax.device_put(rng.standard_normal((4, 33)).astype(np.float32), CPU)
    expected = np.asarray(a) + np.asarray(b)
    np.testing.assert_array_equal(np.asarray(jax.jit(xgo_jax.simple_add)(a, b)), expected)
    np.testing.assert_array_equal(np.asarray(jax.vmap(xgo_jax.simple_add)(a, b)), expected)
    # one operand batched, the other not: broadcast_all must broadcast b
    batched = jax.vmap(xgo_jax.simple_add, in_axes=(0, None))(a, b[0])
    np.testing.assert_array_equal(np.asarray(batched), np.asarray(a) + np.asarray(b[0]))


@pytest.mark.parametrize(
    ("a", "b", "error", "argument"),
    [
        (np.ones(3, np.float32), np.ones(3, np.float16), TypeError, "b"),
        (np.ones(3, np.float32), np.ones(4, np.float32), ValueError, "b"),
        (np.ones(3, np.int32), np.ones(3, np.int32), TypeError, "a"),
    ],
    ids=["dtype-mismatch", "shape-mismatch", "int-dtype"],
)
def test_simple_add_rejects_bad_input(a, b, error, argument):
    with pytest.raises(error, match=rf"simple_add: {argument}:"):
        xgo_jax.simple_add(a, b)


# ------------------------------------------------------------------------------------ host: correctness
@pytest.mark.parametrize("gqa", [1, 4, 8])
@pytest.mark.parametrize("head_dim", [32, 64, 80, 96, 128, 192, 256])
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_host_dtype_head_dim_gqa(dtype, head_dim, gqa):
    run_case(CPU, MIXED, dtype=dtype, head_dim=head_dim, num_q_heads=2 * gqa, pad_tokens=3)


@pytest.mark.parametrize("page_size", [8, 16, 128, 7])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_host_page_sizes(dtype, page_size):
    run_case(CPU, MIXED, dtype=dtype, page_size=page_size, extra_seqs=2)


FEATURES = {
    "plain": {},
    "window": {"sliding_window": 13},
    "soft_cap": {"soft_cap": 2.5},
    "window+cap": {"sliding_window": 64, "soft_cap": 10.0},
    "shared_pages": {"shared_prefix": True},
    "padding+slots": {"pad_tokens": 5, "extra_seqs": 3},
}


@pytest.mark.parametrize("feature", FEATURES.values(), ids=FEATURES.keys())
@pytest.mark.parametrize("specs", [DECODE, PREFILL, MIXED], ids=["decode", "prefill", "mixed"])
def test_host_batch_kinds_and_features(specs, feature):
    run_case(CPU, specs, num_q_heads=8, num_kv_heads=2, **feature)


EDGE_CASES = {
    "context_1": {"specs": ((1, 1),)},
    "context_eq_page": {"specs": ((1, 16), (16, 16))},
    "window_gt_context": {"specs": ((4, 10), (1, 30)), "sliding_window": 1000},
    "window_1": {"specs": ((4, 10), (1, 30)), "sliding_window": 1},
    "one_sequence": {"specs": ((9, 77),)},
    "empty_q_in_middle": {"specs": ((2, 5), (0, 7), (3, 3))},
    "S_256": {"specs": tuple((1, 1 + (7 * i) % 40) for i in range(256)), "page_size": 8},
    "spare_slots_only_padding": {"specs": ((2, 3),), "pad_tokens": 6, "extra_seqs": 5},
}


@pytest.mark.parametrize("case", EDGE_CASES.values(), ids=EDGE_CASES.keys())
def test_host_edge_cases(case):
    case = dict(case)
    run_case(CPU, case.pop("specs"), **case)


def test_host_num_seqs_zero_writes_zeros():
    inputs = small_inputs()
    inputs["num_seqs"][0] = 0
    out = host_ffi_call(jax_inputs(inputs, CPU))
    assert (np.asarray(out) == 0).all()


def test_host_jit_and_vmap():
    seeds = [fresh_seed(), fresh_seed()]
    batch = [make_paged_inputs(MIXED, 8, 2, 64, 16, torch.float32, s, pad_tokens=2) for s in seeds]
    stacked = [jnp.stack([to_jax(b[name], CPU) for b in batch]) for name in OPERANDS]
    fn = functools.partial(xgo_jax.paged_attention, scale=0.1, sliding_window=20)
    batched = jax.jit(jax.vmap(fn))(*stacked)
    assert batched.shape == (2, *batch[0]["query"].shape)
    for i, inputs in enumerate(batch):
        check_against_reference(inputs, batched[i], seed=seeds[i], scale=0.1, sliding_window=20)
    single = jax.jit(fn)(*jax_inputs(batch[0], CPU))
    np.testing.assert_array_equal(np.asarray(single), np.asarray(batched[0]))


def test_hlo_contains_typed_ffi_custom_call():
    args = jax_inputs(small_inputs(), CPU)
    fn = functools.partial(xgo_jax.paged_attention, scale=0.1, soft_cap=3.0)
    for text in (
        jax.jit(fn).lower(*args).as_text(dialect="hlo"),
        jax.jit(fn).lower(*args).compile().as_text(),
    ):
        assert f'custom_call_target="{PAGED_ATTENTION.ffi_target}"' in text
        assert "api_version=API_VERSION_TYPED_FFI" in text


# ------------------------------------------------------------------------------------ bad input
def _bad(**changes):
    """Small valid inputs as numpy (torch for dtypes numpy lacks), with some replaced."""
    inputs = {name: t.numpy() for name, t in small_inputs().items()}
    inputs.update(changes)
    return [inputs[name] for name in OPERANDS]


def _call(args, **kwargs):
    kwargs.setdefault("scale", 0.125)
    return xgo_jax.paged_attention(*args, **kwargs)


BASE = {name: t.numpy() for name, t in small_inputs().items()}  # shapes only; values unused
STATIC_BAD_INPUTS = {
    "query_rank": ({"query": BASE["query"][0]}, {}, ValueError, "query"),
    "kv_cache_rank": ({"kv_cache": BASE["kv_cache"][0]}, {}, ValueError, "kv_cache"),
    "block_tables_rank": (
        {"block_tables": BASE["block_tables"][0]},
        {},
        ValueError,
        "block_tables",
    ),
    "kv_dtype_mismatch": (
        {"kv_cache": BASE["kv_cache"].astype(np.float16)},
        {},
        TypeError,
        "kv_cache",
    ),
    "query_int_dtype": (
        {"query": BASE["query"].astype(np.int32), "kv_cache": BASE["kv_cache"].astype(np.int32)},
        {},
        TypeError,
        "query",
    ),
    "context_lens_int16": (  # int64 is converted (tests/test_client_inputs.py); int16 is not
        {"context_lens": BASE["context_lens"].astype(np.int16)},
        {},
        TypeError,
        "context_lens",
    ),
    "block_tables_f32": (
        {"block_tables": BASE["block_tables"].astype(np.float32)},
        {},
        TypeError,
        "block_tables",
    ),
    "query_start_loc_int16": (
        {"query_start_loc": BASE["query_start_loc"].astype(np.int16)},
        {},
        TypeError,
        "query_start_loc",
    ),
    "num_seqs_uint32": (
        {"num_seqs": BASE["num_seqs"].astype(np.uint32)},
        {},
        TypeError,
        "num_seqs",
    ),
    "head_dim_72": (
        {"query": np.ones((9, 4, 72), np.float32), "kv_cache": np.ones((12, 8, 4, 72), np.float32)},
        {},
        ValueError,
        "query",
    ),
    "odd_combined_heads": (
        {"kv_cache": np.ones((12, 8, 3, 64), np.float32)},
        {},
        ValueError,
        "kv_cache",
    ),
    "hq_not_multiple_of_hkv": (
        {"query": np.ones((9, 6, 64), np.float32), "kv_cache": np.ones((12, 8, 8, 64), np.float32)},
        {},
        ValueError,
        "query",
    ),
    "page_size_129": (
        {"kv_cache": np.ones((2, 129, 4, 64), np.float32)},
        {},
        ValueError,
        "kv_cache",
    ),
    "query_start_loc_shape": (
        {"query_start_loc": BASE["query_start_loc"][:-1]},
        {},
        ValueError,
        "query_start_loc",
    ),
    "num_seqs_shape": ({"num_seqs": np.zeros(2, np.int32)}, {}, ValueError, "num_seqs"),
    "soft_cap_zero": ({}, {"soft_cap": 0.0}, ValueError, "soft_cap"),
    "soft_cap_negative": ({}, {"soft_cap": -1.0}, ValueError, "soft_cap"),
    "soft_cap_inf": ({}, {"soft_cap": float("inf")}, ValueError, "soft_cap"),
    "sliding_window_zero": ({}, {"sliding_window": 0}, ValueError, "sliding_window"),
    "sliding_window_negative": ({}, {"sliding_window": -4}, ValueError, "sliding_window"),
    "sliding_window_float": ({}, {"sliding_window": 2.5}, TypeError, "sliding_window"),
    "scale_nan": ({}, {"scale": float("nan")}, ValueError, "scale"),
    "abi_unknown": ({}, {"abi": "v3"}, ValueError, "abi"),
}


@pytest.mark.parametrize(
    ("changes", "kwargs", "error", "argument"),
    STATIC_BAD_INPUTS.values(),
    ids=STATIC_BAD_INPUTS.keys(),
)
def test_static_bad_input_raises_naming_argument(changes, kwargs, error, argument):
    with pytest.raises(error, match=rf"paged_attention: {argument}:"):
        _call(_bad(**changes), **kwargs)


def test_scale_must_be_static_under_jit():
    args = jax_inputs(small_inputs(), CPU)
    with pytest.raises(TypeError, match="paged_attention: scale:"):
        jax.jit(lambda s, *a: xgo_jax.paged_attention(*a, scale=s))(0.1, *args)


@pytest.mark.skipif(bool(GPUS), reason="checks the CPU-only error; a GPU is present")
def test_legacy_abi_on_cpu_is_a_clear_error():
    with pytest.raises(RuntimeError, match="paged_attention: abi: 'legacy' is a CUDA-only"):
        _call(_bad(), abi="legacy")


def _metadata_cases():
    """(name, mutate(inputs), argument): each mutation breaks exactly one metadata rule."""

    def set_(name, index, value):
        def mutate(inputs):
            inputs[name][index] = value

        return mutate

    def non_monotone(inputs):
        qsl = inputs["query_start_loc"]
        first, second = int(qsl[1]), int(qsl[2])  # ints: tensor elements would alias
        qsl[1], qsl[2] = second, first

    def q_len_too_long(inputs):  # sequence 1 has q_len 5, context 9
        inputs["context_lens"][1] = 4

    return {
        "num_seqs_gt_S": (set_("num_seqs", 0, 4), "num_seqs"),
        "num_seqs_negative": (set_("num_seqs", 0, -1), "num_seqs"),
        "query_start_loc_non_monotone": (non_monotone, "query_start_loc"),
        "query_start_loc_past_T": (set_("query_start_loc", 3, 10_000), "query_start_loc"),
        "query_start_loc_negative": (set_("query_start_loc", 0, -1), "query_start_loc"),
        "q_len_gt_context_len": (q_len_too_long, "context_lens"),
        "context_len_gt_capacity": (set_("context_lens", 2, 10_000), "context_lens"),
        "context_len_negative": (set_("context_lens", 0, -3), "context_lens"),
        "page_index_too_large": (set_("block_tables", (2, 0), 10_000), "block_tables"),
        "page_index_negative": (set_("block_tables", (0, 2), -1), "block_tables"),
    }


METADATA_CASES = _metadata_cases()


@pytest.mark.parametrize(("mutate", "argument"), METADATA_CASES.values(), ids=METADATA_CASES.keys())
def test_host_handler_rejects_bad_metadata(mutate, argument):
    inputs = small_inputs()
    mutate(inputs)
    arrays = jax_inputs(inputs, CPU)
    pattern = rf"INVALID_ARGUMENT.*paged_attention: {argument}:"
    with pytest.raises(HANDLER_ERRORS, match=pattern):
        host_ffi_call(arrays)  # the FFI target itself, no Python check in between
    with pytest.raises(HANDLER_ERRORS, match=pattern):
        xgo_jax.paged_attention(*arrays, scale=0.125).block_until_ready()  # the public wrapper
    # the process and the target stay usable after a rejected call
    fine = small_inputs()
    out = host_ffi_call(jax_inputs(fine, CPU), scale=0.125)
    check_against_reference(fine, out, seed=-1, scale=0.125)


HANDLER_STATIC_CASES = {
    "head_dim_72": (
        {"query": np.ones((9, 4, 72), np.float32), "kv_cache": np.ones((12, 8, 4, 72), np.float32)},
        {},
        "query",
    ),
    "hq_not_multiple": (
        {"query": np.ones((9, 6, 64), np.float32), "kv_cache": np.ones((12, 8, 8, 64), np.float32)},
        {},
        "query",
    ),
    "odd_combined_heads": ({"kv_cache": np.ones((12, 8, 3, 64), np.float32)}, {}, "kv_cache"),
    "kv_dtype_mismatch": ({"kv_cache": BASE["kv_cache"].astype(np.float16)}, {}, "kv_cache"),
    "query_rank": ({"query": BASE["query"][0]}, {}, "query"),
    "block_tables_rows": ({"block_tables": BASE["block_tables"][:2]}, {}, "block_tables"),
    "soft_cap_negative": ({}, {"soft_cap": -2.0}, "soft_cap"),
    "sliding_window_negative": ({}, {"sliding_window": -1}, "sliding_window"),
    "scale_inf": ({}, {"scale": float("inf")}, "scale"),
}


@pytest.mark.parametrize(
    ("changes", "attributes", "argument"),
    HANDLER_STATIC_CASES.values(),
    ids=HANDLER_STATIC_CASES.keys(),
)
def test_host_handler_rejects_bad_static_input(changes, attributes, argument):
    """Bypassing the Python checks, the handler's own static checks name the argument."""
    with pytest.raises(HANDLER_ERRORS, match=rf"INVALID_ARGUMENT.*paged_attention: {argument}:"):
        host_ffi_call([jnp.asarray(a) for a in _bad(**changes)], **attributes)


# ------------------------------------------------------------------------------------ GPU
ABI_PARAMS = ["ffi", "legacy"]


@needs_gpu
@pytest.mark.gpu
@pytest.mark.parametrize("abi", ABI_PARAMS)
@pytest.mark.parametrize("gqa", [1, 4, 8])
@pytest.mark.parametrize("head_dim", [32, 64, 80, 96, 128, 192, 256])
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_gpu_dtype_head_dim_gqa(dtype, head_dim, gqa, abi):
    run_case(
        GPUS[0], MIXED, dtype=dtype, head_dim=head_dim, num_q_heads=2 * gqa, pad_tokens=3, abi=abi
    )


@needs_gpu
@pytest.mark.gpu
@pytest.mark.parametrize("abi", ABI_PARAMS)
@pytest.mark.parametrize("page_size", [8, 16, 128, 7])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_gpu_page_sizes(dtype, page_size, abi):
    run_case(GPUS[0], MIXED, dtype=dtype, page_size=page_size, extra_seqs=2, abi=abi)


@needs_gpu
@pytest.mark.gpu
@pytest.mark.parametrize("abi", ABI_PARAMS)
@pytest.mark.parametrize("feature", FEATURES.values(), ids=FEATURES.keys())
@pytest.mark.parametrize("specs", [DECODE, PREFILL, MIXED], ids=["decode", "prefill", "mixed"])
def test_gpu_batch_kinds_and_features(specs, feature, abi):
    run_case(GPUS[0], specs, dtype=torch.bfloat16, **feature, abi=abi)


@needs_gpu
@pytest.mark.gpu
@pytest.mark.parametrize("abi", ABI_PARAMS)
@pytest.mark.parametrize("case", EDGE_CASES.values(), ids=EDGE_CASES.keys())
def test_gpu_edge_cases(case, abi):
    case = dict(case)
    run_case(GPUS[0], case.pop("specs"), abi=abi, **case)


@needs_gpu
@pytest.mark.gpu
@pytest.mark.parametrize("abi", ABI_PARAMS)
def test_gpu_jit_and_vmap(abi):
    seeds = [fresh_seed(), fresh_seed()]
    batch = [
        make_paged_inputs(MIXED, 8, 2, 128, 16, torch.bfloat16, s, pad_tokens=2) for s in seeds
    ]
    stacked = [jnp.stack([to_jax(b[name], GPUS[0]) for b in batch]) for name in OPERANDS]
    fn = functools.partial(xgo_jax.paged_attention, scale=0.1, soft_cap=4.0, abi=abi)
    batched = jax.jit(jax.vmap(fn))(*stacked)
    for i, inputs in enumerate(batch):
        check_against_reference(inputs, batched[i], seed=seeds[i], scale=0.1, soft_cap=4.0)


@needs_gpu
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float16, ml_dtypes.bfloat16], ids=DTYPE_IDS)
def test_gpu_simple_add_both_abis(dtype):
    rng = np.random.default_rng(fresh_seed())
    a = (rng.standard_normal((1001,)) * 10).astype(dtype)
    b = rng.standard_normal((1001,)).astype(dtype)
    expected = (a.astype(np.float32) + b.astype(np.float32)).astype(dtype)
    a_gpu, b_gpu = jax.device_put(a, GPUS[0]), jax.device_put(b, GPUS[0])
    np.testing.assert_array_equal(np.asarray(xgo_jax.simple_add(a_gpu, b_gpu)), expected)
    call, _ = library_call(SIMPLE_ADD, [a, b], {})
    legacy = jax.ffi.ffi_call(
        SIMPLE_ADD.legacy_target,
        jax.ShapeDtypeStruct(a.shape, a.dtype),
        custom_call_api_version=2,
        legacy_backend_config=bytes(call),
    )
    np.testing.assert_array_equal(np.asarray(legacy(a_gpu, b_gpu)), expected)


@needs_gpu
@pytest.mark.gpu
def test_gpu_hlo_contains_both_custom_calls():
    args = jax_inputs(small_inputs(torch.bfloat16), GPUS[0])
    for abi, target, version in (
        ("ffi", PAGED_ATTENTION.ffi_target, "API_VERSION_TYPED_FFI"),
        ("legacy", PAGED_ATTENTION.legacy_target, "API_VERSION_STATUS_RETURNING"),
    ):
        fn = functools.partial(xgo_jax.paged_attention, scale=0.1, abi=abi)
        lowered = jax.jit(fn).lower(*args)
        for text in (lowered.as_text(dialect="hlo"), lowered.compile().as_text()):
            assert f'custom_call_target="{target}"' in text, abi
            assert f"api_version={version}" in text, abi


def _legacy_paged_attention(arrays, opaque: bytes):
    xgo_jax.register()  # the raw ffi_call below does not register on its own
    _, (*_, workspace) = library_call(PAGED_ATTENTION, arrays, {"scale": 0.125})
    call = jax.ffi.ffi_call(
        PAGED_ATTENTION.legacy_target,
        (
            jax.ShapeDtypeStruct(arrays[0].shape, arrays[0].dtype),
            jax.ShapeDtypeStruct(arrays[0].shape[:2], np.float32),  # lse
            jax.ShapeDtypeStruct(workspace.shape, np.float32),
        ),
        custom_call_api_version=2,
        legacy_backend_config=opaque,
    )
    return call(*with_absent(PAGED_ATTENTION, arrays))[0].block_until_ready()


@needs_gpu
@pytest.mark.gpu
def test_gpu_legacy_bad_opaque_raises_with_message():
    inputs = small_inputs(torch.bfloat16)
    arrays = jax_inputs(inputs, GPUS[0])
    call, _ = library_call(PAGED_ATTENTION, arrays, {"scale": 0.125})
    with pytest.raises(HANDLER_ERRORS, match=r"paged_attention: opaque: expected \d+ bytes"):
        _legacy_paged_attention(arrays, b"\x00not a config")
    bad_magic = bytearray(bytes(call))
    bad_magic[0] ^= 0xFF
    with pytest.raises(HANDLER_ERRORS, match="paged_attention: call: not an XgoCall"):
        _legacy_paged_attention(arrays, bytes(bad_magic))
    call.attrs[2].f64 = -1.0  # soft_cap
    with pytest.raises(HANDLER_ERRORS, match="paged_attention: soft_cap:"):
        _legacy_paged_attention(arrays, bytes(call))
    # the process and the GPU stay usable
    out = xgo_jax.paged_attention(*arrays, scale=0.125, abi="legacy")
    check_against_reference(inputs, out, seed=-1, scale=0.125)


@needs_gpu
@pytest.mark.gpu
@pytest.mark.parametrize(
    ("workspace_elems", "soft_cap", "argument"),
    [(0, 0.0, "workspace"), (None, -1.0, "soft_cap")],
    ids=["workspace_too_small", "soft_cap_negative"],
)
def test_gpu_ffi_handler_rejects_bad_static_input(workspace_elems, soft_cap, argument):
    """The CUDA FFI handler itself (no Python checks) rejects what it can see statically."""
    arrays = [jax.device_put(a, GPUS[0]) for a in _bad()]
    if workspace_elems is None:
        _, (*_, workspace) = library_call(PAGED_ATTENTION, arrays, {"scale": 0.1})
        (workspace_elems,) = workspace.shape
    xgo_jax.register()
    call = jax.ffi.ffi_call(
        PAGED_ATTENTION.ffi_target,
        (
            jax.ShapeDtypeStruct(arrays[0].shape, arrays[0].dtype),
            jax.ShapeDtypeStruct(arrays[0].shape[:2], np.float32),  # lse
            jax.ShapeDtypeStruct((workspace_elems,), np.float32),
        ),
    )
    attributes = {
        "scale": np.float32(0.1),
        "sliding_window": np.int64(0),
        "soft_cap": np.float32(soft_cap),
        "k_scale": np.float32(1.0),
        "v_scale": np.float32(1.0),
        "kv_layout": np.int64(0),
    }
    with pytest.raises(HANDLER_ERRORS, match=rf"INVALID_ARGUMENT.*paged_attention: {argument}:"):
        call(*with_absent(PAGED_ATTENTION, arrays), **attributes)[0].block_until_ready()


@needs_gpu
@pytest.mark.gpu
@pytest.mark.parametrize("abi", ABI_PARAMS)
def test_gpu_bad_metadata_poisons_rows_with_nan(abi):
    """docs/DESIGN.md: the CUDA kernel cannot raise; an inconsistent sequence gets NaN rows."""
    inputs = small_inputs(torch.float32)
    inputs["context_lens"][1] = 4  # sequence 1: q_len 5 > context_len 4
    out = np.asarray(xgo_jax.paged_attention(*jax_inputs(inputs, GPUS[0]), scale=0.125, abi=abi))
    starts = inputs["query_start_loc"].tolist()
    assert np.isnan(out[starts[1] : starts[2]]).all()
    assert np.isfinite(out[: starts[1]]).all()
    assert np.isfinite(out[starts[2] :]).all()


def test_host_handler_names_a_missing_attribute():
    """A typed-FFI call without one of the op's attributes is refused, naming it."""
    xgo_jax.register()
    arrays = [jax.device_put(a, CPU) for a in jax_inputs(small_inputs(torch.float32), CPU)]
    _, (*_, workspace) = library_call(PAGED_ATTENTION, arrays, {"scale": 0.1})
    call = jax.ffi.ffi_call(
        PAGED_ATTENTION.ffi_target,
        (
            jax.ShapeDtypeStruct(arrays[0].shape, arrays[0].dtype),
            jax.ShapeDtypeStruct(arrays[0].shape[:2], np.float32),  # lse
            jax.ShapeDtypeStruct(workspace.shape, np.float32),
        ),
    )
    attributes = {
        "scale": np.float32(0.1),
        "sliding_window": np.int64(0),
        "soft_cap": np.float32(0.0),
        "k_scale": np.float32(1.0),
    }
    with pytest.raises(
        HANDLER_ERRORS, match=r"INVALID_ARGUMENT.*paged_attention: v_scale: missing"
    ):
        call(*with_absent(PAGED_ATTENTION, arrays), **attributes)[0].block_until_ready()
