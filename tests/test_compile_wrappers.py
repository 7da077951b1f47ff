"""torch.compile of the public wrappers (`xla_gpu_ops.paged_attention`, `kv_cache_update`,
`simple_add`) in every call form README shows, with fullgraph=True: under inductor (CPU, CUDA) the
result equals the eager call; under backend="openxla" (torch_xla, XLA:CPU) it equals the eager call
on the XLA device (the composite) and the op's custom call is in the HLO XLA compiles.

Each backend runs every case in one fresh interpreter (`run_cases`) and prints the outcomes on one
RESULTS line; the tests read it, one test per case. Fresh, because importing torchax (other tests
do) renames torch's PrivateUse1 backend, after which dynamo fails whatever the function.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from paged_inputs import MIXED, fresh_seed, make_cache_write_inputs, make_paged_inputs, rel_l2
from subprocess_python import recorder, results_of, run_python

import xla_gpu_ops
from xla_gpu_ops import ops

TESTS = Path(__file__).resolve().parent
SCALE = 0.125
PAGE_SIZE = 16


# ---------------------------------------------------------------------------- inputs
# `grow` enlarges one dimension: a case's custom-call program gets shapes of its own (see
# _custom_call_case).
def attention_inputs(seed: int, grow: int = 0) -> dict[str, torch.Tensor]:
    return make_paged_inputs(
        MIXED, 8, 2, 64, PAGE_SIZE, torch.float32, seed=seed, pad_tokens=2 + grow
    )


def sink_inputs(seed: int, grow: int = 0) -> dict[str, torch.Tensor]:
    return make_paged_inputs(
        MIXED, 8, 2, 64, PAGE_SIZE, torch.float32, seed=seed, pad_tokens=2 + grow, sinks=True
    )


def cache_inputs(seed: int, grow: int = 0) -> dict[str, torch.Tensor]:
    new_kv, slot_mapping, kv_cache = make_cache_write_inputs(
        seed, torch.float32, num_kv_heads=3 + grow
    )
    return {"new_kv": new_kv, "slot_mapping": slot_mapping, "kv_cache": kv_cache}


def add_inputs(seed: int, grow: int = 0) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    shape = (7, 33 + grow)
    return {"a": torch.randn(shape, generator=gen), "b": torch.randn(shape, generator=gen)}


def step_inputs(seed: int, grow: int = 0) -> dict[str, torch.Tensor]:
    """A decoder step's tensors: the attention inputs plus the K/V rows of its query tokens and
    the cache slots they go to (padding rows: -1)."""
    inputs = attention_inputs(seed, grow)
    starts = inputs["query_start_loc"].tolist()
    lens, tables = inputs["context_lens"].tolist(), inputs["block_tables"]
    slots = torch.full((inputs["query"].shape[0],), -1, dtype=torch.int32)
    for seq in range(int(inputs["num_seqs"][0])):
        q_len = starts[seq + 1] - starts[seq]
        for row in range(q_len):
            position = lens[seq] - q_len + row
            page = int(tables[seq, position // PAGE_SIZE])
            slots[starts[seq] + row] = page * PAGE_SIZE + position % PAGE_SIZE
    gen = torch.Generator().manual_seed(seed + 1)
    kv_shape = (slots.shape[0], *inputs["kv_cache"].shape[2:])
    return {**inputs, "new_kv": torch.randn(kv_shape, generator=gen), "slot_mapping": slots}


# ---------------------------------------------------------------------------- call forms
@dataclass(frozen=True)
class Case:
    inputs: Callable[..., dict[str, torch.Tensor]]  # (seed, grow=0)
    fn: Callable  # takes the inputs positionally, in their dict order
    ops: tuple[ops.Op, ...]  # whose custom calls the compiled program holds


def attention(*, scale=SCALE, **attrs):
    """paged_attention with the operands positional, as README's first form."""

    def call(query, kv_cache, context_lens, block_tables, query_start_loc, num_seqs):
        return xla_gpu_ops.paged_attention(
            query,
            kv_cache,
            context_lens,
            block_tables,
            query_start_loc,
            num_seqs,
            scale=scale,
            **attrs,
        )

    return call


def attention_operands_by_keyword(
    query, kv_cache, context_lens, block_tables, query_start_loc, num_seqs
):
    return xla_gpu_ops.paged_attention(
        query=query,
        kv_cache=kv_cache,
        context_lens=context_lens,
        block_tables=block_tables,
        query_start_loc=query_start_loc,
        num_seqs=num_seqs,
        scale=SCALE,
    )


