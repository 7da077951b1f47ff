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
The plumbing both routes share (the plugin library, its PJRT_Api table and version check, the
client options, the torch_xla DevicePlugin, step 2's registration) is xla_gpu_ops._pjrt_plugin;
this module adds what is 2.9's own: the release check, the platform name, the "GPU" device.
Importing it needs no framework.

The function-table layout used here is PJRT C API major 0 (checked when the plugin loads); the
plugin must speak the PJRT C API version of the installed torch_xla (0.75 for 2.9:
jax-cuda12-pjrt 0.7.1, the default lock's).
"""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path

from xla_gpu_ops import _pjrt_plugin, _torch_xla_version

# Part of this route's interface (docs/TORCH_XLA_GPU.md): our targets in the plugin (step 2).
from xla_gpu_ops._pjrt_plugin import CustomCallTarget as CustomCallTarget
from xla_gpu_ops._pjrt_plugin import handler_entries as handler_entries
from xla_gpu_ops._pjrt_plugin import register_custom_call_targets as register_custom_call_targets

DEVICE_TYPE = _pjrt_plugin.PLUGIN_DEVICE_TYPE  # PJRT_DEVICE and torch_xla's hardware name
# Our client option: the platform name torch_xla's client should see. Never reaches the plugin.
PLATFORM_NAME_OPTION = "xla_gpu_ops_platform_name"


class TorchXlaTooOldError(RuntimeError):
    """The installed torch_xla still has XLA:CUDA: use xla_gpu_ops.xla_cuda there."""


# ---------------------------------------------------------------------------- PJRT C API layout
# The structures of the two wrapped entries (pjrt_c_api.h, major 0; PluginApi checks the major).
class _NamedValue(ctypes.Structure):  # PJRT_NamedValue; the union is one 8-byte slot
    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("extension_start", ctypes.c_void_p),
        ("name", ctypes.c_void_p),
        ("name_size", ctypes.c_size_t),
        ("type", ctypes.c_int),
        ("value", ctypes.c_void_p),
        ("value_size", ctypes.c_size_t),
    ]


_NAMED_VALUE_STRING = 0  # PJRT_NamedValue_kString


class _ClientCreateArgs(ctypes.Structure):  # the leading fields of PJRT_Client_Create_Args
    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("extension_start", ctypes.c_void_p),
        ("create_options", ctypes.c_void_p),
        ("num_options", ctypes.c_size_t),
        ("kv_get_callback", ctypes.c_void_p),
        ("kv_get_user_arg", ctypes.c_void_p),
        ("kv_put_callback", ctypes.c_void_p),
        ("kv_put_user_arg", ctypes.c_void_p),
        ("client", ctypes.c_void_p),
    ]


class _PlatformNameArgs(ctypes.Structure):  # PJRT_Client_PlatformName_Args
    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("extension_start", ctypes.c_void_p),
        ("client", ctypes.c_void_p),
        ("platform_name", ctypes.c_void_p),
        ("platform_name_size", ctypes.c_size_t),
    ]


# ---------------------------------------------------------------------------- platform name
class _PlatformRename:
    """The two wrapped PJRT_Api entries of one plugin (installed once per process)."""

    def __init__(self, api: _pjrt_plugin.PluginApi):
        self.api = api
        self.original_create = _pjrt_plugin.PjrtFunction(api.function("PJRT_Client_Create"))
        self.original_platform_name = _pjrt_plugin.PjrtFunction(
            api.function("PJRT_Client_PlatformName")
        )
        self.names: dict[int, ctypes.Array] = {}  # client -> its platform name (kept alive)
        self.create_calls: list[list[str]] = []  # option names of each PJRT_Client_Create
        self.create_errors: list[str] = []
        # The callbacks must outlive every call through the table: they live as long as this.
        self.create = _pjrt_plugin.PjrtFunction(self._create)
        self.platform_name = _pjrt_plugin.PjrtFunction(self._platform_name)

    def install(self) -> None:
        for function, callback in (
            ("PJRT_Client_Create", self.create),
            ("PJRT_Client_PlatformName", self.platform_name),
        ):
            address = ctypes.cast(callback, ctypes.c_void_p).value
            ctypes.c_void_p.from_address(self.api.slot_address(function)).value = address

    def _create(self, args_address: int) -> int | None:
        args = _ClientCreateArgs.from_address(args_address)
        try:
            stripped = self._strip_platform_option(args)
        except Exception as failure:  # a Python error must not turn into a fake success
            self.create_errors.append(repr(failure))
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
    api = _pjrt_plugin.plugin_api(path)
    if api.path not in _renames:
        rename = _PlatformRename(api)
        rename.install()
        _renames[api.path] = rename
    return _renames[api.path]


def client_create_calls(path: Path | None = None) -> list[list[str]]:
    """Option names of every PJRT_Client_Create made through the wrapped plugin (diagnostics)."""
    rename = _renames.get(_pjrt_plugin.plugin_api(path).path)
    return [list(names) for names in rename.create_calls] if rename else []


# ---------------------------------------------------------------------------- torch_xla plugin
def check_torch_xla_version() -> None:
    version = _torch_xla_version.torch_xla_version()
    if version < _torch_xla_version.FIRST_RELEASE_WITHOUT_CUDA:
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
    _pjrt_plugin.register_custom_call_targets()


def client_create_options() -> dict:
    """The GPU plugin's options from the environment, plus the platform name for torch_xla."""
    return {**_pjrt_plugin.client_options_from_env(), PLATFORM_NAME_OPTION: DEVICE_TYPE.lower()}


@functools.cache
def _plugin_class() -> type:
    class JaxCudaPluginDevice(_pjrt_plugin.device_plugin_class()):  # type: ignore[misc]  # made at run time
        """XLA's GPU PJRT plugin (jax-cuda12-pjrt) as torch_xla's generic device "GPU"."""

        def library_path(self) -> str:
            prepare_plugin()  # torch_xla loads the plugin next
            return str(_pjrt_plugin.plugin_api().path)

        def client_create_options(self) -> dict:
            return client_create_options()

    return JaxCudaPluginDevice


def register_plugin():
    """Make XLA:GPU torch_xla's device "GPU" (PJRT_DEVICE=GPU) with our targets registered.

    Call before the first XLA tensor of the process. Checks the torch_xla release and that the
    plugin speaks its PJRT C API version, wraps the plugin's platform name, registers every op's
    handlers through the plugin's extension, then registers and selects the plugin. The client
    (and the GPU) is first touched by torch_xla at the first XLA tensor. Returns the plugin.
    """
    check_torch_xla_version()
    _pjrt_plugin.check_plugin_matches_torch_xla(_pjrt_plugin.plugin_api().path)
    client_create_options()  # a bad variable fails here, not inside torch_xla
    _pjrt_plugin.check_runtime_not_started(DEVICE_TYPE)
    prepare_plugin()  # errors surface here rather than inside torch_xla's client creation
    plugin = _plugin_class()()
    _pjrt_plugin.select_device_plugin(DEVICE_TYPE, plugin)
    return plugin
