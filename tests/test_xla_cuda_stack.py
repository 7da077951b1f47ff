"""torch_xla on XLA:CUDA, the pinned legacy stack (locks/xla-cuda.txt, `nox -s xla_cuda`).

Runs under both torch_xla stacks; each test says which one it needs:
- any stack: client options, the plugin's PJRT C API version and GPU custom-call extension (read
  from the .so, no GPU), the custom-call ABI in the HLO on XLA:CPU (legacy api_version 2 with the
  packed config as opaque, typed FFI api_version 4 with attributes);
- torch_xla 2.7 (the xla-cuda stack): the plugin loads in a subprocess, PJRT version negotiation
  succeeds and client creation stops at "No visible GPU devices" on a CPU-only machine;
- torch_xla >= 2.9: one clear error instead of XLA:CUDA;
- a CUDA GPU + torch_xla 2.7: the ops through the lazy path and torch.compile(backend="openxla").
Subprocesses: plugin loading and the GPU runs need a fresh XLA runtime (this process may already
run XLA:CPU) and a failed CUDA client may abort the process.
"""

from __future__ import annotations

import codecs
import importlib.util
import json
import os
import re
from pathlib import Path

import pytest
from subprocess_python import assert_lines_in_order, results_of, run_python

from xla_gpu_ops import ops

pytestmark = pytest.mark.xla_cuda

HAS_TORCH_XLA = importlib.util.find_spec("torch_xla") is not None
HAS_PLUGIN = importlib.util.find_spec("jax_plugins") is not None
needs_torch_xla = pytest.mark.skipif(not HAS_TORCH_XLA, reason="needs torch_xla")
needs_plugin = pytest.mark.skipif(
    not (HAS_TORCH_XLA and HAS_PLUGIN), reason="needs torch_xla and jax-cuda12-pjrt"
)

from xla_gpu_ops import _pjrt_plugin, _torch_xla_version, xla_cuda  # noqa: E402  (no framework)


def torch_xla_version() -> tuple[int, int]:
    return _torch_xla_version.torch_xla_version() if HAS_TORCH_XLA else (0, 0)


IS_LEGACY_STACK = (
    HAS_TORCH_XLA and torch_xla_version() < _torch_xla_version.FIRST_RELEASE_WITHOUT_CUDA
)
needs_legacy_stack = pytest.mark.skipif(
    not (IS_LEGACY_STACK and HAS_PLUGIN),
    reason="needs torch_xla 2.7 + jax-cuda12-pjrt 0.5.3 (locks/xla-cuda.txt, nox -s xla_cuda)",
)


def cuda_visible() -> bool:
    import torch

    return torch.cuda.is_available()


TESTS_DIR = Path(__file__).resolve().parent


# ---------------------------------------------------------------------------- any stack
def test_client_options_from_env(monkeypatch):
    for name in (
        "RANK",
        "WORLD_SIZE",
        "LOCAL_RANK",
        "LOCAL_WORLD_SIZE",
        "PJRT_LOCAL_PROCESS_RANK",
        "PJRT_LOCAL_PROCESS_COUNT",
    ):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(_pjrt_plugin.ALLOCATOR_ENV, "cuda_async")
    monkeypatch.setenv(_pjrt_plugin.MEMORY_FRACTION_ENV, "0.5")
    monkeypatch.setenv(_pjrt_plugin.PREALLOCATE_ENV, "false")
    monkeypatch.setenv(_pjrt_plugin.VISIBLE_DEVICES_ENV, "1,0")
    assert _pjrt_plugin.client_options_from_env() == {
        "platform_name": "gpu",
        "allocator": "cuda_async",
        "memory_fraction": 0.5,
        "preallocate": False,
        "visible_devices": [1, 0],
        "node_id": 0,
        "num_nodes": 1,
    }
    for name in (
        _pjrt_plugin.ALLOCATOR_ENV,
        _pjrt_plugin.MEMORY_FRACTION_ENV,
        _pjrt_plugin.PREALLOCATE_ENV,
        _pjrt_plugin.VISIBLE_DEVICES_ENV,
    ):
        monkeypatch.delenv(name)
    # torchrun, 2 local processes: one GPU each, node id = global rank
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "4")
    assert _pjrt_plugin.client_options_from_env() == {
        "platform_name": "gpu",
        "visible_devices": [1],
        "node_id": 3,
        "num_nodes": 4,
    }


