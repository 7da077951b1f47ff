"""HLO / StableHLO tooling: dump a function's graph under torch_xla, torchax or JAX, and list the
custom calls in it (target, api_version, operand and result shapes).

    from xla_gpu_ops import hlo
    dump = hlo.dump_op("jax", "paged_attention", zeros=True)
    print(hlo.format_table(dump.custom_calls()))
    dump.write("artifacts/hlo/jax")

Shapes are normalised to HLO spelling without layout ("f32[8,4,64]", "s32[1]") whichever text they
were read from. `after_optimizations` holds the optimised module: JAX compiles in process; torch_xla
offers it only through `XLA_FLAGS=--xla_dump_to=DIR`, which must be set before XLA starts, so
`dump_op(..., xla_dump_dir=DIR)` / the CLI set it up in a fresh process (see `collect_xla_dumps`).
Framework modules are imported inside the functions that need them.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from xla_gpu_ops import ops

FRONTENDS = ("torch_xla", "jax", "torchax")
OP_NAMES = tuple(op.name for op in ops.OPS)
# HLO's CustomCallApiVersion names (xla_data.proto); absent in HLO text means ORIGINAL (1).
HLO_API_VERSIONS = {
    "API_VERSION_UNSPECIFIED": 0,
    "API_VERSION_ORIGINAL": 1,
    "API_VERSION_STATUS_RETURNING": 2,
    "API_VERSION_STATUS_RETURNING_UNIFIED": 3,
    "API_VERSION_TYPED_FFI": 4,
}
_MLIR_ELEMENT_TYPES = {
    "i1": "pred",
    "i8": "s8",
    "i16": "s16",
    "i32": "s32",
    "i64": "s64",
    "ui8": "u8",
    "ui16": "u16",
    "ui32": "u32",
    "ui64": "u64",
}


@dataclass(frozen=True)
class CustomCall:
    target: str
    api_version: int
    operand_shapes: tuple[str, ...]
    result_shapes: tuple[str, ...]


# ---------------------------------------------------------------------------- parsing
_HLO_SHAPE = re.compile(r"\b([a-z][a-z0-9]*)\[([0-9,]*)\]")  # f32, bf16, f8e4m3fn, pred
_HLO_INSTRUCTION = re.compile(
    r"^\s*(?:ROOT\s+)?%?(?P<name>[\w.-]+)\s*=\s*(?P<shape>\([^=]*?\)|\S+)\s+[\w-]+\("
)
_HLO_CUSTOM_CALL = re.compile(
    r"=\s*(?P<result>.*?)\s+custom-call\((?P<operands>.*?)\),(?P<attrs>.*)$"
)


def _hlo_shapes(text: str) -> tuple[str, ...]:
    return tuple(f"{dtype}[{dims}]" for dtype, dims in _HLO_SHAPE.findall(text))


def _split_top_level(text: str) -> list[str]:
    """Split 'f32[4,2]{1,0} %a, %b' at the commas outside brackets and braces."""
    parts, depth, current = [], 0, ""
    for char in text:
        depth += (char in "[{(") - (char in "]})")
        if char == "," and depth == 0:
            parts.append(current.strip())
            current = ""
        else:
            current += char
    return [*parts, current.strip()] if current.strip() else parts


def _braced_after(text: str, key: str) -> str | None:
    """The balanced {...} that follows `key` in text, without the outer braces."""
    start = text.find(key + "{")
    if start < 0:
        return None
    start += len(key)
    depth = 0
    for end in range(start, len(text)):
        depth += (text[end] == "{") - (text[end] == "}")
        if depth == 0:
            return text[start + 1 : end]
    return None


def custom_calls_in_hlo(text: str) -> list[CustomCall]:
    """Custom-call instructions of an HLO text module (before or after optimizations).

    Operand shapes come from the operand list where the printer writes them, else from the
    defining instruction (newer printers write bare names).
    """
    shapes = {}
    for line in text.splitlines():
        if (instruction := _HLO_INSTRUCTION.match(line)) is not None:
            shapes[instruction["name"]] = _hlo_shapes(instruction["shape"])
    calls = []
    for line in text.splitlines():
        match = _HLO_CUSTOM_CALL.search(line)
        if match is None:
            continue
        attrs = match["attrs"]
        target = re.search(r'custom_call_target="([^"]*)"', attrs)
        api = re.search(r"api_version=(API_VERSION_[A-Z_]+)", attrs)
        operand_shapes: list[str] = []
        constraints = _braced_after(attrs, "operand_layout_constraints=")
        operand_list = re.sub(r"/\*.*?\*/", "", match["operands"])  # drop /*index=5*/ comments
        for operand in _split_top_level(operand_list) if constraints is None else []:
            written = _hlo_shapes(operand)
            operand_shapes += written or shapes.get(operand.split()[-1].lstrip("%"), ("?",))
        if constraints is not None:  # exact operand shapes, written by JAX's ffi_call
            operand_shapes = list(_hlo_shapes(constraints))
        calls.append(
            CustomCall(
                target=target[1] if target else "",
                api_version=HLO_API_VERSIONS[api[1]] if api else 1,
                operand_shapes=tuple(operand_shapes),
                result_shapes=_hlo_shapes(match["result"]),
            )
        )
    return calls


def _mlir_tensor_to_hlo(tensor_type: str) -> str:
    """'tensor<8x4x64xf32>' -> 'f32[8,4,64]'; 'tensor<f32>' -> 'f32[]'."""
    *dims, element = tensor_type.split("x")
    return f"{_MLIR_ELEMENT_TYPES.get(element, element)}[{','.join(dims)}]"


def _mlir_types(text: str) -> tuple[str, ...]:
    return tuple(_mlir_tensor_to_hlo(t) for t in re.findall(r"tensor<([^>]*)>", text))


_MLIR_CUSTOM_CALL = re.compile(r"stablehlo\.custom_call\"?\s*@?(?P<name>[\w.$-]*)")


def custom_calls_in_stablehlo(text: str) -> list[CustomCall]:
    """stablehlo.custom_call ops of a StableHLO text module (pretty or generic form)."""
    calls = []
    for line in text.splitlines():
        match = _MLIR_CUSTOM_CALL.search(line)
        if match is None:
            continue
        target = match["name"]
        if not target:
            named = re.search(r'call_target_name\s*=\s*"([^"]*)"', line)
            target = named[1] if named else ""
        api = re.search(r"api_version\s*=\s*(\d+)", line)
        # JAX's ffi_call leaves api_version implicit and writes the typed-FFI attribute
        # dictionary as mhlo.backend_config = {...}; that is API_VERSION_TYPED_FFI (4).
        typed_ffi = re.search(r"mhlo\.backend_config\s*=\s*\{", line) is not None
        # The function type closes the line: `: (operand types) -> result type(s)`.
        signature = line.rsplit(" : ", 1)[-1]
        operands, _, results = signature.partition("->")
        calls.append(
            CustomCall(
                target=target,
                api_version=int(api[1]) if api else (4 if typed_ffi else 1),
                operand_shapes=_mlir_types(operands),
                result_shapes=_mlir_types(results),
            )
        )
    return calls


def format_table(calls: Sequence[CustomCall]) -> str:
    rows = [("target", "api", "operands", "results")]
    rows += [
        (c.target, str(c.api_version), " ".join(c.operand_shapes), " ".join(c.result_shapes))
        for c in calls
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(row[:3], widths, strict=True))
        + "  "
        + row[3]
        for row in rows
    )


# ---------------------------------------------------------------------------- dumps
@dataclass
class Dump:
    """What one front end produced for one function."""

    frontend: str
    hlo: str = ""  # HLO text before optimizations
    stablehlo: str = ""
    after_optimizations: str = ""  # optimised HLO text, where available
    xla_dumps: dict[str, str] = field(default_factory=dict)  # file name -> text (--xla_dump_to)
    notes: list[str] = field(default_factory=list)  # e.g. the execution error on XLA:CPU

    def custom_calls(self) -> dict[str, list[CustomCall]]:
        """Custom calls per text: 'hlo', 'stablehlo', 'after_optimizations', then each dump file."""
        found = {
            "hlo": custom_calls_in_hlo(self.hlo),
            "stablehlo": custom_calls_in_stablehlo(self.stablehlo),
            "after_optimizations": custom_calls_in_hlo(self.after_optimizations),
        }
        for name, text in self.xla_dumps.items():
            found[name] = custom_calls_in_hlo(text)
        return found

    def write(self, directory: str | os.PathLike) -> list[Path]:
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        written = []
        texts = {
            "hlo.txt": self.hlo,
            "stablehlo.mlir": self.stablehlo,
            "after_optimizations.txt": self.after_optimizations,
            "notes.txt": "\n".join(self.notes),
        }
        for name, text in texts.items():
            if text:
                (directory / name).write_text(text)
                written.append(directory / name)
        return written


def collect_xla_dumps(directory: str | os.PathLike) -> dict[str, str]:
    """The HLO text files an `XLA_FLAGS=--xla_dump_to=DIR --xla_dump_hlo_as_text` run wrote.

    Keys are file names, e.g. 'module_0001.IrToHlo.25.before_optimizations.txt'.
    """
    directory = Path(directory)
    if not directory.is_dir():
        return {}
    return {
        path.name: path.read_text()
        for path in sorted(directory.glob("*.txt"))
        if path.name.endswith(("before_optimizations.txt", "after_optimizations.txt"))
    }


def xla_dump_flags(directory: str | os.PathLike) -> str:
    """XLA_FLAGS value that dumps every module as text, before and after optimizations."""
    return f"--xla_dump_to={directory} --xla_dump_hlo_as_text"


# ---------------------------------------------------------------------------- sample inputs
def sample_inputs(op: ops.Op | str, zeros: bool = False) -> dict[str, np.ndarray]:
    """Small valid inputs of an op as numpy arrays (framework-neutral), from the op table.

    zeros=True makes every input all zeros, metadata included (for paged_attention num_seqs = 0,
    a valid empty batch): the case where a graph built from constants could be folded into a
    constant.
    """
    return ops.get(op).sample_call(zeros)


# ---------------------------------------------------------------------------- front ends
def dump_torch_xla(fn: Callable[..., Any], args: Sequence[Any], zeros: bool = False) -> Dump:
    """HLO + StableHLO of `fn(*args)` traced lazily on the XLA device (nothing is executed).

    `args` are numpy arrays; zeros=True builds them on the device with torch.zeros so they are
    constants of the graph (the constant-folding case) instead of parameters.
    """
    import torch
    import torch_xla

    device = torch_xla.device()
    if zeros:
        tensors = [torch.zeros(a.shape, dtype=_torch_dtype(a.dtype), device=device) for a in args]
    else:
        tensors = [torch.from_numpy(np.asarray(a)).to(device) for a in args]
    outputs = fn(*tensors)
    outputs = list(outputs) if isinstance(outputs, (tuple, list)) else [outputs]
    return Dump(
        frontend="torch_xla",
        hlo=torch_xla._XLAC._get_xla_tensors_hlo(outputs),
        stablehlo=torch_xla._XLAC._get_stablehlo(outputs, str(device), [], False).decode(),
    )


def _torch_dtype(dtype: np.dtype):
    import torch

    return {np.dtype(np.float32): torch.float32, np.dtype(np.int32): torch.int32}[np.dtype(dtype)]


def dump_jax(fn: Callable[..., Any], args: Sequence[Any], zeros: bool = False) -> Dump:
    """StableHLO, HLO and optimised HLO of `jax.jit(fn)` (compiled, not executed).

    zeros=True bakes the inputs into the graph as constants instead of passing parameters.
    """
    import jax
    import jax.numpy as jnp

    if zeros:
        constants = [np.asarray(a) for a in args]
        lowered = jax.jit(lambda: fn(*[jnp.asarray(c) for c in constants])).lower()
    else:
        lowered = jax.jit(fn).lower(*[jnp.asarray(a) for a in args])
    return Dump(
        frontend="jax",
        hlo=lowered.as_text(dialect="hlo"),
        stablehlo=lowered.as_text(),
        after_optimizations=lowered.compile().as_text(),
    )


def dump_torchax(fn: Callable[..., Any], args: Sequence[Any], zeros: bool = False) -> Dump:
    """`fn` is a torch function; torchax turns it into a JAX function, dumped as in `dump_jax`."""
    import torchax
    import torchax.interop

    from xla_gpu_ops import torchax as xgo_torchax

    xgo_torchax.register()
    env = torchax.default_env()

    def jax_fn(*jax_args):
        with env:
            return torchax.interop.jax_view(fn)(*jax_args)

    dump = dump_jax(jax_fn, args, zeros=zeros)
    dump.frontend = "torchax"
    return dump


_DUMPERS = {"torch_xla": dump_torch_xla, "jax": dump_jax, "torchax": dump_torchax}


def op_function(frontend: str, op: ops.Op | str) -> Callable[..., Any]:
    """A function of the op's tensor inputs that calls the op the way `frontend` users do, with
    the table's sample attributes."""
    op = ops.get(op)
    attrs = dict(op.sample_attrs)
    if frontend == "jax":
        from xla_gpu_ops import jax as xgo_jax

        return lambda *operands: xgo_jax.call(op, operands, attrs)
    import torch

    import xla_gpu_ops._torch_library  # noqa: F401  (defines torch.ops.xla_gpu.*)

    overload = getattr(getattr(torch.ops, ops.NAMESPACE), op.name).default

    def call(*operands):
        outs = overload(*op.schema_args(operands, attrs))
        written = [operands[i] for i in op.aliases.values()]  # in place: the operand is the result
        return written[0] if written and outs is None else outs

    return call


