"""kv_cache_store's own checks: K and V held apart land where kv_cache_update puts the same rows
interleaved (16-bit and fp8 caches, int32 and int64 slots, padding), on torch and JAX; keyword-
only calls; bad input. Its routes (every front end) come from the table: tests/test_every_op.py."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import xla_gpu_ops
from xla_gpu_ops import _library

pytestmark = [
    pytest.mark.kernels,
    pytest.mark.skipif(not _library.is_built(), reason="libxla_gpu_ops.so is not built"),
]
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
CACHES = {"bf16": torch.bfloat16, "fp8": torch.float8_e4m3fn}


def split(new_kv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return new_kv[:, 0::2].contiguous(), new_kv[:, 1::2].contiguous()


def rows(n: int, hkv: int, d: int, seed: int) -> torch.Tensor:
    return torch.randn(n, 2 * hkv, d, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("cache_dtype", CACHES.values(), ids=CACHES.keys())
@pytest.mark.parametrize("slot_dtype", [torch.int32, torch.int64])
def test_split_rows_land_where_kv_cache_update_puts_them(device, cache_dtype, slot_dtype):
    new_kv = rows(7, 2, 64, seed=1).to(torch.bfloat16).to(device)
    slots = torch.tensor([3, 17, -1, 8, 31, 0, 22], dtype=slot_dtype, device=device)
    cache = torch.zeros(4, 8, 4, 64, device=device).to(cache_dtype)
    want = cache.clone()
    xla_gpu_ops.kv_cache_update(new_kv, slots, want, k_scale=2.0, v_scale=0.5)
    key, value = split(new_kv)
    xla_gpu_ops.kv_cache_store(
        key=key, value=value, slot_mapping=slots, kv_cache=cache, k_scale=2.0, v_scale=0.5
    )
    assert torch.equal(cache.view(torch.uint8), want.view(torch.uint8))  # bit for bit


def test_jax_host_handler_equals_kv_cache_update():
    pytest.importorskip("jax", reason="needs jax")
    import xla_gpu_ops.jax as xjax

    new_kv = rows(6, 2, 64, seed=2).numpy()
    slots = np.array([3, 17, -1, 8, 31, 0], np.int32)
    cache = np.random.default_rng(0).standard_normal((4, 8, 4, 64), np.float32)
    want = np.asarray(xjax.kv_cache_update(new_kv, slots, cache, v_scale=0.25))
    got = xjax.kv_cache_store(
        key=new_kv[:, 0::2], value=new_kv[:, 1::2], slot_mapping=slots, kv_cache=cache, v_scale=0.25
    )
    np.testing.assert_array_equal(np.asarray(got), want)


def test_arguments_are_keyword_only():
    key, value = split(rows(2, 1, 8, seed=3))
    slots, cache = torch.tensor([0, 1], dtype=torch.int32), torch.zeros(1, 4, 2, 8)
    with pytest.raises(TypeError, match="positional argument"):
        xla_gpu_ops.kv_cache_store(key, value, slots, cache)
    with pytest.raises(TypeError, match="missing 1 required keyword-only argument: 'value'"):
        xla_gpu_ops.kv_cache_store(key=key, slot_mapping=slots, kv_cache=cache)


@pytest.mark.parametrize(
    ("change", "error", "match"),
    [
        (
            {"value": torch.zeros(2, 1, 4)},
            ValueError,
            r"value: shape \(2, 1, 4\) differs from key's",
        ),
        ({"value": torch.zeros(2, 1, 8).half()}, TypeError, "value: dtype float16 differs"),
        (
            {"kv_cache": torch.zeros(1, 4, 4, 8)},
            ValueError,
            r"key: rows of shape \(1, 8\) do not match kv_cache \(1, 4, 4, 8\)",
        ),
        (
            {"slot_mapping": torch.tensor([0, 9])},
            ValueError,
            "slot_mapping: token 1 goes to slot 9",
        ),
        ({"slot_mapping": torch.tensor([0])}, ValueError, "slot_mapping: 1 entries, key has 2"),
    ],
)
def test_bad_input_names_the_argument(change, error, match):
    key, value = split(rows(2, 1, 8, seed=4))
    arguments = {"key": key, "value": value, "slot_mapping": torch.tensor([0, 1])}
    arguments["kv_cache"] = torch.zeros(1, 4, 2, 8)
    with pytest.raises(error, match=f"kv_cache_store: {match}"):
        xla_gpu_ops.kv_cache_store(**{**arguments, **change})
