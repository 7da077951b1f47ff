"""The op table (xla_gpu_ops.ops) and the library's own table agree, and everything derived from
the table (schema, argument binding, attribute encoding, public signatures) behaves."""

from __future__ import annotations

import inspect
from pathlib import Path

import numpy as np
import pytest

from xla_gpu_ops import _library, ops

needs_library = pytest.mark.skipif(not _library.is_built(), reason="needs the built library")


@needs_library
@pytest.mark.parametrize("op", ops.OPS, ids=[op.name for op in ops.OPS])
def test_library_names_equal_the_table(op):
    entry = _library.load().op(op)
    assert entry.operand_names == op.operand_names
    assert entry.result_names == op.results
    assert entry.attr_names == op.attr_names
    assert entry.attr_types == tuple(
        _library.ATTR_F32 if a.kind is float else _library.ATTR_I64 for a in op.attrs
    )


@needs_library
def test_every_library_dtype_is_a_torch_and_numpy_dtype():
    """The library's dtype list is the one list: the torch and JAX front ends map its names
    (torch's and numpy's spelling) without a table of their own."""
    torch = pytest.importorskip("torch")
    from xla_gpu_ops._torch import dtype_name, torch_dtype

    names = set(_library.load().dtype_codes)
    assert {"float32", "float16", "bfloat16", "float8_e4m3fn", "int32", "int64"} <= names
    for name in names:
        assert dtype_name(torch_dtype(name)) == name
        if name not in ("bfloat16", "float8_e4m3fn"):  # numpy has these through ml_dtypes
            assert np.dtype(name).name == name
    assert isinstance(torch_dtype("float32"), torch.dtype)
    with pytest.raises(TypeError, match="'no_such' has no torch dtype"):
        torch_dtype("no_such")


@needs_library
@pytest.mark.parametrize("op", ops.OPS, ids=[op.name for op in ops.OPS])
def test_library_rejects_each_wrong_rank_naming_the_operand(op):
    sample = list(op.sample(False).values())
    for i, operand in enumerate(op.operands):
        if operand.rank < 0:  # any rank
            continue
        arrays = list(sample)
        # one dim more, or one fewer where one more is a rank the operand also takes
        arrays[i] = arrays[i][0] if operand.rank + 1 in operand.other_ranks else arrays[i][None]
        call = _library.make_call(
            op,
            [a.shape for a in arrays],
            [a.dtype.name for a in arrays],
            op.encode_attrs(op.sample_attrs),
        )
        with pytest.raises(
            ValueError, match=rf"{op.name}: {operand.name}: expected rank {operand.rank}"
        ):
            _library.describe(op, call)


@needs_library
def test_library_rejects_another_ops_call():
    sample = ops.SIMPLE_ADD.sample(False)
    call = _library.make_call(
        ops.SIMPLE_ADD, [a.shape for a in sample.values()], ["float32", "float32"], ()
    )
    call.op = b"paged_attention"
    with pytest.raises(ValueError, match="describes op 'paged_attention'"):
        _library.describe(ops.SIMPLE_ADD, call)


def test_schema():
    assert (
        ops.PAGED_ATTENTION.schema()
        == (
            "(Tensor query, Tensor kv_cache, Tensor context_lens, Tensor block_tables, "
            "Tensor query_start_loc, Tensor num_seqs, float scale, int? sliding_window=None, "
            "float? soft_cap=None, float? k_scale=None, float? v_scale=None, "
            "str kv_layout='NHD', Tensor? sinks=None, Tensor? k_scales=None, "
            "Tensor? v_scales=None, Tensor? value_cache=None) -> (Tensor, Tensor)"  # out and lse: the op always returns both
        )
    )
    assert ops.SIMPLE_ADD.schema() == "(Tensor a, Tensor b) -> Tensor"
    # in place: the operand is marked mutable and not returned; the functional twin returns it
    # (an optional one too, with an alias set of its own)
    assert ops.KV_CACHE_UPDATE.schema() == (
        "(Tensor new_kv, Tensor slot_mapping, Tensor(a!) kv_cache, float? k_scale=None, "
        "float? v_scale=None, str kv_layout='NHD', Tensor? k_scales=None, "
        "Tensor? v_scales=None, Tensor(b!)? value_cache=None) -> ()"
    )
    assert ops.KV_CACHE_UPDATE.functional_schema() == (
        "(Tensor new_kv, Tensor slot_mapping, Tensor kv_cache, float? k_scale=None, "
        "float? v_scale=None, str kv_layout='NHD', Tensor? k_scales=None, "
        "Tensor? v_scales=None, Tensor? value_cache=None) -> (Tensor, Tensor)"
    )


