"""Eager host cost per call: µs of host time per call on a tiny decode, where the host is the
bottleneck (the kernel takes a few µs; the Python and binding layers take the rest).

Rows: `torch.ops.xla_gpu.paged_attention` (the registered op), `xla_gpu_ops.paged_attention` (the
public wrapper with its default arguments), the launcher function alone (no torch.library layers),
torch SDPA on the same shapes (the yardstick) and FlashInfer's decode `run()` after its `plan()`.
Every output is checked against the op's. Timer: timing.time_host_per_call.
"""

from __future__ import annotations

from collections.abc import Mapping

from benchmarks import flashinfer_peer, ours
from benchmarks.cases import OPERANDS, build_inputs, rel_l2, scale_of
from benchmarks.runners import NotApplicable, canon, left_out_reason, prepared
from benchmarks.timing import error_text, time_host_per_call

ROWS = (  # name, role
    ("xgo_op", "ours"),
    ("xgo_wrapper", "ours"),
    ("xgo_launcher", "ours"),
    ("torch_sdpa", "peer"),
    ("flashinfer_decode", "peer"),
)
OURS_TARGETED = ("xgo_op", "xgo_wrapper")  # the rows the host-cost target applies to


def _makers(env, case, inputs: dict) -> dict:
    """name -> () -> call (raises NotApplicable where the row cannot run here)."""
    import torch.nn.functional as F

    args = [inputs[name] for name in OPERANDS]
    scale = scale_of(case)

    def launcher():
        if not env.on_gpu:
            raise NotApplicable("needs a CUDA GPU (the C launcher)")
        return lambda: ours.launcher_paged_attention(*args, scale=scale)

    def sdpa():
        (q_len, ctx), batch = case.seqs[0], case.batch
        if not case.uniform or q_len != 1:
            raise NotApplicable("decode batches of one shape only")
        pages = -(-ctx // case.page_size)
        kv = inputs["kv_cache"][inputs["block_tables"][:, :pages].long()]
        kv = kv.reshape(batch, pages * case.page_size, 2 * case.num_kv_heads, case.head_dim)[
            :, :ctx
        ]
        k = kv[:, :, 0::2].transpose(1, 2).contiguous()
        v = kv[:, :, 1::2].transpose(1, 2).contiguous()
        q4 = inputs["query"].view(batch, 1, case.num_q_heads, case.head_dim).transpose(1, 2)

        def call():
            out = F.scaled_dot_product_attention(q4, k, v, scale=scale, enable_gqa=True)
            return out.transpose(1, 2).reshape(inputs["query"].shape)

        return call

    def flashinfer():
        runner = flashinfer_peer.prepare_decode(
            env, flashinfer_peer.as_run(flashinfer_peer.HOST_COST_PEER, case), [inputs]
        )
        return runner.calls[0]

    return {
        "xgo_op": lambda: lambda: ours.op_paged_attention(*args, scale=scale),
        "xgo_wrapper": lambda: lambda: ours.wrapper_paged_attention(*args, scale=scale),
        "xgo_launcher": launcher,
        "torch_sdpa": sdpa,
        "flashinfer_decode": flashinfer,
    }


def measure_host_cost(
    env,
    case,
    *,
    samples: int,
    on_impl=None,
    skips: dict | None = None,
    skip_impls: Mapping[str, str] | None = None,
) -> dict:
    """{row: entry} with median / p10 / p90 µs of host time per call; never raises for a row."""
    inputs = build_inputs(case, env.device, seed=4242)
    makers = _makers(env, case, inputs)
    impls: dict = {}
    expected = None
    for name, role in ROWS:
        entry = impls[name] = {"role": role}
        reason = left_out_reason(skip_impls, name, case.name)
        if reason:
            entry.update(status="skipped", reason=reason)
            continue
        if skips and name in skips:
            entry.update(status="failed", reason=skips[name])
            continue
        if on_impl is not None:
            on_impl(name)
        call = prepared(entry, makers[name])
        if call is None:
            continue
        try:
            out = canon(call())
            if expected is None:
                expected = out
            else:
                entry["rel_l2_err"] = rel_l2(out, expected)
                entry["check"] = "ok" if entry["rel_l2_err"] <= 2e-2 else "MISMATCH"
            timing = time_host_per_call(call, samples=samples)
            entry.update(
                status="ok",
                median_us=timing.median_us,
                p10_us=timing.quantile(0.1),
                p90_us=timing.quantile(0.9),
                samples=len(timing.samples_us),
                method=timing.method,
            )
        except Exception as error:
            entry.update(status="failed", reason=error_text(error, 300))
    return impls
