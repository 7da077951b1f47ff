"""Loads libxla_gpu_ops.so once and reads its op table (kernels/include/xla_gpu_ops/c_api.h).

The library's table names each op's operands, results and attributes and holds its entry
points; `load()` checks it against xla_gpu_ops.ops, so Python and C++ cannot disagree on an
op's signature. Front ends describe a call with `make_call` (an XgoCall: operand shapes and
dtypes, attribute values) and then ask the library for its static checks and result shapes
(`describe`), run it (`LibraryOp.launch`), or hand its XLA handlers to a runtime (`capsule`).

Importing this module needs no framework; the library itself needs no GPU to load.
"""

from __future__ import annotations

import ctypes
import functools
import os
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from xla_gpu_ops import ops
from xla_gpu_ops.ops import Op

ABI_VERSION = 3
LIBRARY_ENV = "XLA_GPU_OPS_LIBRARY"  # optional override: path of a libxla_gpu_ops.so to load
_DEFAULT_PATH = Path(__file__).parent / "_lib" / "libxla_gpu_ops.so"

# Sizes of the XgoCall arrays (c_api.h); `load` compares the struct sizes with the library's.
MAX_RANK, MAX_OPERANDS, MAX_RESULTS, MAX_ATTRS, MAX_OP_NAME = 8, 12, 4, 12, 32
CALL_MAGIC = 0x4C4C4358
STATUS_OK, STATUS_INVALID_ARGUMENT, STATUS_CUDA_ERROR, STATUS_INVALID_DTYPE = 0, 1, 2, 3
ATTR_F32, ATTR_I64 = 0, 1


class LibraryNotBuiltError(RuntimeError):
    pass


class XgoShape(ctypes.Structure):
    _fields_ = [
        ("dtype", ctypes.c_int32),
        ("rank", ctypes.c_int32),
        ("dims", ctypes.c_int64 * MAX_RANK),
    ]


class XgoAttrValue(ctypes.Union):
    _fields_ = [("f64", ctypes.c_double), ("i64", ctypes.c_int64)]


class XgoCall(ctypes.Structure):
    _fields_ = [
        ("magic", ctypes.c_uint32),
        ("abi_version", ctypes.c_uint32),
        ("op", ctypes.c_char * MAX_OP_NAME),
        ("num_operands", ctypes.c_int32),
        ("num_attrs", ctypes.c_int32),
        ("operands", XgoShape * MAX_OPERANDS),
        ("attrs", XgoAttrValue * MAX_ATTRS),
    ]


class XgoResults(ctypes.Structure):
    _fields_ = [
        ("num_results", ctypes.c_int32),
        ("reserved", ctypes.c_int32),
        ("results", XgoShape * MAX_RESULTS),
    ]


_DESCRIBE = ctypes.CFUNCTYPE(ctypes.c_int32, ctypes.POINTER(XgoCall), ctypes.POINTER(XgoResults))
_LAUNCH = ctypes.CFUNCTYPE(ctypes.c_int32, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p)
_CHECK = ctypes.CFUNCTYPE(ctypes.c_int32, ctypes.c_void_p, ctypes.c_void_p)


class XgoOpInfo(ctypes.Structure):
    _fields_ = [
        ("name", ctypes.c_char_p),
        ("num_operands", ctypes.c_int32),
        ("num_results", ctypes.c_int32),
        ("num_attrs", ctypes.c_int32),
        ("reserved", ctypes.c_int32),
        ("operand_names", ctypes.POINTER(ctypes.c_char_p)),
        ("result_names", ctypes.POINTER(ctypes.c_char_p)),
        ("attr_names", ctypes.POINTER(ctypes.c_char_p)),
        ("attr_types", ctypes.POINTER(ctypes.c_int32)),
        ("describe", _DESCRIBE),
        ("launch", _LAUNCH),
        ("check_host_values", _CHECK),
        ("cuda_ffi_handler", ctypes.c_void_p),
        ("host_ffi_handler", ctypes.c_void_p),
        ("cuda_legacy_handler", ctypes.c_void_p),
    ]


@dataclass(frozen=True)
class ResultSpec:
    shape: tuple[int, ...]
    dtype: str  # "float32", ...


