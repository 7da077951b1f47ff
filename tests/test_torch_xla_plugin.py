"""torch_xla >= 2.9 on XLA:GPU through a generic plugin device (xla_gpu_ops.torch_xla_plugin).

Without a GPU:
- every op's handlers are registered through the plugin's GPU custom-call extension (any stack's
  plugin), and a refused one comes back with the plugin's own message;
- the wrapped PJRT_Client_Create strips our platform-name option and remembers the client; the
  wrapped PJRT_Client_PlatformName answers "gpu" for that client and the plugin's answer for
  every other one (checked with stand-in plugin functions, called through the plugin's table);
- torch_xla 2.9: register_plugin() registers the targets, then torch_xla loads the plugin as
  device type GPU, negotiates PJRT C API 0.75 = 0.75, creates its client through our wrapper
  with every client option (ours stripped, or the plugin would refuse it) and stops at
  "No visible GPU devices".
A GPU host with torch_xla 2.9 + jax-cuda12-pjrt 0.7.1: the ops through the lazy path (mark_step,
wait_device_ops) and torch.compile(backend="openxla").
Subprocesses: each needs a fresh XLA runtime and plugin table.
"""

from __future__ import annotations

import ctypes
import importlib.util
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from subprocess_python import assert_lines_in_order, results_of, run_python

from xla_gpu_ops import _library, _pjrt_plugin, _torch_xla_version, torch_xla_plugin
from xla_gpu_ops.ops import OPS

pytestmark = pytest.mark.torch_xla

HAS_TORCH_XLA = importlib.util.find_spec("torch_xla") is not None
HAS_PLUGIN = importlib.util.find_spec("jax_plugins") is not None
TORCH_XLA_VERSION = _torch_xla_version.torch_xla_version() if HAS_TORCH_XLA else (0, 0)
TESTS_DIR = Path(__file__).resolve().parent

needs_plugin = pytest.mark.skipif(
    not (HAS_TORCH_XLA and HAS_PLUGIN), reason="needs torch_xla and jax-cuda12-pjrt"
)
needs_2_9 = pytest.mark.skipif(
    not (HAS_PLUGIN and TORCH_XLA_VERSION >= _torch_xla_version.FIRST_RELEASE_WITHOUT_CUDA),
    reason="needs torch_xla >= 2.9 + jax-cuda12-pjrt 0.7.1 (locks/default.txt)",
)


def built_library() -> None:
    if not _library.is_built():
        pytest.skip(f"needs the built library ({_library.library_path()}): nox -s build")


def cuda_visible() -> bool:
    import torch

    return torch.cuda.is_available()


# ---------------------------------------------------------------------------- no GPU, any stack
def test_handler_entries_map_each_op_to_its_handlers():
    built_library()
    entries = torch_xla_plugin.handler_entries()
    expected = []
    for op in OPS:
        info = _library.load().op(op).info
        expected.append((op.ffi_target, info.cuda_ffi_handler, 1))
        expected.append((op.legacy_target, info.cuda_legacy_handler, 0))
    assert [tuple(entry) for entry in entries] == expected
    assert len({entry.address for entry in entries}) == len(entries)


@needs_plugin
@pytest.mark.skipif(shutil.which("nm") is None, reason="needs nm (binutils)")
def test_table_slots_hold_the_functions_this_module_calls_and_wraps():
    """The slot numbers are the plugin's own: its symbol table names the function in each slot."""
    path = _pjrt_plugin.plugin_api().path
    listing = subprocess.run(
        ["nm", "-C", "--defined-only", str(path)], capture_output=True, text=True, check=True
    ).stdout
    symbols = {}
    for line in listing.splitlines():
        address, _, name = line.split(" ", 2)
        symbols.setdefault(name, int(address, 16))
    base = ctypes.cast(ctypes.CDLL(str(path)).GetPjrtApi, ctypes.c_void_p).value
    base -= symbols["GetPjrtApi"]
    api = _pjrt_plugin.plugin_api()
    expected = {
        "PJRT_Error_Destroy": "pjrt::PJRT_Error_Destroy(PJRT_Error_Destroy_Args*)",
        "PJRT_Error_Message": "pjrt::PJRT_Error_Message(PJRT_Error_Message_Args*)",
        "PJRT_Client_Create": "pjrt::gpu_plugin::PJRT_Client_Create(PJRT_Client_Create_Args*)",
        "PJRT_Client_PlatformName": (
            "pjrt::PJRT_Client_PlatformName(PJRT_Client_PlatformName_Args*)"
        ),
    }
    for function, symbol in expected.items():
        assert api.function(function) - base == symbols[symbol], function
    extension = api.gpu_custom_call_extension()
    custom_call = ctypes.cast(extension.custom_call, ctypes.c_void_p).value
    register = (
        "pjrt::gpu_plugin::PJRT_Gpu_Register_Custom_Call(PJRT_Gpu_Register_Custom_Call_Args*)"
    )
    assert custom_call - base == symbols[register]


