"""The paged_attention plan: one function (MakePagedAttentionPlan) picks each call's kernel path
from its static shapes and the device's facts, and sizes the workspace from the shapes alone.
Runs on the CPU through the library's plan hook, which plans for a described device instead of
asking one."""

from __future__ import annotations

import ctypes

import pytest

from xla_gpu_ops import _library, ops

pytestmark = [
    pytest.mark.kernels,
    pytest.mark.skipif(not _library.is_built(), reason="needs the built library"),
]

# AttentionPath's values (kernels/ops/paged_attention/plan.h)
PATHS = {0: "f32_fma", 1: "decode_mma", 2: "prefill_mma", 3: "rows_mma", 4: "prefill_sm90"}
AUTO, MMA, SM90 = -1, 0, 1  # xgo_debug_force_prefill_kernel's values
ATTRS = {"scale": 0.1, "sliding_window": None, "soft_cap": None, "k_scale": None, "v_scale": None}


def paged_call(
    num_tokens,
    max_num_seqs,
    head_dim=128,
    dtype="bfloat16",
    kv_dtype=None,
    num_q_heads=32,
    num_kv_heads=8,
    page_size=16,
    pages_per_seq=512,
    sliding_window=None,
):
    """(XgoCall, workspace elements Describe reports) of a call of these static shapes."""
    shapes = [
        (num_tokens, num_q_heads, head_dim),
        (max_num_seqs * pages_per_seq, page_size, 2 * num_kv_heads, head_dim),
        (max_num_seqs,),
        (max_num_seqs, pages_per_seq),
        (max_num_seqs + 1,),
        (1,),
        (0,),  # no sinks
        (0,),  # no k_scales
        (0,),  # no v_scales
        (0,),  # no value_cache: K and V interleaved
    ]
    dtypes = [dtype, kv_dtype or dtype, "int32", "int32", "int32", "int32"] + ["float32"] * 4
    attrs = {**ATTRS, "sliding_window": sliding_window}
    call, results = _library.describe_call(ops.PAGED_ATTENTION, shapes, dtypes, attrs)
    workspace = results[-1]  # after out and lse
    assert workspace.dtype == "float32"
    return call, workspace.shape[0]


def plan(call, sm90_prefill: bool, prefill_kernel: int = AUTO) -> tuple[str, int]:
    """(path, workspace elements) of the plan for a device that runs the sm_90a prefill kernel or
    not, with a prefill kernel forced or not."""
    lib = _library.load()
    hook = lib.cdll.xgo_debug_paged_attention_plan
    hook.restype = ctypes.c_int32
    hook.argtypes = [
        ctypes.POINTER(_library.XgoCall),
        ctypes.c_int32,
        ctypes.c_int32,
        ctypes.POINTER(ctypes.c_int32),
        ctypes.POINTER(ctypes.c_int64),
    ]
    path, workspace = ctypes.c_int32(-1), ctypes.c_int64(-1)
    status = hook(
        ctypes.byref(call),
        int(sm90_prefill),
        prefill_kernel,
        ctypes.byref(path),
        ctypes.byref(workspace),
    )
    lib.raise_for_status(status)
    return PATHS[path.value], workspace.value


# (sm90_prefill, prefill_kernel): devices without and with the sm_90a kernel, each with the
# plan's choice, mma.sync forced and sm_90a forced.
DEVICES = [(False, AUTO), (False, MMA), (False, SM90), (True, AUTO), (True, MMA), (True, SM90)]
PM, PS, RM = "prefill_mma", "prefill_sm90", "rows_mma"

