"""torch_xla on XLA:CUDA (the pinned legacy stack, locks/xla-cuda.txt): JAX's CUDA PJRT plugin as
torch_xla's "CUDA" device, and this library's legacy custom-call targets registered into it.

torch_xla 2.7 is the last release that runs XLA:CUDA, and its own CUDA plugin wheel was never
published. XLA's stock GPU PJRT plugin is the same program, shipped by JAX as `jax-cuda12-pjrt`;
0.5.3 speaks PJRT C API 0.67, torch_xla 2.7's. torch_xla 2.7 registers custom-call targets through
the plugin's GPU custom-call extension, which takes untyped (legacy, api_version 2) handlers only,
so on this stack the ops run as `xla_gpu_<op>_legacy` calls (xla_gpu_ops.torch_xla picks that ABI).

    from xla_gpu_ops import xla_cuda
    xla_cuda.register_plugin()            # before the first XLA tensor: PJRT_DEVICE=CUDA
    xla_cuda.register_legacy_targets()    # after it; xla_gpu_ops.torch_xla calls it on demand

Client options, read from the environment when the client is created (unset: XLA's default):
    XLA_GPU_OPS_XLA_ALLOCATOR        default | bfc | platform | cuda_async
    XLA_GPU_OPS_XLA_MEMORY_FRACTION  fraction of GPU memory the BFC allocator may take, (0, 1]
    XLA_GPU_OPS_XLA_PREALLOCATE      1/0: reserve that fraction up front (XLA's default: 1)
    XLA_GPU_OPS_XLA_VISIBLE_DEVICES  comma-separated CUDA ordinals this process uses, e.g. "0"
    XLA_GPU_OPS_CUDA_PLUGIN          path of a PJRT GPU plugin .so (default: jax-cuda12-pjrt's)
Multi-process runs (torchrun) use torch_xla's own variables: RANK, WORLD_SIZE,
LOCAL_RANK/PJRT_LOCAL_PROCESS_RANK, LOCAL_WORLD_SIZE/PJRT_LOCAL_PROCESS_COUNT, MASTER_ADDR.

torch_xla >= 2.9 cannot take this route (its registration call is a stub and a CUDA-typed XLA
tensor aborts the process); every entry point here says so in one error and names the 2.9 route,
xla_gpu_ops.torch_xla_plugin (the same plugin as a generic device). See docs/TORCH_XLA_GPU.md.
"""

from __future__ import annotations

import ctypes
import functools
import importlib.metadata
import os
from pathlib import Path

from xla_gpu_ops import _library, ops

DEVICE_TYPE = "CUDA"  # torch_xla's PJRT_DEVICE name for this plugin
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
# First torch_xla without XLA:CUDA: _xla_register_custom_call_target is a stub there and
# XLATensorImpl aborts on a CUDA device (torch_xla/csrc/tensor_impl.cpp).
FIRST_RELEASE_WITHOUT_CUDA = (2, 9)

_PJRT_EXTENSION_GPU_CUSTOM_CALL = 0  # PJRT_Extension_Type_Gpu_Custom_Call (pjrt_c_api.h)
_ABSL_SET_STDERR_THRESHOLD = (  # absl::SetStderrThreshold in torch_xla 2.7's _XLAC (absl LTS 2023-08-02)
    "_ZN4absl12lts_2023080218SetStderrThresholdENS0_18LogSeverityAtLeastE"
)


class XlaCudaUnsupportedError(RuntimeError):
    """The installed torch_xla has no XLA:CUDA."""


# ---------------------------------------------------------------------------- versions
def torch_xla_version() -> tuple[int, int]:
    """(major, minor) of the installed torch_xla, read without importing it."""
    major, minor, *_ = importlib.metadata.version("torch_xla").split(".")
    return int(major), int(minor)


def check_torch_xla_supports_cuda() -> None:
    """Raise XlaCudaUnsupportedError, naming the version and the way out, on torch_xla >= 2.9."""
    version = torch_xla_version()
    if version >= FIRST_RELEASE_WITHOUT_CUDA:
        raise XlaCudaUnsupportedError(
            f"torch_xla {version[0]}.{version[1]} has no XLA:CUDA: its "
            "_xla_register_custom_call_target is a stub (RegisterCustomCall not implemented) and "
            "an XLA tensor on a CUDA PJRT device aborts the process. With this torch_xla, use "
            "xla_gpu_ops.torch_xla_plugin.register_plugin() (the same plugin as the generic "
            'device "GPU"), or torchax / JAX (xla_gpu_ops.torchax, xla_gpu_ops.jax); or run '
            "the pinned stack (torch 2.7.0 + torch_xla 2.7.0 + jax-cuda12-pjrt 0.5.3: "
            "`nox -s xla_cuda`, locks/xla-cuda.txt, or `docker compose run --rm tests-xla-cuda`). "
            "See docs/TORCH_XLA_GPU.md."
        )


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


@functools.cache
def _plugin_api(path: Path) -> _PjrtApiHead:
    # The same path torch_xla dlopens later, so both get the same loaded library. GetPjrtApi only
    # returns a static table: no CUDA call, no GPU needed.
    get_api = ctypes.CDLL(str(path)).GetPjrtApi
    get_api.restype = ctypes.POINTER(_PjrtApiHead)
    return get_api().contents