@dataclass(frozen=True)
class LibraryOp:
    """One op's entries in the loaded library."""

    info: XgoOpInfo
    operand_names: tuple[str, ...]
    result_names: tuple[str, ...]
    attr_names: tuple[str, ...]
    attr_types: tuple[int, ...]

    @property
    def launch(self):
        """launch(call address, packed buffer pointers, stream) -> status (c_api.h)."""
        return self.info.launch

    def capsule(self, handler: str):
        """A PyCapsule of a handler (cuda_ffi, host_ffi, cuda_legacy), for XLA registration."""
        address = getattr(self.info, f"{handler}_handler")
        pycapsule_new = ctypes.pythonapi.PyCapsule_New
        pycapsule_new.restype = ctypes.py_object
        pycapsule_new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
        return pycapsule_new(address, None, None)


@dataclass(frozen=True)
class Library:
    path: Path
    cdll: ctypes.CDLL
    ops: dict[str, LibraryOp]
    dtype_codes: dict[str, int]  # "bfloat16" -> code, from the library's own list
    dtype_names: dict[int, str]  # the inverse

    def op(self, op: Op | str) -> LibraryOp:
        return self.ops[ops.get(op).name]

    def last_error(self) -> str:
        return self.cdll.xla_gpu_ops_last_error().decode(errors="replace")

    def raise_for_status(self, status: int, what: str = "") -> None:
        """The library's status as the matching Python exception, with its message."""
        if status == STATUS_OK:
            return
        message = self.last_error() + (f" ({what})" if what else "")
        if status == STATUS_INVALID_DTYPE:
            raise TypeError(message)
        if status == STATUS_INVALID_ARGUMENT:
            raise ValueError(message)
        raise RuntimeError(message)


def library_path() -> Path:
    return Path(os.environ.get(LIBRARY_ENV, _DEFAULT_PATH))


def is_built() -> bool:
    return library_path().is_file()


def _names(pointer, count: int) -> tuple[str, ...]:
    return tuple(pointer[i].decode() for i in range(count))


@functools.cache
def load() -> Library:
    """The loaded library, its ABI and op table checked against this package."""
    path = library_path()
    if not path.is_file():
        raise LibraryNotBuiltError(
            f"{path} does not exist: build it with `nox -s build` or `pip install .` "
            f"(or set {LIBRARY_ENV})"
        )
    cdll = ctypes.CDLL(str(path))
    cdll.xla_gpu_ops_abi_version.restype = ctypes.c_int32
    if (found := cdll.xla_gpu_ops_abi_version()) != ABI_VERSION:
        raise RuntimeError(f"{path} has ABI version {found}, this package expects {ABI_VERSION}")
    cdll.xla_gpu_ops_last_error.restype = ctypes.c_char_p
    cdll.xla_gpu_ops_dtype_name.restype = ctypes.c_char_p
    cdll.xla_gpu_ops_dtype_name.argtypes = [ctypes.c_int32]
    cdll.xla_gpu_ops_sizeof.restype = ctypes.c_int64
    cdll.xla_gpu_ops_sizeof.argtypes = [ctypes.c_char_p]
    for struct_type in (XgoCall, XgoResults, XgoOpInfo):
        size = cdll.xla_gpu_ops_sizeof(struct_type.__name__.encode())
        if size != ctypes.sizeof(struct_type):
            raise RuntimeError(
                f"{path}: {struct_type.__name__} is {size} bytes, the Python mirror "
                f"{ctypes.sizeof(struct_type)}: library and package are from different versions"
            )
    dtype_codes = {}
    for code in range(64):
        if (name := cdll.xla_gpu_ops_dtype_name(code)) is not None:
            dtype_codes[name.decode()] = code
    cdll.xla_gpu_ops_ops.restype = ctypes.POINTER(ctypes.POINTER(XgoOpInfo))
    cdll.xla_gpu_ops_ops.argtypes = [ctypes.POINTER(ctypes.c_int32)]
    count = ctypes.c_int32()
    table = cdll.xla_gpu_ops_ops(ctypes.byref(count))
    found_ops = {}
    for i in range(count.value):
        info = table[i].contents
        name = info.name.decode()
        entry = LibraryOp(
            info=info,
            operand_names=_names(info.operand_names, info.num_operands),
            result_names=_names(info.result_names, info.num_results),
            attr_names=_names(info.attr_names, info.num_attrs),
            attr_types=tuple(info.attr_types[a] for a in range(info.num_attrs)),
        )
        found_ops[name] = entry
    _check_table(path, found_ops)
    dtype_names = {code: name for name, code in dtype_codes.items()}
    return Library(
        path=path, cdll=cdll, ops=found_ops, dtype_codes=dtype_codes, dtype_names=dtype_names
    )