@pytest.mark.parametrize(
    ("name", "value"),
    [
        (_pjrt_plugin.ALLOCATOR_ENV, "tcmalloc"),
        (_pjrt_plugin.MEMORY_FRACTION_ENV, "1.5"),
        (_pjrt_plugin.MEMORY_FRACTION_ENV, "half"),
        (_pjrt_plugin.PREALLOCATE_ENV, "maybe"),
        (_pjrt_plugin.VISIBLE_DEVICES_ENV, "0,0"),
        (_pjrt_plugin.VISIBLE_DEVICES_ENV, "gpu0"),
    ],
)
def test_bad_client_option_names_the_variable(monkeypatch, name, value):
    monkeypatch.setenv(name, value)
    with pytest.raises(ValueError, match=f"^{name}="):
        _pjrt_plugin.client_options_from_env()


@needs_plugin
def test_plugin_speaks_the_pjrt_api_of_the_installed_torch_xla():
    """Read from the plugin .so itself (GetPjrtApi), no GPU: 0.67 for 2.7, 0.75 for 2.9."""
    version = torch_xla_version()
    assert xla_cuda.plugin_pjrt_api_version() == _pjrt_plugin.FRAMEWORK_PJRT_API[version]
    _pjrt_plugin.check_plugin_matches_torch_xla()
    # The extension torch_xla 2.7's _xla_register_custom_call_target registers through.
    assert _pjrt_plugin.has_gpu_custom_call_extension(), _pjrt_plugin.plugin_extension_types()


@needs_plugin
def test_mismatched_plugin_is_refused(monkeypatch):
    installed = torch_xla_version()
    other = next(v for v in _pjrt_plugin.FRAMEWORK_PJRT_API if v != installed)
    monkeypatch.setattr(_torch_xla_version, "torch_xla_version", lambda: other)
    with pytest.raises(
        RuntimeError, match=re.escape(f"jax-cuda12-pjrt=={_pjrt_plugin.MATCHING_PLUGIN[other]}")
    ):
        _pjrt_plugin.check_plugin_matches_torch_xla()


@needs_torch_xla
def test_torch_xla_without_cuda_gets_one_clear_error(monkeypatch):
    """torch_xla >= 2.9: register_plugin/register_legacy_targets refuse before touching the runtime."""
    if IS_LEGACY_STACK:  # on 2.7 pretend to be 2.9 (only the version decides)
        monkeypatch.setattr(_torch_xla_version, "torch_xla_version", lambda: (2, 9))
    major, minor = _torch_xla_version.torch_xla_version()
    for entry_point in (xla_cuda.register_plugin, xla_cuda.register_legacy_targets):
        with pytest.raises(xla_cuda.XlaCudaUnsupportedError) as raised:
            entry_point()
        message = str(raised.value)
        assert f"torch_xla {major}.{minor} has no XLA:CUDA" in message
        assert "locks/xla-cuda.txt" in message
        assert "nox -s xla_cuda" in message
        assert "xla_gpu_ops.torch_xla_plugin.register_plugin()" in message  # the 2.9 route


# ---------------------------------------------------------------------------- HLO on XLA:CPU
def hlo_custom_call_line(tensor) -> str:
    import torch_xla

    hlo = torch_xla._XLAC._get_xla_tensors_hlo([tensor])
    lines = [line for line in hlo.splitlines() if " custom-call(" in line]
    assert len(lines) == 1, hlo
    return lines[0]


def hlo_opaque(line: str) -> bytes:
    """The backend_config of a legacy custom call, C-unescaped as XLA printed it."""
    match = re.search(r'backend_config="((?:[^"\\]|\\.)*)"', line)
    assert match, line
    return codecs.escape_decode(match.group(1).encode())[0]


def built_library() -> None:
    from xla_gpu_ops import _library

    if not _library.is_built():
        pytest.skip(f"needs the built library ({_library.library_path()}): nox -s build")


ABIS = [None, "legacy", "ffi"]  # None: the default of the installed torch_xla