# paged_attention's attributes, each left out
NO_ATTRS = {
    "scale": None,
    "sliding_window": None,
    "soft_cap": None,
    "k_scale": None,
    "v_scale": None,
    "kv_layout": "NHD",
}


def test_bind():
    op = ops.PAGED_ATTENTION
    operands, attrs = op.bind(
        (1, 2, 3), {"block_tables": 4, "query_start_loc": 5, "num_seqs": 6, "scale": 0.5}
    )
    # sinks, k_scales, v_scales, value_cache: left out
    assert operands == [1, 2, 3, 4, 5, 6, None, None, None, None]
    assert attrs == {
        "scale": 0.5,
        "sliding_window": None,
        "soft_cap": None,
        "k_scale": None,
        "v_scale": None,
        "kv_layout": "NHD",
    }
    # the fast path (required operands positional, the rest by keyword) and the general one
    assert op.bind(range(6), {"scale": 0.5, "sinks": 7}) == (
        [*range(6), 7, None, None, None],
        {**NO_ATTRS, "scale": 0.5},
    )
    with_sinks = [*range(6), 7, None, None, None]
    assert op.bind(range(6), {"scale": 0.5, "sinks": 7, "soft_cap": 2.0})[0] == with_sinks
    assert op.bind([*range(6), 0.5, None, None, None, None, "NHD", 7], {})[0] == with_sinks
    with pytest.raises(TypeError, match="scale: missing"):
        op.bind(range(6), {})
    with pytest.raises(TypeError, match="num_seqs: missing"):
        op.bind(range(5), {"scale": 1.0})
    with pytest.raises(TypeError, match="query: given twice"):
        op.bind(range(6), {"query": 0, "scale": 1.0})
    with pytest.raises(TypeError, match="unexpected argument 'scael'"):
        op.bind(range(6), {"scael": 1.0})


def test_split_schema_args_fills_dropped_defaults():
    op = ops.PAGED_ATTENTION
    assert op.split_schema_args([*range(6), 0.5]) == (
        [*range(6), None, None, None, None],
        {**NO_ATTRS, "scale": 0.5},
    )
    # an optional operand comes after the attributes in the schema, first in nothing else
    operands, attrs = op.split_schema_args([*range(6), 0.5, 3, None, None, None, "HND", "sinks"])
    assert operands == [*range(6), "sinks", None, None, None]
    assert attrs["sliding_window"] == 3
    assert attrs["kv_layout"] == "HND"
    args = [*range(6), 0.5, 3, None, None, None, "HND", "sinks", None, None, None]
    assert op.schema_args(operands, attrs) == args


def test_optional_operands_come_last():
    with pytest.raises(ValueError, match="optional operands must come last"):
        ops.Op(
            name="bad",
            operands=(
                ops.Operand("x", 1, "f", "[n]", optional=True),
                ops.Operand("y", 1, "f", "[n]"),
            ),
            attrs=(),
            results=("out",),
            result_like=("y",),
            doc="",
            sample=ops.SIMPLE_ADD.sample,
        )
    with pytest.raises(TypeError, match=r"takes 6 to 10 operands"):
        ops.PAGED_ATTENTION.complete(range(5))
    assert ops.PAGED_ATTENTION.complete(range(6)) == [*range(6), None, None, None, None]


