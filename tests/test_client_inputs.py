"""What serving clients hand over, taken as it comes (ops.Operand.converts): int64 metadata, a
Python int num_seqs and float16/bfloat16 sinks give the same output as the int32 / float32 call,
on torch (eager, torch.compile) and JAX. The library itself still reads int32 and float32 only."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from paged_inputs import make_paged_inputs

import xla_gpu_ops
from xla_gpu_ops import _library, ops

pytestmark = pytest.mark.skipif(not _library.is_built(), reason="libxla_gpu_ops.so is not built")
METADATA = ("context_lens", "block_tables", "query_start_loc", "num_seqs")


def call_inputs(sink_dtype: torch.dtype) -> tuple[dict, dict]:
    """(the library's own dtypes, the client's: int64 metadata, an int num_seqs, sinks in
    sink_dtype); the float32 sinks hold the sink_dtype values exactly."""
    made = make_paged_inputs(
        ((1, 37), (9, 9)), 4, 2, 64, 16, torch.float32, seed=5, pad_tokens=1, sinks=True
    )
    made["sinks"] = made["sinks"].to(sink_dtype).float()
    client = dict(made)
    for name in METADATA:
        client[name] = made[name].long()
    client["num_seqs"] = int(made["num_seqs"][0])
    client["sinks"] = made["sinks"].to(sink_dtype)
    return made, client


def torch_call(fn, inputs: dict):
    required = [inputs[o.name] for o in ops.PAGED_ATTENTION.operands if not o.optional]
    return fn(*required, scale=0.125, sinks=inputs["sinks"])


@pytest.mark.dynamo
@pytest.mark.parametrize("sink_dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compile"])
def test_torch_takes_int64_metadata_an_int_num_seqs_and_16_bit_sinks(sink_dtype, compiled):
    made, client = call_inputs(sink_dtype)
    fn = xla_gpu_ops.paged_attention
    if compiled:
        torch._dynamo.reset()
        fn = torch.compile(fn, fullgraph=True, backend="eager")
    want = torch_call(xla_gpu_ops.paged_attention, made)
    torch.testing.assert_close(torch_call(fn, client), want, rtol=0, atol=0)


@pytest.mark.parametrize("sink_dtype", [torch.float16, torch.bfloat16])
def test_jax_takes_int64_metadata_an_int_num_seqs_and_16_bit_sinks(sink_dtype):
    pytest.importorskip("jax", reason="needs jax")
    import ml_dtypes

    import xla_gpu_ops.jax as xjax

    made, client = call_inputs(sink_dtype)
    numpy_dtype = {torch.float16: np.float16, torch.bfloat16: ml_dtypes.bfloat16}[sink_dtype]

    def arrays(inputs: dict) -> dict:
        out = {k: v for k, v in inputs.items() if k != "sinks"}
        out = {k: v.numpy() if isinstance(v, torch.Tensor) else v for k, v in out.items()}
        sinks = inputs["sinks"].float().numpy()  # numpy has no bfloat16 of torch's
        out["sinks"] = sinks.astype(numpy_dtype) if inputs is client else sinks
        return out

    def run(inputs: dict):
        a = arrays(inputs)
        required = [a[o.name] for o in ops.PAGED_ATTENTION.operands if not o.optional]
        return np.asarray(xjax.paged_attention(*required, scale=0.125, sinks=a["sinks"]))

    np.testing.assert_array_equal(run(client), run(made))


def test_another_dtype_is_still_refused_by_name():
    """Only the listed conversions happen: an int16 context_lens is an error naming it."""
    made, _ = call_inputs(torch.bfloat16)
    made["context_lens"] = made["context_lens"].to(torch.int16)
    with pytest.raises(TypeError, match="paged_attention: context_lens: dtype int16"):
        torch_call(xla_gpu_ops.paged_attention, made)