def dump_op(
    frontend: str,
    op: ops.Op | str,
    zeros: bool = False,
    xla_dump_dir: str | os.PathLike | None = None,
) -> Dump:
    """Dump one op under one front end with `sample_inputs`.

    torch_xla: forces the custom-call implementation (XLA_GPU_OPS_XLA_IMPL=custom_call), then, if
    `xla_dump_dir` is given, syncs so XLA compiles the graph and writes its dumps there (XLA_FLAGS
    must already point there, see `xla_dump_flags`); on XLA:CPU execution then fails ("No FFI
    handler registered ... Host"), which is recorded in `notes`, not raised.
    """
    if frontend not in _DUMPERS:
        raise ValueError(f"frontend: {frontend!r} is not one of {FRONTENDS}")
    name = ops.get(op).name
    args = list(sample_inputs(name, zeros=zeros).values())
    # Only the files this call adds: one process may dump several ops into the same folder.
    earlier = set(collect_xla_dumps(xla_dump_dir)) if xla_dump_dir is not None else set()
    if frontend != "torch_xla":
        dump = _DUMPERS[frontend](op_function(frontend, name), args, zeros=zeros)
        if xla_dump_dir is not None:
            dump.xla_dumps = _new_dumps(xla_dump_dir, earlier)
        return dump

    from xla_gpu_ops import torch_xla as xgo_torch_xla

    previous = os.environ.get(xgo_torch_xla.IMPL_ENV)
    os.environ[xgo_torch_xla.IMPL_ENV] = "custom_call"
    try:
        fn = op_function(frontend, name)
        dump = dump_torch_xla(fn, args, zeros=zeros)
        if xla_dump_dir is not None:
            dump.notes.append(_compile_torch_xla(ops.get(op), fn, args, zeros))
            dump.xla_dumps = _new_dumps(xla_dump_dir, earlier)
            after = [
                text
                for file, text in dump.xla_dumps.items()
                if file.endswith("after_optimizations.txt") and custom_calls_in_hlo(text)
            ]
            dump.after_optimizations = after[-1] if after else ""
    finally:
        if previous is None:
            os.environ.pop(xgo_torch_xla.IMPL_ENV, None)
        else:
            os.environ[xgo_torch_xla.IMPL_ENV] = previous
    return dump


