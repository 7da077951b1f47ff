"""The drop-in call sites (xla_gpu_ops.compat): upstream's exact signatures, and upstream's own
reference functions on the same inputs (torch_xla's non-kernel path on XLA:CPU, JAX's
ref_ragged_paged_attention on the CPU) against ours."""

from __future__ import annotations

import ast
import inspect
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
    for frontend, front_end in (("torch_xla", "torch_ops"), ("jax", "jax")):
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
