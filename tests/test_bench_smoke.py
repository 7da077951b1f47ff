"""The benchmark harness through its entry point: the CPU smoke run must write sane JSON, table
and plot, and `publish` must turn a (made-up) GPU run into the compact record of its GPU kind.

The smoke run uses tiny shapes and host timings; it checks the harness code paths, not speed, and
judges no target. A planted failing implementation must be recorded as "failed: <reason>" without
stopping the run. Also: FlashInfer's page metadata and kernel-cache files, the verdicts on a
made-up GPU run, and the library A/B.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import signal
import subprocess
import sys
import time
import types
from pathlib import Path

import pytest

pytest.importorskip("matplotlib", reason="the harness plots with matplotlib")
pytest.importorskip("tqdm", reason="the harness shows a tqdm progress bar")
torch = pytest.importorskip("torch", reason="the harness builds inputs with torch")

from benchmarks import (  # noqa: E402
    case_runner,
    cli,
    environment,
    flashinfer_peer,
    host_cost,
    ours,
    peers,
    per_call,
    record,
    report,
    run,
    workers,
)
from benchmarks.cases import (  # noqa: E402
    all_cases,
    build_inputs,
    decode_case,
    mixed_case,
    select_cases,
    smoke_cases,
)

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
        status = cli.main(["run", "--cpu", "--out", str(out), "--samples", "3", "--no-progress"])
    finally:
        mp.undo()
    assert status == 0
    return out, report.load(out / "results.json")


def test_smoke_writes_every_file(smoke):
    out, results = smoke
    assert {"results.json", "table.md", "plot.png"} <= {p.name for p in out.iterdir()}
    assert (out / "plot.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (out / "plot.png").stat().st_size > 10_000
    env = results["env"]
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
    assert report.verdicts(on_disk) == []  # a smoke run judges no target
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
            if case["kind"] != "host_cost":
                assert entry["gbps"] == pytest.approx(case["bytes"] / med / 1e3)
                assert entry["frac_floor"] == pytest.approx(case["floor_us"] / med)
            if "check" in entry:
                assert entry["check"] == "ok", (case["name"], name, entry.get("rel_l2_err"))
        if case["kind"] == "host_cost":
            continue
        planted = case["impls"][PLANTED]
        assert planted["status"] == "failed"
        assert "planted failure" in planted["reason"]
    assert ok_count >= 2 * len(on_disk["cases"])
    decode = on_disk["cases"][0]
    for name in ("reference", "jax_composite", "torch_gather_sdpa", "torch_sdpa_contiguous"):
        assert decode["impls"][name]["status"] == "ok", (name, decode["impls"][name])
    assert decode["impls"]["xgo_torch"]["status"] == "n/a"  # no GPU here
    assert "noise_pct" in decode["impls"]["reference"]  # the same version timed twice


def test_smoke_checks_ours_against_sdpa_and_flashinfer(smoke):
    """Every paged row compares our output with SDPA's, FlashInfer's and, on decode and spec
    decode rows, XQA's (or says why not): SDPA takes the fp8 row (a dequantised copy) and the spec
    decode row (a lower-right causal mask), not the sinks row."""
    _, results = smoke
    cases = {c.name: c for c in smoke_cases()}
    assert "spec_decode" in {c["kind"] for c in results["cases"]}
    for case in results["cases"]:
        if case["kind"] not in ("decode", "spec_decode", "mixed", "prefill"):
            continue
        cross = case["cross_check"]
        assert cross["ours"] is not None, case["name"]
        sdpa = {k: v for k, v in cross["against"].items() if "sdpa" in k}
        if cases[case["name"]].sinks:
            assert [v["check"] for v in sdpa.values()] == ["not run"], (case["name"], cross)
            assert "no sink logit" in next(iter(sdpa.values()))["reason"], cross
        else:
            assert [v["check"] for v in sdpa.values()] == ["ok"], (case["name"], cross)
        flashinfer = {k: v for k, v in cross["against"].items() if k.startswith("flashinfer")}
        peers_of_kind = (
            {"flashinfer_decode", "flashinfer_xqa"}
            if case["kind"] in ("decode", "spec_decode")
            else {"flashinfer_prefill"}
        )
        assert set(flashinfer) == peers_of_kind, (case["name"], cross)
        for fi in flashinfer.values():
            assert fi["check"] == "not run", (case["name"], fi)
            assert fi["reason"], (case["name"], fi)
            if importlib.util.find_spec("flashinfer") is None:
                assert fi["reason"].startswith("not installed"), fi


def test_smoke_host_cost_row(smoke):
    _, results = smoke
    (host,) = [c for c in results["cases"] if c["kind"] == "host_cost"]
    impls = host["impls"]
    assert list(impls) == [name for name, _ in host_cost.ROWS]
    for name in ("xgo_op", "xgo_wrapper", "torch_sdpa"):
        assert impls[name]["status"] == "ok", (name, impls[name])
        assert impls[name]["median_us"] > 0
    assert impls["xgo_wrapper"]["check"] == "ok"  # same output as the op
    assert impls["torch_sdpa"]["check"] == "ok"
    assert impls["xgo_launcher"]["status"] == "n/a"  # the C launcher needs a GPU


def test_smoke_table_lists_cases_and_no_verdicts(smoke, capsys):
    out, results = smoke
    table = (out / "table.md").read_text()
    assert table == report.table(results)
    for case in smoke_cases():
        assert case.name in table
    assert f"Failed: smoke_decode_B4_ctx100_h4-2_d64_p16 {PLANTED}: RuntimeError: planted" in table
    assert "MISSED" not in table
    assert "met (" not in table
    assert "No verdicts" in table
    # a row per kernel case, a column per implementation that ran
    rows = [line for line in table.splitlines() if line.startswith("| smoke_")]
    assert len(rows) == len(smoke_cases()) - 1  # the host-cost case has its own line
    assert "Eager host µs per call (smoke_host_cost" in table
    head = next(line for line in table.splitlines() if line.startswith("| case |"))
    assert "reference (CPU)" in head
    assert "SDPA, contiguous" in head
    assert cli.main(["report", str(out)]) == 0
    assert capsys.readouterr().out.strip() == table.strip()


def test_a_smoke_run_is_not_published(smoke, tmp_path):
    out, _ = smoke
    with pytest.raises(SystemExit, match="a CPU smoke run is not a record"):
        cli.main(["publish", str(out), "--results-dir", str(tmp_path)])
    assert not list(tmp_path.iterdir())


def test_runs_write_into_git_ignored_folders():
    assert run.SMOKE_DIR.relative_to(run.ROOT).as_posix() == "artifacts/bench-smoke"
    env = {
        "date_utc": "2026-11-23T00:00:00Z",
        "git_commit": "0123456789ab+dirty",
        "gpu": {"name": "NVIDIA H100 80GB HBM3"},
    }
    assert environment.run_name(env) == "2026-11-23-nvidia-h100-80gb-hbm3-0123456"
    if not (run.ROOT / ".git").exists():
        pytest.skip("no git checkout")
    for path in (
        "artifacts/bench-smoke/results.json",
        f"artifacts/bench/{environment.run_name(env)}/results.json",
    ):
        probe = subprocess.run(
            ["git", "-C", str(run.ROOT), "check-ignore", "-q", path], check=False
        )
        assert probe.returncode == 0, f"{path} must be ignored by git"


def test_smoke_runs_our_host_handler(smoke):
    """With the library built, our XLA:CPU host handler runs inside the jitted chain and agrees."""
    if not ours.library_built():
        pytest.skip("libxla_gpu_ops.so is not built (nox -s build)")
    _, results = smoke
    for case in results["cases"]:
        if case["kind"] == "host_cost":
            continue
        entry = case["impls"]["xgo_jax_nograph"]
        assert entry["status"] == "ok", (case["name"], entry)
        assert entry.get("check") == "ok", (case["name"], entry)


def test_no_gpu_message_is_printed(tmp_path, capsys):
    with pytest.raises(SystemExit):
        cli.main(["--cpu", "--out", str(tmp_path), "--cases", "no-such-case", "--no-progress"])
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
    assert kinds == {
        "decode",
        "spec_decode",
        "mixed",
        "prefill",
        "simple_add",
        "overhead_decode",
        "host_cost",
    }
    prefill = {
        (c.batch, c.seqs[0][0], c.head_dim) for c in all_cases(quick=True) if c.kind == "prefill"
    }
    assert prefill == {(b, n, d) for b, n in ((1, 8192), (8, 2048)) for d in (64, 128, 256)}
    # a decode row of each new path: FlashInfer's and XQA's fp8 decode, sinks and a window
    assert "decode_B32_ctx4k_h32-8_d128_fp8_p16" in names
    assert "decode_B32_ctx4k_h64-8_d64_sinks_w128_p16" in names
    assert "decode_B32_ctx4k_h32-8_d128_q4_p16" in names  # speculative decoding's verify step
    # decode and prefill at D 64/128/256, fp8 decode, sink decode; XQA: 8 (dtype, D, page, group)
    # and the q_len 4 row's speculative-decoding module
    assert len(flashinfer_peer.modules_needed(all_cases(quick=True))) == 3 * 2 + 2 + 8 + 1
    full = all_cases(quick=False)
    assert len([c for c in full if c.kind == "decode"]) == 4 * 4 * 3 + 3 + 3


def test_isolated_run_survives_a_dying_worker(tmp_path):
    """A worker that dies inside one implementation (as after a device-side assert) costs that
    implementation only: a fresh worker resumes the same case without it."""
    import os
    import subprocess
    import sys

    env = {
        **os.environ,
        "JAX_PLATFORMS": "cpu",
        workers.PLANTED_CRASH_ENV: "smoke_simple_add:reference",
    }
    cmd = [
        sys.executable,
        "-m",
        "benchmarks",
        "run",
        "--cpu",
        "--isolate",
        "--no-progress",
        "--samples",
        "2",
        "--cases",
        "smoke_simple_add",
        "--out",
        str(tmp_path),
    ]
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
        f"{noise}{workers.IMPL_MARKER} a:b\nIndexKernel.cu:111: Assertion `index out of bounds` failed.\n"
        "torch.AcceleratorError: CUDA error: device-side assert triggered\n"
    )
    reason = workers._crash_reason(text, -6)
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
    graph = per_call.parse_thunk_sequence(GRAPH_DUMP)
    assert graph["custom_call_in_command_buffer"] == 2
    assert graph["custom_call_outside"] == 0
    assert graph["command_buffers"] == 1
    # evidence carries the line number in the dump
    assert graph["lines"]["custom_call"].startswith("2: 000: kCustomCall")
    nograph = per_call.parse_thunk_sequence(NOGRAPH_DUMP)
    assert nograph["custom_call_in_command_buffer"] == 0
    assert nograph["custom_call_outside"] == 2
    mixed = per_call.parse_thunk_sequence(MIXED_DUMP)  # a graph exists, but not around the call
    assert mixed["custom_call_in_command_buffer"] == 0
    assert mixed["custom_call_outside"] == 1
    # a function named like the old search pattern in HLO metadata is not evidence
    assert (
        per_call.parse_thunk_sequence('op_name="command_buffer_evidence"')["command_buffers"] == 0
    )


def test_cases_run_in_pattern_order():
    names = [c.name for c in select_cases(smoke_cases(), ["smoke_simple", "smoke_decode"])]
    assert names[0].startswith("smoke_simple")
    assert names[-1].startswith("smoke_decode")
    assert len(names) == len(set(names))


def test_torch_compile_peer_never_runs_after_torchax(monkeypatch):
    """torchax breaks torch.compile in torch 2.11 (seen on the H200): a clean-torch peer runs
    before torchax in its case, and is refused (with the reason) once torchax is loaded."""
    monkeypatch.setenv(peers.FORCE_CLEAN_TORCH_ENV, "1")
    env = peers.BenchEnv(False)
    case = smoke_cases()[0]
    assert case.kind == "decode"
    flex = next(s for s in peers.IMPLS if s.name == "torch_flex_paged")
    assert peers.needs_clean_process(flex, env)
    monkeypatch.setattr(peers, "torchax_loaded", lambda: True)
    assert case_runner.needs_fresh_process(case, env, None)
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
    result = case_runner.run_case(env, case, ceilings, samples=2, budget_bytes=1e9, l2_bytes=2**20)
    assert list(result["impls"]) == ["xgo_torchax", "torch_flex_paged", "reference"]
    flex_entry = result["impls"]["torch_flex_paged"]
    assert flex_entry["status"] == "failed"
    assert flex_entry["reason"] == case_runner.TORCHAX_LOADED_REASON
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
    cmd = [
        sys.executable,
        "-m",
        "benchmarks",
        "run",
        "--cpu",
        "--isolate",
        "--no-progress",
        "--samples",
        "2",
        "--cases",
        "smoke_simple_add",
        "smoke_decode_B4_ctx100_h4-2_d64_p16",
        "--out",
        str(tmp_path),
    ]
    proc = subprocess.run(cmd, env=env, cwd=run.ROOT, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "fresh worker for smoke_decode" in proc.stdout
    simple, decode = json.loads((tmp_path / "results.json").read_text())["cases"]
    assert simple["name"].startswith("smoke_simple_add")
    flex = decode["impls"]["torch_flex_paged"]
    assert flex["status"] == "ok", flex
    assert flex["torchax_loaded_before"] is False


def test_fingerprint_in_chunks_equals_the_whole_sum_and_sees_one_change(monkeypatch):
    monkeypatch.setattr(case_runner, "FINGERPRINT_CHUNK", 1000)  # many chunks, one partial
    big = torch.randint(-30000, 30000, ((1 << 20) + 12345,), dtype=torch.int16)
    small = torch.arange(10, dtype=torch.int32)
    prints = case_runner._fingerprint([{"kv_cache": big, "lens": small}])
    assert prints[0] == int(big.sum(dtype=torch.int64))  # sorted keys: kv_cache, lens
    changed = big.clone()
    changed[-1] += 1  # in the last, partial chunk
    assert case_runner._fingerprint([{"kv_cache": changed, "lens": small}])[0] == prints[0] + 1


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


# ------------------------------------------------------------------------------ FlashInfer
def test_flashinfer_page_metadata_matches_block_tables():
    """CSR pages (indptr, indices, last_page_len) name the same pages as block_tables, in order."""
    case = mixed_case()
    inputs = build_inputs(case, "cpu", seed=3)
    indptr, indices, last = flashinfer_peer.page_metadata(case, inputs)
    assert indptr.dtype == indices.dtype == last.dtype == torch.int32
    assert indptr[0] == 0
    assert len(indptr) == case.batch + 1
    for i, (_, ctx) in enumerate(case.seqs):
        pages = -(-ctx // case.page_size)
        assert indptr[i + 1] - indptr[i] == pages
        assert torch.equal(indices[indptr[i] : indptr[i + 1]], inputs["block_tables"][i, :pages])
        assert 1 <= last[i] <= case.page_size
        assert (pages - 1) * case.page_size + last[i] == ctx


def test_flashinfer_kv_views_are_our_even_and_odd_heads():
    case = decode_case(2, 40, (4, 2), head_dim=64)
    kv = build_inputs(case, "cpu", seed=5)["kv_cache"]
    k, v = flashinfer_peer.kv_views(kv)
    assert k.shape == v.shape == (kv.shape[0], case.page_size, case.num_kv_heads, case.head_dim)
    assert k.stride() == v.stride()  # FlashInfer requires equal K and V strides
    assert k.data_ptr() == kv.data_ptr()  # views: no copy
    assert torch.equal(k[:, :, 1], kv[:, :, 2])
    assert torch.equal(v[:, :, 1], kv[:, :, 3])


def test_flashinfer_absent_is_reported_not_raised(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "flashinfer" else real(name, *a),
    )
    assert flashinfer_peer.unavailable().startswith("not installed")
    case = decode_case(1, 32, (4, 2), head_dim=64)
    with pytest.raises(peers.NotApplicable, match="not installed"):
        flashinfer_peer.prepare_decode(peers.BenchEnv(False), case, [])
    assert cli.main(["flashinfer", "prebuild"]) == 0  # says so, builds nothing


def test_a_stopped_prebuild_stops_its_compilers_and_keeps_its_lines(tmp_path):
    """The prebuild's lines arrive as they come; stopping it at its timeout stops the processes it
    started too (a compiler left running would share the host with the timings)."""
    pid_file = tmp_path / "child.pid"
    script = (
        "import subprocess, sys, time\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        f"open({str(pid_file)!r}, 'w').write(str(child.pid))\n"
        "print('ready flashinfer_xqa one_page 1 s', flush=True)\n"
        "time.sleep(60)\n"
    )
    start = time.time()
    lines, status = run.stream_process([sys.executable, "-c", script], timeout=3.0)
    assert status is None
    assert time.time() - start < 30
    assert lines == ["ready flashinfer_xqa one_page 1 s"]
    child = int(pid_file.read_text())
    for _ in range(50):  # killed with its group: gone, or a zombie where no one reaps orphans
        try:
            if Path(f"/proc/{child}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                break
        except (FileNotFoundError, ProcessLookupError):
            break
        time.sleep(0.1)
    else:
        pytest.fail("the prebuild's child process outlived the stop")
    lines, status = run.stream_process([sys.executable, "-c", "print('a'); print('b')"], None)
    assert (lines, status) == (["a", "b"], 0)
    # asked for its stacks before the stop, a process that registered for them prints them
    script = (
        "import faulthandler, signal, time\n"
        "faulthandler.register(signal.SIGUSR1, all_threads=True)\n"
        "print('waiting', flush=True)\n"
        "def wait_here():\n    time.sleep(60)\n"
        "wait_here()\n"
    )
    lines, status = run.stream_process([sys.executable, "-c", script], 3.0, signal.SIGUSR1)
    assert status is None
    assert lines[0] == "waiting"
    assert any("wait_here" in line for line in lines)


def test_peers_without_their_kernels_sit_out_the_run(monkeypatch):
    """A prebuild stopped at its share of the time limit: a second pass that builds nothing loads
    what the stopped build linked; a peer sits out the cases whose module is still not ready
    (recorded as skipped, with the reason) and runs the others; ours runs on all."""
    monkeypatch.setattr(flashinfer_peer, "unavailable", lambda: None)
    anchor, bf16, fp8 = (
        "decode_B32_ctx4k_h32-8_d128_p16",
        "prefill_B8_len2k_h32-8_d128_p16",
        "prefill_B8_len2k_h32-8_d128_fp8_p16",
    )
    config = {
        "quick": False,
        "on_gpu": True,
        "skip_impls": [],
        "deadline": time.time() + 100,
        "patterns": [anchor, bf16, fp8],
    }
    seen = {"cached_lines": [f"ready flashinfer_prefill one_page_of_{fp8} 1 s"]}

    def stopped(cmd, timeout, stack_signal=None):
        if "--cached-only" in cmd:  # the second pass: its lines, within its own time
            seen["cached_pass"] = timeout
            return seen["cached_lines"], 0
        seen["timeout"], seen["signal"] = timeout, stack_signal
        return ["FlashInfer: 5 modules", f"ready flashinfer_xqa one_page_of_{anchor} 4 s"], None

    monkeypatch.setattr(run, "stream_process", stopped)
    result = run.prebuild_flashinfer(config)
    assert 45 < seen["timeout"] <= 50  # half of what is left
    assert seen["signal"] == signal.SIGUSR1  # its stacks first
    assert seen["cached_pass"] == run.CACHED_PASS_S
    assert sorted(result["left_out"]) == [
        f"flashinfer_decode for one page of {anchor}",
        f"flashinfer_prefill for one page of {bf16}",
    ]
    reasons = workers.left_out(config)
    assert set(reasons) == {f"flashinfer_decode:{anchor}", f"flashinfer_prefill:{bf16}"}
    assert "not built within" in reasons[f"flashinfer_prefill:{bf16}"]
    env = peers.BenchEnv(False)
    spec = {s.name: s for s in peers.IMPLS}
    case = {c.name: c for c in select_cases(all_cases(False), config["patterns"])}
    skip = case_runner._skip_reason
    assert skip(spec["flashinfer_prefill"], case[bf16], env, None, reasons) == (
        "skipped",
        reasons[f"flashinfer_prefill:{bf16}"],
    )
    assert skip(spec["flashinfer_prefill"], case[fp8], env, None, reasons) is None
    assert skip(spec["flashinfer_xqa"], case[anchor], env, None, reasons) is None
    assert skip(spec["xgo_torch"], case[bf16], env, None, reasons) is None
    # the host-cost row's FlashInfer peer is the decode peer on its decode: out with that module
    config_host = {**config, "patterns": [anchor, "host_cost"]}
    config_host.pop("left_out", None)
    seen["cached_lines"] = []
    run.prebuild_flashinfer(config_host)
    host = select_cases(all_cases(False), ["host_cost"])[0].name
    assert f"flashinfer_decode:{host}" in workers.left_out(config_host)
    config["skip_impls"] = ["sdpa"]
    assert workers.left_out(config)["sdpa"] == "left out of this run (--skip-impls)"
    # a prebuild that finishes leaves every peer in
    monkeypatch.setattr(run, "stream_process", lambda cmd, timeout, stack_signal: (["done"], 0))
    config = {k: v for k, v in config.items() if k != "left_out"}
    assert "left_out" not in run.prebuild_flashinfer(config)
    assert "left_out" not in config


def test_prebuild_loads_the_cached_modules_then_builds_the_rest(monkeypatch, capsys):
    """Cached modules load one at a time with FlashInfer's JIT disabled; the missing ones build
    in one ninja run on all the host's cores and load the same way; one that run did not make
    builds on its own; a failure is reported."""

    class MissingJITCacheError(RuntimeError):  # FlashInfer's name for it; carries the build
        def __init__(self, name):
            super().__init__(name)
            self.spec = types.SimpleNamespace(name=f"module of {name}")

    cached = {"decode_B32"}
    calls, shared_builds = [], []

    def prepare(impl):
        def make(env, case, inputs):
            def call():
                jit_disabled = os.environ.get("FLASHINFER_DISABLE_JIT") == "1"
                calls.append((impl, case.name, jit_disabled))
                if impl == "flashinfer_prefill":
                    raise ValueError("bad plan")
                if jit_disabled and not any(c in case.name for c in cached):
                    raise MissingJITCacheError(case.name)

            return types.SimpleNamespace(calls=[call])

        return make

    def build_together(specs):  # makes the first module only (the other fails to link)
        shared_builds.append([s.name for s in specs])
        cached.add(specs[0].name.removeprefix("module of "))
        return [specs[0].name]

    monkeypatch.setattr(
        flashinfer_peer,
        "PEERS",
        {impl: (kinds, prepare(impl)) for impl, (kinds, _) in flashinfer_peer.PEERS.items()},
    )
    monkeypatch.setattr(flashinfer_peer, "BenchEnv", lambda on_gpu: peers.BenchEnv(False))
    monkeypatch.setattr(flashinfer_peer, "build_inputs", lambda *a, **k: {})
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    # set, then removed: monkeypatch restores both afterwards (what the prebuild sets included)
    for name in ("FLASHINFER_DISABLE_JIT", "MAX_JOBS"):
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    monkeypatch.setattr(os, "cpu_count", lambda: 16)
    monkeypatch.setattr(flashinfer_peer, "_build_together", build_together)
    modules = [
        ("flashinfer_xqa", decode_case(32, 64, (4, 1))),
        ("flashinfer_decode", decode_case(8, 64, (4, 1))),
        ("flashinfer_xqa", decode_case(8, 64, (4, 2))),
        ("flashinfer_prefill", mixed_case()),
    ]
    result = flashinfer_peer.prebuild(modules)
    assert result["ready"] == 3
    assert result["built"] == 2
    assert result["max_jobs"] == "16"  # every core for the one ninja run of the missing ones
    assert shared_builds == [[f"module of {case.name}" for _, case in modules[1:3]]]
    assert len(result["errors"]) == 1
    assert "bad plan" in result["errors"][0]
    assert calls[:4] == [(impl, case.name, True) for impl, case in modules]  # in turn, no JIT
    # the two missing ones again without JIT: the first loads; the second builds on its own
    assert calls[4:] == [(impl, case.name, True) for impl, case in modules[1:3]] + [
        (modules[2][0], modules[2][1].name, False)
    ]
    assert "FLASHINFER_DISABLE_JIT" not in os.environ
    out = capsys.readouterr().out
    assert out.count("to build: ") == 3  # the second one twice
    assert out.count(f"{flashinfer_peer.READY} flashinfer_") == 3  # the cached one, the two built
    # build=False: what a stopped build linked is placed first; nothing builds
    monkeypatch.setattr(flashinfer_peer, "place_linked", lambda: ["module of the stopped build"])
    cached.clear()
    calls.clear()
    shared_builds.clear()
    result = flashinfer_peer.prebuild(modules[:3], build=False)
    assert (result["ready"], result["built"], result["errors"]) == (0, 0, [])
    assert shared_builds == []
    assert calls == [(impl, case.name, True) for impl, case in modules[:3]]  # JIT disabled only
    assert "1 modules a stopped build linked" in capsys.readouterr().out


def test_missing_modules_build_in_one_ninja_run_into_the_aot_directory(tmp_path, monkeypatch):
    """The shared build's modules that ninja linked (its log in the JIT directory names them) go
    where FlashInfer loads prebuilt modules; one it did not link stays out, and a failed shared
    build is reported, not raised (its modules build on their own afterwards)."""
    jit_dir, aot_dir = tmp_path / "jit", tmp_path / "aot"

    def spec(name):
        return types.SimpleNamespace(name=name, jit_library_path=jit_dir / name / f"{name}.so")

    def build_jit_specs(specs, verbose):  # links all but the last: stopped mid-link
        log = ["# ninja log v7"]
        for s in specs:
            s.jit_library_path.parent.mkdir(parents=True)
            s.jit_library_path.write_bytes(s.name.encode())
            log.append(f"1\t2\t0\t{s.jit_library_path}\t1a")
        (jit_dir / ".ninja_log").write_text("\n".join(log[:-1]) + "\n")
        seen.append([s.name for s in specs])

    seen = []
    core = types.ModuleType("flashinfer.jit.core")
    core.build_jit_specs = build_jit_specs
    for name in ("flashinfer", "flashinfer.jit"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, "flashinfer.jit.core", core)
    monkeypatch.setattr(flashinfer_peer, "_dirs", lambda: (jit_dir, aot_dir))
    monkeypatch.setenv("MAX_JOBS", "16")
    specs = [spec("batch_prefill_fa3"), spec("xqa_small"), spec("batch_prefill_sink")]
    assert flashinfer_peer._build_together(specs) == ["batch_prefill_fa3", "xqa_small"]
    assert seen == [["batch_prefill_fa3", "xqa_small", "batch_prefill_sink"]]
    for name in ("batch_prefill_fa3", "xqa_small"):
        assert (aot_dir / name / f"{name}.so").read_bytes() == name.encode()
    assert not (aot_dir / "batch_prefill_sink").exists()

    # a stopped shared build: its linked modules the AOT directory lacks are placed, once
    (jit_dir / "xqa_late").mkdir()
    (jit_dir / "xqa_late" / "xqa_late.so").write_bytes(b"late")
    with (jit_dir / ".ninja_log").open("a") as log:
        log.write(f"3\t4\t0\t{jit_dir / 'xqa_late' / 'xqa_late.so'}\t1a\n")
    assert flashinfer_peer.place_linked() == ["xqa_late"]
    assert (aot_dir / "xqa_late" / "xqa_late.so").read_bytes() == b"late"
    assert flashinfer_peer.place_linked() == []  # batch_prefill_sink: never linked

    def failing(specs, verbose):
        raise RuntimeError("Ninja build failed.")

    core.build_jit_specs = failing
    assert flashinfer_peer._build_together([spec("other")]) == []


def test_flashinfer_cache_round_trip_in_parts(tmp_path, monkeypatch):
    """Built modules pack into files below the size limit and unpack into the AOT directory; a
    module whose link ninja did not log (a build stopped mid-link) stays out."""
    jit_dir, aot_dir = tmp_path / "jit", tmp_path / "aot"
    for name in ("batch_prefill_a", "batch_prefill_b", "batch_prefill_cut"):
        (jit_dir / name).mkdir(parents=True)
        so = jit_dir / name / f"{name}.so"
        so.write_bytes(os.urandom(3000))
        (jit_dir / name / "x.cuda.o").write_bytes(b"object files stay behind")
        log = ["# ninja log v6", f"0\t900\t0\t{jit_dir / name / 'x.cuda.o'}\t1a"]
        if name != "batch_prefill_cut":
            log.append(f"900\t1000\t0\t{so.resolve()}\t2b")
        (jit_dir / name / ".ninja_log").write_text("\n".join(log) + "\n")
    monkeypatch.setattr(flashinfer_peer, "_dirs", lambda: (jit_dir, aot_dir))
    monkeypatch.setattr(flashinfer_peer, "version", lambda: "0.6.13")
    monkeypatch.setattr(flashinfer_peer, "_cuda_arch", lambda: "sm_90")
    monkeypatch.setattr(flashinfer_peer, "MAX_PART_BYTES", 2500)
    files = flashinfer_peer.export_cache(tmp_path / "out" / "cache.tar.xz")
    assert len(files) >= 2
    assert all(f.stat().st_size <= 2500 for f in files)
    assert flashinfer_peer.import_cache(tmp_path / "out" / "cache.tar.xz").startswith("2 modules")
    for name in ("batch_prefill_a", "batch_prefill_b"):
        got = (aot_dir / name / f"{name}.so").read_bytes()
        assert got == (jit_dir / name / f"{name}.so").read_bytes()
    assert not list(aot_dir.rglob("*.o"))
    assert not (aot_dir / "batch_prefill_cut").exists()
    monkeypatch.setattr(flashinfer_peer, "_cuda_arch", lambda: "sm_80")
    assert flashinfer_peer.import_cache(tmp_path / "out" / "cache.tar.xz").startswith("skipped")


# ------------------------------------------------------------------------------ verdicts
def _entry(us, **extra):
    return {"role": "peer", "status": "ok", "median_us": us, "p10_us": us, "p90_us": us, **extra}


def _gpu_results(device="NVIDIA H200", baseline_device="NVIDIA H200", ours_prefill=900.0):
    decode = {
        "name": "decode_B1_ctx64k_h32-8_d128_p16",
        "kind": "decode",
        "floor_us": 60.0,
        "params": {"head_dim": 128, "batch": 1, "context_max": 65536},
        "impls": {
            "xgo_torch": _entry(64.0, role="ours", frac_floor=60 / 64),
            "flashinfer_decode": _entry(66.0),
        },
    }
    prefill = {
        "name": "prefill_B1_len8k_h32-8_d128_p16",
        "kind": "prefill",
        "floor_us": 40.0,
        "params": {"head_dim": 128, "batch": 1, "context_max": 8192},
        "impls": {
            "xgo_torch": _entry(ours_prefill, role="ours", frac_floor=0.04),
            "torch_sdpa_contiguous": _entry(850.0),
            "flashinfer_prefill": _entry(1000.0),
        },
    }
    host = {
        "name": "host_cost_decode_B1_ctx256_h32-8_d128_p16",
        "kind": "host_cost",
        "impls": {"xgo_op": _entry(30.0, role="ours"), "xgo_wrapper": _entry(20.0, role="ours")},
    }
    results = {
        "env": {"gpu": {"name": device}, "git_commit": "abc", "date_utc": "2026-11-23T00:00:00Z"},
        "ceilings": {"read_gbps": 4000.0},
        "cases": [decode, prefill, host],
        "baseline": {
            "device": baseline_device,
            "commit": "7411aa3",
            "rows": {
                decode["name"]: {"impl": "xgo_torch", "median_us": 71.0},
                prefill["name"]: {"impl": "xgo_torch", "median_us": 800.0},
            },
        },
    }
    results["verdicts"] = report.verdicts(results)
    return results


def _verdict(results, case_prefix, target_word):
    return next(
        v["verdict"]
        for v in results["verdicts"]
        if v["case"].startswith(case_prefix)
        and target_word in v["target"]
        and (v.get("impl") != "xgo_wrapper" or case_prefix != "host")
    )


def test_verdicts_judge_each_target():
    results = _gpu_results()
    assert _verdict(results, "decode", "floor").startswith("met (0.94 ≥ 0.90")  # B=1 x 64k: 0.9
    assert _verdict(results, "decode", "FlashInfer").startswith("met (64.0 ≤ 66.0")
    assert _verdict(results, "prefill", "FlashInfer").startswith("met (900.0 ≤ 1000.0")
    # 0.9x SDPA's throughput: time ≤ 850 / 0.9 = 944.4 µs
    assert _verdict(results, "prefill", "SDPA").startswith("met (900.0 ≤ 944.4")
    host = [v for v in results["verdicts"] if v["case"].startswith("host")]
    assert [v["verdict"].split(" ")[0] for v in host] == ["MISSED", "met"]  # op 30, wrapper 20
    slower = _gpu_results(ours_prefill=1200.0)
    assert _verdict(slower, "prefill", "SDPA").startswith("MISSED by 27%")
    assert _verdict(slower, "prefill", "FlashInfer").startswith("MISSED by 20%")


def test_verdicts_take_the_slower_of_two_timings():
    """Our version is timed twice in a run; a target met by one timing only is not met."""
    results = _gpu_results()
    prefill = next(c for c in results["cases"] if c["kind"] == "prefill")
    prefill["impls"]["xgo_torch"]["median_us_repeat"] = 1100.0  # first timing 900
    decode = next(c for c in results["cases"] if c["kind"] == "decode")
    decode["impls"]["xgo_torch"]["median_us_repeat"] = 63.0  # faster again: the first counts
    results["verdicts"] = report.verdicts(results)
    verdict = _verdict(results, "prefill", "FlashInfer")
    assert verdict.startswith("MISSED by 10% (1100.0 > 1000.0 µs FlashInfer")
    assert "the slower of two timings, 900.0 and 1100.0 µs" in verdict
    assert _verdict(results, "prefill", "SDPA").startswith("MISSED by 16% (1100.0 > 944.4")
    assert _verdict(results, "decode", "FlashInfer").startswith("met (64.0 ≤ 66.0 µs FlashInfer)")
    assert _verdict(results, "decode", "floor").startswith("met (0.94 ≥ 0.90)")
    decode["impls"]["xgo_torch"]["median_us_repeat"] = 70.0  # 60 / 70 = 0.86 < 0.90
    results["verdicts"] = report.verdicts(results)
    assert _verdict(results, "decode", "floor").startswith("MISSED by 5% (0.86 < 0.90")


def test_verdicts_hold_xqa_and_the_fp8_cache_against_its_bf16_twin():
    """Decode rows are judged against XQA too; an fp8-cache row against the bf16-cache row of the
    same name without "_fp8": our slower fp8 timing against our faster bf16 one."""
    results = _gpu_results()
    decode, prefill = results["cases"][:2]
    decode["impls"]["flashinfer_xqa"] = _entry(63.0)
    fp8_decode = {
        **decode,
        "name": decode["name"].replace("_d128", "_d128_fp8"),
        "impls": {"xgo_torch": _entry(40.0, role="ours", median_us_repeat=41.0)},
    }
    fp8_prefill = {
        **prefill,
        "name": prefill["name"].replace("_d128", "_d128_fp8"),
        "impls": {"xgo_torch": _entry(980.0, role="ours")},
    }
    results["cases"] += [fp8_decode, fp8_prefill]
    results["verdicts"] = report.verdicts(results)
    assert _verdict(results, "decode_B1_ctx64k_h32-8_d128_p16", "XQA").startswith(
        "MISSED by 2% (64.0 > 63.0 µs XQA"
    )
    # bf16 64.0 µs / fp8 41.0 µs (the slower) = 1.56x
    assert _verdict(results, fp8_decode["name"], "fp8").startswith(
        "MISSED by 13% (1.56x < 1.8x: 41.0 µs fp8 against 64.0 µs bf16)"
    )
    assert _verdict(results, fp8_prefill["name"], "fp8").startswith("met (1.09x ≤ 1.1x")
    prefill["impls"]["xgo_torch"]["median_us_repeat"] = 800.0  # the faster bf16 timing counts
    results["verdicts"] = report.verdicts(results)
    assert _verdict(results, fp8_prefill["name"], "fp8").startswith("MISSED by 11% (1.23x > 1.1x")
    prefill["impls"]["xgo_torch"].update(status="failed", reason="worker died")
    results["verdicts"] = report.verdicts(results)
    assert _verdict(results, fp8_prefill["name"], "fp8") == (
        "no bf16-cache number for xgo_torch (worker died)"  # not another implementation's time
    )
    results["cases"] = [c for c in results["cases"] if c is not prefill]
    results["verdicts"] = report.verdicts(results)
    assert _verdict(results, fp8_prefill["name"], "fp8").startswith("no bf16-cache number")
    # a row without XQA (a record from before it) gets no XQA verdict
    del decode["impls"]["flashinfer_xqa"]
    results["verdicts"] = report.verdicts(results)
    assert not [
        v for v in results["verdicts"] if "XQA" in v["target"] and v["case"] == decode["name"]
    ]


def test_a_timing_faster_than_the_bytes_floor_is_invalid():
    """Calls that did not run their kernels time as fast as their launches: such a timing is
    recorded as invalid, with its reason, not as a peer's time."""
    record = {"kind": "decode", "floor_us": 488.8}
    fine = {"median_us": 480.5, "frac_floor": 488.8 / 480.5, "method": "m"}
    assert case_runner._impossible(record, fine) is None
    broken = {"median_us": 26.7, "frac_floor": 488.8 / 26.7, "method": "torch eager loop"}
    assert "18.3x faster than the bytes floor (488.8 µs)" in case_runner._impossible(record, broken)
    assert case_runner._impossible({"kind": "simple_add", "floor_us": 488.8}, broken) is None
    fast_again = {**fine, "median_us_repeat": 26.7}  # the second timing is judged too
    assert "18.3x faster" in case_runner._impossible(record, fast_again)
    results = _gpu_results()
    results["cases"][0]["impls"]["flashinfer_xqa"] = {
        "role": "peer",
        "status": "invalid",
        "reason": "too fast",
    }
    lines = report.summary(results)
    assert "Invalid: decode_B1_ctx64k_h32-8_d128_p16 flashinfer_xqa: too fast" in lines
    assert "no XQA number (too fast)" in _verdict(
        {**results, "verdicts": report.verdicts(results)}, "decode", "XQA"
    )