@needs_torch_xla
@pytest.mark.parametrize("abi", ABIS, ids=["default", "legacy", "ffi"])
def test_simple_add_custom_call_abi_in_hlo(monkeypatch, abi):
    import torch
    import torch_xla

    import xla_gpu_ops
    from xla_gpu_ops import _library, ops
    from xla_gpu_ops import torch_xla as xla_binding

    built_library()
    monkeypatch.setenv(xla_binding.IMPL_ENV, "custom_call")  # on XLA:CPU the default is composite
    if abi is None:
        monkeypatch.delenv(xla_binding.ABI_ENV, raising=False)
        abi = "legacy" if IS_LEGACY_STACK else "ffi"
    else:
        monkeypatch.setenv(xla_binding.ABI_ENV, abi)
    assert xla_binding.custom_call_abi() == abi
    device = torch_xla.device()
    a = torch.randn(5, 7, dtype=torch.bfloat16)
    b = torch.randn(5, 7, dtype=torch.bfloat16)
    line = hlo_custom_call_line(xla_gpu_ops.simple_add(a.to(device), b.to(device)))
    if abi == "legacy":
        assert 'custom_call_target="xla_gpu_simple_add_legacy"' in line
        assert "api_version=API_VERSION_STATUS_RETURNING" in line
        expected = _library.make_call(ops.SIMPLE_ADD, [(5, 7), (5, 7)], ["bfloat16"] * 2, ())
        assert hlo_opaque(line) == bytes(expected)
    else:
        assert 'custom_call_target="xla_gpu_simple_add"' in line
        assert "api_version=API_VERSION_TYPED_FFI" in line


@needs_torch_xla
@pytest.mark.parametrize("abi", ABIS, ids=["default", "legacy", "ffi"])
def test_paged_attention_custom_call_abi_in_hlo(monkeypatch, abi):
    import torch
    import torch_xla
    from paged_inputs import MIXED, make_paged_inputs

    import xla_gpu_ops
    from xla_gpu_ops import _library, ops
    from xla_gpu_ops import torch_xla as xla_binding

    built_library()
    monkeypatch.setenv(xla_binding.IMPL_ENV, "custom_call")
    if abi is None:
        monkeypatch.delenv(xla_binding.ABI_ENV, raising=False)
        abi = "legacy" if IS_LEGACY_STACK else "ffi"
    else:
        monkeypatch.setenv(xla_binding.ABI_ENV, abi)
    inputs = make_paged_inputs(MIXED, 8, 2, 128, 16, torch.float16, seed=7, pad_tokens=3)
    device = torch_xla.device()
    out = xla_gpu_ops.paged_attention(
        **{name: t.to(device) for name, t in inputs.items()},
        scale=0.0625,
        sliding_window=40,
        soft_cap=30.0,
    )
    line = hlo_custom_call_line(out)
    num_tokens = inputs["query"].shape[0]
    num_pages = inputs["kv_cache"].shape[0]
    max_num_seqs, pages_per_seq = inputs["block_tables"].shape
    shapes = [
        (num_tokens, 8, 128),
        (num_pages, 16, 4, 128),
        (max_num_seqs,),
        (max_num_seqs, pages_per_seq),
        (max_num_seqs + 1,),
        (1,),
        (0,),
        (0,),
        (0,),
        (0,),
    ]
    # sinks, scales, value_cache: none, [0]
    dtypes = ["float16", "float16"] + ["int32"] * 4 + ["float32"] * 4
    config = _library.make_call(
        ops.PAGED_ATTENTION, shapes, dtypes, (0.0625, 40, 30.0, 1.0, 1.0, 0)
    )
    (workspace,) = _library.describe(ops.PAGED_ATTENTION, config)[-1].shape
    # outputs: (out, lse, float32 workspace sized from static shapes)
    assert (
        f"(f16[{num_tokens},8,128]{{2,1,0}}, f32[{num_tokens},8]{{1,0}}, f32[{workspace}]{{0}}) "
        "custom-call(" in line
    ), line
    if abi == "legacy":
        assert 'custom_call_target="xla_gpu_paged_attention_legacy"' in line
        assert "api_version=API_VERSION_STATUS_RETURNING" in line
        assert hlo_opaque(line) == bytes(config)
    else:
        assert 'custom_call_target="xla_gpu_paged_attention"' in line
        assert "api_version=API_VERSION_TYPED_FFI" in line
        assert (
            "backend_config={scale = 0.0625 : f32, sliding_window = 40 : i64, soft_cap = 30.0 : f32, "
            "k_scale = 1.0 : f32, v_scale = 1.0 : f32, kv_layout = 0 : i64}" in line
        ), line


