"""JAX's CUDA PJRT plugin under torch_xla: the plumbing both GPU routes share, and our custom-call
targets in the plugin. Private; importing it needs no framework (torch_xla is imported by the
functions that use it).

The two routes (docs/TORCH_XLA_GPU.md) load the same program, XLA's stock GPU PJRT plugin as
shipped by `jax-cuda12-pjrt`: torch_xla 2.7 as its "CUDA" device (xla_gpu_ops.xla_cuda), torch_xla
>= 2.9 as the generic plugin device "GPU" (xla_gpu_ops.torch_xla_plugin). What they share is here:

- where the plugin library is ($XLA_GPU_OPS_CUDA_PLUGIN, else jax-cuda12-pjrt's .so);
- its PJRT_Api table, read with ctypes (GetPjrtApi returns a static table: no CUDA call, no GPU):
  the PJRT C API version, the extensions, the function slots; and the version check against the
  installed torch_xla;
- the client options from the environment (the variables in xla_gpu_ops.xla_cuda's docstring)
  and torchrun's process topology;
- the torch_xla DevicePlugin of the plugin, and its registration as torch_xla's device;
- the custom-call targets: through torch_xla's own registration call (2.7: legacy targets only)
  or through the plugin's GPU custom-call extension directly (2.9, where that call is a stub).
  The XLA kernel (xla_gpu_ops.torch_xla) registers them here before a custom call on a GPU device.
"""

from __future__ import annotations

import ctypes
import functools
import importlib.metadata
import os
from pathlib import Path
from typing import NamedTuple

from xla_gpu_ops import _library, _torch_xla_version, ops

# torch_xla's device type (PJRT_DEVICE) of the plugin on each route. "CUDA" is 2.7's built-in type.
# "GPU" is not a built-in type in 2.9 (so PLUGIN), and has no "_" (torch_xla.runtime.device_type()
# keeps only the part before the first "_").
CUDA_DEVICE_TYPE = "CUDA"
PLUGIN_DEVICE_TYPE = "GPU"

PLUGIN_DISTRIBUTION = "jax-cuda12-pjrt"
PLUGIN_FILE = "jax_plugins/xla_cuda12/xla_cuda_plugin.so"  # inside that distribution

PLUGIN_PATH_ENV = "XLA_GPU_OPS_CUDA_PLUGIN"
ALLOCATOR_ENV = "XLA_GPU_OPS_XLA_ALLOCATOR"
MEMORY_FRACTION_ENV = "XLA_GPU_OPS_XLA_MEMORY_FRACTION"
PREALLOCATE_ENV = "XLA_GPU_OPS_XLA_PREALLOCATE"
VISIBLE_DEVICES_ENV = "XLA_GPU_OPS_XLA_VISIBLE_DEVICES"
# The values the plugin accepts (its PJRT_Client_Create rejects others).
ALLOCATORS = ("default", "bfc", "platform", "cuda_async")

# PJRT C API version torch_xla was built with (read from the releases; torch_xla checks the
# plugin's against it at load time) and the jax-cuda12-pjrt release that speaks it.
FRAMEWORK_PJRT_API = {(2, 7): (0, 67), (2, 8): (0, 70), (2, 9): (0, 75)}
MATCHING_PLUGIN = {(2, 7): "0.5.3", (2, 8): "0.6.2", (2, 9): "0.7.1"}


