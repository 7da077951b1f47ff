"""The op table (xla_gpu_ops.ops) and the library's own table agree, and everything derived from
the table (schema, argument binding, attribute encoding, public signatures) behaves."""

from __future__ import annotations

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
        arrays[i] = arrays[i][None]
        call = _library.make_call(
            op, [a.shape for a in arrays], [a.dtype.name for a in arrays],
            op.encode_attrs(op.sample_attrs),
        )  # fmt: skip
        with pytest.raises(
            ValueError, match=rf"{op.name}: {operand.name}: expected rank {operand.rank}"
        ):
            _library.describe(op, call)


@needs_library
def test_library_rejects_another_ops_call():
    sample = ops.SIMPLE_ADD.sample(False)
    call = _library.make_call(ops.SIMPLE_ADD, [a.shape for a in sample.values()],
                              ["float32", "float32"], ())  # fmt: skip
    call.op = b"paged_attention"
    with pytest.raises(ValueError, match="describes op 'paged_attention'"):
        _library.describe(ops.SIMPLE_ADD, call)


def test_schema():
    assert ops.PAGED_ATTENTION.schema() == (
        "(Tensor query, Tensor kv_cache, Tensor context_lens, Tensor block_tables, "
        "Tensor query_start_loc, Tensor num_seqs, float scale, int? sliding_window=None, "
        "float? soft_cap=None, float? k_scale=None, float? v_scale=None, Tensor? sinks=None) -> Tensor"
    )
    assert ops.SIMPLE_ADD.schema() == "(Tensor a, Tensor b) -> Tensor"
    # in place: the operand is marked mutable and not returned; the functional twin returns it
    assert ops.KV_CACHE_UPDATE.schema() == (
        "(Tensor new_kv, Tensor slot_mapping, Tensor(a!) kv_cache, float? k_scale=None, "
        "float? v_scale=None) -> ()"
    )
    assert ops.KV_CACHE_UPDATE.functional_schema() == (
        "(Tensor new_kv, Tensor slot_mapping, Tensor kv_cache, float? k_scale=None, "
        "float? v_scale=None) -> Tensor"
    )


def test_bind():
    op = ops.PAGED_ATTENTION
    operands, attrs = op.bind((1, 2, 3), {"block_tables": 4, "query_start_loc": 5,
                                          "num_seqs": 6, "scale": 0.5})  # fmt: skip
    assert operands == [1, 2, 3, 4, 5, 6, None]  # sinks, optional, left out
    assert attrs == {"scale": 0.5, "sliding_window": None, "soft_cap": None, "k_scale": None,
                     "v_scale": None}  # fmt: skip
    # the fast path (required operands positional, the rest by keyword) and the general one
    assert op.bind(range(6), {"scale": 0.5, "sinks": 7}) == (
        [*range(6), 7], {"scale": 0.5, "sliding_window": None, "soft_cap": None, "k_scale": None,
                         "v_scale": None},
    )  # fmt: skip
    assert op.bind(range(6), {"scale": 0.5, "sinks": 7, "soft_cap": 2.0})[0] == [*range(6), 7]
    assert op.bind([*range(6), 0.5, None, None, None, None, 7], {})[0] == [*range(6), 7]
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
        [*range(6), None],
        {"scale": 0.5, "sliding_window": None, "soft_cap": None, "k_scale": None, "v_scale": None},
    )
    # an optional operand comes after the attributes in the schema, first in nothing else
    operands, attrs = op.split_schema_args([*range(6), 0.5, 3, None, None, None, "sinks"])
    assert operands == [*range(6), "sinks"]
    assert attrs["sliding_window"] == 3
    assert op.schema_args(operands, attrs) == [*range(6), 0.5, 3, None, None, None, "sinks"]


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
        )
    with pytest.raises(TypeError, match=r"takes 6 to 7 operands"):
        ops.PAGED_ATTENTION.complete(range(5))
    assert ops.PAGED_ATTENTION.complete(range(6)) == [*range(6), None]


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
    ],
)
def test_attribute_encoding_rejects(attrs, error, match):
    op = ops.PAGED_ATTENTION
    with pytest.raises(error, match=match):
        op.encode_attrs({"sliding_window": None, "soft_cap": None, "k_scale": None,
                         "v_scale": None, **attrs})  # fmt: skip


def test_attribute_encoding_turns_none_off():
    op = ops.PAGED_ATTENTION
    encoded = op.encode_attrs({"scale": 2, "sliding_window": None, "soft_cap": None,
                               "k_scale": None, "v_scale": 0.5})  # fmt: skip
    assert encoded == (2.0, 0, 0.0, 1.0, 0.5)
    assert isinstance(encoded[0], float)


def test_public_signature_must_match_the_table():
    def wrong(query, kv_cache, *, scale):  # too few operands
        """x"""

    with pytest.raises(TypeError, match="parameters"):
        ops.public_signature(ops.PAGED_ATTENTION)(wrong)

    def positional_attr(a, b, validate):  # an extra that is not keyword-only is fine, order matters
        """x"""

    ops.public_signature(ops.SIMPLE_ADD, extra=("validate",))(positional_attr)

    def attr_not_keyword_only(query, kv_cache, context_lens, block_tables, query_start_loc,
                              num_seqs, scale, *, sliding_window=None, soft_cap=None,
                              k_scale=None, v_scale=None, sinks=None):  # fmt: skip
        """x"""

    with pytest.raises(TypeError, match="scale must be keyword-only"):
        ops.public_signature(ops.PAGED_ATTENTION)(attr_not_keyword_only)

    def optional_operand_with_a_default(query, kv_cache, context_lens, block_tables,
                                        query_start_loc, num_seqs, *, scale, sliding_window=None,
                                        soft_cap=None, k_scale=None, v_scale=None, sinks=0):  # fmt: skip
        """x"""

    with pytest.raises(TypeError, match="sinks must be keyword-only, default None"):
        ops.public_signature(ops.PAGED_ATTENTION)(optional_operand_with_a_default)


def test_targets_and_names_derive_from_the_op_name():
    assert ops.PAGED_ATTENTION.ffi_target == "xla_gpu_paged_attention"
    assert ops.PAGED_ATTENTION.legacy_target == "xla_gpu_paged_attention_legacy"
    assert ops.PAGED_ATTENTION.qualname == "xla_gpu::paged_attention"
    with pytest.raises(ValueError, match="op: 'nope' is not one of"):
        ops.get("nope")
