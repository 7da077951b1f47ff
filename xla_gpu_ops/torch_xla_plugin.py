"""torch_xla >= 2.9 on XLA:GPU: JAX's CUDA PJRT plugin as a generic torch_xla plugin device "GPU",
with this library's custom-call targets registered through the plugin's GPU custom-call extension.

torch_xla 2.9 aborts on an XLA tensor whose current device has type CUDA, and it names devices
after the PJRT client's platform name, which XLA's GPU plugin reports as "cuda" whatever name the
plugin was registered under (docs/TORCH_XLA_GPU.md has the source references). Any other platform
name makes the device a generic PLUGIN device, which 2.9 runs like any other. So this module:

1. wraps two entries of the plugin's PJRT_Api function table in this process:
   PJRT_Client_Create strips our own client option `xla_gpu_ops_platform_name` (the plugin
   would reject an option it does not know) and remembers the client it made;
   PJRT_Client_PlatformName answers that name ("gpu") for those clients only, the plugin's own
   answer for every other client (JAX's, for one);
2. registers the handlers with the plugin's GPU custom-call extension, the way jaxlib's CUDA
   plugin extension does it: typed FFI handlers under `xla_gpu_<op>` (extension api_version 1)
   and legacy ones under `xla_gpu_<op>_legacy` (api_version 0). torch_xla's own
   `_xla_register_custom_call_target` is a stub in 2.9;
3. registers the plugin with torch_xla as device type "GPU" and selects it (PJRT_DEVICE=GPU).
Steps 1 and 2 also run from the device plugin's library_path(), which torch_xla calls right before
it loads the plugin, so the class works as a "torch_xla.plugins" entry point as well.

    from xla_gpu_ops import torch_xla_plugin
    torch_xla_plugin.register_plugin()   # before the first XLA tensor of the process
    import torch_xla
    device = torch_xla.device()          # xla:0, hardware "GPU"

Client options come from the environment, as for the legacy stack (xla_gpu_ops.xla_cuda):
XLA_GPU_OPS_XLA_ALLOCATOR, XLA_GPU_OPS_XLA_MEMORY_FRACTION, XLA_GPU_OPS_XLA_PREALLOCATE,
XLA_GPU_OPS_XLA_VISIBLE_DEVICES, XLA_GPU_OPS_CUDA_PLUGIN, and torchrun's RANK, WORLD_SIZE, ...

The function-table layout used here is PJRT C API major 0 (checked when the plugin loads); the
plugin must speak the PJRT C API version of the installed torch_xla (0.75 for 2.9:
jax-cuda12-pjrt 0.7.1, the default lock's).
"""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path
from typing import NamedTuple

from xla_gpu_ops import _library, ops, xla_cuda

# PJRT_DEVICE and torch_xla's hardware name: not a built-in type in 2.9 (so PLUGIN), and without
# "_" (torch_xla.runtime.device_type() keeps only the part before the first "_").
DEVICE_TYPE = "GPU"
# Our client option: the platform name torch_xla's client should see. Never reaches the plugin.
PLATFORM_NAME_OPTION = "xla_gpu_ops_platform_name"
FIRST_RELEASE = xla_cuda.FIRST_RELEASE_WITHOUT_CUDA  # older torch_xla: xla_gpu_ops.xla_cuda

# Extension api_version of PJRT_Gpu_Register_Custom_Call_Args (pjrt_c_api_gpu_extension.h).
UNTYPED = 0  # legacy handler: void f(stream, void** buffers, const char* opaque, size_t, status*)
TYPED_FFI = 1  # XLA_FFI_Handler*: the execute stage of a typed FFI handler


class TorchXlaTooOldError(RuntimeError):
    """The installed torch_xla still has XLA:CUDA: use xla_gpu_ops.xla_cuda there."""


class CustomCallTarget(NamedTuple):
    name: str  # XLA custom-call target
    address: int  # handler function in the loaded library
    api_version: int  # UNTYPED or TYPED_FFI