def _new_dumps(directory: str | os.PathLike, earlier: set[str]) -> dict[str, str]:
    return {
        name: text for name, text in collect_xla_dumps(directory).items() if name not in earlier
    }


# What XLA says when a compiled graph reaches a custom-call target with no handler on the platform
# (typed FFI in torch_xla 2.9 and 2.7, then legacy).
_NO_HANDLER = ("No FFI handler registered for", "No registered implementation for")


def _compile_torch_xla(op: ops.Op, fn: Callable[..., Any], args: Sequence[Any], zeros: bool) -> str:
    """Trace again and sync, so XLA compiles (and dumps) the graph; returns what happened."""
    import torch
    import torch_xla

    device = torch_xla.device()
    if zeros:
        tensors = [torch.zeros(a.shape, dtype=_torch_dtype(a.dtype), device=device) for a in args]
    else:
        tensors = [torch.from_numpy(np.asarray(a)).to(device) for a in args]
    out = fn(*tensors)
    try:
        torch_xla.sync()
        out.cpu()
    except (RuntimeError, ValueError) as error:
        message = str(error)
        # XLA:CPU has no handler of ours: the graph compiles (the dumps) and stops at our target.
        # That is the expected outcome there, said as such; any other error is a failure.
        if any(s in message for s in _NO_HANDLER) and op.ffi_target in message:
            return f"compiled; not run: no {op.ffi_target} handler on this XLA device (expected off a GPU)"
        return f"execution failed: {message}".strip()
    return "executed"
