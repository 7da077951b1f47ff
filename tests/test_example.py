"""examples/xla_gpu_attention.py: every available mode runs a prefill then a decode step and agrees.

Each mode is compared (relative L2) with the example's float64 dense-attention oracle, which never
touches the paged cache, and with the cpu mode (the reference implementation of the op).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch
from paged_inputs import fresh_seed

EXAMPLE_PATH = Path(__file__).resolve().parents[1] / "examples" / "xla_gpu_attention.py"


def load_example():
    name = "xla_gpu_attention_example"
    if name not in sys.modules:  # dataclasses look their module up in sys.modules
        spec = importlib.util.spec_from_file_location(name, EXAMPLE_PATH)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


example = load_example()

DTYPE_IDS = lambda dtype: str(dtype).removeprefix("torch.")  # noqa: E731
ATTRIBUTES = {"plain": {}, "window_cap": {"sliding_window": 7, "soft_cap": 3.0}}
MODES = [
    pytest.param("cuda", marks=pytest.mark.gpu),
    pytest.param("torch_xla", marks=pytest.mark.torch_xla),
    pytest.param("torchax", marks=pytest.mark.torchax),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=DTYPE_IDS)
def test_cpu_mode_matches_dense_oracle_and_writes_only_its_slots(dtype):
    seed = fresh_seed()
    scenario = example.make_scenario(dtype, seed)
    result = example.run_eager(scenario, "cpu")
    oracle = example.dense_oracle(scenario)
    for step, out, expected in zip(scenario.steps, result.outputs, oracle, strict=True):
        err = example.rel_l2(out, expected)
        assert err < example.REL_L2_TOL[dtype], f"{step.name}: rel L2 {err:.2e} (seed {seed})"

    # The cache holds each step's K/V at its slots (vLLM layout) and the initial values elsewhere.
    module, initial = scenario.module, scenario.kv_cache.flatten(0, 1)
    final = result.kv_cache.flatten(0, 1)
    written = torch.zeros(final.shape[0], dtype=torch.bool)
    with torch.no_grad():
        for step in scenario.steps:
            x = step.hidden_states
            k = module.k_proj(x).view(x.shape[0], module.num_kv_heads, module.head_dim)
            v = module.v_proj(x).view(x.shape[0], module.num_kv_heads, module.head_dim)
            assert torch.equal(final[step.slot_mapping, 0::2], k), f"{step.name}: K (seed {seed})"
            assert torch.equal(final[step.slot_mapping, 1::2], v), f"{step.name}: V (seed {seed})"
            written[step.slot_mapping] = True
    assert torch.equal(final[~written], initial[~written]), f"unwritten slots changed (seed {seed})"


@pytest.mark.parametrize("attributes", list(ATTRIBUTES))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=DTYPE_IDS)
@pytest.mark.parametrize("mode", MODES)
def test_mode_agrees_with_oracle_and_cpu(mode, dtype, attributes):
    if (why := example.unavailable_reason(mode)) is not None:
        pytest.skip(why)
    seed = fresh_seed()
    scenario = example.make_scenario(dtype, seed, **ATTRIBUTES[attributes])
    report = example.run([mode], scenario)
    assert set(report.results) == {"cpu", mode}
    assert not report.skipped
    assert set(report.errors[mode]) == {
        "prefill vs f64",
        "decode vs f64",
        "prefill vs cpu",
        "decode vs cpu",
        "cache vs cpu",
    }
    assert not report.failures, f"seed {seed}:\n{report.table()}"


def test_script_prints_table_and_exits_zero(capsys):
    assert example.main(["--mode", "cpu", "--seed", str(fresh_seed())]) == 0
    printed = capsys.readouterr().out
    assert "prefill vs f64" in printed
    assert "all modes agree" in printed


def test_script_fails_when_modes_disagree(monkeypatch, capsys):
    """A mode whose output is off gets reported and the script exits non-zero."""
    honest = example.RUNNERS["cpu"]

    def off_by_a_bit(scenario):
        result = honest(scenario)
        result.outputs[1] = result.outputs[1] * 1.01
        return result

    monkeypatch.setitem(example.RUNNERS, "cuda", off_by_a_bit)
    monkeypatch.setattr(example, "unavailable_reason", lambda mode: None)
    assert example.main(["--mode", "cuda", "--seed", str(fresh_seed())]) == 1
    assert "cuda: decode vs f64" in capsys.readouterr().err


def test_script_reports_a_crashing_mode_and_fails(monkeypatch, capsys):
    def crash(scenario):
        raise RuntimeError("planted failure")

    monkeypatch.setitem(example.RUNNERS, "cuda", crash)
    monkeypatch.setattr(example, "unavailable_reason", lambda mode: None)
    assert example.main(["--mode", "cuda", "--seed", str(fresh_seed())]) == 1
    captured = capsys.readouterr()
    assert "cuda       CRASHED: RuntimeError: planted failure" in captured.out
    assert "cpu        CPU (reference impl)" in captured.out  # the other modes still reported


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message for a missing GPU")
def test_script_refuses_an_unavailable_mode_with_the_reason(capsys):
    with pytest.raises(SystemExit) as exit_info:
        example.main(["--mode", "cuda"])
    assert exit_info.value.code == 2
    assert "no CUDA GPU visible to torch" in capsys.readouterr().err