# ---------------------------------------------------------------------------- PJRT C API layout
# PJRT_Api (pjrt_c_api.h, major 0): struct_size, extension_start, PJRT_Api_Version (24 bytes),
# then one function pointer per entry, append-only across minor versions.
_FUNCTIONS_OFFSET = 40
_SLOT = {"PJRT_Error_Destroy": 0, "PJRT_Error_Message": 1, "PJRT_Client_Create": 10,
         "PJRT_Client_PlatformName": 12}  # fmt: skip
_EXTENSION_GPU_CUSTOM_CALL = 0  # PJRT_Extension_Type_Gpu_Custom_Call

_PjrtFunction = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p)  # PJRT_Error* f(Args*)


class _ErrorDestroyArgs(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("extension_start", ctypes.c_void_p),
                ("error", ctypes.c_void_p)]  # fmt: skip


class _ErrorMessageArgs(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("extension_start", ctypes.c_void_p),
                ("error", ctypes.c_void_p), ("message", ctypes.c_void_p),
                ("message_size", ctypes.c_size_t)]  # fmt: skip


class _NamedValue(ctypes.Structure):  # PJRT_NamedValue; the union is one 8-byte slot
    _fields_ = [("struct_size", ctypes.c_size_t), ("extension_start", ctypes.c_void_p),
                ("name", ctypes.c_void_p), ("name_size", ctypes.c_size_t),
                ("type", ctypes.c_int), ("value", ctypes.c_void_p),
                ("value_size", ctypes.c_size_t)]  # fmt: skip


_NAMED_VALUE_STRING = 0  # PJRT_NamedValue_kString


class _ClientCreateArgs(ctypes.Structure):  # the leading fields of PJRT_Client_Create_Args
    _fields_ = [("struct_size", ctypes.c_size_t), ("extension_start", ctypes.c_void_p),
                ("create_options", ctypes.c_void_p), ("num_options", ctypes.c_size_t),
                ("kv_get_callback", ctypes.c_void_p), ("kv_get_user_arg", ctypes.c_void_p),
                ("kv_put_callback", ctypes.c_void_p), ("kv_put_user_arg", ctypes.c_void_p),
                ("client", ctypes.c_void_p)]  # fmt: skip


class _PlatformNameArgs(ctypes.Structure):  # PJRT_Client_PlatformName_Args
    _fields_ = [("struct_size", ctypes.c_size_t), ("extension_start", ctypes.c_void_p),
                ("client", ctypes.c_void_p), ("platform_name", ctypes.c_void_p),
                ("platform_name_size", ctypes.c_size_t)]  # fmt: skip


class _RegisterCustomCallArgs(ctypes.Structure):  # PJRT_Gpu_Register_Custom_Call_Args
    _fields_ = [("struct_size", ctypes.c_size_t), ("function_name", ctypes.c_char_p),
                ("function_name_size", ctypes.c_size_t), ("api_version", ctypes.c_int),
                ("handler_instantiate", ctypes.c_void_p), ("handler_prepare", ctypes.c_void_p),
                ("handler_initialize", ctypes.c_void_p), ("handler_execute", ctypes.c_void_p)]  # fmt: skip


class _GpuCustomCallExtension(ctypes.Structure):  # PJRT_Gpu_Custom_Call
    _fields_ = [("struct_size", ctypes.c_size_t), ("type", ctypes.c_int),
                ("next", ctypes.c_void_p), ("custom_call", _PjrtFunction)]  # fmt: skip


class PluginApi:
    """The PJRT_Api table of one loaded PJRT GPU plugin (the one torch_xla dlopens later: same
    path, so the same loaded library and table)."""

    def __init__(self, path: Path):
        self.path = path
        head = xla_cuda._plugin_api(path)  # GetPjrtApi(): a static table, no CUDA call
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
        return ctypes.c_void_p.from_address(self.slot_address(function)).value

    def call(self, function: str, args: ctypes.Structure) -> int | None:
        return _PjrtFunction(self.function(function))(ctypes.addressof(args))

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
    return PluginApi(path or xla_cuda.plugin_library_path())


