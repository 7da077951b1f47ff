"""Every op of the table on every front end that runs here, from the op's table entry alone: its
sample call (`Op.sample`, `Op.sample_attrs`) against its reference (`reference.of`). An op gets
these tests by being in `ops.OPS`; only its own numerics (dtypes, edge cases) are written by hand.
HLO / StableHLO / the legacy targets of torch_xla 2.7: tests/test_hlo.py, also over the table.

Routes: torch CPU (the reference behind the library's checks), CUDA eager (skips without a GPU),
`opcheck` (schema, fake kernel, autograd registration), `torch.compile(fullgraph=True)`, JAX
(the host handler on XLA:CPU; the CUDA handler, typed and legacy, on a GPU), torchax (eager and
jitted), torch_xla (lazy and `openxla`).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import xla_gpu_ops
from xla_gpu_ops import _library, ops, reference

needs_library = pytest.mark.skipif(
    not _library.is_built(), reason="libxla_gpu_ops.so is not built (nox -s build)"
)
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
every_op = pytest.mark.parametrize("op", ops.OPS, ids=lambda op: op.name)
# The samples are float32: the library's host and CUDA kernels compute in float32 too, so only
# the order of the sums differs from the reference.
TOLERANCE = {"rtol": 1e-5, "atol": 1e-5}


def sample(op: ops.Op, device: str = "cpu") -> tuple[list[torch.Tensor], dict]:
    """The op's sample call as (operands in table order, attributes), fresh tensors each time."""
    arrays = op.sample(False)
    return [torch.from_numpy(arrays[name].copy()).to(device) for name in op.operand_names], dict(
        op.sample_attrs
    )


def outputs(op: ops.Op, returned, operands: list) -> list:
    """What a call produced: the operands written in place (not an optional one left out),
    then what it returned."""
    written = [operands[i] for _, i in op.given_writes(operands)]
    if returned is None:
        return written
    return written + (list(returned) if isinstance(returned, tuple) else [returned])


def expected(op: ops.Op) -> list[torch.Tensor]:
    operands, attrs = sample(op)
    required, optional = op.split_optional(operands)
    return outputs(op, reference.of(op)(*required, **attrs, **optional), operands)


def assert_outputs(op: ops.Op, actual: list, **tolerance) -> None:
    want = expected(op)
    assert len(actual) == len(want), op.name
    for got, ref in zip(actual, want, strict=True):
        got = got if isinstance(got, torch.Tensor) else torch.from_numpy(np.array(got))
        torch.testing.assert_close(got.cpu(), ref, **(tolerance or TOLERANCE))


def by_name(op: ops.Op, operands) -> dict:
    """Operands as keyword arguments: how every public function takes them (some only so), and
    every result returned on request asked for (paged_attention's LSE), so all are compared."""
    return dict(zip(op.operand_names, operands, strict=True)) | {
        f"return_{name}": True for name in op.on_request
    }


def call_torch(op: ops.Op, fn, device: str = "cpu") -> list:
    operands, attrs = sample(op, device)
    return outputs(op, fn(**by_name(op, operands), **attrs), operands)


# ------------------------------------------------------------------------------------- torch
@needs_library
@every_op
def test_torch_cpu(op):
    assert_outputs(op, call_torch(op, getattr(xla_gpu_ops, op.name)))


@pytest.mark.gpu
@pytest.mark.kernels
@needs_library
@needs_cuda
@every_op
def test_torch_cuda(op):
    assert_outputs(op, call_torch(op, getattr(xla_gpu_ops, op.name), "cuda"))


@needs_library
@every_op
def test_torch_opcheck(op):
    operands, attrs = sample(op)
    overload = getattr(getattr(torch.ops, ops.NAMESPACE), op.name).default
    torch.library.opcheck(overload, tuple(op.schema_args(operands, attrs)))


@needs_library
@pytest.mark.dynamo
@every_op
def test_torch_compile_fullgraph(op):
    torch._dynamo.reset()
    compiled = torch.compile(getattr(xla_gpu_ops, op.name), fullgraph=True, backend="eager")
    assert_outputs(op, call_torch(op, compiled))


# --------------------------------------------------------------------------------------- JAX
def _jax_outputs(op: ops.Op, device_kind: str, abi: str = "ffi") -> list:
    jax = pytest.importorskip("jax", reason="needs jax")
    import xla_gpu_ops.jax as xjax

    try:
        device = jax.devices(device_kind)[0]
    except RuntimeError:
        pytest.skip(f"needs jax with a {device_kind} device")
    sample_arrays = op.sample(False)
    arrays = [jax.device_put(sample_arrays[name], device) for name in op.operand_names]
    public = getattr(xjax, op.name)
    out = jax.jit(lambda *a: public(**by_name(op, a), **op.sample_attrs, abi=abi))(*arrays)
    return [np.asarray(o) for o in (out if isinstance(out, tuple) else (out,))]


@pytest.mark.kernels
@needs_library
@every_op
def test_jax_host_handler(op):
    assert_outputs(op, _jax_outputs(op, "cpu"))


@pytest.mark.gpu
@pytest.mark.kernels
@needs_library
@pytest.mark.parametrize("abi", ["ffi", "legacy"])
@every_op
def test_jax_cuda_handler(op, abi):
    assert_outputs(op, _jax_outputs(op, "gpu", abi))


# ----------------------------------------------------------------------------------- torchax
@pytest.mark.torchax
@needs_library
@pytest.mark.parametrize("jitted", [False, True], ids=["eager", "jit"])
@every_op
def test_torchax(op, jitted):
    torchax = pytest.importorskip("torchax", reason="needs torchax")
    import xla_gpu_ops.torchax as xgo_torchax

    xgo_torchax.register()
    with torchax.default_env():
        operands, attrs = sample(op)
        operands = [t.to("jax") for t in operands]
        public = getattr(xla_gpu_ops, op.name)

        def call(*tensors):  # the attributes stay static Python values under jax_jit
            return public(**by_name(op, tensors), **attrs)

        # an op writing in place updates its torchax tensor: no jit of a function returning None
        fn = torchax.interop.jax_jit(call) if jitted and not op.aliases else call
        actual = outputs(op, fn(*operands), operands)
        actual = [np.asarray(t.jax() if hasattr(t, "jax") else t) for t in actual]
    assert_outputs(op, actual)


# --------------------------------------------------------------------------------- torch_xla
@pytest.mark.torch_xla
@needs_library
@pytest.mark.parametrize("route", ["lazy", "openxla"])
@every_op
def test_torch_xla(op, route):
    torch_xla = pytest.importorskip("torch_xla", reason="needs torch_xla (XLA device)")
    fn = getattr(xla_gpu_ops, op.name)
    if route == "openxla":
        torch._dynamo.reset()
        fn = torch.compile(fn, backend="openxla")
    assert_outputs(op, [t.cpu() for t in call_torch(op, fn, torch_xla.device())])
