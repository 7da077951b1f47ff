"""The installed torch_xla release, and the release where the GPU route and the custom-call ABI
change. Private; imports no framework (the version is read from the installed distribution).

Before 2.9 torch_xla has XLA:CUDA (2.7 is the last release built for it: xla_gpu_ops.xla_cuda)
and registers custom-call targets through the PJRT GPU custom-call extension, which takes legacy
(untyped) handlers only, so the calls use the legacy ABI. From 2.9 on XLA:CUDA is gone and the
GPU runs as the generic plugin device of xla_gpu_ops.torch_xla_plugin, with typed FFI calls.
"""

from __future__ import annotations

import functools
import importlib.metadata

# The first torch_xla without XLA:CUDA: its _xla_register_custom_call_target is a stub and
# XLATensorImpl aborts on a CUDA device (torch_xla/csrc/tensor_impl.cpp).
FIRST_RELEASE_WITHOUT_CUDA = (2, 9)


@functools.cache
def torch_xla_version() -> tuple[int, int]:
    """(major, minor) of the installed torch_xla, read without importing it."""
    major, minor, *_ = importlib.metadata.version("torch_xla").split(".")
    return int(major), int(minor)
