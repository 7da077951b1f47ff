"""Loads libxla_gpu_ops.so once and mirrors its C ABI (kernels/include/xla_gpu_ops/c_api.h).

Importing this module needs no framework; the library itself needs no GPU to load.
"""

from __future__ import annotations

import ctypes
import enum
import functools
import os
from pathlib import Path

from xla_gpu_ops._registry import OPS, OpSpec
from xla_gpu_ops._validation import PagedAttentionDims

ABI_VERSION = 1
LIBRARY_ENV = "XLA_GPU_OPS_LIBRARY"  # optional override: path of a libxla_gpu_ops.so to load
_DEFAULT_PATH = Path(__file__).parent / "_lib" / "libxla_gpu_ops.so"


class LibraryNotBuiltError(RuntimeError):
    pass


class XgoStatus(enum.IntEnum):
    OK = 0
    INVALID_ARGUMENT = 1
    CUDA_ERROR = 2


class XgoDtype(enum.IntEnum):
    F32 = 0
    F16 = 1
    BF16 = 2


DTYPE_CODES = {"float32": XgoDtype.F32, "float16": XgoDtype.F16, "bfloat16": XgoDtype.BF16}

SIMPLE_ADD_MAGIC = 0x41475800
PAGED_ATTENTION_MAGIC = 0x41505800
CONFIG_VERSION = 1


class SimpleAddConfig(ctypes.Structure):
    _fields_ = [
        ("magic", ctypes.c_uint32),
        ("version", ctypes.c_uint32),
        ("dtype", ctypes.c_int32),
        ("reserved", ctypes.c_int32),
        ("num_elements", ctypes.c_int64),
    ]


class PagedAttentionConfig(ctypes.Structure):
    _fields_ = [
        ("magic", ctypes.c_uint32),
        ("version", ctypes.c_uint32),
        ("dtype", ctypes.c_int32),
        ("reserved", ctypes.c_int32),
        ("num_tokens", ctypes.c_int64),
        ("num_q_heads", ctypes.c_int64),
        ("num_kv_heads", ctypes.c_int64),
        ("head_dim", ctypes.c_int64),
        ("num_pages", ctypes.c_int64),
        ("page_size", ctypes.c_int64),
        ("max_num_seqs", ctypes.c_int64),
        ("pages_per_seq", ctypes.c_int64),
        ("sliding_window", ctypes.c_int64),
        ("scale", ctypes.c_float),
        ("soft_cap", ctypes.c_float),
    ]


CONFIG_STRUCTS = {"simple_add": SimpleAddConfig, "paged_attention": PagedAttentionConfig}


def simple_add_config(dtype_name: str, num_elements: int) -> SimpleAddConfig:
    """The XgoSimpleAddConfig of a call (launcher argument and legacy opaque)."""
    return SimpleAddConfig(
        magic=SIMPLE_ADD_MAGIC, version=CONFIG_VERSION, dtype=DTYPE_CODES[dtype_name],
        reserved=0, num_elements=num_elements,
    )  # fmt: skip


def paged_attention_config(
    dims: PagedAttentionDims,
    dtype_name: str,
    scale: float,
    sliding_window: int | None,
    soft_cap: float | None,
) -> PagedAttentionConfig:
    """The XgoPagedAttentionConfig of a call: launcher argument, legacy opaque, workspace sizing."""
    return PagedAttentionConfig(
        magic=PAGED_ATTENTION_MAGIC, version=CONFIG_VERSION, dtype=DTYPE_CODES[dtype_name],
        reserved=0, num_tokens=dims.num_tokens, num_q_heads=dims.num_q_heads,
        num_kv_heads=dims.num_kv_heads, head_dim=dims.head_dim, num_pages=dims.num_pages,
        page_size=dims.page_size, max_num_seqs=dims.max_num_seqs,
        pages_per_seq=dims.pages_per_seq, sliding_window=int(sliding_window or 0),
        scale=float(scale), soft_cap=float(soft_cap or 0.0),
    )  # fmt: skip


def library_path() -> Path:
    return Path(os.environ.get(LIBRARY_ENV, _DEFAULT_PATH))


def is_built() -> bool:
    return library_path().is_file()


@functools.cache
def load() -> ctypes.CDLL:
    """The loaded library, with argument types set and its ABI checked against this module."""
    path = library_path()
    if not path.is_file():
        raise LibraryNotBuiltError(
            f"{path} does not exist: build it with `nox -s build` (or set {LIBRARY_ENV})"
        )
    lib = ctypes.CDLL(str(path))
    lib.xla_gpu_ops_abi_version.restype = ctypes.c_int32
    lib.xla_gpu_ops_last_error.restype = ctypes.c_char_p
    lib.xla_gpu_ops_config_size.restype = ctypes.c_int64
    lib.xla_gpu_ops_config_size.argtypes = [ctypes.c_char_p]
    if (found := lib.xla_gpu_ops_abi_version()) != ABI_VERSION:
        raise RuntimeError(f"{path} has ABI version {found}, this package expects {ABI_VERSION}")
    for name, struct in CONFIG_STRUCTS.items():
        size = lib.xla_gpu_ops_config_size(name.encode())
        if size != ctypes.sizeof(struct):
            raise RuntimeError(
                f"{path}: config struct of {name} is {size} bytes, Python mirror {ctypes.sizeof(struct)}"
            )
    lib.xla_gpu_paged_attention_workspace_elems.restype = ctypes.c_int64
    lib.xla_gpu_paged_attention_workspace_elems.argtypes = [ctypes.POINTER(PagedAttentionConfig)]
    for op in OPS:
        launch = getattr(lib, op.launch_symbol)
        launch.restype = ctypes.c_int32
    return lib


def last_error() -> str:
    return load().xla_gpu_ops_last_error().decode(errors="replace")


def check_status(status: int, what: str) -> None:
    """Turn a launcher's XgoStatus into the matching Python exception."""
    if status == XgoStatus.OK:
        return
    message = f"{what}: {last_error()}"
    if status == XgoStatus.INVALID_ARGUMENT:
        raise ValueError(message)
    raise RuntimeError(message)


def symbol_address(name: str) -> int:
    return ctypes.cast(getattr(load(), name), ctypes.c_void_p).value


def ffi_capsule(op: OpSpec, variant: str):
    """A PyCapsule of one handler symbol (variant: cuda_ffi, host_ffi, cuda_legacy), for XLA registration."""
    symbol = getattr(op, f"{variant}_symbol")
    pycapsule_new = ctypes.pythonapi.PyCapsule_New
    pycapsule_new.restype = ctypes.py_object
    pycapsule_new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
    return pycapsule_new(symbol_address(symbol), None, None)


def paged_attention_workspace_elems(config: PagedAttentionConfig) -> int:
    elems = load().xla_gpu_paged_attention_workspace_elems(ctypes.byref(config))
    if elems < 0:
        raise ValueError(f"paged_attention: {last_error()}")
    return int(elems)
