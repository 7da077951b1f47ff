"""Cache layouts besides the interleaved NHD cache: K and V in caches of their own
(`value_cache`, [P, page_size, Hkv, D]: vLLM's FlashAttention backend's `cache.unbind(0)`
halves, FlashInfer's xqa, transformers' paged cache), K and V in one tensor [P, 2, page_size,
Hkv, D] (FlashInfer's paged cache, vLLM's FlashInfer backend) and the HND order
(`kv_layout="HND"`, [P, heads, page_size, D]), read by paged_attention and written by
kv_cache_store and kv_cache_update in place. Checked against the interleaved NHD call on the same
values, on every kernel path where there is a GPU (decode, mma.sync and sm_90a prefill, f32, fp8)
and on the CPU routes here; bad caches and layouts are refused by name."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from paged_inputs import (
    DECODE,
    MIXED,
    PREFILL,
    fresh_seed,
    is_hopper,
    make_paged_inputs,
    prefill_kernel,
    rel_l2,
)

import xla_gpu_ops
from xla_gpu_ops import _library

pytestmark = [
    pytest.mark.kernels,
    pytest.mark.skipif(not _library.is_built(), reason="libxla_gpu_ops.so is not built"),
]
OPERANDS = ("query", "kv_cache", "context_lens", "block_tables", "query_start_loc", "num_seqs")
HQ, HKV, D, PAGE = 8, 2, 64, 16
SCALE = 1.0 / math.sqrt(D)
BATCHES = {"decode": DECODE, "prefill": PREFILL, "mixed": MIXED}
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def split(kv_cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The interleaved cache's K and V as two caches [P, page, Hkv, D]; vLLM's layout: one
    [2, P, page, Hkv, D] tensor, unbound (each half contiguous, no copy when read)."""
    both = torch.stack([kv_cache[:, :, 0::2], kv_cache[:, :, 1::2]]).contiguous()
    key_cache, value_cache = both.unbind(0)
    assert key_cache.is_contiguous()
    assert value_cache.is_contiguous()
    return key_cache, value_cache


def to_hnd(cache: torch.Tensor) -> torch.Tensor:
    """An NHD cache [P, page_size, heads, D] as the HND cache with its values, [P, heads,
    page_size, D] (FlashInfer's other layout)."""
    return cache.transpose(1, 2).contiguous()


def attend(data: dict, **kwargs):
    return xla_gpu_ops.paged_attention(*[data[n] for n in OPERANDS], scale=SCALE, **kwargs)


LAYOUTS = {  # the caches of a test: (kv_layout, how K and V are kept)
    "separate": ("NHD", "separate"),
    "paired": ("NHD", "paired"),
    "hnd": ("HND", "interleaved"),
    "hnd-separate": ("HND", "separate"),
    "hnd-paired": ("HND", "paired"),
}