def attention_some_operands_by_keyword(
    query, kv_cache, context_lens, block_tables, query_start_loc, num_seqs
):
    return xla_gpu_ops.paged_attention(
        query,
        kv_cache,
        context_lens,
        block_tables=block_tables,
        query_start_loc=query_start_loc,
        num_seqs=num_seqs,
        scale=SCALE,
        soft_cap=30.0,
    )


def attention_with_sinks(
    query, kv_cache, context_lens, block_tables, query_start_loc, num_seqs, sinks
):
    return xla_gpu_ops.paged_attention(
        query,
        kv_cache,
        context_lens,
        block_tables,
        query_start_loc,
        num_seqs,
        scale=SCALE,
        sliding_window=9,
        sinks=sinks,
    )


def cache_write(**attrs):
    """kv_cache_update(new_kv, slot_mapping, kv_cache, ...): in place, returns None."""

    def call(new_kv, slot_mapping, kv_cache):
        xla_gpu_ops.kv_cache_update(new_kv, slot_mapping, kv_cache, **attrs)

    return call


def cache_write_by_keyword(new_kv, slot_mapping, kv_cache):
    xla_gpu_ops.kv_cache_update(
        new_kv=new_kv, slot_mapping=slot_mapping, kv_cache=kv_cache, k_scale=None, v_scale=None
    )


def cache_write_then_read(new_kv, slot_mapping, kv_cache):
    xla_gpu_ops.kv_cache_update(new_kv, slot_mapping, kv_cache, k_scale=0.5)
    return kv_cache.view(-1)[::97] * 2.0  # the graph reads the written cache back (exactly)


def add(**kwargs):
    def call(a, b):
        return xla_gpu_ops.simple_add(a, b, **kwargs)

    return call


def add_by_keyword(a, b):
    return xla_gpu_ops.simple_add(a=a, b=b)


def decoder_step(
    query, kv_cache, context_lens, block_tables, query_start_loc, num_seqs, new_kv, slot_mapping
):
    """README's example layer: write the step's K/V, attend over the cache, add the residual."""
    xla_gpu_ops.kv_cache_update(new_kv, slot_mapping, kv_cache)
    out = xla_gpu_ops.paged_attention(
        query * 2.0, kv_cache, context_lens, block_tables, query_start_loc, num_seqs, scale=SCALE
    )
    return xla_gpu_ops.simple_add(out, query)


ATTENTION, CACHE, ADD = ops.PAGED_ATTENTION, ops.KV_CACHE_UPDATE, ops.SIMPLE_ADD
README_ATTRS = {"sliding_window": None, "soft_cap": None, "k_scale": None, "v_scale": None}
CASES: dict[str, Case] = {
    "attention-operands-positional-defaults-omitted": Case(
        attention_inputs, attention(), (ATTENTION,)
    ),
    "attention-every-attribute-by-keyword": Case(
        attention_inputs, attention(**README_ATTRS), (ATTENTION,)
    ),
    "attention-operands-by-keyword": Case(
        attention_inputs, attention_operands_by_keyword, (ATTENTION,)
    ),
    "attention-some-operands-by-keyword": Case(
        attention_inputs, attention_some_operands_by_keyword, (ATTENTION,)
    ),
    "attention-window-and-cap-numbers": Case(
        attention_inputs, attention(sliding_window=7, soft_cap=5.0), (ATTENTION,)
    ),
    "attention-kv-scales": Case(
        attention_inputs, attention(k_scale=2.0, v_scale=0.5), (ATTENTION,)
    ),
    "attention-validate-true": Case(attention_inputs, attention(validate=True), (ATTENTION,)),
    "attention-validate-false": Case(attention_inputs, attention(validate=False), (ATTENTION,)),
    "attention-with-sinks": Case(sink_inputs, attention_with_sinks, (ATTENTION,)),
    "cache-operands-positional": Case(cache_inputs, cache_write(), (CACHE,)),
    "cache-by-keyword": Case(cache_inputs, cache_write_by_keyword, (CACHE,)),
    "cache-scales": Case(cache_inputs, cache_write(k_scale=0.5, v_scale=2.0), (CACHE,)),
    "cache-validate-true": Case(cache_inputs, cache_write(validate=True), (CACHE,)),
    "cache-validate-false": Case(cache_inputs, cache_write(validate=False), (CACHE,)),
    "cache-write-then-read": Case(cache_inputs, cache_write_then_read, (CACHE,)),
    "add-positional": Case(add_inputs, add(), (ADD,)),
    "add-by-keyword": Case(add_inputs, add_by_keyword, (ADD,)),
    "add-validate-true": Case(add_inputs, add(validate=True), (ADD,)),
    "add-validate-false": Case(add_inputs, add(validate=False), (ADD,)),
    "decoder-step": Case(step_inputs, decoder_step, (CACHE, ATTENTION, ADD)),
}


