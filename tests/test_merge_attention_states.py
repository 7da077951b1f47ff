"""merge_attention_states' own numerics: attention over split keys merges into attention over all
of them; empty parts; bad input. Its routes (every front end) come from the table:
tests/test_every_op.py."""

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
DTYPES = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}
TOLERANCE = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2}


def attend(q, k, v):
    """Dense attention of q [T, H, D] over k, v [K, H, D] in float64: (out, lse [T, H])."""
    logits = torch.einsum("thd,khd->thk", q.double(), k.double()) / q.shape[-1] ** 0.5
    lse = torch.logsumexp(logits, dim=-1)
    return torch.einsum("thk,khd->thd", torch.softmax(logits, dim=-1), v.double()), lse


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
@pytest.mark.parametrize("split", [1, 37, 99])
def test_merging_split_keys_equals_attention_over_all_keys(device, dtype, split):
    g = torch.Generator().manual_seed(split)
    q, k, v = (
        torch.randn(shape, generator=g) for shape in ((5, 4, 64), (100, 4, 64), (100, 4, 64))
    )
    (out_a, lse_a), (out_b, lse_b) = (
        attend(q, k[:split], v[:split]),
        attend(q, k[split:], v[split:]),
    )
    want_out, want_lse = attend(q, k, v)
    args = [out_a.to(dtype), lse_a.float(), out_b.to(dtype), lse_b.float()]
    out, lse = xla_gpu_ops.merge_attention_states(*(t.to(device) for t in args))
    assert out.dtype == dtype
    assert lse.dtype == torch.float32
    tol = TOLERANCE[dtype]
    torch.testing.assert_close(out.double().cpu(), want_out, rtol=tol, atol=tol)
    torch.testing.assert_close(lse.double().cpu(), want_lse, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
def test_empty_parts(device):
    """An empty part (-inf, or FA2's +inf) leaves the other as it is; two empty parts give out 0
    and lse -inf, not NaN."""
    out_a, out_b = torch.randn(3, 1, 8), torch.randn(3, 1, 8)
    lse_a = torch.tensor([[-torch.inf], [1.5], [-torch.inf]])
    lse_b = torch.tensor([[0.5], [torch.inf], [torch.inf]])
    out, lse = xla_gpu_ops.merge_attention_states(
        *(t.to(device) for t in (out_a, lse_a, out_b, lse_b))
    )
    out, lse = out.cpu(), lse.cpu()
    torch.testing.assert_close(out[0], out_b[0])
    torch.testing.assert_close(out[1], out_a[1])
    assert (out[2] == 0).all()
    assert lse[:, 0].tolist() == [0.5, 1.5, -np.inf]


@pytest.mark.parametrize(
    ("shapes", "lse_dtype", "error", "match"),
    [
        (((2, 3, 8), (2, 3), (2, 3, 8), (2, 3)), torch.float16, TypeError, "lse_a: dtype float16"),
        (
            ((2, 3, 8), (3, 2), (2, 3, 8), (2, 3)),
            torch.float32,
            ValueError,
            r"lse_a: shape \(3, 2\)",
        ),
        (((2, 3, 8), (2, 3), (2, 3, 4), (2, 3)), torch.float32, ValueError, "out_b: shape"),
        (((2, 3, 8), (2, 3), (2, 3, 8), (2,)), torch.float32, ValueError, "lse_b: expected rank 2"),
    ],
)
def test_bad_input_names_the_argument(shapes, lse_dtype, error, match):
    out_a, lse_a, out_b, lse_b = (torch.zeros(shape) for shape in shapes)
    with pytest.raises(error, match=f"merge_attention_states: {match}"):
        xla_gpu_ops.merge_attention_states(out_a, lse_a.to(lse_dtype), out_b, lse_b)