# ---------------------------------------------------------------------------- custom-call targets
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
            ctypes.sizeof(_RegisterCustomCallArgs), name, len(name), entry.api_version,
            None, None, None, entry.address,
        )  # fmt: skip
        error = extension.custom_call(ctypes.addressof(args))
        if error:
            raise RuntimeError(
                f"{api.path.name} refused custom-call target {entry.name} (extension api_version "
                f"{entry.api_version}): {api.error_message(error)}"
            )
        _registered[key] = entry
    return [entry.name for entry in entries]


# ---------------------------------------------------------------------------- platform name
class _PlatformRename:
    """The two wrapped PJRT_Api entries of one plugin (installed once per process)."""

    def __init__(self, api: PluginApi):
        self.api = api
        self.original_create = _PjrtFunction(api.function("PJRT_Client_Create"))
        self.original_platform_name = _PjrtFunction(api.function("PJRT_Client_PlatformName"))
        self.names: dict[int, ctypes.Array] = {}  # client -> its platform name (kept alive)
        self.create_calls: list[list[str]] = []  # option names of each PJRT_Client_Create
        self.create_errors: list[str] = []
        # The callbacks must outlive every call through the table: they live as long as this.
        self.create = _PjrtFunction(self._create)
        self.platform_name = _PjrtFunction(self._platform_name)

    def install(self) -> None:
        for function, callback in (("PJRT_Client_Create", self.create),
                                   ("PJRT_Client_PlatformName", self.platform_name)):  # fmt: skip
            address = ctypes.cast(callback, ctypes.c_void_p).value
            ctypes.c_void_p.from_address(self.api.slot_address(function)).value = address

    def _create(self, args_address: int) -> int | None:
        args = _ClientCreateArgs.from_address(args_address)
        try:
            stripped = self._strip_platform_option(args)
        except Exception as error:  # a Python error must not turn into a fake success
            self.create_errors.append(repr(error))
            stripped = None
        if stripped is None:  # another framework's client (JAX's, ...): untouched
            return self.original_create(args_address)
        kept, platform = stripped
        saved = args.create_options, args.num_options
        args.create_options, args.num_options = ctypes.addressof(kept), len(kept)
        try:
            error = self.original_create(args_address)
        finally:
            args.create_options, args.num_options = saved
        if not error and args.client:
            # torch_xla keeps its client for the process; no later client reuses this address
            self.names[args.client] = ctypes.create_string_buffer(platform, len(platform))
        return error

    def _strip_platform_option(self, args: _ClientCreateArgs):
        """(the options without ours, the platform name it asks for), or None if it is absent."""
        options = [
            _NamedValue.from_address(args.create_options + i * ctypes.sizeof(_NamedValue))
            for i in range(args.num_options)
        ]
        names = [ctypes.string_at(option.name, option.name_size).decode() for option in options]
        self.create_calls.append(names)
        if PLATFORM_NAME_OPTION not in names:
            return None
        index = names.index(PLATFORM_NAME_OPTION)
        marker = options[index]
        if marker.type != _NAMED_VALUE_STRING:
            raise TypeError(f"{PLATFORM_NAME_OPTION}: expected a string option")
        platform = ctypes.string_at(marker.value, marker.value_size)
        kept = (_NamedValue * (len(options) - 1))(*(o for i, o in enumerate(options) if i != index))
        return kept, platform

    def _platform_name(self, args_address: int) -> int | None:
        args = _PlatformNameArgs.from_address(args_address)
        name = self.names.get(args.client)
        if name is None:
            return self.original_platform_name(args_address)
        args.platform_name = ctypes.addressof(name)
        args.platform_name_size = len(name)
        return None