@pytest.mark.parametrize(
    ("attrs", "error", "match"),
    [
        ({"scale": None}, TypeError, "scale: must be a float, got None"),
        (
            {"scale": np.float32(0.5), "sliding_window": 2.5},
            TypeError,
            "sliding_window: must be an int",
        ),
        ({"scale": "0.5"}, TypeError, "scale: must be a static Python float"),
        ({"scale": float("nan")}, ValueError, "scale: must be finite"),
        ({"scale": 1.0, "soft_cap": 0.0}, ValueError, r"soft_cap: must be > 0 or None"),
        ({"scale": 1.0, "sliding_window": 0}, ValueError, r"sliding_window: must be > 0 or None"),
        ({"scale": 1.0, "sliding_window": True}, TypeError, "sliding_window"),
        ({"scale": 1.0, "kv_layout": "NDH"}, ValueError, "kv_layout: must be one of 'NHD', 'HND'"),
    ],
)
def test_attribute_encoding_rejects(attrs, error, match):
    op = ops.PAGED_ATTENTION
    with pytest.raises(error, match=match):
        op.encode_attrs(
            {"sliding_window": None, "soft_cap": None, "k_scale": None, "v_scale": None, **attrs}
        )


def test_attribute_encoding_turns_none_off():
    op = ops.PAGED_ATTENTION
    encoded = op.encode_attrs(
        {"scale": 2, "sliding_window": None, "soft_cap": None, "k_scale": None, "v_scale": 0.5}
    )
    assert encoded == (2.0, 0, 0.0, 1.0, 0.5, 0)  # kv_layout: its default, "NHD", is 0
    assert op.encode_attrs({"scale": 1.0, "kv_layout": "HND"})[-1] == 1
    assert isinstance(encoded[0], float)


@pytest.mark.parametrize("op", ops.OPS, ids=lambda op: op.name)
def test_public_functions_take_the_signature_of_the_table(op):
    """Required operands positional (keyword-only for a keyword_only op), then keyword-only the
    attributes (their defaults), the optional operands (None) and the front end's extras; the call
    reaches forward already bound."""
    seen = []
    extra = ops.Extra("flag", False, "a front end's own parameter")

    def forward(*args, **kwargs):
        seen.append((args, kwargs))
        return tuple(range(op.returned)) if op.returned > 1 else 0

    fn = ops.public_function(op, forward, [extra])
    params = list(inspect.signature(fn).parameters.values())
    asked = [f"return_{name}" for name in op.on_request]
    assert [p.name for p in params] == [*op.call_names, *asked, "flag"]
    keyword_only = params[op.num_required :]
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in keyword_only)
    positional = params[: op.num_required]
    kind = (
        inspect.Parameter.KEYWORD_ONLY
        if op.keyword_only
        else inspect.Parameter.POSITIONAL_OR_KEYWORD
    )
    assert all(p.kind is kind for p in positional)
    defaults = [a.default for a in op.attrs] + [None] * len(op.optional_names)
    defaults += [False] * len(asked) + [False]
    expected = [inspect.Parameter.empty if d is ops.REQUIRED else d for d in defaults]
    assert [p.default for p in keyword_only] == expected
    assert fn.__name__ == op.name
    assert op.doc.strip().splitlines()[0] in fn.__doc__
    assert all(o.name in fn.__doc__ for o in op.operands)
    assert "flag" in fn.__doc__
    required = {a.name: 1.0 for a in op.attrs if a.default is ops.REQUIRED}
    names = op.operand_names[: op.num_required]
    returned = fn(**dict(zip(names, range(op.num_required), strict=True)), **required, flag=True)
    # results returned on request are left out unless asked for
    main = [i for i, r in enumerate(op.results[: op.returned]) if r not in op.on_request]
    assert returned == (main[0] if len(main) == 1 else tuple(main))
    if asked:
        everything = fn(*range(op.num_required), **required, **dict.fromkeys(asked, True))
        assert everything == tuple(range(op.returned))
    operands, attrs = seen[0][0]
    assert operands == [*range(op.num_required), *[None] * len(op.optional_names)]
    assert attrs == {a.name: required.get(a.name, a.default) for a in op.attrs}
    assert seen[0][1] == {"flag": True}
    with pytest.raises(TypeError):  # an attribute (or, keyword_only, any operand) by position
        fn(*range(op.num_required + (0 if op.keyword_only else 1)), **required)