# ---------------------------------------------------------------------------- torch_xla 2.7, no GPU
@needs_legacy_stack
def test_plugin_negotiates_pjrt_version_then_stops_at_no_gpu(artifacts_dir):
    """Wiring, paths, versions and client options are right: only the missing GPU stops it.

    Every client option is set, so an option name or type the plugin rejects would fail first
    ("Unexpected option name passed to PJRT_Client_Create" / a type error).
    """
    if cuda_visible():
        pytest.skip("a CUDA GPU is visible: the GPU tests below use the plugin for real")
    code = """
        from xla_gpu_ops import xla_cuda
        assert xla_cuda.show_xla_info_logs()
        plugin = xla_cuda.register_plugin()
        print("OPTIONS", sorted(plugin.client_create_options()), flush=True)
        try:
            xla_cuda.register_legacy_targets()  # creates the CUDA client first
        except RuntimeError as error:
            print("RAISED", str(error).splitlines()[0], flush=True)
        else:
            print("REGISTERED without a GPU?", flush=True)
    """
    env = {
        _pjrt_plugin.ALLOCATOR_ENV: "cuda_async",
        _pjrt_plugin.MEMORY_FRACTION_ENV: "0.5",
        _pjrt_plugin.PREALLOCATE_ENV: "0",
        _pjrt_plugin.VISIBLE_DEVICES_ENV: "0",
        "PJRT_DEVICE": "CPU",  # what the nox session sets; register_plugin must switch to CUDA
    }
    log = run_python(code, env, artifacts_dir / "plugin_load.log")
    plugin_path = re.escape(str(_pjrt_plugin.plugin_library_path()))
    assert_lines_in_order(
        log,
        [
            r"^OPTIONS \['allocator', 'memory_fraction', 'node_id', 'num_nodes', 'platform_name', "
            r"'preallocate', 'visible_devices'\]$",
            rf"pjrt_api\.cc:\d+\] GetPjrtApi was found for cuda at {plugin_path}$",
            r"pjrt_api\.cc:\d+\] PJRT_Api is set for device type cuda$",
            r"pjrt_api\.cc:\d+\] The PJRT plugin has PJRT API version 0\.67\. "
            r"The framework PJRT API version is 0\.67\.$",
            r"^RAISED Bad StatusOr access: FAILED_PRECONDITION: No visible GPU devices\.$",
        ],
    )
    assert "Unexpected option name" not in log
    assert "Mismatched PJRT plugin" not in log


@needs_legacy_stack
def test_client_options_reach_the_plugin(artifacts_dir):
    """An allocator the plugin does not know comes back as the plugin's own error."""
    if cuda_visible():
        pytest.skip("a CUDA GPU is visible: the GPU tests below use the plugin for real")
    code = """
        from xla_gpu_ops import xla_cuda
        plugin = xla_cuda.register_plugin()
        # bypass the Python-side check to see the plugin's answer
        type(plugin).client_create_options = lambda self: {"platform_name": "gpu", "allocator": "bogus"}
        import torch_xla
        try:
            torch_xla.device()
        except RuntimeError as error:
            print("RAISED", str(error).splitlines()[0], flush=True)
    """
    log = run_python(code, {}, artifacts_dir / "bogus_allocator.log")
    assert_lines_in_order(
        log,
        [
            r"^RAISED .*Allocator bogus not supported for PJRT GPU plugin\. Supported allocator "
            r"options are: 'default', 'platform', 'bfc' and 'cuda_async'\.$"
        ],
    )


@needs_legacy_stack
def test_register_legacy_targets_needs_the_cuda_plugin(monkeypatch):
    """On the XLA:CPU runtime, torch_xla 2.7 would register into its own XLA: refuse instead."""
    monkeypatch.setenv("PJRT_DEVICE", "CPU")
    with pytest.raises(
        RuntimeError, match=r"runtime is on 'CPU', not the CUDA plugin.*register_plugin"
    ):
        xla_cuda.register_legacy_targets()