def in_layout(layout: str, kv_cache: torch.Tensor) -> dict:
    """The interleaved NHD cache's values as the caches and kv_layout of `layout`: the keyword
    arguments of the call (kv_cache, value_cache where apart, kv_layout)."""
    kv_layout, kept = LAYOUTS[layout]
    order = to_hnd if kv_layout == "HND" else (lambda c: c)
    if kept == "interleaved":
        return {"kv_cache": order(kv_cache), "kv_layout": kv_layout}
    key_cache, value_cache = (order(c) for c in split(kv_cache))
    if kept == "paired":  # [P, 2, page_size, Hkv, D] (HND: [P, 2, Hkv, page_size, D])
        return {"kv_cache": torch.stack([key_cache, value_cache], dim=1), "kv_layout": kv_layout}
    return {"kv_cache": key_cache, "value_cache": value_cache, "kv_layout": kv_layout}


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=[cuda, pytest.mark.gpu])])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("batch", list(BATCHES))
def test_layouts_equal_the_interleaved_nhd_cache(batch, layout, dtype, device):
    seed = fresh_seed()
    data = make_paged_inputs(BATCHES[batch], HQ, HKV, D, PAGE, dtype, seed, pad_tokens=2)
    data = {n: data[n].to(device) for n in OPERANDS}
    attrs = {"sliding_window": 40, "soft_cap": 20.0}
    expected, expected_lse = attend(data, **attrs, return_lse=True)
    caches = in_layout(layout, data["kv_cache"])
    out, lse = attend(
        {**data, "kv_cache": caches.pop("kv_cache")}, **caches, **attrs, return_lse=True
    )
    # the same values in the same order of sums: equal, not merely close
    assert rel_l2(out, expected) < 1e-6, f"seed {seed}"
    assert torch.equal(lse.isinf(), expected_lse.isinf())
    finite = expected_lse.isfinite()
    assert (lse[finite] - expected_lse[finite]).abs().max().item() < 1e-5


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=[cuda, pytest.mark.gpu])])
@pytest.mark.parametrize("head_dim", [80, 96, 192])
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_layouts_at_head_dims_between_the_kernel_widths(layout, head_dim, device):
    """Head dims the kernels run at the next width, zero-padded in shared memory: every layout's
    strides follow head_dim, not the kernel's width."""
    seed = fresh_seed()
    data = make_paged_inputs(MIXED, HQ, HKV, head_dim, PAGE, torch.bfloat16, seed, pad_tokens=2)
    data = {n: data[n].to(device) for n in OPERANDS}
    expected = attend(data)
    caches = in_layout(layout, data["kv_cache"])
    out = attend({**data, "kv_cache": caches.pop("kv_cache")}, **caches)
    assert rel_l2(out, expected) < 1e-6, f"seed {seed}"


@pytest.mark.gpu
@cuda
@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("batch", list(BATCHES))
def test_fp8_layouts_equal_the_interleaved_nhd_cache_on_cuda(batch, layout):
    seed = fresh_seed()
    data = make_paged_inputs(BATCHES[batch], HQ, HKV, D, PAGE, torch.bfloat16, seed)
    data = {n: data[n].cuda() for n in OPERANDS}
    data["kv_cache"] = (data["kv_cache"] * 8).to(torch.float8_e4m3fn)
    scales = {"k_scale": 0.125, "v_scale": 0.125}
    expected = attend(data, **scales)
    caches = in_layout(layout, data["kv_cache"])
    out = attend({**data, "kv_cache": caches.pop("kv_cache")}, **caches, **scales)
    assert rel_l2(out, expected) < 1e-6, f"seed {seed}"


# (head_dim, page_size): pages of 16 rows in a 128-key tile; 64-key tiles (D 256) in a 128-row page
SM90_TILINGS = {"pages-in-a-tile": (64, 16), "tiles-in-a-page": (256, 128)}


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or not is_hopper(), reason="needs sm_90")
@pytest.mark.parametrize("cache", ["bf16", "fp8"])
@pytest.mark.parametrize("tiling", list(SM90_TILINGS))
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_layouts_on_the_sm90_kernel_by_tensor_map(layout, tiling, cache):
    """The sm_90a kernel reads whole tiles of each layout through its tensor maps (HND boxes of a
    head's rows, NHD boxes of a page's slots), pages smaller and larger than a tile, and gathers
    the rest by cp.async: the same values as the interleaved NHD cache's, bit for bit."""
    seed = fresh_seed()
    head_dim, page_size = SM90_TILINGS[tiling]
    specs = ((300, 700), (129, 129), (1, 520))  # whole tiles, a ragged tail, a decode row
    data = make_paged_inputs(
        specs, HQ, HKV, head_dim, page_size, torch.bfloat16, seed, pad_tokens=2
    )
    data = {n: data[n].cuda() for n in OPERANDS}
    scales = {}
    if cache == "fp8":
        data["kv_cache"] = (data["kv_cache"] * 8).to(torch.float8_e4m3fn)
        scales = {"k_scale": 0.125, "v_scale": 0.125}
    with prefill_kernel(1):
        expected = attend(data, **scales)
        caches = in_layout(layout, data["kv_cache"])
        out = attend({**data, "kv_cache": caches.pop("kv_cache")}, **caches, **scales)
    assert rel_l2(out, expected) < 1e-6, f"seed {seed}"


