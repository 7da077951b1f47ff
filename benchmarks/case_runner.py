"""One case: inputs, every implementation timed and checked, the record of the case.

Outputs are checked against a higher-precision reference where affordable (else against the first
implementation that ran), and ours against FlashInfer's and SDPA's on every row (`cross_check`).
After every implementation the inputs' checksums are re-read, so one that writes outside its
outputs is caught and blamed.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping

from benchmarks import ours
from benchmarks import peers as P
from benchmarks.cases import (
    ANCHOR,
    build_inputs,
    num_copies,
    op_attributes,
    op_operands,
    rel_l2,
)
from benchmarks.ceilings import free_memory
from benchmarks.host_cost import measure_host_cost
from benchmarks.per_call import PER_CALL_IMPLS, per_call_measurements
from benchmarks.report import PRIMARY_ORDER, fastest_us, telling
from benchmarks.runners import left_out_reason, prepared
from benchmarks.timing import error_text, time_jax_chain, time_torch

# Ours is compared with these peers' outputs on every row where they ran (the first one present of
# each group): FlashInfer, its XQA decode, and SDPA (on contiguous K/V, else gathered per sequence).
CROSS_CHECK_GROUPS = (
    ("flashinfer_decode", "flashinfer_prefill"),
    ("flashinfer_xqa",),
    ("torch_sdpa_contiguous", "torch_gather_sdpa"),
)
# XQA's Hopper kernel for an fp8 cache multiplies in fp8 (mha_sm90.cu: MathElem is the cache's
# type, so q and the probabilities are rounded to e4m3): 3.8e-2 relative L2 in a CPU emulation on
# the anchor's random inputs; FlashInfer's own XQA test allows 1e-1 for fp8.
XQA_FP8_TOLERANCE = 8e-2


def _expected(case, first_copy, on_gpu: bool):
    """Higher-precision expected output of copy 0, when affordable; else None."""
    if case.kind == "simple_add":
        return (first_copy["a"].double() + first_copy["b"].double()).float().cpu()
    biggest_logits = max(q * ctx for q, ctx in case.seqs) * case.num_q_heads * 8
    if biggest_logits > 2e9 or case.bytes_needed() > 2e9:
        return None
    compute = "float64" if not on_gpu else "float32"
    import torch

    out = ours.reference_paged_attention(
        **op_operands(first_copy), **op_attributes(case), compute_dtype=getattr(torch, compute)
    )
    return out.float().cpu()


def _tolerance(case, impl: str) -> float:
    """The relative L2 error `impl`'s output may have on the case."""
    if case.dtype == "float32":
        return 1e-5
    return XQA_FP8_TOLERANCE if impl == "flashinfer_xqa" and case.kv_fp8 else 2e-2