def test_record_comparison_needs_the_same_device():
    same = _gpu_results(ours_prefill=900.0)  # 800 -> 900 µs: 12.5 % slower
    verdict = _verdict(same, "all rows", "record")
    assert verdict.startswith("MISSED: 1 of 2 rows slower")
    assert "prefill_B1_len8k" in verdict
    other = _gpu_results(device="NVIDIA H100 80GB HBM3")
    assert _verdict(other, "all rows", "record").startswith("not comparable")
    assert report.compare_with_record(other) == {}
    text = report.table(_complete(same))
    assert "| +12.5% |" in text
    assert "MISSED" in text


def _complete(results):
    """The rest of what a run's results hold (ceilings, methods): enough for its table."""
    results["ceilings"].update(
        copy_gbps=4000.0,
        matmul_tflops=700.0,
        matmul_dtype="bfloat16",
        read_method="r",
        copy_method="c",
        matmul_method="m",
    )
    for case in results["cases"]:
        for entry in case["impls"].values():
            entry.update(method="torch CUDA-graph replay, CUDA events; 8 calls", samples=25)
    return results


def _gpu_run(tmp_path, name="run", device="NVIDIA H200", **env):
    """A made-up GPU run's folder, as `run` writes it."""
    results = _complete(_gpu_results(device=device))
    results["env"].update(
        {
            "git_commit": "0123456789abcdef",
            "torch": "2.11",
            "jax": "0.11.2",
            "mode": "full",
            "host": "a host",
            "library": {"path": "/a/local/path.so", "sha256": "f8fc"},
            **env,
        }
    )
    results["config"] = {"quick": False, "samples": 25, "log_path": "/a/local/workers.log"}
    results["baseline"]["path"] = "/a/local/results.json"
    run_dir = tmp_path / name
    run_dir.mkdir()
    (run_dir / "results.json").write_text(json.dumps(results, indent=1))
    (run_dir / "run.log").write_text("logs stay with the run")
    return run_dir, results


