"""rms_norm's own numerics: dtypes, shapes off the vector path, bad input. The routes (every front
end) come from the table: tests/test_every_op.py."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import xla_gpu_ops
from xla_gpu_ops import _library, reference

pytestmark = [
    pytest.mark.kernels,
    pytest.mark.skipif(not _library.is_built(), reason="libxla_gpu_ops.so is not built"),
]
DTYPES = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}
# One rounding to the output dtype on both sides; sums in float32 in a different order.
TOLERANCE = {torch.float32: 1e-5, torch.float16: 1e-3, torch.bfloat16: 8e-3}
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def inputs(shape, dtype, device="cpu", seed=0):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(shape, generator=g) * 3).to(dtype)
    weight = torch.rand(shape[-1], generator=g).add(0.5).to(dtype)
    return x.to(device), weight.to(device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
@pytest.mark.parametrize("shape", [(16, 4096), (3, 5, 200), (7, 33), (1, 1)])
def test_matches_torch_rms_norm(device, dtype, shape):
    """Against torch.nn.functional.rms_norm in float32 (the library computes in float32)."""
    x, weight = inputs(shape, dtype, device)
    out = xla_gpu_ops.rms_norm(x, weight, eps=1e-5)
    want = torch.nn.functional.rms_norm(x.float(), (shape[-1],), weight.float(), eps=1e-5)
    assert out.dtype == dtype
    assert out.shape == x.shape
    tol = TOLERANCE[dtype]
    torch.testing.assert_close(out.float().cpu(), want.cpu(), rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
@pytest.mark.parametrize("shape", [(16, 4096), (7, 33), (0, 8)])
def test_jax_host_handler_equals_reference(dtype, shape):
    jax = pytest.importorskip("jax")
    import ml_dtypes

    import xla_gpu_ops.jax as xjax

    x, weight = inputs(shape, dtype)
    as_np = {torch.bfloat16: ml_dtypes.bfloat16}.get(dtype)
    arrays = [t.float().numpy().astype(as_np) if as_np else t.numpy() for t in (x, weight)]
    cpu = jax.devices("cpu")[0]
    out = jax.jit(xjax.rms_norm)(*(jax.device_put(a, cpu) for a in arrays))
    got = torch.from_numpy(np.asarray(out).astype(np.float32))
    want = reference.rms_norm(x, weight).float()
    tol = TOLERANCE[dtype]
    torch.testing.assert_close(got, want, rtol=tol, atol=tol)


@pytest.mark.parametrize(
    ("x_shape", "w_shape", "w_dtype", "eps", "error", "match"),
    [
        ((4, 8), (7,), torch.float32, 1e-6, ValueError, r"rms_norm: weight: shape \(7,\)"),
        ((4, 8), (8,), torch.float16, 1e-6, TypeError, "rms_norm: weight: dtype float16 differs"),
        ((4, 8), (2, 4), torch.float32, 1e-6, ValueError, "rms_norm: weight: expected rank 1"),
        ((4, 8), (8,), torch.float32, -1.0, ValueError, "rms_norm: eps: must be finite and >= 0"),
    ],
)
def test_bad_input_names_the_argument(x_shape, w_shape, w_dtype, eps, error, match):
    x, weight = torch.zeros(x_shape), torch.ones(w_shape, dtype=w_dtype)
    with pytest.raises(error, match=match):
        xla_gpu_ops.rms_norm(x, weight, eps=eps)


def test_a_row_longer_than_two_to_the_thirty_is_refused_at_trace_time():
    """The kernels index within a row in 32 bits: the static check refuses longer rows, from
    shapes alone (nothing is allocated)."""
    jax = pytest.importorskip("jax")
    import xla_gpu_ops.jax as xjax

    h = (1 << 30) + 1
    x, weight = jax.ShapeDtypeStruct((1, h), np.float32), jax.ShapeDtypeStruct((h,), np.float32)
    with pytest.raises(ValueError, match=r"rms_norm: weight: H = 1073741825 is larger than 2\^30"):
        jax.jit(xjax.rms_norm).lower(x, weight)