# ---------------------------------------------------------------------------- the plugin library
def plugin_library_path() -> Path:
    """The PJRT GPU plugin .so: $XLA_GPU_OPS_CUDA_PLUGIN, else the one jax-cuda12-pjrt installed."""
    override = os.environ.get(PLUGIN_PATH_ENV)
    if override:
        path = Path(override)
        if not path.is_file():
            raise FileNotFoundError(f"{PLUGIN_PATH_ENV}={override}: no such file")
        return path
    try:
        dist = importlib.metadata.distribution(PLUGIN_DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        raise FileNotFoundError(
            f"{PLUGIN_DISTRIBUTION} is not installed: install the lock of your torch_xla "
            f"(locks/xla-cuda.txt pins {PLUGIN_DISTRIBUTION}=={MATCHING_PLUGIN[(2, 7)]} for 2.7, "
            f"locks/default.txt {MATCHING_PLUGIN[(2, 9)]} for 2.9) or set {PLUGIN_PATH_ENV}"
        ) from None
    path = Path(str(dist.locate_file(PLUGIN_FILE)))
    if not path.is_file():
        raise FileNotFoundError(f"{PLUGIN_DISTRIBUTION} {dist.version} has no {PLUGIN_FILE}")
    return path


# ---------------------------------------------------------------------------- PJRT C API layout
# PJRT_Api (pjrt_c_api.h, major 0): struct_size, extension_start, PJRT_Api_Version (24 bytes),
# then one function pointer per entry, append-only across minor versions.
_FUNCTIONS_OFFSET = 40
_SLOT = {
    "PJRT_Error_Destroy": 0,
    "PJRT_Error_Message": 1,
    "PJRT_Client_Create": 10,
    "PJRT_Client_PlatformName": 12,
}
_EXTENSION_GPU_CUSTOM_CALL = 0  # PJRT_Extension_Type_Gpu_Custom_Call

PjrtFunction = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p)  # PJRT_Error* f(Args*)


class _PjrtExtensionBase(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("type", ctypes.c_int), ("next", ctypes.c_void_p)]


class _PjrtApiVersion(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("extension_start", ctypes.c_void_p),
        ("major_version", ctypes.c_int),
        ("minor_version", ctypes.c_int),
    ]


class _PjrtApiHead(ctypes.Structure):
    """The leading, stable fields of PJRT_Api (pjrt_c_api.h); the function table follows."""

    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("extension_start", ctypes.c_void_p),
        ("pjrt_api_version", _PjrtApiVersion),
    ]


class _ErrorDestroyArgs(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("extension_start", ctypes.c_void_p),
        ("error", ctypes.c_void_p),
    ]


class _ErrorMessageArgs(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("extension_start", ctypes.c_void_p),
        ("error", ctypes.c_void_p),
        ("message", ctypes.c_void_p),
        ("message_size", ctypes.c_size_t),
    ]


class _RegisterCustomCallArgs(ctypes.Structure):  # PJRT_Gpu_Register_Custom_Call_Args
    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("function_name", ctypes.c_char_p),
        ("function_name_size", ctypes.c_size_t),
        ("api_version", ctypes.c_int),
        ("handler_instantiate", ctypes.c_void_p),
        ("handler_prepare", ctypes.c_void_p),
        ("handler_initialize", ctypes.c_void_p),
        ("handler_execute", ctypes.c_void_p),
    ]


class _GpuCustomCallExtension(ctypes.Structure):  # PJRT_Gpu_Custom_Call
    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("type", ctypes.c_int),
        ("next", ctypes.c_void_p),
        ("custom_call", PjrtFunction),
    ]


@functools.cache
def api_head(path: Path) -> _PjrtApiHead:
    """The head of the plugin's PJRT_Api, whatever its major version."""
    # The same path torch_xla dlopens later, so both get the same loaded library. GetPjrtApi only
    # returns a static table: no CUDA call, no GPU needed.
    get_api = ctypes.CDLL(str(path)).GetPjrtApi
    get_api.restype = ctypes.POINTER(_PjrtApiHead)
    return get_api().contents


def plugin_pjrt_api_version(path: Path | None = None) -> tuple[int, int]:
    """PJRT C API (major, minor) the plugin library was built with."""
    version = api_head(path or plugin_library_path()).pjrt_api_version
    return version.major_version, version.minor_version


def plugin_extension_types(path: Path | None = None) -> list[int]:
    """PJRT_Extension_Type of each extension the plugin exposes, in chain order."""
    types: list[int] = []
    address = api_head(path or plugin_library_path()).extension_start
    while address:
        extension = _PjrtExtensionBase.from_address(address)
        types.append(extension.type)
        address = extension.next
    return types


def has_gpu_custom_call_extension(path: Path | None = None) -> bool:
    """Whether the plugin takes custom-call targets (what torch_xla 2.7's registration uses)."""
    return _EXTENSION_GPU_CUSTOM_CALL in plugin_extension_types(path)