def _new_rows(device, dtype, seed: int, tokens: int = 11, pages: int = 9):
    """K and V rows of `tokens` new tokens [N, Hkv, D] and their slots in the first `pages`
    pages (one padding, int64)."""
    gen = torch.Generator().manual_seed(seed)
    key, value = (torch.randn(tokens, HKV, D, generator=gen).to(dtype) for _ in range(2))
    slots = torch.randperm(pages * PAGE, generator=gen)[:tokens]
    slots[3] = -1
    return key.to(device), value.to(device), slots.to(device)


WRITE_CASES = {  # cache dtype, k_scale, v_scale (a tensor: per KV head)
    "bf16": (torch.bfloat16, None, None),
    "f32-scales": (torch.float32, 0.5, torch.tensor([2.0, 0.25])),
    "fp8-scales": (torch.float8_e4m3fn, torch.tensor([0.02, 0.05]), 0.03),
}


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=[cuda, pytest.mark.gpu])])
@pytest.mark.parametrize("case", list(WRITE_CASES))
@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("op", ["kv_cache_store", "kv_cache_update"])
def test_writes_in_each_layout_equal_the_interleaved_write(op, layout, case, device):
    """kv_cache_store (vLLM's reshape_and_cache_flash into key_cache, value_cache, or into
    FlashInfer's one tensor) and kv_cache_update write what the interleaved NHD write writes,
    byte for byte, in every layout, and leave every other row alone."""
    cache_dtype, k_scale, v_scale = WRITE_CASES[case]
    seed = fresh_seed()
    dtype = torch.bfloat16 if cache_dtype == torch.float8_e4m3fn else cache_dtype
    key, value, slots = _new_rows(device, dtype, seed)
    gen = torch.Generator().manual_seed(seed + 1)
    interleaved = torch.randn(10, PAGE, 2 * HKV, D, generator=gen).to(cache_dtype).to(device)
    caches = {n: c.clone() for n, c in in_layout(layout, interleaved).items() if n != "kv_layout"}
    scales = {
        "k_scale": k_scale if not torch.is_tensor(k_scale) else k_scale.to(device),
        "v_scale": v_scale if not torch.is_tensor(v_scale) else v_scale.to(device),
    }
    kv_layout = LAYOUTS[layout][0]
    if op == "kv_cache_store":
        write = dict(key=key, value=value, slot_mapping=slots, **scales)
        xla_gpu_ops.kv_cache_store(**write, kv_cache=interleaved)
        xla_gpu_ops.kv_cache_store(**write, **caches, kv_layout=kv_layout)
    else:
        rows = torch.stack([key, value], dim=2).reshape(key.shape[0], 2 * HKV, D)
        xla_gpu_ops.kv_cache_update(rows, slots, interleaved, **scales)
        xla_gpu_ops.kv_cache_update(rows, slots, **caches, kv_layout=kv_layout, **scales)
    as_bytes = lambda t: t.view(torch.uint8) if t.dtype == torch.float8_e4m3fn else t  # noqa: E731
    for name, expected in in_layout(layout, interleaved).items():
        if name != "kv_layout":
            assert torch.equal(as_bytes(caches[name]), as_bytes(expected)), f"{name}, seed {seed}"


def test_jax_host_handler_writes_separate_caches():
    """The XLA:CPU handler returns both caches, aliasing them; kv_cache alone without value_cache."""
    import jax.numpy as jnp

    import xla_gpu_ops.jax as xjax

    seed = fresh_seed()
    key, value, slots = _new_rows("cpu", torch.float32, seed)
    gen = torch.Generator().manual_seed(seed + 1)
    interleaved = torch.randn(10, PAGE, 2 * HKV, D, generator=gen)
    key_cache, value_cache = split(interleaved)
    store = dict(key=jnp.asarray(key), value=jnp.asarray(value), slot_mapping=jnp.asarray(slots))
    new_k, new_v = xjax.kv_cache_store(
        **store, kv_cache=jnp.asarray(key_cache), value_cache=jnp.asarray(value_cache)
    )
    one = xjax.kv_cache_store(**store, kv_cache=jnp.asarray(interleaved))
    xla_gpu_ops.kv_cache_store(key=key, value=value, slot_mapping=slots, kv_cache=interleaved)
    expected_k, expected_v = split(interleaved)
    assert np.array_equal(np.asarray(one), interleaved.numpy())
    assert np.array_equal(np.asarray(new_k), expected_k.numpy()), f"seed {seed}"
    assert np.array_equal(np.asarray(new_v), expected_v.numpy()), f"seed {seed}"