def test_targets_and_names_derive_from_the_op_name():
    assert ops.PAGED_ATTENTION.ffi_target == "xla_gpu_paged_attention"
    assert ops.PAGED_ATTENTION.legacy_target == "xla_gpu_paged_attention_legacy"
    assert ops.PAGED_ATTENTION.qualname == "xla_gpu::paged_attention"
    with pytest.raises(ValueError, match="op: 'nope' is not one of"):
        ops.get("nope")


def test_a_public_function_without_keyword_parameters_is_made():
    """simple_add has no attribute and no optional operand: with no front-end extra either, its
    function takes the two operands alone."""
    fn = ops.public_function(ops.SIMPLE_ADD, lambda operands, attrs: (operands, attrs))
    assert list(inspect.signature(fn).parameters) == ["a", "b"]
    assert fn(1, 2) == ([1, 2], {})


def _entry(op: ops.Op) -> _library.LibraryOp:
    types = tuple(_library.ATTR_F32 if a.kind is float else _library.ATTR_I64 for a in op.attrs)
    return _library.LibraryOp(None, op.operand_names, op.results, op.attr_names, types)


def test_a_forgotten_piece_is_named_with_the_file_to_write():
    """Every piece an op needs besides its table entry names the file (and function) to write
    when it is missing: the sample, the reference, the C++ registration, the table entry."""
    import dataclasses

    from xla_gpu_ops import reference

    with pytest.raises(TypeError, match=r"no sample: give Op\(sample=...\) in xla_gpu_ops/ops.py"):
        dataclasses.replace(ops.SIMPLE_ADD, name="unwritten", sample=None)
    unwritten = dataclasses.replace(ops.SIMPLE_ADD, name="unwritten")
    with pytest.raises(
        NotImplementedError, match=r"def unwritten\(a, b\)` in xla_gpu_ops/reference"
    ):
        reference.of(unwritten)
    found = {op.name: _entry(op) for op in ops.OPS}
    _library._check_table(Path("lib.so"), found)  # the table as it is: no error
    missing = {name: entry for name, entry in found.items() if name != "simple_add"}
    with pytest.raises(RuntimeError, match=r"kernels/ops/simple_add/ must end with XGO_DEFINE_OP"):
        _library._check_table(Path("lib.so"), missing)
    extra = {**found, "unwritten": _entry(unwritten)}
    with pytest.raises(RuntimeError, match=r"'unwritten', which xla_gpu_ops/ops.py does not list"):
        _library._check_table(Path("lib.so"), extra)
    renamed = {**found, "simple_add": _entry(dataclasses.replace(ops.SIMPLE_ADD, attrs=()))}
    renamed["simple_add"] = dataclasses.replace(renamed["simple_add"], operand_names=("x", "y"))
    with pytest.raises(RuntimeError, match=r"kernels/ops/simple_add/.*xla_gpu_ops/ops.py"):
        _library._check_table(Path("lib.so"), renamed)


@pytest.mark.parametrize("op", ops.OPS, ids=lambda op: op.name)
def test_every_op_of_the_table_has_its_pieces(op):
    """What the front ends look up by the op's name exists: its reference, its composite, the
    public functions of torch and JAX, and the package's export."""
    import xla_gpu_ops
    import xla_gpu_ops.jax as xjax
    from xla_gpu_ops import reference, torch_xla

    assert callable(reference.of(op))
    assert callable(torch_xla.composite_of(op))
    assert getattr(xla_gpu_ops, op.name).__name__ == op.name
    assert op.name in xla_gpu_ops.__all__
    assert getattr(xjax, op.name).__name__ == op.name
    assert op.name in xjax.__all__
    assert set(op.sample(False)) == set(op.operand_names) == set(op.sample(True))