# (case, call shapes, expected path per DEVICES entry)
CASES = [
    ("f32", dict(num_tokens=4096, max_num_seqs=2, dtype="float32"), ["f32_fma"] * 6),
    ("decode", dict(num_tokens=32, max_num_seqs=32), ["decode_mma"] * 6),
    ("decode_d256", dict(num_tokens=64, max_num_seqs=32, head_dim=256), ["decode_mma"] * 6),
    # One split, and no short sequence can sit beside 4096 tokens per slot: no short region.
    ("prefill_d128", dict(num_tokens=8192, max_num_seqs=2), [PM, PM, PM, PS, PM, PS]),
    ("prefill_d64", dict(num_tokens=8192, max_num_seqs=2, head_dim=64), [PM, PM, PM, PS, PM, PS]),
    # 64-row tiles off Hopper
    ("prefill_d256", dict(num_tokens=8192, max_num_seqs=2, head_dim=256), [RM, RM, RM, PS, RM, PS]),
    # An fp8 cache: 64-row tiles off Hopper, the sm_90a kernel on it (also with a short region).
    (
        "prefill_fp8",
        dict(num_tokens=8192, max_num_seqs=2, kv_dtype="float8_e4m3fn"),
        [RM, RM, RM, PS, RM, PS],
    ),
    (
        "prefill_fp8_d256",
        dict(num_tokens=8192, max_num_seqs=2, head_dim=256, kv_dtype="float8_e4m3fn"),
        [RM, RM, RM, PS, RM, PS],
    ),
    (
        "mixed_fp8",
        dict(num_tokens=54 * 64, max_num_seqs=64, kv_dtype="float8_e4m3fn"),
        [RM, RM, RM, PS, RM, PS],
    ),
    # A short region: mma.sync unless mostly prefill (256 tokens per sequence slot) or forced.
    ("mixed", dict(num_tokens=54 * 64, max_num_seqs=64), [PM, PM, PM, PM, PM, PS]),
    ("below_mostly_prefill", dict(num_tokens=255 * 64, max_num_seqs=64), [PM, PM, PM, PM, PM, PS]),
    ("mostly_prefill", dict(num_tokens=256 * 64, max_num_seqs=64), [PM, PM, PM, PS, PM, PS]),
]


@pytest.mark.parametrize(("shapes", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_plan_picks_the_path_for_the_device(shapes, expected):
    call, described = paged_call(**shapes)
    got = [plan(call, sm90, kernel) for sm90, kernel in DEVICES]
    assert [path for path, _ in got] == expected
    # The workspace depends on the shapes only: Describe sizes it without a device.
    assert {workspace for _, workspace in got} == {described}


def test_plan_hook_runs_the_static_checks():
    shapes = [(8, 4, 72), (4, 16, 2, 72), (2,), (2, 2), (3,), (1,), (0,), (0,), (0,), (0,)]
    call = _library.make_call(
        ops.PAGED_ATTENTION,
        shapes,
        ["bfloat16", "bfloat16", "int32", "int32", "int32", "int32"] + ["float32"] * 4,
        ops.PAGED_ATTENTION.encode_attrs(ATTRS),
    )
    with pytest.raises(ValueError, match="head_dim must be a multiple of 16 up to 256"):
        plan(call, True)


def test_a_sliding_window_bounds_the_decode_splits():
    """A decode block under a window reads at most window + its tokens - 1 keys from a tile edge:
    B32 x 8k decode (Hq 32 / Hkv 8: 4 heads and 4 tokens a block, 320 blocks) takes 26 splits
    without a window, 4 with a window of 128 (128 + 3 + 63 keys over 64-key tiles); each split
    holds a softmax state (2 floats) and a 128-float output per token and head. Prefill plans
    keep their splits."""
    call, plain = paged_call(num_tokens=32, max_num_seqs=32)
    windowed_call, windowed = paged_call(num_tokens=32, max_num_seqs=32, sliding_window=128)
    assert plan(call, True) == ("decode_mma", plain)
    assert plan(windowed_call, True) == ("decode_mma", windowed)
    assert plain - windowed == (26 - 4) * 32 * 32 * (2 + 128)
    _, long_window = paged_call(num_tokens=32, max_num_seqs=32, sliding_window=8192)
    assert long_window == plain
    _, widest = paged_call(num_tokens=32, max_num_seqs=32, sliding_window=2**63 - 1)
    assert widest == plain  # no overflow on the way
    _, prefill = paged_call(num_tokens=8192, max_num_seqs=2)
    assert paged_call(num_tokens=8192, max_num_seqs=2, sliding_window=128)[1] == prefill