def check_plugin_matches_torch_xla(path: Path | None = None) -> None:
    """Raise if the plugin's PJRT C API differs from the one the installed torch_xla was built with.

    torch_xla itself only refuses a different major version; a different minor can load and
    then misbehave, so we insist on the exact pair.
    """
    path = path or plugin_library_path()
    version = _torch_xla_version.torch_xla_version()
    expected = FRAMEWORK_PJRT_API.get(version)
    found = plugin_pjrt_api_version(path)
    if expected is None:
        raise RuntimeError(
            f"torch_xla {version[0]}.{version[1]}: PJRT C API version not known here"
        )
    if found != expected:
        raise RuntimeError(
            f"{path} speaks PJRT C API {found[0]}.{found[1]}, torch_xla {version[0]}.{version[1]} "
            f"{expected[0]}.{expected[1]}: install {PLUGIN_DISTRIBUTION}=="
            f"{MATCHING_PLUGIN[version]} or point {PLUGIN_PATH_ENV} at a matching plugin"
        )


class PluginApi:
    """The PJRT_Api table of one loaded PJRT GPU plugin (the one torch_xla dlopens later: same
    path, so the same loaded library and table), major version 0."""

    def __init__(self, path: Path):
        self.path = path
        head = api_head(path)  # GetPjrtApi(): a static table, no CUDA call
        self.address = ctypes.addressof(head)
        self.version = (head.pjrt_api_version.major_version, head.pjrt_api_version.minor_version)
        if self.version[0] != 0:
            raise RuntimeError(f"{path}: PJRT C API {self.version}, this module reads major 0")
        needed = _FUNCTIONS_OFFSET + 8 * (max(_SLOT.values()) + 1)
        if head.struct_size < needed:
            raise RuntimeError(f"{path}: PJRT_Api of {head.struct_size} bytes, need {needed}")

    def slot_address(self, function: str) -> int:
        return self.address + _FUNCTIONS_OFFSET + 8 * _SLOT[function]

    def function(self, function: str) -> int:
        return ctypes.c_void_p.from_address(self.slot_address(function)).value or 0  # 0: NULL

    def call(self, function: str, args: ctypes.Structure) -> int | None:
        return PjrtFunction(self.function(function))(ctypes.addressof(args))

    def error_message(self, error: int) -> str:
        """The message of a PJRT_Error, which is destroyed."""
        message = _ErrorMessageArgs(ctypes.sizeof(_ErrorMessageArgs), None, error, None, 0)
        self.call("PJRT_Error_Message", message)
        text = ctypes.string_at(message.message, message.message_size).decode(errors="replace")
        self.call(
            "PJRT_Error_Destroy", _ErrorDestroyArgs(ctypes.sizeof(_ErrorDestroyArgs), None, error)
        )
        return text

    def gpu_custom_call_extension(self) -> _GpuCustomCallExtension:
        address = ctypes.c_void_p.from_address(self.address + 8).value  # extension_start
        while address:
            extension = _GpuCustomCallExtension.from_address(address)
            if extension.type == _EXTENSION_GPU_CUSTOM_CALL:
                return extension
            address = extension.next
        raise RuntimeError(f"{self.path}: no GPU custom-call extension (not a PJRT GPU plugin?)")


@functools.cache
def plugin_api(path: Path | None = None) -> PluginApi:
    """The plugin's table: $XLA_GPU_OPS_CUDA_PLUGIN, else jax-cuda12-pjrt's .so."""
    return PluginApi(path or plugin_library_path())


# ---------------------------------------------------------------------------- client options
def _env_bool(name: str) -> bool | None:
    raw = os.environ.get(name, "").strip().lower()
    if not raw:
        return None
    if raw in {"1", "true", "yes", "on"}:
        return True
    if raw in {"0", "false", "no", "off"}:
        return False
    raise ValueError(f"{name}={raw!r}: expected 1/0 (true/false)")


def _env_devices(name: str) -> list[int] | None:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return None
    try:
        devices = [int(part) for part in raw.split(",")]
    except ValueError:
        raise ValueError(
            f"{name}={raw!r}: expected comma-separated CUDA ordinals, e.g. 0,1"
        ) from None
    if any(d < 0 for d in devices) or len(set(devices)) != len(devices):
        raise ValueError(f"{name}={raw!r}: ordinals must be distinct and >= 0")
    return devices


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name, "").strip()
    return int(raw) if raw else default


