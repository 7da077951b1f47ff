"""torch_xla on XLA:CUDA (the pinned legacy stack, locks/xla-cuda.txt): JAX's CUDA PJRT plugin as
torch_xla's "CUDA" device, and this library's legacy custom-call targets registered into it.

torch_xla 2.7 is the last release that runs XLA:CUDA, and its own CUDA plugin wheel was never
published. XLA's stock GPU PJRT plugin is the same program, shipped by JAX as `jax-cuda12-pjrt`;
0.5.3 speaks PJRT C API 0.67, torch_xla 2.7's. torch_xla 2.7 registers custom-call targets through
the plugin's GPU custom-call extension, which takes untyped (legacy, api_version 2) handlers only,
so on this stack the ops run as `xla_gpu_<op>_legacy` calls (xla_gpu_ops.torch_xla picks that ABI).

    from xla_gpu_ops import xla_cuda
    xla_cuda.register_plugin()            # before the first XLA tensor: PJRT_DEVICE=CUDA
    xla_cuda.register_legacy_targets()    # after it; xla_gpu_ops.torch_xla registers on demand

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

The plumbing both routes share (the plugin library, its PJRT_Api table and version, the client
options, the torch_xla DevicePlugin, target registration) is xla_gpu_ops._pjrt_plugin; this module
adds what is 2.7's own: the release check, the "CUDA" device and XLA's INFO logs. Importing it
needs no framework.
"""

from __future__ import annotations

import ctypes

from xla_gpu_ops import _pjrt_plugin, _torch_xla_version

# Part of this route's interface (docs/TORCH_XLA_GPU.md): the PJRT C API the plugin speaks.
from xla_gpu_ops._pjrt_plugin import plugin_pjrt_api_version as plugin_pjrt_api_version

DEVICE_TYPE = _pjrt_plugin.CUDA_DEVICE_TYPE  # torch_xla's PJRT_DEVICE name for this plugin

_ABSL_SET_STDERR_THRESHOLD = (  # absl::SetStderrThreshold in torch_xla 2.7's _XLAC (absl LTS 2023-08-02)
    "_ZN4absl12lts_2023080218SetStderrThresholdENS0_18LogSeverityAtLeastE"
)


class XlaCudaUnsupportedError(RuntimeError):
    """The installed torch_xla has no XLA:CUDA."""


# ---------------------------------------------------------------------------- versions
def check_torch_xla_supports_cuda() -> None:
    """Raise XlaCudaUnsupportedError, naming the version and the way out, on torch_xla >= 2.9."""
    version = _torch_xla_version.torch_xla_version()
    if version >= _torch_xla_version.FIRST_RELEASE_WITHOUT_CUDA:
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


# ---------------------------------------------------------------------------- torch_xla plugin
def make_plugin():
    """A new JaxCudaPlugin (a torch_xla.experimental.plugins.DevicePlugin)."""
    return _pjrt_plugin.device_plugin_class()()


def register_plugin():
    """Register the plugin as torch_xla's "CUDA" device and select it (PJRT_DEVICE=CUDA).

    Call before the first XLA tensor of the process. Checks first that torch_xla still has
    XLA:CUDA and that the plugin speaks its PJRT C API version. Returns the plugin.
    """
    check_torch_xla_supports_cuda()
    _pjrt_plugin.check_plugin_matches_torch_xla()
    _pjrt_plugin.check_runtime_not_started(DEVICE_TYPE)
    plugin = make_plugin()
    _pjrt_plugin.select_device_plugin(DEVICE_TYPE, plugin)
    return plugin


# ---------------------------------------------------------------------------- custom-call targets
def register_legacy_targets() -> list[str]:
    """Register every op's legacy target (xla_gpu_<op>_legacy) with the CUDA PJRT plugin.

    torch_xla 2.7 passes the handler to the plugin's GPU custom-call extension as an untyped
    target, called by XLA:GPU for api_version 2 custom calls with the packed config as opaque.
    Needs the runtime on the CUDA plugin (register_plugin() first); registering is per process,
    so a second call does nothing. Returns the registered target names.
    """
    check_torch_xla_supports_cuda()
    return _pjrt_plugin.register_legacy_targets()


def register_custom_call_targets() -> list[str]:
    """register_legacy_targets(), under the name the 2.9 route's registration has too."""
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