def plugin_pjrt_api_version(path: Path | None = None) -> tuple[int, int]:
    """PJRT C API (major, minor) the plugin library was built with."""
    version = _plugin_api(path or plugin_library_path()).pjrt_api_version
    return version.major_version, version.minor_version


def plugin_extension_types(path: Path | None = None) -> list[int]:
    """PJRT_Extension_Type of each extension the plugin exposes, in chain order."""
    types: list[int] = []
    address = _plugin_api(path or plugin_library_path()).extension_start
    while address:
        extension = _PjrtExtensionBase.from_address(address)
        types.append(extension.type)
        address = extension.next
    return types


def has_gpu_custom_call_extension(path: Path | None = None) -> bool:
    """Whether the plugin takes custom-call targets (what torch_xla 2.7's registration uses)."""
    return _PJRT_EXTENSION_GPU_CUSTOM_CALL in plugin_extension_types(path)


def check_plugin_matches_torch_xla(path: Path | None = None) -> None:
    """Raise if the plugin's PJRT C API differs from the one the installed torch_xla was built with.

    torch_xla itself only refuses a different major version; a different minor can load and
    then misbehave, so we insist on the exact pair.
    """
    path = path or plugin_library_path()
    version = torch_xla_version()
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
    """The PJRT_Client_Create options of the GPU plugin, from the variables in this module's doc."""
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


# ---------------------------------------------------------------------------- torch_xla plugin
@functools.cache
def _plugin_class() -> type:
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


def make_plugin():
    """A new JaxCudaPlugin (a torch_xla.experimental.plugins.DevicePlugin)."""
    return _plugin_class()()


def register_plugin():
    """Register the plugin as torch_xla's "CUDA" device and select it (PJRT_DEVICE=CUDA).

    Call before the first XLA tensor of the process. Checks first that torch_xla still has
    XLA:CUDA and that the plugin speaks its PJRT C API version. Returns the plugin.
    """
    check_torch_xla_supports_cuda()
    check_plugin_matches_torch_xla()
    import torch_xla
    import torch_xla.runtime as xr
    from torch_xla.experimental import plugins

    if torch_xla._XLAC._xla_runtime_is_initialized() and xr.device_type() != DEVICE_TYPE:
        raise RuntimeError(
            f"register_plugin: the XLA runtime already runs on {xr.device_type()}; register the "
            "CUDA plugin before the first XLA tensor of the process"
        )
    plugin = make_plugin()
    plugins.use_dynamic_plugins()
    plugins.register_plugin(DEVICE_TYPE, plugin)
    xr.set_device_type(DEVICE_TYPE)
    return plugin


# ---------------------------------------------------------------------------- custom-call targets
_registered = False


def register_legacy_targets() -> list[str]:
    """Register every op's legacy target (xla_gpu_<op>_legacy) with the CUDA PJRT plugin.

    torch_xla 2.7 passes the handler to the plugin's GPU custom-call extension as an untyped
    target, called by XLA:GPU for api_version 2 custom calls with the packed config as opaque.
    Needs the runtime on the CUDA plugin (register_plugin() first); registering is per process,
    so a second call does nothing. Returns the registered target names.
    """
    global _registered
    check_torch_xla_supports_cuda()
    import torch_xla
    import torch_xla.runtime as xr

    if xr.device_type() != DEVICE_TYPE:
        raise RuntimeError(
            f"register_legacy_targets: the XLA runtime is on {xr.device_type()!r}, not the CUDA "
            "plugin: call xla_gpu_ops.xla_cuda.register_plugin() before the first XLA tensor "
            "(torch_xla would otherwise register into its own in-process XLA, which never runs them)"
        )
    targets = [op.legacy_target for op in ops.OPS]
    if _registered:
        return targets
    for op in ops.OPS:
        capsule = _library.load().op(op).capsule("cuda_legacy")
        torch_xla._XLAC._xla_register_custom_call_target(op.legacy_target, capsule, DEVICE_TYPE)
    _registered = True
    return targets


def register_custom_call_targets() -> list[str]:
    """What xla_gpu_ops.torch_xla calls before a custom call on a CUDA XLA device."""
    return register_legacy_targets()


# ---------------------------------------------------------------------------- diagnostics
def show_xla_info_logs() -> bool:
    """Send XLA's INFO logs to stderr (torch_xla 2.7 shows WARNING and up only).

    They include the PJRT version negotiation ("The PJRT plugin has PJRT API version 0.67. The
    framework PJRT API version is 0.67."). Returns False where the symbol is absent (torch_xla
    2.9 already logs them).
    """
    import torch_xla

    library = ctypes.CDLL(torch_xla._XLAC.__file__)
    try:
        set_threshold = getattr(library, _ABSL_SET_STDERR_THRESHOLD)
    except AttributeError:
        return False
    set_threshold.argtypes = [ctypes.c_int]
    set_threshold(0)  # absl::LogSeverityAtLeast::kInfo
    return True