def process_topology() -> dict[str, int]:
    """Ranks and world sizes from torchrun's variables (torch_xla's own CUDA plugin reads these)."""
    local_rank = _env_int("PJRT_LOCAL_PROCESS_RANK", _env_int("LOCAL_RANK", 0))
    local_world = _env_int("PJRT_LOCAL_PROCESS_COUNT", _env_int("LOCAL_WORLD_SIZE", 1))
    return {
        "local_rank": local_rank,
        "rank": _env_int("RANK", local_rank),
        "local_world_size": local_world,
        "world_size": _env_int("WORLD_SIZE", local_world),
    }


def physical_chip_count() -> int:
    """GPUs this host offers torch_xla: the visible ordinals, else $GPU_NUM_DEVICES, else 1."""
    visible = _env_devices(VISIBLE_DEVICES_ENV)
    if visible is not None:
        return len(visible)
    return _env_int("GPU_NUM_DEVICES", 1)


def client_options_from_env() -> dict[str, str | float | bool | int | list[int]]:
    """The PJRT_Client_Create options of the GPU plugin, from the variables in xla_cuda's doc."""
    options: dict[str, str | float | bool | int | list[int]] = {"platform_name": "gpu"}
    allocator = os.environ.get(ALLOCATOR_ENV, "").strip().lower()
    if allocator:
        if allocator not in ALLOCATORS:
            raise ValueError(f"{ALLOCATOR_ENV}={allocator!r}: expected one of {ALLOCATORS}")
        options["allocator"] = allocator
    fraction = os.environ.get(MEMORY_FRACTION_ENV, "").strip()
    if fraction:
        try:
            value = float(fraction)
        except ValueError:
            raise ValueError(f"{MEMORY_FRACTION_ENV}={fraction!r}: expected a number") from None
        if not 0.0 < value <= 1.0:
            raise ValueError(f"{MEMORY_FRACTION_ENV}={fraction!r}: must be in (0, 1]")
        options["memory_fraction"] = value
    preallocate = _env_bool(PREALLOCATE_ENV)
    if preallocate is not None:
        options["preallocate"] = preallocate
    topology = process_topology()
    visible = _env_devices(VISIBLE_DEVICES_ENV)
    if visible is None and topology["local_world_size"] > 1:
        visible = [topology["local_rank"]]  # one GPU per local process, as torch_xla's plugin did
    if visible is not None:
        options["visible_devices"] = visible
    options["node_id"] = topology["rank"]
    options["num_nodes"] = topology["world_size"]
    return options


# ---------------------------------------------------------------------------- torch_xla device
@functools.cache
def device_plugin_class() -> type:
    """The torch_xla DevicePlugin of the plugin; the 2.9 route subclasses it."""
    from torch_xla.experimental import plugins

    class JaxCudaPlugin(plugins.DevicePlugin):
        """torch_xla DevicePlugin for XLA's GPU PJRT plugin as shipped by jax-cuda12-pjrt."""

        def library_path(self) -> str:
            return str(plugin_library_path())

        def physical_chip_count(self) -> int:
            return physical_chip_count()

        def configure_single_process(self) -> None:
            pass

        def client_create_options(self) -> dict:
            return client_options_from_env()

        def requires_xla_coordinator(self) -> bool:
            return process_topology()["world_size"] > 1

    return JaxCudaPlugin


def check_runtime_not_started(device_type: str) -> None:
    """Raise if the XLA runtime already runs on another device: a plugin must be registered
    before the first XLA tensor of the process."""
    import torch_xla
    import torch_xla.runtime as xr

    if torch_xla._XLAC._xla_runtime_is_initialized() and xr.device_type() != device_type:
        raise RuntimeError(
            f"register_plugin: the XLA runtime already runs on {xr.device_type()}; register the "
            f"{device_type} plugin before the first XLA tensor of the process"
        )


def select_device_plugin(device_type: str, plugin) -> None:
    """Register `plugin` as torch_xla's device type `device_type` and select it (PJRT_DEVICE)."""
    import torch_xla.runtime as xr
    from torch_xla.experimental import plugins

    plugins.use_dynamic_plugins()
    plugins.register_plugin(device_type, plugin)
    xr.set_device_type(device_type)