def test_mismatched_write_caches_name_value_cache():
    key, value, slots = _new_rows("cpu", torch.float32, 0)
    key_cache = torch.zeros(10, PAGE, HKV, D)
    write = dict(key=key, value=value, slot_mapping=slots, kv_cache=key_cache)
    with pytest.raises(ValueError, match=r"kv_cache_store: value_cache: shape .* differs from"):
        xla_gpu_ops.kv_cache_store(**write, value_cache=torch.zeros(10, PAGE, HKV, D // 2))
    with pytest.raises(TypeError, match=r"kv_cache_store: value_cache: dtype float16 differs"):
        xla_gpu_ops.kv_cache_store(**write, value_cache=key_cache.half())
    # K alone without its value_cache: the interleaved cache would need 2 * Hkv heads
    with pytest.raises(ValueError, match=r"kv_cache_store: key: rows of shape \(2, 64\) do not"):
        xla_gpu_ops.kv_cache_store(**write)
    with pytest.raises(ValueError, match=r"kv_cache_store: kv_cache: dim 2 .* give value_cache"):
        xla_gpu_ops.kv_cache_store(**write | {"kv_cache": torch.zeros(10, PAGE, 3, D)})


def test_transformers_paged_cache_is_read_in_place():
    """transformers keeps per layer K and V of [(blocks + 2) * block_size, Hkv, D]: a view as
    [blocks + 2, block_size, Hkv, D] is the K and V cache pair."""
    seed = fresh_seed()
    data = make_paged_inputs(MIXED, HQ, HKV, D, PAGE, torch.float32, seed)
    key_rows, value_rows = (c.reshape(-1, HKV, D).clone() for c in split(data["kv_cache"]))
    key_cache = key_rows.view(-1, PAGE, HKV, D)
    value_cache = value_rows.view(-1, PAGE, HKV, D)
    assert key_cache.data_ptr() == key_rows.data_ptr()
    out = attend({**data, "kv_cache": key_cache}, value_cache=value_cache)
    assert rel_l2(out, attend(data)) < 1e-6, f"seed {seed}"


def test_jax_host_handler_reads_separate_caches():
    import xla_gpu_ops.jax as xjax

    seed = fresh_seed()
    data = make_paged_inputs(MIXED, HQ, HKV, D, PAGE, torch.float32, seed, sinks=True)
    sinks = data.pop("sinks")
    key_cache, value_cache = split(data["kv_cache"])
    arrays = [np.asarray(data[n]) for n in OPERANDS]
    arrays[1] = np.asarray(key_cache)
    out = xjax.paged_attention(
        *arrays, scale=SCALE, sinks=np.asarray(sinks), value_cache=np.asarray(value_cache)
    )
    expected = attend(data, sinks=sinks)
    assert rel_l2(torch.from_numpy(np.array(out)), expected) < 1e-5, f"seed {seed}"


def test_mismatched_caches_name_value_cache():
    data = make_paged_inputs(MIXED, HQ, HKV, D, PAGE, torch.float32, 0)
    key_cache, value_cache = split(data["kv_cache"])
    keys = {**data, "kv_cache": key_cache}
    with pytest.raises(ValueError, match=r"value_cache: shape .* differs from kv_cache's"):
        attend(keys, value_cache=value_cache[:, :8])
    with pytest.raises(TypeError, match=r"value_cache: dtype float16 differs from kv_cache's"):
        attend(keys, value_cache=value_cache.half())
    with pytest.raises(ValueError, match=r"value_cache: expected rank 4"):
        attend(keys, value_cache=value_cache[0])
    # K alone without its value_cache: an odd head count cannot be interleaved K and V
    with pytest.raises(ValueError, match=r"kv_cache: dim 2 .* give value_cache"):
        attend({**data, "kv_cache": key_cache[:, :, :1]})


def test_the_sharding_wrappers_refuse_separate_caches_by_name():
    from xla_gpu_ops import head_sharding, ops

    shapes = [(10, 8, 64), (7, 16, 2, 64), (3,), (3, 4), (4,), (1,), (0,), (0,), (0,)]
    with pytest.raises(ValueError, match=r"value_cache: the sharding wrappers split the interleav"):
        head_sharding.check_split(ops.PAGED_ATTENTION, [*shapes, (7, 16, 2, 64)], 2, "x")
    head_sharding.check_split(
        ops.PAGED_ATTENTION, [*shapes[:1], (7, 16, 4, 64), *shapes[2:], (0,)], 2, "x"
    )


# ------------------------------------------------------------------------------------ HND
def test_jax_host_handler_reads_and_writes_hnd_caches():
    import jax.numpy as jnp

    import xla_gpu_ops.jax as xjax

    seed = fresh_seed()
    data = make_paged_inputs(MIXED, HQ, HKV, D, PAGE, torch.float32, seed)
    key, value, slots = _new_rows("cpu", torch.float32, seed, pages=data["kv_cache"].shape[0])
    key_cache, value_cache = (to_hnd(c) for c in split(data["kv_cache"]))
    new_k, new_v = xjax.kv_cache_store(
        key=jnp.asarray(key),
        value=jnp.asarray(value),
        slot_mapping=jnp.asarray(slots),
        kv_cache=jnp.asarray(key_cache),
        value_cache=jnp.asarray(value_cache),
        kv_layout="HND",
    )
    xla_gpu_ops.kv_cache_store(key=key, value=value, slot_mapping=slots, kv_cache=data["kv_cache"])
    expected_k, expected_v = (to_hnd(c) for c in split(data["kv_cache"]))
    assert np.array_equal(np.asarray(new_k), expected_k.numpy()), f"seed {seed}"
    assert np.array_equal(np.asarray(new_v), expected_v.numpy()), f"seed {seed}"
    arrays = [np.asarray(data[n]) for n in OPERANDS]
    arrays[1] = np.asarray(new_k)
    out = xjax.paged_attention(*arrays, scale=SCALE, value_cache=np.asarray(new_v), kv_layout="HND")
    expected = attend(data)
    assert rel_l2(torch.from_numpy(np.array(out)), expected) < 1e-5, f"seed {seed}"


@pytest.mark.parametrize("kv_layout", ["NHD", "HND"])
def test_jax_host_handler_reads_and_writes_one_kv_tensor(kv_layout):
    """FlashInfer's [P, 2, ...] cache on the XLA:CPU handlers: both writes return it whole (the
    second result is the absent value_cache), and attention reads it."""
    import jax.numpy as jnp

    import xla_gpu_ops.jax as xjax

    seed = fresh_seed()
    data = make_paged_inputs(MIXED, HQ, HKV, D, PAGE, torch.float32, seed)
    key, value, slots = _new_rows("cpu", torch.float32, seed, pages=data["kv_cache"].shape[0])
    layout = "paired" if kv_layout == "NHD" else "hnd-paired"
    both = in_layout(layout, data["kv_cache"])["kv_cache"]
    rows = torch.stack([key, value], dim=2).reshape(key.shape[0], 2 * HKV, D)
    stored = xjax.kv_cache_store(
        key=jnp.asarray(key),
        value=jnp.asarray(value),
        slot_mapping=jnp.asarray(slots),
        kv_cache=jnp.asarray(both),
        kv_layout=kv_layout,
    )
    updated = xjax.kv_cache_update(
        jnp.asarray(rows), jnp.asarray(slots), jnp.asarray(both), kv_layout=kv_layout
    )
    xla_gpu_ops.kv_cache_store(key=key, value=value, slot_mapping=slots, kv_cache=data["kv_cache"])
    expected = in_layout(layout, data["kv_cache"])["kv_cache"].numpy()
    assert np.array_equal(np.asarray(stored), expected), f"seed {seed}"
    assert np.array_equal(np.asarray(updated), expected), f"seed {seed}"
    arrays = [np.asarray(data[n]) for n in OPERANDS]
    arrays[1] = np.asarray(stored)
    out = xjax.paged_attention(*arrays, scale=SCALE, kv_layout=kv_layout)
    assert rel_l2(torch.from_numpy(np.array(out)), attend(data)) < 1e-5, f"seed {seed}"


def test_bad_one_kv_tensors_are_named():
    data = make_paged_inputs(MIXED, HQ, HKV, D, PAGE, torch.float32, 0)
    both = in_layout("paired", data["kv_cache"])["kv_cache"]
    with pytest.raises(ValueError, match=r"paged_attention: kv_cache: a rank-5 cache is \[P, 2,"):
        attend({**data, "kv_cache": torch.cat([both, both], dim=1)})
    with pytest.raises(
        ValueError, match=r"paged_attention: value_cache: kv_cache .* already holds"
    ):
        attend({**data, "kv_cache": both}, value_cache=both[:, 1].contiguous())
    key, value, slots = _new_rows("cpu", torch.float32, 0)
    with pytest.raises(ValueError, match=r"kv_cache_store: kv_cache: expected rank 4 .* or 5"):
        xla_gpu_ops.kv_cache_store(key=key, value=value, slot_mapping=slots, kv_cache=both[None])


def test_the_sharding_wrappers_refuse_one_kv_tensor_by_name():
    from xla_gpu_ops import head_sharding, ops

    shapes = [(10, 8, 64), (7, 2, 16, 2, 64), (3,), (3, 4), (4,), (1,), (0,), (0,), (0,), (0,)]
    with pytest.raises(ValueError, match=r"kv_cache: the sharding wrappers split the interleaved"):
        head_sharding.check_split(ops.PAGED_ATTENTION, shapes, 2, "x")


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_torch_xla_composites_read_and_write_each_layout(layout):
    """The composites (torch_xla's fallback graphs), run here as plain torch on the CPU: attention
    over each layout equals the interleaved call, and the writes return each layout's caches."""
    xla_composites = pytest.importorskip("xla_gpu_ops.torch_xla", reason="needs torch_xla")
    seed = fresh_seed()
    data = make_paged_inputs(MIXED, HQ, HKV, D, PAGE, torch.float32, seed)
    key, value, slots = _new_rows("cpu", torch.float32, seed, pages=data["kv_cache"].shape[0])
    caches = in_layout(layout, data["kv_cache"])
    kv_layout = caches.pop("kv_layout")
    args = [data[n] for n in OPERANDS]
    args[1] = caches["kv_cache"]
    value_cache = caches.get("value_cache")
    out = xla_composites.paged_attention_composite(
        *args, SCALE, kv_layout=kv_layout, value_cache=value_cache
    )
    assert rel_l2(out, attend(data)) < 1e-5, f"seed {seed}"
    written = xla_composites.kv_cache_store_composite(
        key, value, slots, caches["kv_cache"], kv_layout=kv_layout, value_cache=value_cache
    )
    xla_gpu_ops.kv_cache_store(key=key, value=value, slot_mapping=slots, kv_cache=data["kv_cache"])
    expected = in_layout(layout, data["kv_cache"])
    assert torch.equal(written[0], expected["kv_cache"]), f"seed {seed}"
    if "value_cache" in expected:
        assert torch.equal(written[1], expected["value_cache"]), f"seed {seed}"


def test_bad_layouts_name_kv_layout():
    data = make_paged_inputs(MIXED, HQ, HKV, D, PAGE, torch.float32, 0)
    with pytest.raises(
        ValueError, match=r"paged_attention: kv_layout: must be one of 'NHD', 'HND'"
    ):
        attend(data, kv_layout="NDH")
    # an HND cache of 3 combined heads: K and V interleaved need an even count, named by its dim
    odd = to_hnd(data["kv_cache"])[:, :3].contiguous()
    with pytest.raises(
        ValueError, match=r"kv_cache: dim 1 must be 2 \* num_kv_heads \(kv_layout HND"
    ):
        attend({**data, "kv_cache": odd}, kv_layout="HND")
    key, value, slots = _new_rows("cpu", torch.float32, 0)
    with pytest.raises(ValueError, match=r"kv_cache_store: kv_cache: dim 1 must be 2 \* num_kv"):
        xla_gpu_ops.kv_cache_store(
            key=key, value=value, slot_mapping=slots, kv_cache=odd, kv_layout="HND"
        )


def test_the_sharding_wrappers_refuse_hnd_by_name():
    from xla_gpu_ops import head_sharding, ops

    with pytest.raises(ValueError, match=r"paged_attention: kv_layout: 'HND'; the sharding"):
        head_sharding.check_layout(ops.PAGED_ATTENTION, {"kv_layout": "HND"})
    head_sharding.check_layout(ops.PAGED_ATTENTION, {"kv_layout": "NHD"})


@pytest.mark.gpu
@cuda
def test_a_cache_view_the_kernels_cannot_read_is_refused_on_cuda():
    """FlashInfer's [P, 2, page_size, Hkv, D] cache: its K half cache[:, 0] is a view with a page
    stride of two halves. Eager CUDA refuses it naming kv_cache rather than copying the whole
    cache on every call; its contiguous copy (and the unbind(0) halves) is read in place."""
    data = make_paged_inputs(MIXED, HQ, HKV, D, PAGE, torch.bfloat16, 0)
    data = {n: data[n].cuda() for n in OPERANDS}
    key_cache, value_cache = split(data["kv_cache"])
    both = torch.stack([key_cache, value_cache], dim=1)  # [P, 2, page_size, Hkv, D]
    with pytest.raises(
        ValueError, match=r"paged_attention: kv_cache: strides .* cannot be read in"
    ):
        attend({**data, "kv_cache": both[:, 0]}, value_cache=both[:, 1])
    out = attend({**data, "kv_cache": key_cache}, value_cache=value_cache)
    assert rel_l2(out, attend(data)) < 1e-6


@pytest.mark.gpu
@cuda
def test_interleaved_hnd_cache_of_one_kv_head_on_cuda():
    """One KV head, K and V interleaved, HND: [P, 2, page_size, D]. Its rows look like NHD rows
    (D apart), but a page holds two heads: the sm_90a prefill must not read it through an NHD
    tensor map (the page stride tells them apart)."""
    seed = fresh_seed()
    data = make_paged_inputs(PREFILL, 8, 1, 128, PAGE, torch.bfloat16, seed)
    data = {n: data[n].cuda() for n in OPERANDS}
    expected = attend(data)
    out = attend({**data, "kv_cache": to_hnd(data["kv_cache"])}, kv_layout="HND")
    assert rel_l2(out, expected) < 1e-6, f"seed {seed}"


def test_a_write_too_wide_for_the_kernel_is_refused():
    """2 * Hkv * D elements per token must fit the write kernel's int index, also with K and V
    in caches of their own (Hkv * D each): checked from the shapes alone, nothing allocated."""
    from xla_gpu_ops import ops

    heads = 2**22  # x 256 = 2^30 per cache: 2^31 K and V elements per token
    shapes = [(1, heads, 256), (1, heads, 256), (1,), (1, 1, heads, 256), (0,), (0,)]
    shapes.append((1, 1, heads, 256))
    dtypes = ["bfloat16", "bfloat16", "int32", "bfloat16", "float32", "float32", "bfloat16"]
    call = _library.make_call(ops.KV_CACHE_STORE, shapes, dtypes, (1.0, 1.0, 0))
    with pytest.raises(ValueError, match=r"kv_cache_store: kv_cache: shape .* is too large"):
        _library.describe(ops.KV_CACHE_STORE, call)
