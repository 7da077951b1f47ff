"""The benchmark harness's CPU smoke run, in-process: it must write sane JSON, table and plot.

The smoke run uses tiny shapes and host timings; it checks the harness code paths, not speed.
A planted failing implementation must be recorded as "failed: <reason>" without stopping the run.
"""

from __future__ import annotations

import json
import math

import pytest

pytest.importorskip("matplotlib", reason="the harness plots with matplotlib")
pytest.importorskip("tqdm", reason="the harness shows a tqdm progress bar")
torch = pytest.importorskip("torch", reason="the harness builds inputs with torch")

from benchmarks import peers, run  # noqa: E402
from benchmarks.cases import all_cases, smoke_cases  # noqa: E402

PLANTED = "planted_failure"


def _planted(env, case, copies):
    raise RuntimeError("planted failure for the smoke test")


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench")
    mp = pytest.MonkeyPatch()
    mp.setattr(
        peers, "IMPLS", (*peers.IMPLS, peers.ImplSpec(PLANTED, "peer", peers.ALL, False, _planted))
    )
    try:
        results = run.run_benchmark(out, force_cpu=True, samples=3, show_progress=False)
    finally:
        mp.undo()
    return out, results


def test_smoke_writes_every_file(smoke):
    out, _ = smoke
    for name in ("results.json", "table.md", "plot.png", "env.json"):
        assert (out / name).is_file(), name
    assert (out / "plot.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (out / "plot.png").stat().st_size > 10_000
    env = json.loads((out / "env.json").read_text())
    assert env["mode"] == "cpu-smoke"
    assert env["torch"] == torch.__version__
    assert env["date_utc"]


def test_smoke_json_is_sane(smoke):
    out, _results = smoke
    on_disk = json.loads((out / "results.json").read_text())
    assert [c["name"] for c in on_disk["cases"]] == [c.name for c in smoke_cases()]
    ceil = on_disk["ceilings"]
    assert ceil["read_gbps"] > 0
    assert ceil["copy_gbps"] > 0
    assert ceil["matmul_tflops"] > 0
    assert len(on_disk["verdicts"]) == len(on_disk["cases"])
    ok_count = 0
    for case in on_disk["cases"]:
        assert case["bytes"] > 0
        assert case["flops"] > 0
        assert case["floor_us"] > 0
        for name, entry in case["impls"].items():
            assert entry["status"] in ("ok", "n/a", "failed", "skipped"), (case["name"], name)
            if entry["status"] != "ok":
                assert entry["reason"], (case["name"], name)
                continue
            ok_count += 1
            med = entry["median_us"]
            assert math.isfinite(med)
            assert med > 0
            assert entry["p10_us"] <= med <= entry["p90_us"]
            assert entry["gbps"] == pytest.approx(case["bytes"] / med / 1e3)
            assert entry["frac_floor"] == pytest.approx(case["floor_us"] / med)
            if "check" in entry:
                assert entry["check"] == "ok", (case["name"], name, entry.get("rel_l2_err"))
        planted = case["impls"][PLANTED]
        assert planted["status"] == "failed"
        assert "planted failure" in planted["reason"]
    assert ok_count >= 2 * len(on_disk["cases"])
    decode = on_disk["cases"][0]
    for name in ("reference", "jax_composite", "torch_gather_sdpa", "torch_sdpa_contiguous"):
        assert decode["impls"][name]["status"] == "ok", (name, decode["impls"][name])
    assert decode["impls"]["xgo_torch"]["status"] == "n/a"  # no GPU here
    assert "noise_pct" in decode["impls"]["reference"]  # the same version timed twice


def test_smoke_table_lists_cases_and_verdicts(smoke, capsys):
    out, _ = smoke
    table = (out / "table.md").read_text()
    assert "## Verdicts" in table
    assert "## All measurements" in table
    for case in smoke_cases():
        assert case.name in table
    assert "failed: RuntimeError: planted failure" in table


def test_smoke_runs_our_host_handler(smoke):
    """With the library built, our XLA:CPU host handler runs inside the jitted chain and agrees."""
    from xla_gpu_ops import _library

    if not _library.is_built():
        pytest.skip("libxla_gpu_ops.so is not built (nox -s build)")
    _, results = smoke
    for case in results["cases"]:
        entry = case["impls"]["xgo_jax_nograph"]
        assert entry["status"] == "ok", (case["name"], entry)
        assert entry.get("check") == "ok", (case["name"], entry)


def test_no_gpu_message_is_printed(tmp_path, capsys):
    with pytest.raises(SystemExit):
        run.main(["--cpu", "--out", str(tmp_path), "--cases", "no-such-case", "--no-progress"])
    assert run.NO_GPU_MESSAGE in capsys.readouterr().out


def test_quick_grid_keeps_required_rows():
    names = [c.name for c in all_cases(quick=True)]
    assert "decode_B32_ctx4k_h32-8_d128_p16" in names
    assert "decode_B1_ctx64k_h32-8_d128_p16" in names
    assert any("ctx1k" in n and n.startswith("decode") for n in names)
    assert any(n.endswith("_p64") for n in names)
    assert any("_d64_" in n for n in names)
    assert any("_d256_" in n for n in names)
    kinds = {c.kind for c in all_cases(quick=True)}
    assert kinds == {"decode", "mixed", "prefill", "simple_add", "overhead_decode"}
    full = all_cases(quick=False)
    assert len([c for c in full if c.kind == "decode"]) == 4 * 4 * 3 + 3


def test_isolated_run_survives_a_dying_worker(tmp_path):
    """A worker that dies inside one implementation (as after a device-side assert) costs that
    implementation only: a fresh worker resumes the same case without it."""
    import os
    import subprocess
    import sys

    env = {
        **os.environ,
        "JAX_PLATFORMS": "cpu",
        run.PLANTED_CRASH_ENV: "smoke_simple_add:reference",
    }
    cmd = [sys.executable, "-m", "benchmarks.run", "--cpu", "--isolate", "--no-progress",
           "--samples", "2", "--cases", "smoke_simple_add", "--out", str(tmp_path)]  # fmt: skip
    proc = subprocess.run(cmd, env=env, cwd=run.ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "restarting at smoke_simple_add_4k without reference" in proc.stdout
    (case,) = json.loads((tmp_path / "results.json").read_text())["cases"]
    dead = case["impls"]["reference"]
    assert dead["status"] == "failed"
    assert "exit status 3" in dead["reason"]
    others = {k: v["status"] for k, v in case["impls"].items() if k != "reference"}
    assert others
    assert all(s in ("ok", "n/a", "failed") for s in others.values()), others
    assert (tmp_path / "plot.png").is_file()
    assert (tmp_path / "table.md").is_file()


def test_crash_reason_reads_past_the_last_marker():
    noise = "RuntimeError: startup noise\n"
    text = (
        f"{noise}{run.IMPL_MARKER} a:b\nIndexKernel.cu:111: Assertion `index out of bounds` failed.\n"
        "torch.AcceleratorError: CUDA error: device-side assert triggered\n"
    )
    reason = run._crash_reason(text, -6)
    assert "exit status -6" in reason
    assert "index out of bounds" in reason
    assert "device-side assert" in reason
    assert "startup noise" not in reason


# XLA's thunk dumps (GpuExecutable: root_thunk->ToString): "<indent><index>: <kind> ...", thunks
# recorded into a CUDA graph indented under their kCommandBuffer thunk. Shapes only, made up here.
GRAPH_DUMP = """000: kCommandBuffer
  000: kCustomCall xla_gpu_paged_attention_cuda_ffi
  001: kCustomCall xla_gpu_paged_attention_cuda_ffi
"""
NOGRAPH_DUMP = """000: kCustomCall xla_gpu_paged_attention_cuda_ffi
001: kCustomCall xla_gpu_paged_attention_cuda_ffi
"""
MIXED_DUMP = """000: kCommandBuffer
  000: kKernel loop_fusion
001: kCustomCall xla_gpu_paged_attention_cuda_ffi
"""


def test_thunk_dump_parser_tells_graph_from_no_graph():
    graph = run.parse_thunk_sequence(GRAPH_DUMP)
    assert graph["custom_call_in_command_buffer"] == 2
    assert graph["custom_call_outside"] == 0
    assert graph["command_buffers"] == 1
    # evidence carries the line number in the dump
    assert graph["lines"]["custom_call"].startswith("2: 000: kCustomCall")
    nograph = run.parse_thunk_sequence(NOGRAPH_DUMP)
    assert nograph["custom_call_in_command_buffer"] == 0
    assert nograph["custom_call_outside"] == 2
    mixed = run.parse_thunk_sequence(MIXED_DUMP)  # a graph exists, but not around the call
    assert mixed["custom_call_in_command_buffer"] == 0
    assert mixed["custom_call_outside"] == 1
    # a function named like the old search pattern in HLO metadata is not evidence
    assert run.parse_thunk_sequence('op_name="command_buffer_evidence"')["command_buffers"] == 0


def test_cases_run_in_pattern_order():
    names = [c.name for c in run.select_cases(smoke_cases(), ["smoke_simple", "smoke_decode"])]
    assert names[0].startswith("smoke_simple")
    assert names[-1].startswith("smoke_decode")
    assert len(names) == len(set(names))


def test_torch_compile_peer_never_runs_after_torchax(monkeypatch):
    """torchax breaks torch.compile in torch 2.11 (seen on the H200): a clean-torch peer runs
    before torchax in its case, and is refused (with the reason) once torchax is loaded."""
    from benchmarks.cases import build_inputs

    monkeypatch.setenv(peers.FORCE_CLEAN_TORCH_ENV, "1")
    env = peers.BenchEnv(False)
    case = smoke_cases()[0]
    assert case.kind == "decode"
    flex = next(s for s in peers.IMPLS if s.name == "torch_flex_paged")
    assert peers.needs_clean_process(flex, env)
    monkeypatch.setattr(peers, "torchax_loaded", lambda: True)
    assert run.needs_fresh_process(case, env, None)
    order = []
    monkeypatch.setattr(
        peers,
        "IMPLS",
        tuple(
            peers.ImplSpec(
                s.name,
                s.role,
                s.kinds,
                False,
                _recorder(order, s.name),
                needs_clean_torch=s.needs_clean_torch,
            )
            for s in peers.IMPLS
            if s.name in ("xgo_torchax", "torch_flex_paged", "reference")
        ),
    )
    assert build_inputs  # the case builds its own inputs
    ceilings = {"read_gbps": 1.0, "matmul_tflops": 1.0}
    record = run.run_case(env, case, ceilings, samples=2, budget_bytes=1e9, l2_bytes=2**20)
    assert list(record["impls"]) == ["xgo_torchax", "torch_flex_paged", "reference"]
    flex_entry = record["impls"]["torch_flex_paged"]
    assert flex_entry["status"] == "failed"
    assert flex_entry["reason"] == run.TORCHAX_LOADED_REASON
    assert order == ["xgo_torchax", "reference"]  # flex was never prepared


def _recorder(order, name):
    def prepare(env, case, copies):
        order.append(name)
        raise peers.NotApplicable("recorded only")

    return prepare


def test_isolated_run_moves_flex_to_a_fresh_worker(tmp_path):
    """simple_add first loads torchax (xgo_torchax); the decode case after it needs a process
    without torchax, so a fresh worker runs it and FlexAttention runs there."""
    import os
    import subprocess
    import sys

    pytest.importorskip("torchax", reason="needs torchax")
    env = {**os.environ, "JAX_PLATFORMS": "cpu", peers.FORCE_CLEAN_TORCH_ENV: "1"}
    cmd = [sys.executable, "-m", "benchmarks.run", "--cpu", "--isolate", "--no-progress",
           "--samples", "2", "--cases", "smoke_simple_add", "smoke_decode",
           "--out", str(tmp_path)]  # fmt: skip
    proc = subprocess.run(cmd, env=env, cwd=run.ROOT, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "fresh worker for smoke_decode" in proc.stdout
    simple, decode = json.loads((tmp_path / "results.json").read_text())["cases"]
    assert simple["name"].startswith("smoke_simple_add")
    flex = decode["impls"]["torch_flex_paged"]
    assert flex["status"] == "ok", flex
    assert flex["torchax_loaded_before"] is False


def test_fingerprint_in_chunks_equals_the_whole_sum_and_sees_one_change(monkeypatch):
    monkeypatch.setattr(run, "FINGERPRINT_CHUNK", 1000)  # many chunks, one partial
    big = torch.randint(-30000, 30000, ((1 << 20) + 12345,), dtype=torch.int16)
    small = torch.arange(10, dtype=torch.int32)
    prints = run._fingerprint([{"kv_cache": big, "lens": small}])
    assert prints[0] == int(big.sum(dtype=torch.int64))  # sorted keys: kv_cache, lens
    changed = big.clone()
    changed[-1] += 1  # in the last, partial chunk
    assert run._fingerprint([{"kv_cache": changed, "lens": small}])[0] == prints[0] + 1


def test_release_cached_memory_waits_in_proportion_to_what_it_freed(monkeypatch):
    from benchmarks import timing

    reserved = iter([40e9, 6e9, 1e9, 1e9 - (64 << 20)])  # before / after, twice
    waits = []
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda: next(reserved))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    monkeypatch.setattr(timing.time, "sleep", waits.append)
    expected = 0.02 + 34e9 / timing.FREED_CLEAR_BYTES_PER_S
    assert timing.release_cached_memory() == pytest.approx(expected)
    assert timing.release_cached_memory() == 0.0  # 64 MiB: below FREED_SETTLE_MIN_BYTES
    assert waits == [pytest.approx(expected)]
