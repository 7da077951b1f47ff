#!/usr/bin/env python3
"""A tiny decoder attention layer on `torch.ops.xla_gpu.paged_attention`, run on every back end.

`XlaGpuAttention` projects hidden states to q/k/v (grouped-query attention), writes the new K/V
in place into a paged KV cache in vLLM's layout (`cat([k, v], -1).reshape(-1, 2 * Hkv, D)`: K of
kv head h at combined head 2h, V at 2h + 1) at the slots named by `slot_mapping` with
`torch.ops.xla_gpu.kv_cache_update`, attends with `torch.ops.xla_gpu.paged_attention` and
projects back. The same module runs unchanged in each mode:

  cpu        eager PyTorch on the CPU: the op's CPU implementation is the pure-PyTorch reference
  cuda       eager PyTorch on a GPU: the CUDA kernel through its C launcher
  torch_xla  lazy tensors: prints the HLO with the `xla_gpu_paged_attention` custom call; on
             XLA:CPU (where torch_xla cannot register a handler of ours) it then executes with
             the composite fallback (XLA_GPU_OPS_XLA_IMPL=composite), on XLA:CUDA with the
             custom call itself
  torchax    the module as a JAX function under jax.jit: the custom call on jax's default
             backend (the CUDA handler on a GPU, the host handler on XLA:CPU)

A prefill step (whole prompts) and a decode step (one new token per sequence) run in every
available mode; each output is compared (relative L2) with a float64 dense-attention oracle that
never touches the paged cache, and with the cpu mode. The script fails if any disagrees.

    python examples/xla_gpu_attention.py --mode all --dtype bfloat16
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import importlib.util
import math
import os
import sys
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

if importlib.util.find_spec("xla_gpu_ops") is None:  # run from a checkout without an install
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import xla_gpu_ops
from xla_gpu_ops import _library
from xla_gpu_ops._platform import prefer_cpu_without_gpu
from xla_gpu_ops.ops import KV_CACHE_UPDATE, PAGED_ATTENTION

MODES = ("cpu", "cuda", "torch_xla", "torchax")
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
# Largest relative L2 error allowed against the float64 oracle (and against the cpu mode).
REL_L2_TOL = {torch.float32: 2e-5, torch.float16: 3e-3, torch.bfloat16: 2e-2}
XLA_IMPL_ENV = "XLA_GPU_OPS_XLA_IMPL"


class XlaGpuAttention(nn.Module):
    """Decoder self-attention over a paged KV cache (no rotary embedding, to stay tiny)."""

    def __init__(
        self,
        hidden_size: int,
        num_q_heads: int,
        num_kv_heads: int,
        head_dim: int,
        *,
        sliding_window: int | None = None,
        soft_cap: float | None = None,
    ) -> None:
        super().__init__()
        if num_q_heads % num_kv_heads:
            raise ValueError(
                f"num_q_heads {num_q_heads} must be a multiple of num_kv_heads {num_kv_heads}"
            )
        self.num_q_heads, self.num_kv_heads, self.head_dim = num_q_heads, num_kv_heads, head_dim
        self.scale = 1.0 / math.sqrt(head_dim)
        self.sliding_window, self.soft_cap = sliding_window, soft_cap
        self.q_proj = nn.Linear(hidden_size, num_q_heads * head_dim, bias=False)
        self.k_proj = nn.Linear(hidden_size, num_kv_heads * head_dim, bias=False)
        self.v_proj = nn.Linear(hidden_size, num_kv_heads * head_dim, bias=False)
        self.o_proj = nn.Linear(num_q_heads * head_dim, hidden_size, bias=False)

    def forward(
        self,
        hidden_states: torch.Tensor,  # [num_tokens, hidden_size]
        kv_cache: torch.Tensor,  # [num_pages, page_size, 2 * num_kv_heads, head_dim]
        slot_mapping: torch.Tensor,  # int64 [num_tokens]: page * page_size + offset of each token
        context_lens: torch.Tensor,  # int32 [max_num_seqs]
        block_tables: torch.Tensor,  # int32 [max_num_seqs, pages_per_seq]
        query_start_loc: torch.Tensor,  # int32 [max_num_seqs + 1]
        num_seqs: torch.Tensor,  # int32 [1]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Returns (output [num_tokens, hidden_size], the updated kv_cache)."""
        num_tokens = hidden_states.shape[0]
        q = self.q_proj(hidden_states).view(num_tokens, self.num_q_heads, self.head_dim)
        k = self.k_proj(hidden_states).view(num_tokens, self.num_kv_heads, self.head_dim)
        v = self.v_proj(hidden_states).view(num_tokens, self.num_kv_heads, self.head_dim)
        new_kv = torch.cat([k, v], dim=-1).reshape(num_tokens, 2 * self.num_kv_heads, self.head_dim)
        # In place (eager, torch_xla); under torchax's jax.jit the written cache is the output.
        torch.ops.xla_gpu.kv_cache_update(new_kv, slot_mapping, kv_cache)
        attn = torch.ops.xla_gpu.paged_attention(
            q,
            kv_cache,
            context_lens,
            block_tables,
            query_start_loc,
            num_seqs,
            self.scale,
            self.sliding_window,
            self.soft_cap,
        )[0]
        return self.o_proj(attn.reshape(num_tokens, -1)), kv_cache