REGISTRATION_SCRIPT = """
    import json
    from xla_gpu_ops import _library, torch_xla_plugin as plugin
    from xla_gpu_ops.ops import OPS

    results = {"targets": plugin.register_custom_call_targets()}
    results["again"] = plugin.register_custom_call_targets()  # same handlers: nothing to do

    def refused(entries):
        try:
            plugin.register_custom_call_targets(entries)
        except (RuntimeError, ValueError) as error:
            return f"{type(error).__name__}: {error}"
        return None

    address = _library.load().op(OPS[0]).info.cuda_ffi_handler
    other = _library.load().op(OPS[0]).info.cuda_legacy_handler
    results["bad_api_version"] = refused([plugin.CustomCallTarget("xgo_bad_version", address, 7)])
    results["other_handler"] = refused([plugin.CustomCallTarget(OPS[0].ffi_target, other, 1)])
    results["null_handler"] = refused([plugin.CustomCallTarget("xgo_null", 0, 1)])
    print("RESULTS " + json.dumps(results), flush=True)
"""


@needs_plugin
def test_targets_register_through_the_plugin_extension(artifacts_dir):
    """The registration torch_xla 2.9 cannot do, made on the plugin's own extension (no GPU).

    An unknown extension api_version is refused with the plugin's message, so the successes are
    the extension's answers and not calls that never happened.
    """
    built_library()
    results = results_of(run_python(REGISTRATION_SCRIPT, {}, artifacts_dir / "register.log"))
    expected = [name for op in OPS for name in (op.ffi_target, op.legacy_target)]
    assert results["targets"] == expected
    assert results["again"] == expected
    assert results["bad_api_version"].startswith(
        "RuntimeError: xla_cuda_plugin.so refused custom-call target xgo_bad_version"
    ), results
    assert "API version 7 not supported for PJRT GPU plugin" in results["bad_api_version"]
    assert results["other_handler"].startswith(
        f"RuntimeError: {OPS[0].ffi_target}: already registered"
    ), results
    assert results["null_handler"] == (
        "ValueError: register_custom_call_targets: xgo_null: null handler address"
    )