_renames: dict[Path, _PlatformRename] = {}


def install_platform_rename(path: Path | None = None) -> _PlatformRename:
    """Wrap PJRT_Client_Create and PJRT_Client_PlatformName of the plugin (once per process)."""
    api = plugin_api(path)
    if api.path not in _renames:
        rename = _PlatformRename(api)
        rename.install()
        _renames[api.path] = rename
    return _renames[api.path]


def client_create_calls(path: Path | None = None) -> list[list[str]]:
    """Option names of every PJRT_Client_Create made through the wrapped plugin (diagnostics)."""
    rename = _renames.get(plugin_api(path).path)
    return [list(names) for names in rename.create_calls] if rename else []


# ---------------------------------------------------------------------------- torch_xla plugin
def check_torch_xla_version() -> None:
    version = xla_cuda.torch_xla_version()
    if version < FIRST_RELEASE:
        raise TorchXlaTooOldError(
            f"torch_xla {version[0]}.{version[1]} still has XLA:CUDA: use "
            "xla_gpu_ops.xla_cuda.register_plugin() there (the pinned stack, locks/xla-cuda.txt)"
        )


def prepare_plugin() -> None:
    """Wrap the plugin's platform name and register every op's handlers (once per process).

    register_plugin() calls it, and so does the device plugin's library_path(), which torch_xla
    calls right before it loads the plugin: a process that gets the plugin some other way (an
    entry point in the "torch_xla.plugins" group, which torch_xla 2.9 loads at import) is ready too.
    """
    install_platform_rename()
    register_custom_call_targets()


def client_create_options() -> dict:
    """The GPU plugin's options from the environment, plus the platform name for torch_xla."""
    return {**xla_cuda.client_options_from_env(), PLATFORM_NAME_OPTION: DEVICE_TYPE.lower()}


@functools.cache
def _plugin_class() -> type:
    from torch_xla.experimental import plugins

    class JaxCudaPluginDevice(plugins.DevicePlugin):
        """XLA's GPU PJRT plugin (jax-cuda12-pjrt) as torch_xla's generic device "GPU"."""

        def library_path(self) -> str:
            prepare_plugin()  # torch_xla loads the plugin next
            return str(plugin_api().path)

        def physical_chip_count(self) -> int:
            return xla_cuda.physical_chip_count()

        def configure_single_process(self) -> None:
            pass

        def client_create_options(self) -> dict:
            return client_create_options()

        def requires_xla_coordinator(self) -> bool:
            return xla_cuda.process_topology()["world_size"] > 1

    return JaxCudaPluginDevice


def register_plugin():
    """Make XLA:GPU torch_xla's device "GPU" (PJRT_DEVICE=GPU) with our targets registered.

    Call before the first XLA tensor of the process. Checks the torch_xla release and that the
    plugin speaks its PJRT C API version, wraps the plugin's platform name, registers every op's
    handlers through the plugin's extension, then registers and selects the plugin. The client
    (and the GPU) is first touched by torch_xla at the first XLA tensor. Returns the plugin.
    """
    check_torch_xla_version()
    xla_cuda.check_plugin_matches_torch_xla(plugin_api().path)
    client_create_options()  # a bad variable fails here, not inside torch_xla
    import torch_xla
    import torch_xla.runtime as xr
    from torch_xla.experimental import plugins

    if torch_xla._XLAC._xla_runtime_is_initialized() and xr.device_type() != DEVICE_TYPE:
        raise RuntimeError(
            f"register_plugin: the XLA runtime already runs on {xr.device_type()}; register the "
            "GPU plugin before the first XLA tensor of the process"
        )
    prepare_plugin()  # errors surface here rather than inside torch_xla's client creation
    plugin = _plugin_class()()
    plugins.use_dynamic_plugins()
    plugins.register_plugin(DEVICE_TYPE, plugin)
    xr.set_device_type(DEVICE_TYPE)
    return plugin