def run_case(
    env,
    case,
    ceilings: dict,
    *,
    samples: int,
    budget_bytes: float,
    l2_bytes: int,
    progress=None,
    skips: dict | None = None,
    on_impl=None,
    skip_impls: Mapping[str, str] | None = None,
) -> dict:
    """Measure one case for every implementation; never raises for an implementation's failure.

    skips: {impl: reason} recorded as failed without running (an earlier worker crashed there).
    on_impl(impl): called before each implementation starts (the isolated runner's bookkeeping).
    skip_impls: {impl or "impl:case": why this run leaves it out} (recorded as skipped;
    workers.left_out).
    """
    record = {
        "name": case.name,
        "kind": case.kind,
        "params": case.params(),
        "bytes": case.bytes_needed(),
        "flops": case.flops(),
        "floor_us": case.bytes_needed() / (ceilings["read_gbps"] * 1e3),
        "compute_floor_us": case.flops() / (ceilings["matmul_tflops"] * 1e6),
        "impls": {},
    }
    if case.kind == "host_cost":
        record["impls"] = measure_host_cost(
            env, case, samples=samples, on_impl=on_impl, skips=skips, skip_impls=skip_impls
        )
        return record
    per_copy = case.kv_cache_bytes if case.kind != "simple_add" else case.bytes_needed()
    # peers that keep a second layout of the cache (contiguous K/V, transposed pages) double it
    if 2 * per_copy > budget_bytes:
        record["skipped"] = (
            f"KV cache {per_copy / 1e9:.1f} GB (x2 for peer layouts) exceeds the "
            f"memory budget {budget_bytes / 1e9:.0f} GB"
        )
        return record
    # CPU smoke: two copies exercise the rotation without multiplying slow host timings
    copies_wanted = num_copies(case, l2_bytes, cap=32 if env.on_gpu else 2)
    copies_n = max(1, min(copies_wanted, int(budget_bytes // (2 * per_copy))))
    record["input_copies"] = copies_n
    record["working_set_bytes"] = copies_n * case.bytes_needed()
    copies = [build_inputs(case, env.device, seed=1000 + case_seed(case))]
    meta = meta_of(copies[0])
    for i in range(1, copies_n):
        copies.append(
            build_inputs(case, env.device, seed=1000 + case_seed(case) + i, metadata=meta or None)
        )
    expected = _expected(case, copies[0], env.on_gpu)
    record["check_against"] = "reference (higher precision)" if expected is not None else None
    fingerprint = _fingerprint(copies)

    # Entries appear in IMPLS order; torch.compile peers run first (before torchax is imported).
    specs = [spec for spec in P.IMPLS if case.kind in spec.kinds]
    keep = set(PRIMARY_ORDER).union(*CROSS_CHECK_GROUPS)
    outputs = {}  # canonical outputs of ours and of the cross-check peers
    for spec in specs:
        record["impls"][spec.name] = {"role": spec.role}
    for spec in sorted(specs, key=lambda spec: not spec.needs_clean_torch):
        if progress is not None:
            progress.set_postfix_str(f"{case.name[:28]} {spec.name}")
        entry = record["impls"][spec.name]
        skipped = _skip_reason(spec, case, env, skips, skip_impls)
        if skipped is not None:
            entry.update(status=skipped[0], reason=skipped[1])
            continue
        if P.needs_clean_process(spec, env):
            entry["torchax_loaded_before"] = P.torchax_loaded()
            if entry["torchax_loaded_before"]:
                entry.update(status="failed", reason=TORCHAX_LOADED_REASON)
                continue
        if on_impl is not None:
            on_impl(spec.name)
        runner = prepared(entry, functools.partial(spec.prepare, env, case, copies))
        if runner is None:
            continue
        try:
            out = runner.output()
            if expected is None and record.get("check_against") is None:
                expected = out  # the first implementation that ran is the yardstick
                record["check_against"] = spec.name
            if expected is not out:
                err = rel_l2(out, expected)
                entry["rel_l2_err"] = err
                entry["check"] = "ok" if err <= _tolerance(case, spec.name) else "MISMATCH"
            if spec.name in keep:
                outputs[spec.name] = out
            del out

            def timed(runner=runner):
                if runner.framework == "torch":
                    return time_torch(runner.calls, samples=samples, graph=runner.graph)
                return time_jax_chain(
                    runner.program,
                    runner.first_carry,
                    runner.operand_sets,
                    chain=runner.chain,
                    samples=samples,
                )

            timing = timed()
            entry.update(_summarise(timing, case, record, ceilings), status="ok")
            if runner.notes:
                entry["notes"] = runner.notes
            if spec.name in ("xgo_torch", "xgo_jax_graph") or (
                spec.name == "reference" and not env.on_gpu
            ):
                again = timed()  # the same version timed twice: the noise of this setup
                entry["median_us_repeat"] = again.median_us
                entry["noise_pct"] = (
                    100
                    * abs(again.median_us - timing.median_us)
                    / min(again.median_us, timing.median_us)
                )
            # Only a GPU's timings are judged: a CPU's bandwidth, measured while other jobs run,
            # is no floor for a later timing.
            impossible = _impossible(record, entry) if env.on_gpu else None
            if impossible is not None:
                entry.update(status="invalid", reason=impossible)
            if spec.name in PER_CALL_IMPLS and (
                case.kind in ("simple_add", "overhead_decode") or case.name == ANCHOR
            ):
                entry.update(per_call_measurements(runner, env, samples))
        except Exception as error:
            entry.update(status="failed", reason=error_text(error, 300))
        finally:
            del runner
            free_memory(env.on_gpu)
        # An implementation that writes outside its outputs would corrupt the inputs of the ones
        # after it: check, blame it, and give the rest fresh inputs.
        if _fingerprint(copies) != fingerprint:
            entry["check"] = "CORRUPTED ITS INPUTS"
            entry["status"] = "failed"
            entry["reason"] = "inputs changed while it ran (a write outside its outputs)"
            first = build_inputs(case, env.device, seed=1000 + case_seed(case))
            copies = [first] + [
                build_inputs(
                    case,
                    env.device,
                    seed=1000 + case_seed(case) + i,
                    metadata=meta_of(first) or None,
                )
                for i in range(1, copies_n)
            ]
            outputs.pop(spec.name, None)
            fingerprint = _fingerprint(copies)
    del copies
    record["cross_check"] = cross_check(record, outputs, functools.partial(_tolerance, case))
    del outputs
    free_memory(env.on_gpu)
    return record


def cross_check(record: dict, outputs: dict, tolerance) -> dict:
    """Our primary implementation's output against FlashInfer's, XQA's and SDPA's (relative L2
    error; tolerance(peer) is the most it may be)."""
    impls = record["impls"]
    ours_name = next(
        (n for n in PRIMARY_ORDER if n in outputs and impls[n].get("status") == "ok"), None
    )
    result: dict = {"ours": ours_name, "against": {}}
    for group in CROSS_CHECK_GROUPS:
        ran = [n for n in group if n in impls]
        if not ran:
            continue  # no such peer for this kind of case
        peer = next((n for n in ran if n in outputs and impls[n].get("status") == "ok"), None)
        if ours_name is None or peer is None:
            shown = telling(impls, ran)
            why = (
                "ours did not run"
                if ours_name is None
                else impls[shown].get("reason", "did not run")
            )
            result["against"][shown] = {"check": "not run", "reason": str(why)[:200]}
            continue
        err = rel_l2(outputs[ours_name], outputs[peer])
        result["against"][peer] = {
            "rel_l2_err": err,
            "check": "ok" if err <= tolerance(peer) else "MISMATCH",
        }
    return result


TORCHAX_LOADED_REASON = (
    "torchax was imported earlier in this process and breaks torch.compile (dynamo: "
    "'PyTorch is not linked with support for jax devices'); the isolated runner (--isolate) "
    "moves such a case to a fresh worker"
)


def _skip_reason(
    spec, case, env, skips: dict | None, skip_impls: Mapping[str, str] | None = None
) -> tuple[str, str] | None:
    """(status, reason) when `spec` is not run on `case`; None when it runs."""
    reason = left_out_reason(skip_impls, spec.name, case.name)
    if reason:
        return "skipped", reason
    if spec.slow and not case.slow_peers:
        return "skipped", "slow peer: run on the anchor and key rows only"
    if spec.anchor_only and env.on_gpu and case.name != ANCHOR:
        return "skipped", "compiles per shape (tens of s): anchor only"
    if skips and spec.name in skips:
        return "failed", skips[spec.name]
    return None


def needs_fresh_process(
    case, env, skips: dict | None, skip_impls: Mapping[str, str] | None = None
) -> bool:
    """Whether `case` runs an implementation that needs a process without torchax, and this
    process has torchax loaded already."""
    if not P.torchax_loaded():
        return False
    return any(
        case.kind in spec.kinds
        and P.needs_clean_process(spec, env)
        and _skip_reason(spec, case, env, skips, skip_impls) is None
        for spec in P.IMPLS
    )


def meta_of(inputs: dict) -> dict:
    return {k: v for k, v in inputs.items() if k not in ("query", "kv_cache", "a", "b")}


FINGERPRINT_CHUNK = 1 << 24  # elements: a 128 MiB int64 temporary


def _fingerprint(copies: list[dict]) -> list[int]:
    """Exact integer checksums of every input tensor (one host sync)."""
    import torch

    sums = []
    for inputs in copies:
        for name in sorted(inputs):
            t = inputs[name].contiguous()
            bits = t.view(torch.int16) if t.element_size() == 2 else t.view(torch.int32)
            weights = torch.arange(1, 8, device=t.device, dtype=torch.int64)
            flat = bits.reshape(-1).to(torch.int64) if bits.numel() < (1 << 20) else None
            if flat is not None:  # small tensors (metadata): position-weighted, catches swaps
                sums.append((flat * weights.repeat(-(-flat.numel() // 7))[: flat.numel()]).sum())
            else:
                # in chunks: sum(dtype=int64) materialises an int64 copy (34 GB for an 8.6 GB
                # cache), and freeing that slows the next timing (timing.release_cached_memory)
                total = torch.zeros((), dtype=torch.int64, device=t.device)
                for chunk in bits.reshape(-1).split(FINGERPRINT_CHUNK):
                    total += chunk.sum(dtype=torch.int64)
                sums.append(total)
    return torch.stack(sums).tolist() if sums else []


def case_seed(case) -> int:
    return sum(ord(ch) for ch in case.name) * 97


# A timing this much faster than the bytes floor (at the read bandwidth measured in the run) is
# impossible: the datasheet bandwidth of an H100 or H200 is 1.08x what torch.sum reads at.
MAX_FRAC_FLOOR = 1.15


def _impossible(record: dict, entry: dict) -> str | None:
    """Why the entry's timing cannot be the work it claims (None: it can). Calls that did not run
    their kernels (a launch that failed silently after a failed graph capture) time as fast as
    their launches."""
    if record["kind"] not in P.PAGED or not record.get("floor_us"):
        return None
    fastest = fastest_us(entry)
    frac = record["floor_us"] / fastest
    if frac <= MAX_FRAC_FLOOR:
        return None
    return (
        f"{fastest:.1f} µs is {frac:.1f}x faster than the bytes floor "
        f"({record['floor_us']:.1f} µs): its calls did not do the work ({entry['method']})"
    )


def _summarise(timing, case, record, ceilings) -> dict:
    median = timing.median_us
    return {
        "median_us": median,
        "p10_us": timing.quantile(0.1),
        "p90_us": timing.quantile(0.9),
        "samples": len(timing.samples_us),
        "method": timing.method,
        "gbps": record["bytes"] / median / 1e3,
        "tflops": record["flops"] / median / 1e6,
        "frac_floor": record["floor_us"] / median,
    }