WRAPPER_SCRIPT = """
    import ctypes, json
    from xla_gpu_ops import _pjrt_plugin, torch_xla_plugin as plugin

    api = _pjrt_plugin.plugin_api()
    originals = {name: api.function(name) for name in ("PJRT_Client_Create", "PJRT_Client_PlatformName")}
    rename = plugin.install_platform_rename()
    results = {"table_points_at_wrappers": [
        api.function("PJRT_Client_Create") == ctypes.cast(rename.create, ctypes.c_void_p).value,
        api.function("PJRT_Client_PlatformName")
        == ctypes.cast(rename.platform_name, ctypes.c_void_p).value,
    ]}
    results["originals_kept"] = [
        ctypes.cast(rename.original_create, ctypes.c_void_p).value == originals["PJRT_Client_Create"],
        ctypes.cast(rename.original_platform_name, ctypes.c_void_p).value
        == originals["PJRT_Client_PlatformName"],
    ]

    # Stand-ins for the plugin's own functions (the real ones need a GPU client).
    seen = []
    def fake_create(address):
        args = plugin._ClientCreateArgs.from_address(address)
        names = []
        for i in range(args.num_options):
            option = plugin._NamedValue.from_address(
                args.create_options + i * ctypes.sizeof(plugin._NamedValue))
            names.append(ctypes.string_at(option.name, option.name_size).decode())
        seen.append(names)
        args.client = 0x1000 + len(seen)  # a fake PJRT_Client*
        return None
    cuda = ctypes.create_string_buffer(b"cuda", 4)
    def fake_platform_name(address):
        args = plugin._PlatformNameArgs.from_address(address)
        args.platform_name, args.platform_name_size = ctypes.addressof(cuda), 4
        return None
    rename.original_create = _pjrt_plugin.PjrtFunction(fake_create)
    rename.original_platform_name = _pjrt_plugin.PjrtFunction(fake_platform_name)

    keep = []
    def option(name, value):
        name, value = name.encode(), value.encode()
        keep.extend([name, value])
        return plugin._NamedValue(ctypes.sizeof(plugin._NamedValue), None,
                                  ctypes.cast(ctypes.c_char_p(name), ctypes.c_void_p), len(name),
                                  0, ctypes.cast(ctypes.c_char_p(value), ctypes.c_void_p), len(value))

    def create(options):
        array = (plugin._NamedValue * len(options))(*options)
        args = plugin._ClientCreateArgs(ctypes.sizeof(plugin._ClientCreateArgs), None,
                                        ctypes.addressof(array), len(options))
        error = api.call("PJRT_Client_Create", args)  # through the plugin's table
        return error, args.client, args.create_options == ctypes.addressof(array), args.num_options

    def platform_name(client):
        args = plugin._PlatformNameArgs(ctypes.sizeof(plugin._PlatformNameArgs), None, client)
        error = api.call("PJRT_Client_PlatformName", args)
        return error, ctypes.string_at(args.platform_name, args.platform_name_size).decode()

    ours = create([option("platform_name", "gpu"), option(plugin.PLATFORM_NAME_OPTION, "gpu"),
                   option("allocator", "bfc")])
    theirs = create([option("platform_name", "cuda"), option("allocator", "bfc")])
    results["create"] = {"ours": ours, "theirs": theirs, "seen": seen}
    results["platform_name"] = {"ours": platform_name(ours[1]), "theirs": platform_name(theirs[1])}
    results["create_calls"] = plugin.client_create_calls()
    print("RESULTS " + json.dumps(results), flush=True)
"""


@needs_plugin
def test_platform_name_is_ours_for_our_client_only(artifacts_dir):
    """The wrapped table entries, called through the plugin's own PJRT_Api like torch_xla does."""
    results = results_of(run_python(WRAPPER_SCRIPT, {}, artifacts_dir / "wrapper.log"))
    assert results["table_points_at_wrappers"] == [True, True], results
    assert results["originals_kept"] == [True, True], results
    ours, theirs = results["create"]["ours"], results["create"]["theirs"]
    # the plugin sees our options without the platform-name one; the caller's args are restored
    assert results["create"]["seen"] == [
        ["platform_name", "allocator"],
        ["platform_name", "allocator"],
    ]
    assert ours == [None, 0x1001, True, 3], ours
    assert theirs == [None, 0x1002, True, 2], theirs
    assert results["platform_name"] == {"ours": [None, "gpu"], "theirs": [None, "cuda"]}
    assert results["create_calls"] == [
        ["platform_name", torch_xla_plugin.PLATFORM_NAME_OPTION, "allocator"],
        ["platform_name", "allocator"],
    ]


# ---------------------------------------------------------------------------- torch_xla 2.9, no GPU
def test_register_plugin_refuses_torch_xla_with_cuda(monkeypatch):
    monkeypatch.setattr(_torch_xla_version, "torch_xla_version", lambda: (2, 7))
    with pytest.raises(torch_xla_plugin.TorchXlaTooOldError, match=r"xla_cuda\.register_plugin"):
        torch_xla_plugin.register_plugin()


@needs_2_9
@pytest.mark.parametrize(
    ("name", "value"),
    [(_pjrt_plugin.ALLOCATOR_ENV, "tcmalloc"), (_pjrt_plugin.MEMORY_FRACTION_ENV, "2")],
)
def test_bad_client_option_fails_before_torch_xla_starts(monkeypatch, name, value):
    monkeypatch.setenv(name, value)
    with pytest.raises(ValueError, match=f"^{name}="):
        torch_xla_plugin.register_plugin()


def test_client_create_options_add_the_platform_name(monkeypatch):
    for name in (
        _pjrt_plugin.ALLOCATOR_ENV,
        _pjrt_plugin.MEMORY_FRACTION_ENV,
        _pjrt_plugin.PREALLOCATE_ENV,
        _pjrt_plugin.VISIBLE_DEVICES_ENV,
        "RANK",
        "WORLD_SIZE",
        "LOCAL_RANK",
        "LOCAL_WORLD_SIZE",
        "PJRT_LOCAL_PROCESS_RANK",
        "PJRT_LOCAL_PROCESS_COUNT",
    ):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(_pjrt_plugin.PREALLOCATE_ENV, "0")
    assert torch_xla_plugin.client_create_options() == {
        "platform_name": "gpu",
        "preallocate": False,
        "node_id": 0,
        "num_nodes": 1,
        torch_xla_plugin.PLATFORM_NAME_OPTION: "gpu",
    }


