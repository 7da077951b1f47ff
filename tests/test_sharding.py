"""Sharding by KV head: the split rules, and on 4 XLA:CPU host devices (fresh processes, so the
other tests keep one device) the JAX shard_map wrapper, the plain-jit (custom_partitioning) path,
the torchax route and torch_xla SPMD with manual sharding: outputs equal the unsharded call, the
compiled HLO has no collective, and a head axis the KV heads do not fit gives a clear error.

Inputs are fresh random values each run (the seed is in every failure message); the host
handlers compute each head on its own, so a sharded output equals the unsharded one exactly.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np
import pytest
from conftest import artifacts_root
from paged_inputs import fresh_seed
from subprocess_python import results_of, run_python

from xla_gpu_ops import _library, head_sharding, ops
from xla_gpu_ops.ops import KV_CACHE_UPDATE, PAGED_ATTENTION

TESTS_DIR = Path(__file__).resolve().parent
ROOT = TESTS_DIR.parent
NUM_DEVICES = 4
needs_library = pytest.mark.skipif(
    not _library.is_built(), reason="libxla_gpu_ops.so is not built (nox -s build)"
)

# name: (sequences, Hq, Hkv, head_dim, page_size, dtype, attributes); Hkv >= 4 for 4 devices
CASES = {
    "mha_f32_mixed": ("MIXED", 4, 4, 64, 16, "float32", {"scale": 0.125}),
    "gqa2_bf16_mixed_window_cap": (
        "MIXED",
        8,
        4,
        64,
        16,
        "bfloat16",
        {"scale": 0.125, "sliding_window": 19, "soft_cap": 4.0},
    ),
    # attention sinks split with the query heads
    "gqa2_f32_mixed_sinks": ("MIXED", 8, 4, 64, 16, "float32", {"scale": 0.125, "sinks": True}),
    "gqa4_f32_decode": ("DECODE", 16, 4, 128, 16, "float32", {"scale": 0.0884}),
    "gqa4_8kv_f16_prefill_cap": (
        "PREFILL",
        32,
        8,
        64,
        8,
        "float16",
        {"scale": 0.125, "soft_cap": 3.0},
    ),
    "gqa8_f32_mixed_window": (
        "MIXED",
        32,
        4,
        64,
        16,
        "float32",
        {"scale": 0.1, "sliding_window": 7},
    ),
}


def log_dir() -> Path:
    path = artifacts_root() / "sharding"
    path.mkdir(parents=True, exist_ok=True)
    return path


def ok(results: dict, name: str, seed: int) -> dict:
    entry = results[name]
    assert "error" not in entry, f"{name}: {entry['error']} (seed {seed})"
    return entry


# ------------------------------------------------------------------------------- split rules
@pytest.mark.parametrize(
    ("num_q_heads", "num_kv_heads", "num_shards"),
    [(4, 4, 4), (8, 4, 2), (16, 4, 4), (32, 8, 4), (32, 8, 8), (64, 8, 2), (6, 6, 3)],
)
def test_contiguous_split_keeps_kv_pairs_with_their_query_groups(
    num_q_heads, num_kv_heads, num_shards
):
    """A plain contiguous split of the combined axis (what P(None, None, axis, None) does) puts
    K (2h) and V (2h+1) of the same KV heads on a device as the query heads that use them, and
    the op's own GQA rule (q head j -> kv head j // g) holds on every shard."""
    group = num_q_heads // num_kv_heads
    combined = np.split(np.arange(2 * num_kv_heads), num_shards)
    query = np.split(np.arange(num_q_heads), num_shards)
    for shard in range(num_shards):
        kv_heads = combined[shard][0::2] // 2
        assert (combined[shard][0::2] % 2 == 0).all()
        assert (combined[shard][1::2] % 2 == 1).all()
        assert (combined[shard][1::2] // 2 == kv_heads).all(), "K and V of one head split"
        assert set(query[shard] // group) == set(kv_heads)
        for local_q, global_q in enumerate(query[shard]):
            # local kv head of local query head == the global rule's kv head
            assert kv_heads[local_q // group] == global_q // group


def test_layouts_name_real_operands():
    for name, layout in head_sharding.LAYOUTS.items():
        op = ops.get(name)
        for operand, entry in layout.dims.items():
            assert operand in op.operand_names, (name, operand)
            assert 0 <= entry.dim < op.operands[op.operand_names.index(operand)].rank
        assert layout.kv_operand in layout.dims
        assert set(op.returned_like) <= set(op.operand_names)


def shapes(num_q_heads: int, num_kv_heads: int, combined: int | None = None, sinks: int = 0):
    """Operand shapes of paged_attention; sinks: the entries of the sinks operand (0: none)."""
    combined = 2 * num_kv_heads if combined is None else combined
    metadata = [(3,), (3, 4), (4,), (1,)]
    # then sinks, k_scales, v_scales and value_cache (absent: [0])
    return [(10, num_q_heads, 64), (7, 16, combined, 64), *metadata, (sinks,), (0,), (0,), (0,)]


@pytest.mark.parametrize(
    ("num_q_heads", "num_kv_heads", "num_shards", "message"),
    [
        (8, 2, 4, r"kv_cache: 2 KV heads .* cannot be split over 4 devices .*more devices than KV"),
        (12, 6, 4, r"kv_cache: 6 KV heads .* not divisible by the 4 devices"),
        (8, 8, 3, r"kv_cache: 8 KV heads .* not divisible by the 3 devices"),
        (1, 1, 2, r"kv_cache: 1 KV heads .* cannot be split over 2 devices"),
    ],
)
def test_split_errors_name_kv_cache(num_q_heads, num_kv_heads, num_shards, message):
    with pytest.raises(ValueError, match=message):
        head_sharding.check_split(
            PAGED_ATTENTION, shapes(num_q_heads, num_kv_heads), num_shards, "mesh axis 'heads'"
        )


def test_split_errors_for_inconsistent_heads():
    with pytest.raises(ValueError, match=r"query: 6 heads .* not a multiple of the 4 KV heads"):
        head_sharding.check_split(PAGED_ATTENTION, shapes(6, 4), 2, "x")
    with pytest.raises(ValueError, match=r"kv_cache: dimension 2 has 5 entries, expected 2 per"):
        head_sharding.check_split(PAGED_ATTENTION, shapes(4, 2, combined=5), 1, "x")
    with pytest.raises(ValueError, match=r"simple_add: op: has no KV-head sharding rule"):
        head_sharding.layout(ops.SIMPLE_ADD)
    with pytest.raises(ValueError, match=r"axis: 'model' is not an axis of the mesh"):
        head_sharding.axis_size({"heads": 4}, "model")
    assert head_sharding.axis_size({"data": 2, "heads": 4}, ("data", "heads")) == 8
    with pytest.raises(ValueError, match=r"sinks: 6 heads .* not a multiple of the 4 KV heads"):
        head_sharding.check_split(PAGED_ATTENTION, shapes(8, 4, sinks=6), 2, "x")
    for q, kv, n in [(8, 4, 4), (32, 8, 2), (4, 4, 1), (8, 2, 1)]:
        head_sharding.check_split(PAGED_ATTENTION, shapes(q, kv), n, "x")  # valid: no error
        head_sharding.check_split(PAGED_ATTENTION, shapes(q, kv, sinks=q), n, "x")


def test_partition_entries():
    assert head_sharding.partition_entries(PAGED_ATTENTION, "heads") == [
        (None, "heads", None),
        (None, None, "heads", None),
        (None,),
        (None, None),
        (None,),
        (None,),
        ("heads",),  # sinks follow the query heads
        (None,),  # k_scales and v_scales are replicated (one entry, or none)
        (None,),
        (None, None, None, None),  # value_cache: refused by check_split when given
    ]
    # out [T, Hq, D] and lse [T, Hq] follow the query heads
    assert head_sharding.result_entries(PAGED_ATTENTION, [3, 2], ("a", "b")) == [
        (None, ("a", "b"), None),
        (None, ("a", "b")),
    ]
    # kv_cache_update: new_kv by its combined heads, slots replicated; the result is the cache
    assert head_sharding.partition_entries(KV_CACHE_UPDATE, "heads") == [
        (None, "heads", None),
        (None,),
        (None, None, "heads", None),
        (None,),  # k_scales, v_scales: replicated
        (None,),
        (None, None, None, None),  # value_cache: refused by check_split when given
    ]
    assert KV_CACHE_UPDATE.returned_like == ("kv_cache", "value_cache")
    assert head_sharding.result_entries(KV_CACHE_UPDATE, [4, 4], "heads") == [
        (None, None, "heads", None),
        (None, None, None, None),
    ]


def test_cache_write_split_checks_new_kv_against_the_cache():
    def cache_shapes(new_kv_heads: int, cache_heads: int):
        return [(40, new_kv_heads, 64), (40,), (7, 16, cache_heads, 64), (0,), (0,), (0,)]

    head_sharding.check_split(KV_CACHE_UPDATE, cache_shapes(8, 8), 4, "x")  # 4 KV heads, 4 ways
    with pytest.raises(
        ValueError, match=r"kv_cache_update: kv_cache: 2 KV heads .* cannot be split"
    ):
        head_sharding.check_split(KV_CACHE_UPDATE, cache_shapes(4, 4), 4, "mesh axis 'heads'")
    with pytest.raises(ValueError, match=r"kv_cache_update: new_kv: dimension 1 has 6 entries"):
        head_sharding.check_split(KV_CACHE_UPDATE, cache_shapes(6, 8), 2, "x")


HLO_WITH_COLLECTIVES = """
HloModule m
ENTRY %main (p: f32[8,4]) -> f32[8,16] {
  %p = f32[8,4]{1,0} parameter(0)
  %all-gather-start = (f32[8,4]{1,0}, f32[8,16]{1,0}) all-gather-start(%p), dimensions={1}
  %all-gather-done = f32[8,16]{1,0} all-gather-done(%all-gather-start)
  %ar = f32[8,4]{1,0} all-reduce(%p), to_apply=%add
  %cp.1 = f32[8,4]{1,0} collective-permute(%p), source_target_pairs={{0,1}}
  %a2a = f32[8,4]{1,0} all-to-all(%p), dimensions={0}
  %fusion.all-gather = f32[8,4]{1,0} fusion(%p), kind=kLoop, calls=%all_gather_like
  %cc = (f32[8,4]{1,0}) custom-call(%p), custom_call_target="all-gather"
  ROOT %r = f32[8,16]{1,0} copy(%all-gather-done)
}
"""


def test_collectives_parser():
    found = head_sharding.collectives_in_hlo(HLO_WITH_COLLECTIVES)
    assert [(c.name, c.opcode) for c in found] == [
        ("all-gather-start", "all-gather"),
        ("all-gather-done", "all-gather"),
        ("ar", "all-reduce"),
        ("cp.1", "collective-permute"),
        ("a2a", "all-to-all"),
    ]
    assert found[1].shape == "f32[8,16]{1,0}"
    assert head_sharding.collectives_in_hlo("ROOT %r = f32[2]{0} add(%a, %b)") == []


# ------------------------------------------------------------------------------- one device
@needs_library
def test_jax_mesh_of_one_device_is_the_plain_call():
    jax = pytest.importorskip("jax")
    import torch
    from jax.sharding import Mesh
    from paged_inputs import MIXED, make_paged_inputs

    from xla_gpu_ops import jax as xgo_jax
    from xla_gpu_ops import sharding

    seed = fresh_seed()
    inputs = make_paged_inputs(MIXED, 8, 2, 64, 16, torch.float32, seed, pad_tokens=2)
    required = PAGED_ATTENTION.operand_names[: PAGED_ATTENTION.num_required]
    arrays = [jax.numpy.asarray(inputs[name].numpy()) for name in required]
    mesh = Mesh(np.array(jax.devices()[:1]), ("heads",))
    expected = np.asarray(xgo_jax.paged_attention(*arrays, scale=0.125, soft_cap=2.0))
    for fn in (
        lambda *a: sharding.paged_attention(*a, mesh=mesh, scale=0.125, soft_cap=2.0),
        lambda *a: sharding.partitioned_paged_attention(*a, scale=0.125, soft_cap=2.0),
    ):
        assert np.array_equal(np.asarray(jax.jit(fn)(*arrays)), expected), f"seed {seed}"
    by_name = dict(zip(required, arrays, strict=True))
    out = sharding.paged_attention(**by_name, mesh=mesh, scale=0.125, soft_cap=2.0)  # eager
    assert np.array_equal(np.asarray(out), expected), f"seed {seed}"

    with pytest.raises(TypeError, match=r"paged_attention: mesh: must be a jax.sharding.Mesh"):
        sharding.paged_attention(*arrays, mesh=None, scale=0.125)
    with pytest.raises(ValueError, match=r"paged_attention: axis: 'model' is not an axis"):
        sharding.paged_attention(*arrays, mesh=mesh, axis="model", scale=0.125)
    with pytest.raises(TypeError, match=r"paged_attention: scale: missing"):
        sharding.paged_attention(*arrays, mesh=mesh)
    with pytest.raises(TypeError, match=r"paged_attention: unexpected argument 'softcap'"):
        sharding.partitioned_paged_attention(*arrays, scale=0.1, softcap=2.0)
    with pytest.raises(ValueError, match=r"simple_add: op: has no KV-head sharding rule"):
        sharding.shard_map_call(ops.SIMPLE_ADD, arrays[:2], {}, mesh=mesh)


# ------------------------------------------------------------------------------- 4 devices: JAX
JAX_SCRIPT = r"""
import functools, json, re, sys
sys.path.insert(0, TESTS_DIR)
import jax, jax.numpy as jnp, numpy as np, torch
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
import paged_inputs
from subprocess_python import recorder
from xla_gpu_ops import head_sharding, hlo, sharding
from xla_gpu_ops import jax as xgo_jax
from xla_gpu_ops.ops import KV_CACHE_UPDATE as CACHE_OP
from xla_gpu_ops.ops import PAGED_ATTENTION as OP

REQUIRED = OP.operand_names[: OP.num_required]
results = {"devices": len(jax.devices())}
TARGET = OP.ffi_target
record = recorder(results)


def to_jax(t):
    if t.is_floating_point():
        return jnp.asarray(t.float().numpy(), dtype=str(t.dtype).removeprefix("torch."))
    return jnp.asarray(t.numpy())


def make(case, seed):
    seqs, hq, hkv, d, ps, dtype, attrs = CASES[case]
    attrs = dict(attrs)
    sinks = attrs.pop("sinks", False)  # the case has sinks: given by keyword with the attributes
    inputs = paged_inputs.make_paged_inputs(getattr(paged_inputs, seqs), hq, hkv, d, ps,
                                            getattr(torch, dtype), seed, pad_tokens=2, extra_seqs=1,
                                            sinks=sinks)
    if sinks:
        attrs["sinks"] = to_jax(inputs["sinks"])
    return inputs, [to_jax(inputs[n]) for n in REQUIRED], attrs


def host(x):
    return np.asarray(jnp.asarray(x, jnp.float32))


def compiled_facts(fn, args, target=TARGET):
    text = fn.lower(*args).compile().as_text()
    return {
        "collectives": [[c.name, c.opcode, c.shape] for c in head_sharding.collectives_in_hlo(text)],
        "calls": [list(c.operand_shapes) for c in hlo.custom_calls_in_hlo(text) if c.target == target],
        "aliases": [line.strip()[:300] for line in text.splitlines() if "input_output_alias" in line],
    }


def compare(out, expected):
    return {"equal": bool(np.array_equal(host(out), expected)),
            "max_abs": float(np.max(np.abs(host(out) - expected))),
            "spec": [str(e) for e in out.sharding.spec], "shape": list(out.shape)}


def map_operand_count(lowered_text):  # operands entering the shard_map (sdy.manual_computation)
    match = re.search(r"sdy\.manual_computation\(([^)]*)\)", lowered_text)
    return len(match[1].split(",")) if match else None


def run_case(case, mesh, axis="heads", variants=("shard_map", "partitioned")):
    inputs, arrays, attrs = make(case, SEED)
    expected = host(jax.jit(functools.partial(xgo_jax.paged_attention, **attrs))(*arrays))
    placed = [jax.device_put(a, s) for a, s in zip(arrays, sharding.input_shardings(mesh, axis))]
    out = {}
    for variant in variants:
        if variant == "shard_map":
            fn = jax.jit(lambda *a: sharding.paged_attention(*a, mesh=mesh, axis=axis, **attrs))
        elif variant == "partitioned":
            fn = jax.jit(lambda *a: sharding.partitioned_paged_attention(*a, **attrs))
        elif variant == "eager":
            result = sharding.paged_attention(*placed, mesh=mesh, axis=axis, **attrs)
            out[variant] = compare(result, expected)
            continue
        else:  # the unwrapped ffi call under plain jit, inputs sharded the same way
            fn = jax.jit(functools.partial(xgo_jax.paged_attention, **attrs))
        out[variant] = {**compare(fn(*placed), expected), **compiled_facts(fn, placed)}
        if variant == "shard_map":
            out[variant]["map_operands"] = map_operand_count(fn.lower(*placed).as_text())
    out["kv_shape"] = list(arrays[1].shape)
    out["given_operands"] = len(REQUIRED) + ("sinks" in attrs)
    return out


mesh4 = Mesh(np.array(jax.devices()[:4]), ("heads",))
for case in CASES:
    record(case, lambda: run_case(case, mesh4))
record("eager", lambda: run_case("gqa4_f32_decode", mesh4, variants=("eager",)))
record("plain_jit", lambda: run_case("gqa2_bf16_mixed_window_cap", mesh4, variants=("plain",)))
record("two_devices", lambda: run_case("gqa8_f32_mixed_window",
                                       Mesh(np.array(jax.devices()[2:4]), ("heads",))))
mesh2d = Mesh(np.array(jax.devices()[:4]).reshape(2, 2), ("data", "heads"))
record("mesh2d_heads", lambda: run_case("gqa4_f32_decode", mesh2d, "heads"))
record("mesh2d_both", lambda: run_case("gqa4_8kv_f16_prefill_cap", mesh2d, ("data", "heads")))


def shard_map_error(num_q_heads, num_kv_heads):
    inputs = paged_inputs.make_paged_inputs(paged_inputs.DECODE, num_q_heads, num_kv_heads, 64, 16,
                                            torch.float32, SEED)
    arrays = [to_jax(inputs[n]) for n in REQUIRED]
    try:
        jax.jit(lambda *a: sharding.paged_attention(*a, mesh=mesh4, scale=0.1))(*arrays)
    except Exception as error:
        return {"type": type(error).__name__, "message": str(error)}
    return {"type": None}


def partitioned_error():
    inputs = paged_inputs.make_paged_inputs(paged_inputs.DECODE, 8, 2, 64, 16, torch.float32, SEED)
    arrays = [to_jax(inputs[n]) for n in REQUIRED]
    kv = NamedSharding(mesh4, P(None, None, "heads", None))
    placed = [jax.device_put(a, kv if i == 1 else NamedSharding(mesh4, P()))
              for i, a in enumerate(arrays)]
    try:
        jax.jit(lambda *a: sharding.partitioned_paged_attention(*a, scale=0.1))(*placed)
    except Exception as error:
        return {"type": type(error).__name__, "message": str(error)[-2000:]}
    return {"type": None}


def cache_inputs(dtype):
    new_kv, slots, cache = paged_inputs.make_cache_write_inputs(SEED, getattr(torch, dtype),
                                                                num_kv_heads=8)
    return [to_jax(new_kv), to_jax(slots), to_jax(cache)]


def cache_case(dtype, attrs):
    # The cache is donated: XLA writes it in place, so each run gets fresh copies.
    arrays = cache_inputs(dtype)
    expected = host(jax.jit(functools.partial(xgo_jax.kv_cache_update, **attrs))(*arrays))
    shardings = sharding.input_shardings(mesh4, op=CACHE_OP)
    out = {"kv_shape": list(arrays[2].shape)}
    for variant in ("shard_map", "partitioned"):
        if variant == "shard_map":
            fn = lambda *a: sharding.kv_cache_update(*a, mesh=mesh4, **attrs)
        else:
            fn = lambda *a: sharding.partitioned_kv_cache_update(*a, **attrs)
        jitted = jax.jit(fn, donate_argnums=2)
        placed = [jax.device_put(a, s) for a, s in zip(cache_inputs(dtype), shardings)]
        facts = compiled_facts(jitted, placed, CACHE_OP.ffi_target)
        out[variant] = {**compare(jitted(*placed), expected), **facts,
                        "donated_deleted": placed[2].is_deleted()}
    return out


record("cache_bf16", lambda: cache_case("bfloat16", {}))
record("cache_f32_scales", lambda: cache_case("float32", {"k_scale": 0.5, "v_scale": 2.0}))
record("error_more_devices", lambda: shard_map_error(8, 2))
record("error_not_divisible", lambda: shard_map_error(12, 6))
record("error_partitioned", partitioned_error)


def torchax_route():
    import torchax
    import xla_gpu_ops.torchax as xgo_torchax

    xgo_torchax.register()
    env = torchax.default_env()
    inputs, arrays, attrs = make("gqa2_bf16_mixed_window_cap", SEED)

    def program(query, kv_cache, *metadata):  # a PyTorch program: torch ops around the call
        out = sharding.torchax_paged_attention(query * 0.5, kv_cache, *metadata, mesh=mesh4,
                                               **attrs)
        return out.float() * 2.0

    def unsharded(query, kv_cache, *metadata):
        out = torch.ops.xla_gpu.paged_attention(query * 0.5, kv_cache, *metadata, **attrs)[0]
        return out.float() * 2.0

    with env:
        tensors = [torchax.interop.torch_view(a) for a in arrays]
        expected = host(unsharded(*tensors).jax())
        for t, s in zip(tensors, sharding.input_shardings(mesh4)):
            t.apply_jax_(jax.device_put, s)
        eager = program(*tensors)
        assert isinstance(eager, torchax.tensor.Tensor), type(eager)
        eager = eager.jax()
    jitted = jax.jit(torchax.interop.jax_view(program))
    placed = [t.jax() for t in tensors]
    return {"kv_spec": [str(e) for e in placed[1].sharding.spec],
            "eager": compare(eager, expected),
            "jit": {**compare(jitted(*placed), expected), **compiled_facts(jitted, placed)}}


def torchax_cache_route():
    import torchax
    import xla_gpu_ops.torchax as xgo_torchax

    xgo_torchax.register()
    env = torchax.default_env()
    attrs = {"k_scale": 0.5}
    expected = host(xgo_jax.kv_cache_update(*cache_inputs("bfloat16"), **attrs))
    shardings = sharding.input_shardings(mesh4, op=CACHE_OP)

    def program(new_kv, slot_mapping, kv_cache):  # in place, as torch.ops.xla_gpu.kv_cache_update
        returned = sharding.torchax_kv_cache_update(new_kv * 1.0, slot_mapping, kv_cache,
                                                    mesh=mesh4, **attrs)
        assert returned is None, type(returned)
        return kv_cache

    arrays = cache_inputs("bfloat16")  # outside the env: there torch.randn would be torchax's
    with env:
        tensors = [torchax.interop.torch_view(a) for a in arrays]
        for t, s in zip(tensors, shardings):
            t.apply_jax_(jax.device_put, s)
        program(*tensors)
        eager = tensors[2].jax()
    jitted = jax.jit(torchax.interop.jax_view(program))
    placed = [jax.device_put(a, s) for a, s in zip(cache_inputs("bfloat16"), shardings)]
    return {"eager": compare(eager, expected),
            "jit": {**compare(jitted(*placed), expected),
                    **compiled_facts(jitted, placed, CACHE_OP.ffi_target)}}


record("torchax", torchax_route)
record("torchax_cache", torchax_cache_route)
print("RESULTS " + json.dumps(results))
"""


@pytest.fixture(scope="module")
def jax_results():
    pytest.importorskip("jax")
    if not _library.is_built():
        pytest.skip("libxla_gpu_ops.so is not built (nox -s build)")
    seed = fresh_seed()
    code = f"TESTS_DIR = {str(TESTS_DIR)!r}\nSEED = {seed}\nCASES = {CASES!r}\n" + JAX_SCRIPT
    env = {
        "XLA_FLAGS": f"--xla_force_host_platform_device_count={NUM_DEVICES}",
        "JAX_PLATFORMS": "cpu",
    }
    log = run_python(code, env, log_dir() / "jax-4-devices.log")
    results = results_of(log)
    assert results["devices"] == NUM_DEVICES, results
    return results, seed


def dims(hlo_shape: str) -> list[int]:
    """'bf16[4,16,8,64]{3,2,1,0}' -> [4, 16, 8, 64]"""
    match = re.match(r"^\w+\[([0-9,]*)\]", hlo_shape)
    assert match is not None, hlo_shape
    return [int(d) for d in match[1].split(",") if d]


def local_kv_shape(kv_shape: list[int], num_shards: int) -> list[int]:
    return [kv_shape[0], kv_shape[1], kv_shape[2] // num_shards, kv_shape[3]]


@pytest.mark.jax
@pytest.mark.parametrize("variant", ["shard_map", "partitioned"])
@pytest.mark.parametrize("case", list(CASES))
def test_jax_sharded_equals_unsharded_without_collectives(jax_results, case, variant):
    results, seed = jax_results
    entry = ok(results, case, seed)
    got = entry[variant]
    assert got["equal"], f"{case}/{variant}: max |diff| {got['max_abs']} (seed {seed})"
    assert got["spec"][:2] == ["None", "heads"], got["spec"]
    assert got["collectives"] == [], f"collectives in the compiled HLO: {got['collectives']}"
    # one custom call per device program, on that device's heads only
    assert len(got["calls"]) == 1, got["calls"]
    local = local_kv_shape(entry["kv_shape"], NUM_DEVICES)
    assert dims(got["calls"][0][1]) == local, (got["calls"], entry["kv_shape"])
    if variant == "shard_map":
        # Only the operands the caller gave enter the map: an absent operand's empty stand-in,
        # split or hoisted into the map, crashed XLA's GPU compiler on two GPUs.
        assert got["map_operands"] == entry["given_operands"], (got, entry["given_operands"])


@pytest.mark.jax
def test_jax_shard_map_eager(jax_results):
    results, seed = jax_results
    got = ok(results, "eager", seed)["eager"]
    assert got["equal"], f"max |diff| {got['max_abs']} (seed {seed})"


@pytest.mark.jax
@pytest.mark.parametrize(
    ("name", "num_shards", "spec"),
    [
        ("two_devices", 2, "heads"),
        ("mesh2d_heads", 2, "heads"),
        ("mesh2d_both", 4, "('data', 'heads')"),
    ],
)
def test_jax_other_meshes(jax_results, name, num_shards, spec):
    """A sub-mesh of 2 devices; a 2x2 mesh split on one axis (replicated over the other) or on
    both axes together."""
    results, seed = jax_results
    entry = ok(results, name, seed)
    for variant in ("shard_map", "partitioned"):
        got = entry[variant]
        assert got["equal"], f"{name}/{variant}: max |diff| {got['max_abs']} (seed {seed})"
        assert got["spec"][1] == spec, got["spec"]
        assert got["collectives"] == [], got["collectives"]
        expected = local_kv_shape(entry["kv_shape"], num_shards)
        assert dims(got["calls"][0][1]) == expected, got["calls"]


@pytest.mark.jax
def test_plain_jit_of_the_ffi_call_all_gathers_the_cache(jax_results):
    """Why the wrappers exist: jax.ffi.ffi_call has no sharding rule, so plain jit gathers the
    sharded query and kv_cache onto every device and runs the whole op there."""
    results, seed = jax_results
    entry = ok(results, "plain_jit", seed)
    got = entry["plain"]
    assert got["equal"], f"max |diff| {got['max_abs']}"
    gathered = [dims(c[2]) for c in got["collectives"] if c[1] == "all-gather"]
    # (XLA:CPU gathers bf16 as f32: compare the dimensions)
    assert entry["kv_shape"] in gathered, got["collectives"]
    assert dims(got["calls"][0][1]) == entry["kv_shape"], got["calls"]  # the whole cache


@pytest.mark.jax
@pytest.mark.parametrize(
    ("name", "message"),
    [
        (
            "error_more_devices",
            r"paged_attention: kv_cache: 2 KV heads \(dimension 2 of size 4\) "
            r"cannot be split over 4 devices of mesh axis 'heads': more devices than KV heads",
        ),
        (
            "error_not_divisible",
            r"paged_attention: kv_cache: 6 KV heads \(dimension 2 of size 12\)"
            r" are not divisible by the 4 devices of mesh axis 'heads'",
        ),
    ],
)
def test_jax_shard_map_errors(jax_results, name, message):
    results, seed = jax_results
    got = ok(results, name, seed)
    assert got["type"] == "ValueError", got
    assert re.search(message, got["message"]), got["message"]


@pytest.mark.jax
def test_jax_partitioned_error_while_compiling(jax_results):
    """Under plain jit the split is known only to the partitioner: jax reports the ValueError
    raised there as a runtime error whose message carries it (jax 0.7 names it XlaRuntimeError,
    later releases JaxRuntimeError)."""
    results, seed = jax_results
    got = ok(results, "error_partitioned", seed)
    assert got["type"] in ("XlaRuntimeError", "JaxRuntimeError"), got
    assert re.search(
        r"ValueError: paged_attention: kv_cache: 2 KV heads .* cannot be split over 4 devices of "
        r"mesh axis 'heads'",
        got["message"],
    ), got["message"]


@pytest.mark.jax
@pytest.mark.parametrize("variant", ["shard_map", "partitioned"])
@pytest.mark.parametrize("case", ["cache_bf16", "cache_f32_scales"])
def test_jax_sharded_cache_write_in_place_without_collectives(jax_results, case, variant):
    """kv_cache_update split by KV head with the cache donated: the same cache as the unsharded
    write, sharded (None, None, heads, None), no collective, one custom call on the device's
    own heads, and the donated cache written in place (its buffer aliased, the input deleted)."""
    results, seed = jax_results
    entry = ok(results, case, seed)
    got = entry[variant]
    assert got["equal"], f"{case}/{variant}: max |diff| {got['max_abs']} (seed {seed})"
    assert got["spec"][:3] == ["None", "None", "heads"], got["spec"]  # jax drops trailing Nones
    assert got["collectives"] == [], f"collectives in the compiled HLO: {got['collectives']}"
    assert len(got["calls"]) == 1, got["calls"]
    local = local_kv_shape(entry["kv_shape"], NUM_DEVICES)
    assert dims(got["calls"][0][2]) == local, (got["calls"], entry["kv_shape"])
    assert dims(got["calls"][0][0])[1] == local[2], got["calls"]  # new_kv's own heads
    assert got["aliases"], "no input_output_alias in the compiled module"
    assert got["donated_deleted"]


@pytest.mark.torchax
def test_torchax_sharded_cache_write_in_place(jax_results):
    pytest.importorskip("torchax")
    results, seed = jax_results
    got = ok(results, "torchax_cache", seed)
    for mode in ("eager", "jit"):
        assert got[mode]["equal"], f"{mode}: max |diff| {got[mode]['max_abs']} (seed {seed})"
        assert got[mode]["spec"][:3] == ["None", "None", "heads"], got[mode]["spec"]
    assert got["jit"]["collectives"] == [], got["jit"]["collectives"]
    assert len(got["jit"]["calls"]) == 1


@pytest.mark.torchax
def test_torchax_route(jax_results):
    pytest.importorskip("torchax")
    results, seed = jax_results
    got = ok(results, "torchax", seed)
    assert got["kv_spec"] == ["None", "None", "heads", "None"]
    for mode in ("eager", "jit"):
        assert got[mode]["equal"], f"{mode}: max |diff| {got[mode]['max_abs']} (seed {seed})"
        assert got[mode]["spec"][:2] == ["None", "heads"], got[mode]["spec"]
    assert got["jit"]["collectives"] == [], got["jit"]["collectives"]
    assert len(got["jit"]["calls"]) == 1


# ------------------------------------------------------------------------------- torch_xla
TORCH_XLA_SCRIPT = r"""
import glob, json, os, sys
sys.path.insert(0, TESTS_DIR)
import numpy as np, torch
import torch_xla, torch_xla.runtime as xr, torch_xla.core.xla_model as xm
import torch_xla.distributed.spmd as xs
import paged_inputs
from subprocess_python import recorder
from xla_gpu_ops import head_sharding, hlo, reference, torch_xla_sharding
from xla_gpu_ops import torch_xla as xgo_torch_xla
from xla_gpu_ops.ops import PAGED_ATTENTION as OP

xr.use_spmd()
results = {"devices": xr.global_runtime_device_count()}
mesh = xs.Mesh(np.arange(4), (4,), ("heads",))
device = torch_xla.device()

record = recorder(results)


def optimized_since(before):
    # The graph's own modules (SyncTensorsGraph); `.cpu()` of a sharded result compiles a
    # separate ReplicateShardedData module that gathers it for the host copy.
    files = sorted(set(glob.glob(os.path.join(DUMP_DIR, "*after_optimizations.txt"))) - before)
    graphs = [f for f in files if ".SyncTensorsGraph." in os.path.basename(f)]
    return "\n".join(open(f).read() for f in graphs), len(graphs)


def dumps():
    return set(glob.glob(os.path.join(DUMP_DIR, "*after_optimizations.txt")))


def facts(text):
    return {"collectives": [[c.name, c.opcode, c.shape] for c in head_sharding.collectives_in_hlo(text)],
            "calls": [list(c.operand_shapes) for c in hlo.custom_calls_in_hlo(text)
                      if c.target == OP.ffi_target]}


REQUIRED = OP.operand_names[: OP.num_required]


def make(case):
    seqs, hq, hkv, d, ps, dtype, attrs = CASES[case]
    attrs = dict(attrs)
    sinks = attrs.pop("sinks", False)  # the case has sinks: given by keyword with the attributes
    inputs = paged_inputs.make_paged_inputs(getattr(paged_inputs, seqs), hq, hkv, d, ps,
                                            getattr(torch, dtype), SEED, pad_tokens=2, extra_seqs=1,
                                            sinks=sinks)
    if sinks:
        attrs["sinks"] = inputs.pop("sinks")
    return inputs, attrs


def composite_case(case):
    os.environ[xgo_torch_xla.IMPL_ENV] = "composite"
    inputs, attrs = make(case)
    on_device = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in attrs.items()}
    plain = torch.ops.xla_gpu.paged_attention(*[inputs[n].to(device) for n in REQUIRED],
                                              **on_device)[0]
    torch_xla.sync()
    plain = plain.cpu()
    before = dumps()
    out = torch_xla_sharding.paged_attention(*[inputs[n].to(device) for n in REQUIRED],
                                             mesh=mesh, **on_device)
    spec = torch_xla._XLAC._get_xla_sharding_spec(out)
    torch_xla.sync()
    out = out.cpu()
    text, modules = optimized_since(before)
    expected = reference.paged_attention(**inputs, **attrs, compute_dtype=torch.float64)
    rel = ((out.double() - expected).norm() / expected.norm()).item()
    return {"equal": bool(torch.equal(out, plain)), "max_abs": (out.float() - plain.float()).abs().max().item(),
            "rel_l2_vs_reference": rel, "spec": spec, "modules": modules, **facts(text)}


def custom_call_case(manual):
    os.environ[xgo_torch_xla.IMPL_ENV] = "custom_call"
    inputs, attrs = make("gqa4_f32_decode")
    tensors = [inputs[n].to(device) for n in REQUIRED]
    before = dumps()
    if manual:
        out = torch_xla_sharding.paged_attention(*tensors, mesh=mesh, **attrs)
    else:
        xs.mark_sharding(tensors[0], mesh, (None, "heads", None))
        xs.mark_sharding(tensors[1], mesh, (None, None, "heads", None))
        out = torch.ops.xla_gpu.paged_attention(*tensors, **attrs)[0]
    try:
        torch_xla.sync()
        out.cpu()
        run = "ran"
    except Exception as error:
        run = f"{type(error).__name__}: {error}"[:500]
    text, modules = optimized_since(before)
    return {"run": run, "modules": modules, "kv_shape": list(inputs["kv_cache"].shape), **facts(text)}


def error_case():
    os.environ[xgo_torch_xla.IMPL_ENV] = "composite"
    inputs = paged_inputs.make_paged_inputs(paged_inputs.DECODE, 8, 2, 64, 16, torch.float32, SEED)
    try:
        torch_xla_sharding.paged_attention(*[inputs[n].to(device) for n in REQUIRED],
                                           mesh=mesh, scale=0.1)
    except Exception as error:
        return {"type": type(error).__name__, "message": str(error)}
    return {"type": None}


def cache_write_case():
    # kv_cache_update on XLA runs its composite scatter (the default: torch_xla cannot alias)
    new_kv, slots, cache = paged_inputs.make_cache_write_inputs(SEED, torch.bfloat16,
                                                                num_kv_heads=8)
    expected = cache.clone()
    reference.kv_cache_update(new_kv, slots, expected, k_scale=0.5)
    tensors = [t.to(device) for t in (new_kv, slots, cache)]
    before = dumps()
    returned = torch_xla_sharding.kv_cache_update(*tensors, mesh=mesh, k_scale=0.5)
    spec = torch_xla._XLAC._get_xla_sharding_spec(tensors[2])
    torch_xla.sync()
    got = tensors[2].cpu()
    text, modules = optimized_since(before)
    return {"returned_none": returned is None, "equal": bool(torch.equal(got, expected)),
            "spec": spec, "modules": modules,
            "collectives": [[c.name, c.opcode, c.shape]
                            for c in head_sharding.collectives_in_hlo(text)]}


for case in COMPOSITE_CASES:
    record(case, lambda: composite_case(case))
record("cache_write", cache_write_case)
record("custom_call_manual", lambda: custom_call_case(True))
record("custom_call_plain", lambda: custom_call_case(False))
record("error_more_devices", error_case)
# the runtime recovers from the failed custom call: a later composite still runs
record("after_failure", lambda: composite_case(COMPOSITE_CASES[0]))
print("RESULTS " + json.dumps(results))
"""
TORCH_XLA_CASES = [
    "gqa2_bf16_mixed_window_cap",
    "gqa4_f32_decode",
    "gqa4_8kv_f16_prefill_cap",
    "gqa2_f32_mixed_sinks",
]
TOLERANCE = {"float32": 1e-5, "float16": 2e-3, "bfloat16": 1e-2}


@pytest.fixture(scope="module")
def torch_xla_results():
    pytest.importorskip("torch_xla", reason="needs torch_xla")
    from xla_gpu_ops import torch_xla as binding

    if binding.torch_xla_version() < (2, 9):
        pytest.skip("the torch_xla SPMD route targets torch_xla 2.9 (the default stack)")
    if not _library.is_built():
        pytest.skip("libxla_gpu_ops.so is not built (nox -s build)")
    seed = fresh_seed()
    dump_dir = log_dir() / "torch-xla-dumps"
    if dump_dir.exists():
        for f in dump_dir.iterdir():
            f.unlink()
    code = (
        f"TESTS_DIR = {str(TESTS_DIR)!r}\nSEED = {seed}\nCASES = {CASES!r}\n"
        f"COMPOSITE_CASES = {TORCH_XLA_CASES!r}\nDUMP_DIR = {str(dump_dir)!r}\n" + TORCH_XLA_SCRIPT
    )
    env = {
        "PJRT_DEVICE": "CPU",
        "CPU_NUM_DEVICES": str(NUM_DEVICES),
        "JAX_PLATFORMS": "cpu",
        "XLA_FLAGS": f"--xla_dump_to={dump_dir} --xla_dump_hlo_as_text",
    }
    log = run_python(code, env, log_dir() / "torch-xla-4-devices.log")
    results = results_of(log)
    assert results["devices"] == NUM_DEVICES, results
    return results, seed


@pytest.mark.torch_xla
@pytest.mark.parametrize("case", TORCH_XLA_CASES)
def test_torch_xla_manual_sharding_composite(torch_xla_results, case):
    """SPMD with manual sharding around the call (composite: what XLA:CPU can run): equal to the
    unsharded call, sharded by head, and no collective in the optimised module."""
    results, seed = torch_xla_results
    got = ok(results, case, seed)
    assert got["equal"], f"max |diff| {got['max_abs']} vs the unsharded call (seed {seed})"
    assert got["rel_l2_vs_reference"] <= TOLERANCE[CASES[case][5]], got
    assert got["spec"] == "{devices=[1,4,1]0,1,2,3}", got["spec"]
    assert got["modules"] >= 1
    assert got["collectives"] == [], got["collectives"]


@pytest.mark.torch_xla
def test_torch_xla_sharded_cache_write_in_place(torch_xla_results):
    """kv_cache_update under SPMD with manual sharding: the caller's cache is updated in place
    to what the unsharded reference writes, keeps its head sharding, and no collective runs."""
    results, seed = torch_xla_results
    got = ok(results, "cache_write", seed)
    assert got["returned_none"]
    assert got["equal"], f"sharded cache write differs from the reference (seed {seed})"
    assert got["spec"] == "{devices=[1,1,4,1]0,1,2,3}", got["spec"]
    assert got["modules"] >= 1
    assert got["collectives"] == [], got["collectives"]


@pytest.mark.torch_xla
def test_torch_xla_runs_after_a_failed_custom_call(torch_xla_results):
    """The same sharded composite after the custom call failed to run (its compiled graph is
    reused: no new module)."""
    results, seed = torch_xla_results
    got = ok(results, "after_failure", seed)
    assert got["equal"], f"max |diff| {got['max_abs']} (seed {seed})"
    assert got["spec"] == "{devices=[1,4,1]0,1,2,3}", got["spec"]


@pytest.mark.torch_xla
def test_torch_xla_manual_sharding_custom_call(torch_xla_results):
    """The custom call itself under manual sharding: the optimised module calls it on one
    device's heads (kv_cache [P, page, 2*Hkv/4, D]) with no collective. XLA:CPU cannot run it:
    torch_xla has no way to register a host handler of ours."""
    results, seed = torch_xla_results
    got = ok(results, "custom_call_manual", seed)
    assert got["collectives"] == [], got["collectives"]
    assert len(got["calls"]) == 1
    assert dims(got["calls"][0][1]) == local_kv_shape(got["kv_shape"], NUM_DEVICES), got["calls"]
    assert "No FFI handler registered for xla_gpu_paged_attention" in got["run"], got["run"]


@pytest.mark.torch_xla
def test_torch_xla_mark_sharding_alone_all_gathers(torch_xla_results):
    """Why manual sharding: with mark_sharding alone GSPMD gathers the cache before the call."""
    results, seed = torch_xla_results
    got = ok(results, "custom_call_plain", seed)
    gathered = [dims(c[2]) for c in got["collectives"] if c[1] == "all-gather"]
    assert got["kv_shape"] in gathered, got["collectives"]
    assert dims(got["calls"][0][1]) == got["kv_shape"], got["calls"]


@pytest.mark.torch_xla
def test_torch_xla_more_devices_than_kv_heads(torch_xla_results):
    results, seed = torch_xla_results
    got = ok(results, "error_more_devices", seed)
    assert got["type"] == "ValueError", got
    assert re.search(r"kv_cache: 2 KV heads .* cannot be split over 4 devices", got["message"])


# ------------------------------------------------------------------------------- benchmark smoke
@pytest.mark.jax
def test_multi_gpu_benchmark_smoke_on_host_devices(tmp_path):
    """benchmarks/multi_gpu.py on 4 host devices: it completes, writes its record, every row's
    checks hold (equal to the one-device call, no collective, custom call on local heads) and
    nothing is judged."""
    pytest.importorskip("jax")
    if not _library.is_built():
        pytest.skip("libxla_gpu_ops.so is not built (nox -s build)")
    out = tmp_path / "multi-gpu"
    code = (
        f"import sys; sys.argv = ['multi_gpu.py', '--out', {str(out)!r}]\n"
        f"sys.path.insert(0, {str(ROOT)!r})\n"
        "from benchmarks import multi_gpu\n"
        "sys.exit(multi_gpu.main())\n"
    )
    env = {
        "XLA_FLAGS": f"--xla_force_host_platform_device_count={NUM_DEVICES}",
        "JAX_PLATFORMS": "cpu",
    }
    run_python(code, env, log_dir() / "multi-gpu-smoke.log")  # exit status 0: every check held
    table = (out / "table.md").read_text()
    assert "not judged (smoke)" in table
    assert "| pass |" not in table
    assert "| FAIL |" not in table
    files = {p.name for p in out.iterdir()}
    assert {"results.json", "table.md", "topology.txt", "run.log"} <= files, files
    assert {"hlo-decode-2gpu.txt", "hlo-decode-4gpu.txt"} <= files, files
    result = json.loads((out / "results.json").read_text())
    assert result["smoke"] is True
    assert result["env"]["env"]["NCCL_NVLS_ENABLE"] == "0"
    rows = {(r["case"], r["devices"]): r for r in result["rows"]}
    assert {n for _, n in rows} == {1, 2, 4}
    assert len(rows) == 3 * 3, sorted(rows)  # decode, mixed, mixed with fp8 and sinks
    for (case, n), row in rows.items():
        assert "error" not in row, (case, n, row.get("error"))
        assert row["kv_heads"] == 2 * n
        for variant in ("shard_map", "partitioned"):
            entry = row[variant]
            assert "error" not in entry, (case, n, variant, entry.get("error"))
            assert all(entry["checks"].values()), (case, n, variant, entry["checks"])
            assert entry["bitwise"], (case, n, variant)  # host handlers: exactly equal
            assert entry["verdict"] is None
            assert math.isfinite(entry["timing"]["us"])
        assert row["torchax"].get("bitwise") is True or "skipped" in row["torchax"], row["torchax"]
    hlo_4 = (out / "hlo-decode-4gpu.txt").read_text()
    assert head_sharding.collectives_in_hlo(hlo_4) == []
    assert PAGED_ATTENTION.ffi_target in hlo_4


def test_multi_gpu_verdicts_on_made_up_gpu_rows(monkeypatch):
    """The scaling verdict: throughput on N devices >= 0.9 x N x the one-device throughput of
    the same case and variant; the checks read the row's own facts."""
    monkeypatch.setenv("NCCL_NVLS_ENABLE", "0")  # what importing the script sets; restored after
    from benchmarks import multi_gpu

    def row(devices, us, rel_l2=1e-4, collectives=(), local=True):
        kv = [100, 16, 16 * devices, 128]
        local_kv = [100, 16, 16 if local else 16 * devices, 128]
        variant = {
            "rel_l2": rel_l2,
            "max_abs": 0.0,
            "bitwise": False,
            "finite": True,
            "collectives": list(collectives),
            "custom_call_kv": [f"bf16[{','.join(map(str, local_kv))}]"],
            "out_devices": devices,
            "timing": {
                "us": us,
                "method": "slope",
                "us_whole_program": us + 1,
                "us_whole_p10": us,
                "us_whole_p90": us + 2,
            },
        }
        return {
            "case": "decode",
            "devices": devices,
            "q_heads": 32 * devices,
            "kv_heads": 8 * devices,
            "tokens": 32,
            "kv_cache_shape": kv,
            "kv_bytes_read": 10**9 * devices,
            "dtype": "bfloat16",
            "shard_map": variant,
            "partitioned": dict(variant),
        }

    rows = [
        row(1, 100.0),
        row(2, 105.0),  # 100/105 = 0.952 of 2x: pass
        row(4, 125.0, rel_l2=0.5, collectives=["all-gather bf16[100,16,64,128]"], local=False),
    ]
    multi_gpu.judge(rows, on_gpu=True)
    one, two, four = (r["shard_map"] for r in rows)
    assert one["verdict"] == "reference"
    assert two["verdict"] == "pass"
    assert two["scaling"] == pytest.approx(100 / 105)
    assert four["verdict"] == "FAIL"
    assert four["scaling"] == pytest.approx(0.8)
    assert all(two["checks"].values())
    assert four["checks"] == {
        "equal_to_one_gpu": False,
        "no_collectives": False,
        "custom_call_on_local_heads": False,
        "runs_on_all_devices": True,
    }
    assert one["head_tokens_per_s"] == pytest.approx(32 * 32 / 100e-6)
    text = multi_gpu.table(rows, on_gpu=True)
    assert "| pass |" in text
    assert "| FAIL |" in text
    multi_gpu.judge(rows := [row(1, 100.0), row(2, 300.0)], on_gpu=False)
    assert [r["shard_map"]["verdict"] for r in rows] == [None, None]  # a smoke judges nothing