# ------------------------------------------------------------------------------ the scenario
@dataclass
class Step:
    name: str
    hidden_states: torch.Tensor
    slot_mapping: torch.Tensor
    context_lens: torch.Tensor
    block_tables: torch.Tensor
    query_start_loc: torch.Tensor
    num_seqs: torch.Tensor
    q_lens: list[int]

    def args(self, kv_cache: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (
            self.hidden_states,
            kv_cache,
            self.slot_mapping,
            self.context_lens,
            self.block_tables,
            self.query_start_loc,
            self.num_seqs,
        )


@dataclass
class Scenario:
    module: XlaGpuAttention
    kv_cache: torch.Tensor  # the initial cache: random values, so reading an unwritten slot shows
    steps: list[Step]
    seed: int


def make_scenario(
    dtype: torch.dtype,
    seed: int,
    prompt_lens: tuple[int, ...] = (5, 17, 40),
    hidden_size: int = 256,
    num_q_heads: int = 8,
    num_kv_heads: int = 2,
    head_dim: int = 64,
    page_size: int = 16,
    sliding_window: int | None = None,
    soft_cap: float | None = None,
) -> Scenario:
    """A prefill step over `prompt_lens` prompts, then a decode step with one token each."""
    gen = torch.Generator().manual_seed(seed)
    module = XlaGpuAttention(
        hidden_size,
        num_q_heads,
        num_kv_heads,
        head_dim,
        sliding_window=sliding_window,
        soft_cap=soft_cap,
    )
    with torch.no_grad():
        for proj in (module.q_proj, module.k_proj, module.v_proj, module.o_proj):
            nn.init.normal_(proj.weight, std=proj.in_features**-0.5, generator=gen)
    module = module.to(dtype)

    num_seqs = len(prompt_lens)
    pages_per_seq = -(-(max(prompt_lens) + 1) // page_size)
    num_pages = num_seqs * pages_per_seq + 2  # two spare pages nobody owns
    # shuffled physical pages: a kernel that assumes contiguous pages gets it wrong
    block_tables = torch.randperm(num_pages, generator=gen)[: num_seqs * pages_per_seq]
    block_tables = block_tables.view(num_seqs, pages_per_seq).to(torch.int32)
    kv_cache = torch.randn((num_pages, page_size, 2 * num_kv_heads, head_dim), generator=gen)

    def slot(seq: int, position: int) -> int:
        return int(block_tables[seq, position // page_size]) * page_size + position % page_size

    def step(name: str, positions: list[list[int]]) -> Step:
        q_lens = [len(p) for p in positions]
        starts = [0]
        for q_len in q_lens:
            starts.append(starts[-1] + q_len)
        return Step(
            name=name,
            hidden_states=torch.randn((starts[-1], hidden_size), generator=gen).to(dtype),
            slot_mapping=torch.tensor([slot(i, p) for i, ps in enumerate(positions) for p in ps]),
            context_lens=torch.tensor([ps[-1] + 1 for ps in positions], dtype=torch.int32),
            block_tables=block_tables,
            query_start_loc=torch.tensor(starts, dtype=torch.int32),
            num_seqs=torch.tensor([num_seqs], dtype=torch.int32),
            q_lens=q_lens,
        )

    prefill = step("prefill", [list(range(n)) for n in prompt_lens])
    decode = step("decode", [[n] for n in prompt_lens])
    return Scenario(module, kv_cache.to(dtype), [prefill, decode], seed)


def dense_oracle(scenario: Scenario) -> list[torch.Tensor]:
    """Each step's output in float64 from plain causal attention over each sequence's history."""
    module = copy.deepcopy(scenario.module).double()
    hq, hkv, d = module.num_q_heads, module.num_kv_heads, module.head_dim
    histories: list[torch.Tensor] = [
        torch.zeros(0, module.q_proj.in_features, dtype=torch.float64)
        for _ in scenario.steps[0].q_lens
    ]
    outputs = []
    with torch.no_grad():
        for step in scenario.steps:
            rows = step.hidden_states.double().split(step.q_lens)
            out_rows = []
            for i, new_rows in enumerate(rows):
                histories[i] = torch.cat([histories[i], new_rows])
                x, q_len = histories[i], new_rows.shape[0]
                kv_len = x.shape[0]
                q = module.q_proj(x[-q_len:]).view(q_len, hq, d)
                k = module.k_proj(x).view(kv_len, hkv, d).repeat_interleave(hq // hkv, dim=1)
                v = module.v_proj(x).view(kv_len, hkv, d).repeat_interleave(hq // hkv, dim=1)
                logits = torch.einsum("qhd,khd->hqk", q, k) * module.scale
                if module.soft_cap is not None:
                    logits = module.soft_cap * torch.tanh(logits / module.soft_cap)
                q_pos = torch.arange(kv_len - q_len, kv_len)[:, None]
                k_pos = torch.arange(kv_len)[None, :]
                masked = k_pos > q_pos
                if module.sliding_window is not None:
                    masked |= k_pos <= q_pos - module.sliding_window
                probs = torch.softmax(logits.masked_fill(masked, float("-inf")), dim=-1)
                attn = torch.einsum("hqk,khd->qhd", probs, v).reshape(q_len, hq * d)
                out_rows.append(module.o_proj(attn))
            outputs.append(torch.cat(out_rows))
    return outputs


# ------------------------------------------------------------------------------ the modes
@dataclass
class ModeResult:
    mode: str
    backend: str  # where it actually ran
    outputs: list[torch.Tensor]  # per step, on the CPU
    kv_cache: torch.Tensor  # after the last step, on the CPU
    notes: list[str] = field(default_factory=list)


def unavailable_reason(mode: str) -> str | None:
    """None if `mode` can run on this machine, else why not."""
    has = importlib.util.find_spec
    if mode == "cpu":
        return None
    if mode == "cuda":
        if not torch.cuda.is_available():
            return "no CUDA GPU visible to torch"
        return None if _library.is_built() else "libxla_gpu_ops.so is not built (nox -s build)"
    if mode == "torch_xla":
        return None if has("torch_xla") else "torch_xla is not installed"
    if mode == "torchax":
        if has("torchax") is None or has("jax") is None:
            return "torchax or jax is not installed"
        return None if _library.is_built() else "libxla_gpu_ops.so is not built (nox -s build)"
    raise ValueError(f"mode: unknown mode {mode!r}, expected one of {MODES}")


def run_eager(scenario: Scenario, device: str) -> ModeResult:
    module = copy.deepcopy(scenario.module).to(device)
    kv_cache = scenario.kv_cache.to(device, copy=True)  # the steps write it in place
    outputs = []
    with torch.no_grad():
        for step in scenario.steps:
            out, kv_cache = module(*(t.to(device) for t in step.args(kv_cache)))
            outputs.append(out.cpu())
    backend = torch.cuda.get_device_name() if device == "cuda" else "CPU (reference impl)"
    return ModeResult(device, backend, outputs, kv_cache.cpu())


def custom_calls(hlo: str, marker: str, width: int = 200) -> list[str]:
    """The lines of `hlo` containing `marker`, shortened around it for printing."""
    lines = []
    for line in hlo.splitlines():
        if (at := line.find(marker)) >= 0:
            line = line.strip()
            at = line.find(marker)
            start = max(0, at - width // 2)
            lines.append(("..." if start else "") + line[start : start + width] + "...")
    return lines


@contextlib.contextmanager
def env_set(name: str, value: str) -> Iterator[None]:
    old = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if old is None:
            del os.environ[name]
        else:
            os.environ[name] = old


def run_torch_xla(scenario: Scenario) -> ModeResult:
    import torch_xla
    import torch_xla.core.xla_model as xm

    device = torch_xla.device()
    hardware = xm.xla_device_hw(device)
    module = copy.deepcopy(scenario.module).to(device)
    notes = []
    with torch.no_grad():
        # Trace the first step with the custom call forced (XLA:CPU would default to the
        # composite) and show its HLO; nothing executes.
        with env_set(XLA_IMPL_ENV, "custom_call"):
            out, new_cache = module(
                *(t.to(device) for t in scenario.steps[0].args(scenario.kv_cache))
            )
        hlo = torch_xla._XLAC._get_xla_tensors_hlo([out])
        # torch_xla < 2.9 emits the legacy target, 2.9 the typed FFI one.
        from xla_gpu_ops.torch_xla import custom_call_abi

        abi = custom_call_abi()
        calls = []
        for op in (KV_CACHE_UPDATE, PAGED_ATTENTION):
            target = op.ffi_target if abi == "ffi" else op.legacy_target
            found = custom_calls(hlo, f'custom_call_target="{target}"')
            if not found:
                raise AssertionError(f"torch_xla: no {target} custom call in\n{hlo}")
            calls += found
        notes += [f"HLO: {c}" for c in calls]
        del out, new_cache  # dropped unexecuted: XLA:CPU has no handler for the custom call

        # Execute: the custom call itself on XLA:CUDA, the composite fallback on XLA:CPU.
        with env_set(XLA_IMPL_ENV, "composite" if hardware == "CPU" else "custom_call"):
            kv_cache = scenario.kv_cache.to(device)
            outputs = []
            for step in scenario.steps:
                out, kv_cache = module(*(t.to(device) for t in step.args(kv_cache)))
                outputs.append(out.cpu())
            kv_cache = kv_cache.cpu()
    backend = f"XLA:{hardware}" + (" (composite fallback)" if hardware == "CPU" else "")
    return ModeResult("torch_xla", backend, outputs, kv_cache, notes)


def run_torchax(scenario: Scenario) -> ModeResult:
    import jax
    import torchax

    import xla_gpu_ops.torchax

    xla_gpu_ops.torchax.register()
    env = torchax.default_env()
    states, module_fn = torchax.extract_jax(scenario.module)
    step_fn = jax.jit(module_fn)
    kv_cache = env.t2j_copy(scenario.kv_cache)
    outputs, notes = [], []
    # float32 projections in full precision: XLA on a GPU would otherwise use TF32 (torch's
    # eager CUDA matmul does not), and the table would measure that instead of the attention.
    precision = jax.default_matmul_precision("highest")
    for step in scenario.steps:
        hidden_states, _, *metadata = step.args(scenario.kv_cache)
        args = (env.t2j_copy(hidden_states), kv_cache, *(env.t2j_copy(t) for t in metadata))
        if not notes:
            with precision:
                hlo = step_fn.lower(states, args).as_text()
            for op in (KV_CACHE_UPDATE, PAGED_ATTENTION):
                calls = custom_calls(hlo, f"stablehlo.custom_call @{op.ffi_target}(")
                if not calls:
                    raise AssertionError(f"torchax: no {op.ffi_target} custom call in\n{hlo}")
                notes += [f"StableHLO: {c}" for c in calls]
        with precision:
            out, kv_cache = step_fn(states, args)
        outputs.append(jax_to_torch(out))
    device = kv_cache.devices().pop()
    return ModeResult(
        "torchax",
        f"jax {device.platform}: {device.device_kind}",
        outputs,
        jax_to_torch(kv_cache),
        notes,
    )


def jax_to_torch(array) -> torch.Tensor:
    """A float jax array as a CPU torch tensor of the same dtype (through a float32 copy:
    numpy has no bfloat16, and float32 holds every float16/bfloat16 value exactly)."""
    import numpy as np

    dtype = DTYPES[str(array.dtype)]
    return torch.from_numpy(np.array(array.astype("float32"))).to(dtype)


RUNNERS: dict[str, Callable[[Scenario], ModeResult]] = {
    "cpu": lambda s: run_eager(s, "cpu"),
    "cuda": lambda s: run_eager(s, "cuda"),
    "torch_xla": run_torch_xla,
    "torchax": run_torchax,
}


# ------------------------------------------------------------------------------ agreement
def rel_l2(actual: torch.Tensor, expected: torch.Tensor) -> float:
    actual, expected = actual.double().cpu(), expected.double().cpu()
    if not torch.isfinite(actual).all():
        return float("inf")
    return ((actual - expected).norm() / expected.norm().clamp_min(1e-30)).item()


@dataclass
class Report:
    results: dict[str, ModeResult]
    oracle: list[torch.Tensor]
    errors: dict[str, dict[str, float]]  # mode -> column -> relative L2
    tolerance: float
    skipped: dict[str, str]
    crashed: dict[str, str] = field(default_factory=dict)  # mode -> the exception it raised

    @property
    def failures(self) -> list[str]:
        return [
            f"{mode}: {column} rel L2 {err:.2e} > {self.tolerance:.0e}"
            for mode, columns in self.errors.items()
            for column, err in columns.items()
            if not err <= self.tolerance
        ] + [f"{mode}: crashed: {why}" for mode, why in self.crashed.items()]

    def table(self) -> str:
        columns = list(next(iter(self.errors.values())))
        header = f"{'mode':<10} {'ran on':<34} " + " ".join(f"{c:>16}" for c in columns)
        lines = [header, "-" * len(header)]
        for mode, errs in self.errors.items():
            backend = self.results[mode].backend[:34]
            lines.append(
                f"{mode:<10} {backend:<34} " + " ".join(f"{errs[c]:>16.2e}" for c in columns)
            )
        lines.append(f"(relative L2; tolerance {self.tolerance:.0e})")
        lines += [f"{mode:<10} skipped: {why}" for mode, why in self.skipped.items()]
        lines += [f"{mode:<10} CRASHED: {why}" for mode, why in self.crashed.items()]
        return "\n".join(lines)


def run(modes: list[str], scenario: Scenario) -> Report:
    """Run `modes` (always with cpu as the baseline) and measure every disagreement."""
    skipped = {m: why for m in modes if (why := unavailable_reason(m)) is not None}
    to_run = ["cpu"] + [m for m in modes if m != "cpu" and m not in skipped]
    results, crashed = {}, {}
    for mode in to_run:
        try:
            results[mode] = RUNNERS[mode](scenario)
        except Exception as error:  # report it with the other modes' results, then fail
            if mode == "cpu":
                raise
            traceback.print_exc()
            crashed[mode] = f"{type(error).__name__}: {error}"
    oracle = dense_oracle(scenario)
    baseline = results["cpu"]
    errors = {}
    for mode, result in results.items():
        errs = {}
        for i, step in enumerate(scenario.steps):
            errs[f"{step.name} vs f64"] = rel_l2(result.outputs[i], oracle[i])
            if mode != "cpu":
                errs[f"{step.name} vs cpu"] = rel_l2(result.outputs[i], baseline.outputs[i])
        if mode != "cpu":
            errs["cache vs cpu"] = rel_l2(result.kv_cache, baseline.kv_cache)
        errors[mode] = errs
    columns = list(dict.fromkeys(c for errs in errors.values() for c in errs))
    errors = {m: {c: errs.get(c, 0.0) for c in columns} for m, errs in errors.items()}
    tolerance = REL_L2_TOL[scenario.kv_cache.dtype]
    return Report(results, oracle, errors, tolerance, skipped, crashed)


def main(argv: list[str] | None = None) -> int:
    prefer_cpu_without_gpu()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mode", choices=[*MODES, "all"], default="all")
    parser.add_argument("--dtype", choices=list(DTYPES), default="float32")
    parser.add_argument("--seed", type=int, default=None, help="default: a fresh random seed")
    parser.add_argument("--sliding-window", type=int, default=None)
    parser.add_argument("--soft-cap", type=float, default=None)
    args = parser.parse_args(argv)

    modes = list(MODES) if args.mode == "all" else [args.mode]
    if args.mode != "all" and (why := unavailable_reason(args.mode)):
        parser.error(f"--mode {args.mode} is not available here: {why}")
    seed = args.seed if args.seed is not None else int.from_bytes(os.urandom(4), "little")
    scenario = make_scenario(
        DTYPES[args.dtype], seed, sliding_window=args.sliding_window, soft_cap=args.soft_cap
    )
    report = run(modes, scenario)
    print(
        f"xla_gpu_ops {xla_gpu_ops.__version__}, dtype {args.dtype}, seed {seed}, "
        f"steps: {', '.join(f'{s.name} ({sum(s.q_lens)} tokens)' for s in scenario.steps)}"
    )
    for result in report.results.values():
        for note in result.notes:
            print(f"[{result.mode}] {note}")
    print(report.table())
    if report.failures:
        print("DISAGREEMENT:\n  " + "\n  ".join(report.failures), file=sys.stderr)
        return 1
    print("all modes agree")
    return 0


if __name__ == "__main__":
    sys.exit(main())