@needs_2_9
def test_plugin_device_registers_targets_negotiates_then_stops_at_no_gpu(artifacts_dir):
    """Everything up to the GPU: targets, plugin loading under "GPU", PJRT version, client options
    through our wrapper (an option the plugin does not know would fail first: "Unexpected option
    name"), then "No visible GPU devices"."""
    built_library()
    if cuda_visible():
        pytest.skip("a CUDA GPU is visible: the GPU test below uses the plugin for real")
    code = """
        import json
        from xla_gpu_ops import torch_xla_plugin as plugin
        plugin.register_plugin()
        import torch_xla, torch_xla.runtime as xr
        print("TARGETS", json.dumps(plugin.register_custom_call_targets()), flush=True)
        print("DEVICE_TYPE", xr.device_type(), flush=True)
        try:
            torch_xla.device()  # creates the client
        except RuntimeError as error:
            print("RAISED", str(error).splitlines()[0], flush=True)
        else:
            print("CLIENT without a GPU?", flush=True)
        print("CREATE_CALLS", json.dumps(plugin.client_create_calls()), flush=True)
    """
    env = {
        "TF_CPP_MIN_LOG_LEVEL": "0",  # the PJRT version negotiation is an INFO line
        _pjrt_plugin.ALLOCATOR_ENV: "cuda_async",
        _pjrt_plugin.MEMORY_FRACTION_ENV: "0.5",
        _pjrt_plugin.PREALLOCATE_ENV: "0",
        _pjrt_plugin.VISIBLE_DEVICES_ENV: "0",
        "PJRT_DEVICE": "CPU",  # register_plugin must switch to GPU
    }
    log = run_python(code, env, artifacts_dir / "plugin_load.log")
    plugin_path = re.escape(str(_pjrt_plugin.plugin_library_path()))
    targets = json.dumps([name for op in OPS for name in (op.ffi_target, op.legacy_target)])
    assert_lines_in_order(
        log,
        [
            rf"^TARGETS {re.escape(targets)}$",
            r"^DEVICE_TYPE GPU$",
            rf"pjrt_api\.cc:\d+\] GetPjrtApi was found for gpu at {plugin_path}$",
            r"pjrt_api\.cc:\d+\] PJRT_Api is set for device type gpu$",
            r"pjrt_api\.cc:\d+\] The PJRT plugin has PJRT API version 0\.75\. "
            r"The framework PJRT API version is 0\.75\.$",
            r"^RAISED No visible GPU devices\.$",
        ],
    )
    assert "Unexpected option name" not in log
    (line,) = [line for line in log.splitlines() if line.startswith("CREATE_CALLS ")]
    (options,) = json.loads(line.removeprefix("CREATE_CALLS "))  # torch_xla's one client
    assert sorted(options) == sorted(
        [
            "platform_name",
            "allocator",
            "memory_fraction",
            "preallocate",
            "visible_devices",
            "node_id",
            "num_nodes",
            torch_xla_plugin.PLATFORM_NAME_OPTION,
        ]
    )