# ---------------------------------------------------------------------------- the fresh interpreter
def _tensors(out, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
    """What a call produced: its returned tensors, then every input (in-place writes show there)."""
    returned = [] if out is None else list(out) if isinstance(out, tuple) else [out]
    return [*returned, *inputs]


def _max_diff(actual: list[torch.Tensor], expected: list[torch.Tensor]) -> float:
    assert len(actual) == len(expected)
    diff = 0.0
    for a, e in zip(actual, expected, strict=True):
        assert (a.shape, a.dtype) == (e.shape, e.dtype), ((a.shape, a.dtype), (e.shape, e.dtype))
        diff = max(
            diff, (a.cpu().double() - e.cpu().double()).abs().max().item() if a.numel() else 0.0
        )
    return diff


def _run_case(name: str, backend: str, device: str, seed: int) -> dict:
    """Eager and compiled (fullgraph=True) on copies of one set of inputs: the largest difference
    of their outputs and inputs after the call, and, off the CPU, the largest relative error
    against the eager call on the CPU (the reference)."""
    case = CASES[name]
    inputs = list(case.inputs(seed).values())
    on_device = [t.to(device) for t in inputs]
    cpu_inputs = [t.clone() for t in inputs]
    eager_inputs = [t.clone() for t in on_device]
    eager = _tensors(case.fn(*eager_inputs), eager_inputs)
    torch._dynamo.reset()
    compiled_fn = torch.compile(case.fn, backend=backend, fullgraph=True)
    compiled = _tensors(compiled_fn(*on_device), on_device)
    cpu = _tensors(case.fn(*cpu_inputs), cpu_inputs)
    return {
        "seed": seed,
        "vs_eager": _max_diff(compiled, eager),
        "vs_cpu": max(
            rel_l2(c, e) if e.is_floating_point() else _max_diff([c], [e])
            for c, e in zip(compiled, cpu, strict=True)
        ),
    }


def _custom_call_case(name: str, device: str, dump_dir: Path, seed: int) -> dict:
    """The compiled program with the custom call in place of the composite: XLA:CPU has no
    handler of ours, so it fails at its first run, naming the target; the HLO it compiled is in
    the XLA dump. Each case gets shapes of its own: torch_xla 2.7 runs a program it compiled for
    an earlier case of the same shapes without compiling, so without dumping, it again."""
    import torch_xla

    from xla_gpu_ops import torch_xla as xgo_torch_xla

    case = CASES[name]
    before = set(dump_dir.glob("*before_optimizations.txt"))
    torch._dynamo.reset()
    compiled_fn = torch.compile(case.fn, backend="openxla", fullgraph=True)
    failure = ""
    grow = 1 + list(CASES).index(name)
    try:
        compiled_fn(*[t.to(device) for t in case.inputs(seed, grow).values()])
        torch_xla.sync()
    except Exception as e:  # the missing Host handler, raised by XLA
        failure = f"{type(e).__name__}: {e}"[:2000]
    new = set(dump_dir.glob("*before_optimizations.txt")) - before
    abi = xgo_torch_xla.custom_call_abi()  # legacy on torch_xla 2.7, typed FFI from 2.9 on
    return {
        "abi": abi,
        "failure": failure,
        "targets_in_hlo": sorted(
            _target(op, abi)
            for op in ops.OPS
            if any(f'custom_call_target="{_target(op, abi)}"' in p.read_text() for p in new)
        ),
    }


def _target(op: ops.Op, abi: str) -> str:
    return op.ffi_target if abi == "ffi" else op.legacy_target


def run_cases(backend: str, device: str) -> None:
    """Every case under `backend` on `device`; prints the RESULTS line. For openxla, also every
    case with XLA_GPU_OPS_XLA_IMPL=custom_call (key "<case>/custom_call"); needs XLA_FLAGS to dump
    HLO text into $XLA_GPU_OPS_DUMP."""
    if backend == "openxla":
        import torch_xla

        device = str(torch_xla.device())
    results: dict = {}
    record = recorder(results)
    for name in CASES:
        record(name, functools.partial(_run_case, name, backend, device, fresh_seed()))
    if backend == "openxla":
        from xla_gpu_ops import torch_xla as xgo_torch_xla

        os.environ[xgo_torch_xla.IMPL_ENV] = "custom_call"
        dump_dir = Path(os.environ["XLA_GPU_OPS_DUMP"])
        for name in CASES:
            record(
                f"{name}/custom_call",
                functools.partial(_custom_call_case, name, device, dump_dir, fresh_seed()),
            )
    print("RESULTS " + json.dumps(results))


def results_in_fresh_interpreter(backend: str, device: str, log_dir: Path) -> dict:
    env = {"PYTHONPATH": os.pathsep.join([str(TESTS), str(TESTS.parent)])}
    if backend == "openxla":
        dump = log_dir / "xla_dump"
        shutil.rmtree(dump, ignore_errors=True)  # an earlier run's files carry the same names
        env |= {
            "PJRT_DEVICE": "CPU",
            "XLA_GPU_OPS_DUMP": str(dump),
            "XLA_FLAGS": f"--xla_dump_to={dump} --xla_dump_hlo_as_text",
        }
    code = f"import test_compile_wrappers as t; t.run_cases({backend!r}, {device!r})"
    log_dir.mkdir(parents=True, exist_ok=True)
    return results_of(run_python(code, env, log_dir / f"{backend}-{device}.log"))


# ---------------------------------------------------------------------------- tests
def _artifacts() -> Path:
    return Path(os.environ.get("XLA_GPU_OPS_ARTIFACTS", "artifacts")) / "compile_wrappers"


@pytest.fixture(scope="module")
def inductor_cpu() -> dict:
    return results_in_fresh_interpreter("inductor", "cpu", _artifacts())


@pytest.fixture(scope="module")
def inductor_cuda() -> dict:
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    return results_in_fresh_interpreter("inductor", "cuda", _artifacts())


@pytest.fixture(scope="module")
def openxla() -> dict:
    if importlib.util.find_spec("torch_xla") is None:
        pytest.skip("needs torch_xla")
    return results_in_fresh_interpreter("openxla", "xla", _artifacts() / "openxla")


def _outcome(results: dict, name: str) -> dict:
    got = results[name]
    assert "error" not in got, f"{name}: {got['error']}\n{got['trace']}"
    return got


@pytest.mark.parametrize("name", CASES)
def test_inductor_cpu_equals_eager(inductor_cpu, name):
    """The op stays opaque to inductor: the compiled call runs the same kernel, bit for bit."""
    got = _outcome(inductor_cpu, name)
    assert got["vs_eager"] == 0.0, f"{name}, seed {got['seed']}: {got}"


@pytest.mark.gpu
@pytest.mark.parametrize("name", CASES)
def test_inductor_cuda_equals_eager(inductor_cuda, name):
    got = _outcome(inductor_cuda, name)
    assert got["vs_eager"] == 0.0, f"{name}, seed {got['seed']}: {got}"
    assert got["vs_cpu"] < 1e-5, f"{name}, seed {got['seed']}: {got}"


@pytest.mark.torch_xla
@pytest.mark.parametrize("name", CASES)
def test_openxla_equals_eager(openxla, name):
    """XLA:CPU runs the composite, compiled or eager: the same values; the CPU reference agrees
    to float32 rounding."""
    got = _outcome(openxla, name)
    assert got["vs_eager"] <= 1e-6, f"{name}, seed {got['seed']}: {got}"
    assert got["vs_cpu"] < 1e-5, f"{name}, seed {got['seed']}: {got}"


@pytest.mark.torch_xla
@pytest.mark.parametrize("name", CASES)
def test_openxla_custom_call_in_hlo(openxla, name):
    got = _outcome(openxla, f"{name}/custom_call")
    expected = sorted(_target(op, got["abi"]) for op in CASES[name].ops)
    assert got["targets_in_hlo"] == expected, got
    # The first target the program runs fails on XLA:CPU, which has no handler of ours. Under
    # torch_xla 2.7 (legacy) a program that returns a tensor fails later, when that is read, and
    # then aborts the process: there the call may pass.
    missing = {
        "ffi": "No FFI handler registered for xla_gpu_",
        "legacy": "No registered implementation for untyped custom call to xla_gpu_",
    }
    if got["abi"] == "ffi" or got["failure"]:
        assert missing[got["abi"]] in got["failure"], got