# ---------------------------------------------------------------------------- custom-call targets
_legacy_registered = False


def register_legacy_targets() -> list[str]:
    """Register every op's legacy target (xla_gpu_<op>_legacy) through torch_xla's own call.

    torch_xla 2.7 passes the handler to the plugin's GPU custom-call extension as an untyped
    target, called by XLA:GPU for api_version 2 custom calls with the packed config as opaque.
    Needs the runtime on the CUDA plugin; registering is per process, so a second call does
    nothing. Returns the registered target names.
    """
    global _legacy_registered
    import torch_xla
    import torch_xla.runtime as xr

    if xr.device_type() != CUDA_DEVICE_TYPE:
        raise RuntimeError(
            f"register_legacy_targets: the XLA runtime is on {xr.device_type()!r}, not the CUDA "
            "plugin: call xla_gpu_ops.xla_cuda.register_plugin() before the first XLA tensor "
            "(torch_xla would otherwise register into its own in-process XLA, which never runs them)"
        )
    targets = [op.legacy_target for op in ops.OPS]
    if _legacy_registered:
        return targets
    for op in ops.OPS:
        capsule = _library.load().op(op).capsule("cuda_legacy")
        torch_xla._XLAC._xla_register_custom_call_target(
            op.legacy_target, capsule, CUDA_DEVICE_TYPE
        )
    _legacy_registered = True
    return targets


# Extension api_version of PJRT_Gpu_Register_Custom_Call_Args (pjrt_c_api_gpu_extension.h).
UNTYPED = 0  # legacy handler: void f(stream, void** buffers, const char* opaque, size_t, status*)
TYPED_FFI = 1  # XLA_FFI_Handler*: the execute stage of a typed FFI handler


class CustomCallTarget(NamedTuple):
    name: str  # XLA custom-call target
    address: int  # handler function in the loaded library
    api_version: int  # UNTYPED or TYPED_FFI


def handler_entries() -> list[CustomCallTarget]:
    """Every op's CUDA handlers as (target, address, extension api_version): typed FFI under the
    typed target, legacy under the legacy target. The one place that maps ops to handlers."""
    entries = []
    library = _library.load()
    for op in ops.OPS:
        info = library.op(op).info
        entries.append(CustomCallTarget(op.ffi_target, info.cuda_ffi_handler, TYPED_FFI))
        entries.append(CustomCallTarget(op.legacy_target, info.cuda_legacy_handler, UNTYPED))
    return entries


_registered: dict[tuple[Path, str], CustomCallTarget] = {}


def register_custom_call_targets(
    entries: list[CustomCallTarget] | None = None, path: Path | None = None
) -> list[str]:
    """Register handlers with the plugin's GPU custom-call extension (default: handler_entries()).

    Needs no GPU and no client: the plugin's registries are process-wide, and its compiler reads
    them when a graph with the target is compiled. A target already registered here with the
    same handler is skipped. Raises RuntimeError with the plugin's own message if it refuses one.
    Returns the target names.
    """
    api = plugin_api(path)
    extension = api.gpu_custom_call_extension()
    entries = handler_entries() if entries is None else entries
    for entry in entries:
        if not isinstance(entry.name, str) or not entry.name:
            raise ValueError(
                f"register_custom_call_targets: name: expected a target, got {entry.name!r}"
            )
        if not entry.address:
            raise ValueError(f"register_custom_call_targets: {entry.name}: null handler address")
        key = (api.path, entry.name)
        if key in _registered:
            old = _registered[key]
            if old != entry:
                raise RuntimeError(
                    f"{entry.name}: already registered with handler {old.address:#x} (api_version "
                    f"{old.api_version}), not {entry.address:#x} (api_version {entry.api_version})"
                )
            continue
        name = entry.name.encode()
        args = _RegisterCustomCallArgs(
            ctypes.sizeof(_RegisterCustomCallArgs),
            name,
            len(name),
            entry.api_version,
            None,
            None,
            None,
            entry.address,
        )
        error = extension.custom_call(ctypes.addressof(args))
        if error:
            raise RuntimeError(
                f"{api.path.name} refused custom-call target {entry.name} (extension api_version "
                f"{entry.api_version}): {api.error_message(error)}"
            )
        _registered[key] = entry
    return [entry.name for entry in entries]