# ---------------------------------------------------------------------------- a GPU + torch_xla 2.7
GPU_SCRIPT = """
    import json, sys
    sys.path.insert(0, {tests_dir!r})
    import torch
    from xla_gpu_ops import xla_cuda
    xla_cuda.register_plugin()
    import torch_xla, torch_xla.core.xla_model as xm
    import xla_gpu_ops
    from xla_gpu_ops import reference
    from paged_inputs import MIXED, default_scale, make_paged_inputs, rel_l2

    device = torch_xla.device()
    results = {{"hardware": xm.xla_device_hw(device), "targets": xla_cuda.register_legacy_targets()}}

    a, b = torch.randn(1000, 3), torch.randn(1000, 3)
    out = xla_gpu_ops.simple_add(a.to(device), b.to(device))
    results["simple_add_hlo"] = [l for l in torch_xla._XLAC._get_xla_tensors_hlo([out]).splitlines()
                                 if "custom-call(" in l]
    xm.mark_step()
    results["simple_add_lazy_max_err"] = (out.cpu() - (a + b)).abs().max().item()

    head_dim, scale = 128, default_scale(128)
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        inputs = make_paged_inputs(MIXED, 8, 2, head_dim, 16, dtype, seed={seed}, pad_tokens=3)
        expected = reference.paged_attention(**inputs, scale=scale, sliding_window=64, soft_cap=30.0,
                                             compute_dtype=torch.float64)
        on_xla = {{name: t.to(device) for name, t in inputs.items()}}
        lazy = xla_gpu_ops.paged_attention(**on_xla, scale=scale, sliding_window=64, soft_cap=30.0)
        hlo = torch_xla._XLAC._get_xla_tensors_hlo([lazy])
        results[f"paged_attention_{{dtype}}_legacy_call"] = 'custom_call_target="xla_gpu_paged_attention_legacy"' in hlo
        xm.mark_step()
        results[f"paged_attention_{{dtype}}_lazy_rel_l2"] = rel_l2(lazy, expected)

        def attend(q, kv, lens, tables, starts, n):
            return torch.ops.xla_gpu.paged_attention(q, kv, lens, tables, starts, n, scale, 64, 30.0)[0]

        compiled = torch.compile(attend, backend="openxla", fullgraph=True)
        dynamo = compiled(*(on_xla[name] for name in ("query", "kv_cache", "context_lens",
                                                      "block_tables", "query_start_loc", "num_seqs")))
        results[f"paged_attention_{{dtype}}_dynamo_rel_l2"] = rel_l2(dynamo, expected)
    print("RESULTS " + json.dumps(results, default=str), flush=True)
"""
GPU_TOLERANCE = {"torch.float32": 1e-4, "torch.float16": 2e-3, "torch.bfloat16": 2e-2}


@pytest.mark.gpu
@needs_legacy_stack
def test_ops_on_xla_cuda_lazy_and_openxla_dynamo(artifacts_dir):
    """simple_add and paged_attention on a real GPU through torch_xla 2.7 + the CUDA PJRT plugin."""
    if not cuda_visible():
        pytest.skip("needs a CUDA GPU")
    seed = int.from_bytes(os.urandom(4), "little")
    code = GPU_SCRIPT.format(tests_dir=str(TESTS_DIR), seed=seed)
    log = run_python(code, {"PJRT_DEVICE": "CPU"}, artifacts_dir / "xla_cuda_gpu.log")
    results = results_of(log)
    (artifacts_dir / "results.json").write_text(json.dumps(results, indent=2))
    assert results["hardware"] == "CUDA", results
    assert results["targets"] == [op.legacy_target for op in ops.OPS]
    assert any(
        'custom_call_target="xla_gpu_simple_add_legacy"' in hlo for hlo in results["simple_add_hlo"]
    )
    assert results["simple_add_lazy_max_err"] == 0.0, results
    for dtype, tolerance in GPU_TOLERANCE.items():
        assert results[f"paged_attention_{dtype}_legacy_call"], (dtype, results)
        for path in ("lazy", "dynamo"):
            error = results[f"paged_attention_{dtype}_{path}_rel_l2"]
            assert error < tolerance, f"{dtype} {path}: rel L2 {error} (seed {seed})"