# ---------------------------------------------------------------------------- a GPU + torch_xla 2.9
GPU_SCRIPT = """
    import json, os, sys
    sys.path.insert(0, {tests_dir!r})
    import torch
    from xla_gpu_ops import torch_xla_plugin as plugin
    plugin.register_plugin()
    import torch_xla, torch_xla.core.xla_model as xm, torch_xla.runtime as xr
    import xla_gpu_ops
    from xla_gpu_ops import reference
    from paged_inputs import MIXED, default_scale, make_paged_inputs, rel_l2

    def custom_calls(tensor):
        return [l.strip() for l in torch_xla._XLAC._get_xla_tensors_hlo([tensor]).splitlines()
                if "custom-call(" in l]

    device = torch_xla.device()
    results = {{"device": str(device), "device_type": xr.device_type(),
                "hardware": xm.xla_device_hw(device), "kind": xm.xla_device_kind(device),
                "create_calls": plugin.client_create_calls()}}

    a, b = torch.randn(1000, 3), torch.randn(1000, 3)
    plain = a.to(device) * 2 + b.to(device)  # an ordinary XLA:GPU graph
    xm.mark_step()
    xm.wait_device_ops()
    results["plain_max_err"] = (plain.cpu() - (a * 2 + b)).abs().max().item()
    for abi in ("ffi", "legacy"):
        os.environ["XLA_GPU_OPS_TORCH_XLA_ABI"] = abi
        out = xla_gpu_ops.simple_add(a.to(device), b.to(device))
        results[f"simple_add_{{abi}}_hlo"] = custom_calls(out)
        xm.mark_step()
        xm.wait_device_ops()
        results[f"simple_add_{{abi}}_max_err"] = (out.cpu() - (a + b)).abs().max().item()
    os.environ["XLA_GPU_OPS_TORCH_XLA_ABI"] = "ffi"

    head_dim, scale = 128, default_scale(128)
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        inputs = make_paged_inputs(MIXED, 8, 2, head_dim, 16, dtype, seed={seed}, pad_tokens=3)
        expected = reference.paged_attention(**inputs, scale=scale, sliding_window=64, soft_cap=30.0,
                                             compute_dtype=torch.float64)
        on_xla = {{name: t.to(device) for name, t in inputs.items()}}
        lazy = xla_gpu_ops.paged_attention(**on_xla, scale=scale, sliding_window=64, soft_cap=30.0)
        results[f"paged_attention_{{dtype}}_hlo"] = custom_calls(lazy)
        xm.mark_step()
        results[f"paged_attention_{{dtype}}_lazy_rel_l2"] = rel_l2(lazy, expected)

        def attend(q, kv, lens, tables, starts, n):
            return torch.ops.xla_gpu.paged_attention(q, kv, lens, tables, starts, n, scale, 64, 30.0)[0]

        compiled = torch.compile(attend, backend="openxla", fullgraph=True)
        dynamo = compiled(*(on_xla[name] for name in ("query", "kv_cache", "context_lens",
                                                      "block_tables", "query_start_loc", "num_seqs")))
        results[f"paged_attention_{{dtype}}_dynamo_rel_l2"] = rel_l2(dynamo, expected)
    xm.wait_device_ops()
    print("RESULTS " + json.dumps(results, default=str), flush=True)
"""
GPU_TOLERANCE = {"torch.float32": 1e-4, "torch.float16": 2e-3, "torch.bfloat16": 2e-2}


@pytest.mark.gpu
@needs_2_9
def test_ops_on_the_plugin_device_lazy_and_openxla_dynamo(artifacts_dir):
    """simple_add and paged_attention on a real GPU through torch_xla 2.9's plugin device "GPU"."""
    if not cuda_visible():
        pytest.skip("needs a CUDA GPU")
    built_library()
    seed = int.from_bytes(os.urandom(4), "little")
    code = GPU_SCRIPT.format(tests_dir=str(TESTS_DIR), seed=seed)
    log = run_python(code, {"PJRT_DEVICE": "CPU"}, artifacts_dir / "plugin_gpu.log")
    results = results_of(log)
    (artifacts_dir / "results.json").write_text(json.dumps(results, indent=2))
    assert results["device"] == "xla:0", results
    assert results["device_type"] == "GPU", results
    assert results["hardware"] == "GPU", results  # not CUDA: no abort, a generic plugin device
    assert torch_xla_plugin.PLATFORM_NAME_OPTION in results["create_calls"][0], results
    assert results["plain_max_err"] < 1e-5, results
    for abi, target, api in (
        ("ffi", "xla_gpu_simple_add", "API_VERSION_TYPED_FFI"),
        ("legacy", "xla_gpu_simple_add_legacy", "API_VERSION_STATUS_RETURNING"),
    ):
        (line,) = results[f"simple_add_{abi}_hlo"]
        assert f'custom_call_target="{target}"' in line, line
        assert api in line, line
        assert results[f"simple_add_{abi}_max_err"] == 0.0, results
    for dtype, tolerance in GPU_TOLERANCE.items():
        (line,) = results[f"paged_attention_{dtype}_hlo"]
        assert 'custom_call_target="xla_gpu_paged_attention"' in line, line
        assert "API_VERSION_TYPED_FFI" in line, line
        for path in ("lazy", "dynamo"):
            error = results[f"paged_attention_{dtype}_{path}_rel_l2"]
            assert error < tolerance, f"{dtype} {path}: rel L2 {error} (seed {seed})"