def _check_table(path: Path, found: dict[str, LibraryOp]) -> None:
    """The library's op table must be xla_gpu_ops.ops' table: same ops, names and types. The
    message names the file to fix."""
    for name in sorted(set(ops.BY_NAME) - set(found)):
        raise RuntimeError(
            f"{path}: has no op {name!r}, which xla_gpu_ops/ops.py lists: kernels/ops/{name}/ "
            f"must end with XGO_DEFINE_OP (then rebuild: nox -s build)"
        )
    for name in sorted(set(found) - set(ops.BY_NAME)):
        raise RuntimeError(
            f"{path}: has op {name!r}, which xla_gpu_ops/ops.py does not list: add its Op to OPS "
            "there (or rebuild the library: nox -s build)"
        )
    for name, entry in found.items():
        op = ops.BY_NAME[name]
        expected = (
            op.operand_names,
            op.results,
            op.attr_names,
            tuple(ATTR_F32 if a.kind is float else ATTR_I64 for a in op.attrs),
        )
        actual = (entry.operand_names, entry.result_names, entry.attr_names, entry.attr_types)
        if actual != expected:
            raise RuntimeError(
                f"{path}: {name} is (operands, results, attributes, attribute types) {actual} in "
                f"the library (kernels/ops/{name}/), {expected} in xla_gpu_ops/ops.py: make them "
                "agree (then rebuild: nox -s build)"
            )


def make_call(
    op: ops.Op,
    shapes: Sequence[Sequence[int]],
    dtypes: Sequence[str],
    attr_values: Sequence[float | int],
) -> XgoCall:
    """The XgoCall of one call: operand shapes and dtype names in table order, attribute values
    as `Op.encode_attrs` gives them. A dtype outside the library's list is a TypeError here;
    whether an operand takes a listed dtype is the library's check (`describe`)."""
    lib = load()
    for operand, dtype in zip(op.operands, dtypes, strict=True):
        if dtype not in lib.dtype_codes:
            raise TypeError(
                f"{op.name}: {operand.name}: dtype {dtype} is not one the library knows "
                f"({', '.join(lib.dtype_codes)})"
            )
    call = XgoCall(
        magic=CALL_MAGIC,
        abi_version=ABI_VERSION,
        op=op.name.encode(),
        num_operands=len(shapes),
        num_attrs=len(attr_values),
    )
    for i, (shape, dtype) in enumerate(zip(shapes, dtypes, strict=True)):
        if len(shape) > MAX_RANK:
            raise ValueError(f"{op.name}: {op.operands[i].name}: rank {len(shape)} is too large")
        target = call.operands[i]
        target.dtype = lib.dtype_codes[dtype]
        target.rank = len(shape)
        for d, size in enumerate(shape):
            target.dims[d] = int(size)
    for a, (attr, value) in enumerate(zip(op.attrs, attr_values, strict=True)):
        if attr.kind is float:
            call.attrs[a].f64 = float(value)
        else:
            call.attrs[a].i64 = int(value)
    return call


def describe(op: ops.Op, call: XgoCall) -> list[ResultSpec]:
    """The library's static checks of `call` (raising TypeError / ValueError naming the argument)
    and its result shapes."""
    lib = load()
    results = XgoResults()
    lib.raise_for_status(lib.op(op).info.describe(ctypes.byref(call), ctypes.byref(results)))
    return [
        ResultSpec(tuple(r.dims[d] for d in range(r.rank)), lib.dtype_names[r.dtype])
        for r in results.results[: results.num_results]
    ]


def describe_call(
    op: ops.Op,
    shapes: Sequence[Sequence[int]],
    dtypes: Sequence[str],
    attrs: Mapping[str, Any],
) -> tuple[XgoCall, list[ResultSpec]]:
    """What every front end does first: encode the attributes (TypeError / ValueError naming
    them), describe the call, and let the library check it and size its results."""
    call = make_call(op, shapes, dtypes, op.encode_attrs(attrs))
    return call, describe(op, call)


def check_host_values(op: ops.Op, call: XgoCall, host_pointers: Sequence[int | None]) -> None:
    """The library's value checks (e.g. paged_attention's metadata) on host memory."""
    lib = load()
    pointers = (ctypes.c_void_p * len(host_pointers))(*host_pointers)
    lib.raise_for_status(lib.op(op).info.check_host_values(ctypes.byref(call), pointers))


def pointer_packer(count: int):
    """pack(*addresses) -> bytes holding `count` pointers: the buffers argument of a launch."""
    return struct.Struct(f"{count}Q").pack