def test_publish_writes_the_compact_record_of_the_gpu_kind(tmp_path):
    results_dir = tmp_path / "results"
    run_dir, results = _gpu_run(tmp_path)
    assert cli.main(["publish", str(run_dir), "--results-dir", str(results_dir)]) == 0
    dest = results_dir / "nvidia-h200"
    assert sorted(p.name for p in dest.iterdir()) == sorted(record.RECORD_FILES)
    text = (dest / "results.json").read_text()
    published = json.loads(text)
    assert published == record.compact(results)
    assert record.compact(published) == published  # publishing a record again changes nothing
    # one top-level key per line, one case per line
    assert len(text.splitlines()) == len(published) + len(published["cases"]) + 3
    assert "/a/local" not in text  # a run's local paths stay out of the record
    assert "host" not in published["env"]
    assert published["verdicts"] == report.verdict_counts(report.verdicts(results))
    # the record holds what the table, the plot and the verdicts need: they come out the same
    assert report.verdicts(published) == report.verdicts(results)
    assert (dest / "table.md").read_text() == report.table(published) == report.table(results)
    assert (dest / "plot.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    readme = (dest / "README.md").read_text()
    assert readme.startswith("# Benchmark record: NVIDIA H200")
    assert "commit 0123456789abcdef" in readme
    counts = published["verdicts"]
    assert f"verdicts {counts['met']} met, {counts['missed']} missed" in readme
    assert "Against the record before it (commit 7411aa3" in readme
    index = (results_dir / "RESULTS.md").read_text()
    assert "| NVIDIA H200 | 2026-11-23 | 0123456 | 3 of 3 |" in index
    assert "[nvidia-h200/](nvidia-h200/README.md)" in index
    assert "git log" in index


def test_publish_keeps_one_record_per_gpu_kind(tmp_path):
    results_dir = tmp_path / "results"
    h200, _ = _gpu_run(tmp_path, "h200")
    h100, _ = _gpu_run(tmp_path, "h100", device="NVIDIA H100 80GB HBM3")
    newer, _ = _gpu_run(tmp_path, "newer", git_commit="fedcba9876543210")
    record.publish(h200, results_dir)
    (results_dir / "nvidia-h200" / "stale.txt").write_text("not a record file")
    record.publish(h100, results_dir)
    record.publish(newer, results_dir)  # replaces the H200 record, keeps the H100 one
    assert sorted(p.name for p in results_dir.iterdir()) == [
        "RESULTS.md",
        "nvidia-h100-80gb-hbm3",
        "nvidia-h200",
    ]
    assert sorted(p.name for p in (results_dir / "nvidia-h200").iterdir()) == sorted(
        record.RECORD_FILES
    )
    assert report.load(results_dir / "nvidia-h200" / "results.json")["env"]["git_commit"] == (
        "fedcba9876543210"
    )
    rows = [
        line
        for line in (results_dir / "RESULTS.md").read_text().splitlines()
        if line.startswith("| NVIDIA")
    ]
    assert [row.split(" | ")[2] for row in rows] == ["0123456", "fedcba9"]
    # a run compares itself with the record of its own GPU kind
    env = {"gpu": {"name": "NVIDIA H100 80GB HBM3"}}
    assert record.current_record(env, results_dir) == (
        results_dir / "nvidia-h100-80gb-hbm3" / "results.json"
    )
    assert record.current_record({"gpu": {"name": "NVIDIA B200"}}, results_dir) is None
    assert record.current_record({"gpu": None}, results_dir) is None


def test_a_gpu_kinds_checks_stay_beside_its_record(tmp_path):
    """checks.md (tests and probes, written by hand): a kind with checks alone is listed by its
    title; publishing the kind's first run keeps the file and links it from the README."""
    results_dir = tmp_path / "results"
    (results_dir / "nvidia-b200").mkdir(parents=True)
    checks = "# GPU checks: NVIDIA B200\n\ntests\n"
    (results_dir / "nvidia-b200" / record.CHECKS_FILE).write_text(checks)
    h100, _ = _gpu_run(tmp_path, "h100", device="NVIDIA H100 80GB HBM3")
    record.publish(h100, results_dir)
    index = (results_dir / "RESULTS.md").read_text()
    assert "| NVIDIA H100 80GB HBM3 |" in index
    assert "- [nvidia-b200/](nvidia-b200/checks.md): GPU checks: NVIDIA B200" in index
    assert "checks.md" not in (results_dir / "nvidia-h100-80gb-hbm3" / "README.md").read_text()
    b200, _ = _gpu_run(tmp_path, "b200", device="NVIDIA B200")
    record.publish(b200, results_dir)
    index = (results_dir / "RESULTS.md").read_text()
    assert "| NVIDIA B200 |" in index
    assert "GPU checks" not in index
    dest = results_dir / "nvidia-b200"
    assert (dest / record.CHECKS_FILE).read_text() == checks
    assert "[checks.md](checks.md)" in (dest / "README.md").read_text()
    assert sorted(p.name for p in dest.iterdir()) == sorted((*record.RECORD_FILES, "checks.md"))


def test_publish_fills_cases_skipped_at_the_time_limit_from_a_second_run(tmp_path, monkeypatch):
    """Only time-limit skips are filled, only from a run of the same commit, device and library;
    the verdicts are made again from the joined cases."""
    results_dir = tmp_path / "results"
    monkeypatch.setattr(report, "plot", lambda results, path: path.write_bytes(b"png"))
    first_dir, first = _gpu_run(tmp_path, "run")
    fill_dir, second = _gpu_run(tmp_path, "fill")
    prefill = first["cases"][1]
    first["cases"][1] = {
        **{k: prefill[k] for k in ("name", "kind", "params")},
        "impls": {},
        "skipped": "time limit of 410 s reached",
    }
    first["cases"][2]["skipped"] = "KV cache 137.4 GB exceeds the memory budget"
    assert _verdict({**first, "verdicts": report.verdicts(first)}, "prefill", "-").startswith(
        "skipped: time limit"
    )
    second["env"]["date_utc"] = "2026-11-23T01:00:00Z"
    second["cases"][0]["skipped"] = "time limit of 100 s reached"
    (first_dir / "results.json").write_text(json.dumps(first))
    (fill_dir / "results.json").write_text(json.dumps(second))
    argv = [
        "publish",
        str(first_dir),
        "--fill-skipped",
        str(fill_dir),
        "--results-dir",
        str(results_dir),
    ]
    assert cli.main(argv) == 0
    dest = results_dir / "nvidia-h200"
    joined = report.load(dest / "results.json")
    assert [c.get("filled_from", {}).get("date_utc") for c in joined["cases"]] == [
        None,
        "2026-11-23T01:00:00Z",
        None,
    ]
    assert joined["cases"][2]["skipped"].startswith("KV cache")  # not a time-limit skip: kept
    assert _verdict(
        {**joined, "verdicts": report.verdicts(joined)}, "prefill", "FlashInfer"
    ).startswith("met (900.0 ≤ 1000.0")
    readme = (dest / "README.md").read_text()
    assert "come from a second run of the same commit, library and device" in readme
    assert prefill["name"] in readme
    assert (
        "| prefill_B1_len8k_h32-8_d128_p16 | 40.0 | 900.0 ±0.0% |"
        in (dest / "table.md").read_text()
    )
    second["env"]["library"] = {"sha256": "other"}
    (fill_dir / "results.json").write_text(json.dumps(second))
    with pytest.raises(SystemExit, match="differ in library"):
        cli.main(argv)


def test_library_ab_alternates_builds_and_reads_case_times(tmp_path):
    """Each round runs the command under every build in turn; times come from case-named lines."""
    from benchmarks import library_ab

    builds = []
    for name in ("main", "variant"):
        path = tmp_path / f"lib{name}.so"
        path.write_bytes(b"")
        builds.append(f"{name}={path}")
    log = tmp_path / "order.txt"
    # A stand-in probe: logs which build it ran under and prints a probe-style table row whose
    # time depends on the build (100 for main, 90 for the variant).
    probe = (
        "import os, pathlib; lib = os.environ['XLA_GPU_OPS_LIBRARY']; "
        f"pathlib.Path({str(log)!r}).open('a').write(lib + '\\n'); "
        "t = 90.0 if 'variant' in lib else 100.0; "
        "print('progress decode_B1_ctx1k_h32-8_d128_p16 1.0'); "
        "print(f'| prefill_B1_len8k_h32-8_d64_p16 | {t} | - | 1.8e-03 |'); "
        'print(\'{"case": "prefill_B1_len8k_h32-8_d64_p16", "sm90_us": 5.0}\'); '
        "print(f'label    decode_B1_ctx1k_h32-8_d128_p16      {t / 10:8.1f}  9.9 us')"
    )
    out = tmp_path / "ab"
    status = cli.main(
        ["ab", "--rounds", "2", "--out", str(out), *builds, "--", sys.executable, "-c", probe]
    )
    assert status == 0
    order = [os.path.basename(line) for line in log.read_text().split()]
    assert order == ["libmain.so", "libvariant.so"] * 2
    data = json.loads((out / "library_ab.json").read_text())
    assert data["times_us"]["main"]["prefill_B1_len8k_h32-8_d64_p16"] == [100.0, 100.0]
    assert data["times_us"]["variant"]["prefill_B1_len8k_h32-8_d64_p16"] == [90.0, 90.0]
    # the last line naming a case wins (the table after a progress line); a name followed by
    # anything but spaces, '|' or ':' before its number (a JSON line after the table) is no time
    assert data["times_us"]["variant"]["decode_B1_ctx1k_h32-8_d128_p16"] == [9.0, 9.0]
    # nor is a shorter name cut from a longer one ("..._p1" with "6" as its time)
    assert set(data["times_us"]["variant"]) == {
        "prefill_B1_len8k_h32-8_d64_p16",
        "decode_B1_ctx1k_h32-8_d128_p16",
    }
    assert (out / "variant-2.txt").read_text().count("| prefill_B1_len8k") == 1
    assert "0.900x" in library_ab.table(data["times_us"])


def test_library_ab_rejects_bad_builds_and_reports_failed_runs(tmp_path):
    from benchmarks import library_ab

    lib = tmp_path / "lib.so"
    lib.write_bytes(b"")
    with pytest.raises(SystemExit, match="expected NAME=LIBRARY"):
        library_ab.main([str(lib), f"b={lib}", "--", "true"])
    with pytest.raises(SystemExit, match="no library file"):
        library_ab.main([f"a={lib}", f"b={tmp_path / 'missing.so'}", "--", "true"])
    with pytest.raises(SystemExit, match="at least two builds"):
        library_ab.main([f"a={lib}", "--", "true"])
    with pytest.raises(SystemExit, match="given twice"):
        library_ab.main([f"a={lib}", f"a={lib}", "--", "true"])
    assert library_ab.main(["--rounds", "1", f"a={lib}", f"b={lib}", "--", "false"]) == 1


def test_prefill_probe_checks_sampled_rows_against_float32():
    """The probe's accuracy check on the CPU op: small errors; a wrong row is caught."""
    from benchmarks import probes
    from benchmarks.cases import Case

    for case in (
        Case("prefill_B2_len300_h4-2_d64_p16", "prefill", ((300, 300),) * 2, 4, 2, 64),
        Case("mixed_h4-2_d64_p16", "mixed", ((17, 40), (1, 50), (70, 70)), 4, 2, 64),
    ):
        copies = probes._copies(case, device="cpu")
        out = probes._calls(case, copies)[0]()
        assert probes._errors(copies[0], case, {"ours": out})["ours"] < 1e-2, case.name
        wrong = out.clone()
        wrong[-1] = -wrong[-1]  # the last row: always among the sampled ones
        assert probes._errors(copies[0], case, {"ours": wrong})["ours"] > 1e-2, case.name
    in_order = probes._copies(decode_case(2, 40, (4, 2), head_dim=64), in_order=True, device="cpu")
    assert in_order[0]["block_tables"].flatten().tolist() == list(range(6))
    assert in_order[1]["block_tables"] is in_order[0]["block_tables"]  # one page table
    assert set(probes.decode_groups()) == {
        "rows",
        "layout",
        "context",
        "long",
        "dtypes",
        "mixed",
        "head_dims",
    }


def test_layouts_probe_calls_give_the_interleaved_output_on_the_cpu():
    """Structure and values, not speed: each layout the probe times holds the interleaved cache's
    values, so its output equals the interleaved call's."""
    from benchmarks import probes

    case = decode_case(2, 40, (4, 2), head_dim=64)
    copies = probes._copies(case, device="cpu")
    variants = probes.layout_variants()
    order = probes.layout_calls(case, copies, variants)
    assert len(order) == 1 + len(variants)
    assert all(len(calls) == 2 for calls in order)
    want = order[0][0]()
    for name, calls in zip(variants, order[1:], strict=True):
        assert torch.equal(calls[0](), want), name


def test_rms_norm_probe_rows_on_the_cpu(capsys):
    """Structure and accuracy, not speed: every implementation gets a row per shape, each output
    matches F.rms_norm in float32 to bf16 rounding, and the floor is the bytes moved."""
    from benchmarks import probes

    rows = probes.probe_rms_norm(shapes=((8, 64), (3, 40)))
    assert [(r["case"], r["impl"]) for r in rows] == [
        ("rms_norm_8x64_bfloat16", "ours"),
        ("rms_norm_8x64_bfloat16", "torch"),
        ("rms_norm_3x40_bfloat16", "ours"),
        ("rms_norm_3x40_bfloat16", "torch"),
    ]
    for row in rows:
        assert row["rel_l2"] < 8e-3, row
        assert row["us"] > 0
        assert row["again"] > 0
    assert rows[0]["floor_us"] / rows[2]["floor_us"] == pytest.approx((2 * 8 * 64 + 64) / 280)
    assert "rms_norm_8x64_bfloat16" in capsys.readouterr().out


def test_library_ab_reads_the_probe_rows_and_other_patterns():
    from benchmarks import library_ab, probes

    decode = probes.decode_row("decode_B32_ctx4k_h32-8_d128_p16-inorder", 184.1, 185.0, 173.1)
    prefill = (
        "| prefill_B8_len2k_h32-8_d128_p16 | 556.6 | 700.1 | 504.6 | 494 | 1.258 | 0.907 | - "
        "| 2.0e-03 / 2.1e-03 / 1.0e-03 |"
    )
    assert library_ab.parse_times(f"{decode}\n{prefill}") == {
        "decode_B32_ctx4k_h32-8_d128_p16-inorder": 184.1,
        "prefill_B8_len2k_h32-8_d128_p16": 556.6,
    }
    line = f"{'main':8s} {'B32 ctx4k D=256':34s} {364.1:8.1f} {365.0:8.1f} us"
    pattern = library_ab.compile_pattern(r"^\S+\s+(?P<case>.+?)\s+(?P<us>[0-9.]+)\s+[0-9.]+ us")
    assert library_ab.parse_times(line, pattern) == {"B32 ctx4k D=256": 364.1}
    with pytest.raises(SystemExit, match="needs the groups"):
        library_ab.compile_pattern(r"(\S+) ([0-9.]+)")
    with pytest.raises(SystemExit, match="--pattern"):
        library_ab.compile_pattern(r"(?P<case>[")


def test_sinks_probe_rows_are_the_anchor_and_gpt_oss_shapes():
    from benchmarks import probes

    rows = {(case.name, window) for case, window in probes.sinks_rows()}
    assert ("decode_B32_ctx4k_h32-8_d128_p16", None) in rows  # the anchor
    for window in (None, 128):  # gpt-oss: Hq 64 / Hkv 8, D 64, full and a 128-token window
        assert ("decode_B32_ctx4k_h64-8_d64_p16", window) in rows
        assert ("prefill_B8_len2k_h64-8_d64_p16", window) in rows
    for case, _ in probes.sinks_rows():
        assert f"h{case.num_q_heads}-{case.num_kv_heads}_d{case.head_dim}" in case.name
