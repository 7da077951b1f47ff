"""The benchmark's variant rows (fp8 KV cache, attention sinks, sliding window: gpt-oss's shapes;
speculative decoding's verify rows) and the peers that take or refuse them, on the CPU: the cases'
shapes, bytes and FLOPs, their inputs, what ours and each FlashInfer peer are given (its wrappers'
and XQA's calls, recorded by a stand-in for the flashinfer module; its window; XQA's limits; its
JIT modules), why a peer says it is not applicable, and the verdicts of the speculative-decoding
rows on made-up timings. Neither a GPU nor FlashInfer is needed.
"""

from __future__ import annotations

import dataclasses

import pytest

torch = pytest.importorskip("torch", reason="the harness builds inputs with torch")

from benchmarks import case_runner, flashinfer_peer, peers, report  # noqa: E402
from benchmarks.cases import (  # noqa: E402
    ANCHOR,
    FP8,
    GPT_OSS_WINDOW,
    K_SCALE,
    SPEC_DECODE,
    SPEC_Q_LENS,
    V_SCALE,
    Case,
    all_cases,
    build_inputs,
    decode_case,
    dequantise_kv,
    fp8_cases,
    fp8_copy,
    gpt_oss_cases,
    mixed_case,
    op_attributes,
    op_operands,
    prefill_case,
    quantise_kv,
    rel_l2,
    select_cases,
    smoke_cases,
    spec_decode_cases,
    spec_twin,
)


def _by_name(cases):
    return {case.name: case for case in cases}


def test_a_name_does_not_pick_a_variant_with_its_plain_row():
    """`--cases NAME` selects by substring: a variant's tag sits after the head dim, not at the
    end, so no variant's name holds another case's, and no other name holds a variant's."""
    for pool in (all_cases(quick=False), smoke_cases()):
        for case in pool:
            others = [c for c in select_cases(pool, [case.name]) if c != case]
            assert not any(c.features for c in others), (case.name, others)
            if case.features:
                assert others == [], case.name


def test_fp8_rows_mirror_the_16_bit_ones():
    full = _by_name(all_cases(quick=False))
    for name in (
        "decode_B32_ctx4k_h32-8_d128_p16",
        "prefill_B8_len2k_h32-8_d128_p16",
        "prefill_B1_len8k_h32-8_d128_p16",
        "mixed_4prefill_60decode_h32-8_d128_p16",
    ):
        wide, fp8 = full[name], full[name.replace("_p16", "_fp8_p16")]
        assert (
            dataclasses.replace(wide, name=fp8.name, kv_dtype=FP8, slow_peers=fp8.slow_peers) == fp8
        )
        assert fp8.kv_fp8
        assert fp8.features == ("an fp8 KV cache",)
        assert fp8.kv_token_bytes * 2 == wide.kv_token_bytes  # one byte a value
        q_out = 2 * wide.num_tokens * wide.num_q_heads * wide.head_dim * 2  # 16-bit q and out
        kv = sum(ctx for _, ctx in wide.seqs) * fp8.kv_token_bytes
        assert fp8.bytes_needed() == wide.bytes_needed() - kv  # the KV bytes halve, nothing else
        assert fp8.bytes_needed() - kv - q_out < 1e6  # metadata
        assert fp8.flops() == wide.flops()
        assert fp8.params()["kv_dtype"] == FP8
    assert "kv_dtype" not in full[ANCHOR].params()  # a plain row's record stays as it was
    assert full["decode_B32_ctx4k_h32-8_d128_fp8_p16"].slow_peers is False  # not the anchor
    assert fp8_cases()[0].name in _by_name(all_cases(quick=True))  # the fp8 anchor


@pytest.mark.parametrize("window", [None, GPT_OSS_WINDOW])
def test_gpt_oss_rows(window):
    """Hq 64 / Hkv 8, D 64, sinks; decode B32 x 4k, prefill B8 x 2k, the mixed batch."""
    rows = gpt_oss_cases(window)
    assert [c.kind for c in rows] == ["decode", "prefill", "mixed"]
    tail = "_sinks" + (f"_w{window}" if window else "")
    for case in rows:
        assert (case.num_q_heads, case.num_kv_heads, case.head_dim) == (64, 8, 64)
        assert case.sinks
        assert case.sliding_window == window
        assert case.name.endswith(f"_h64-8_d64{tail}_p16"), case.name
        assert case.params()["sinks"] is True
        assert case.params().get("sliding_window") == window
    decode, prefill, mixed = rows
    assert decode.seqs == ((1, 4096),) * 32
    assert prefill.seqs == ((2048, 2048),) * 8
    assert mixed.seqs == mixed_case().seqs  # the plain mixed batch's sequences
    assert set(_by_name(rows)) <= set(_by_name(all_cases(quick=False)))


def test_a_window_cuts_the_bytes_and_the_flops_of_what_it_hides():
    full, window = gpt_oss_cases(None), gpt_oss_cases(GPT_OSS_WINDOW)
    decode_full, decode_window = full[0], window[0]
    kv_token = 2 * 8 * 64 * 2
    assert decode_full.bytes_needed() - decode_window.bytes_needed() == 32 * (4096 - 128) * kv_token
    assert decode_window.flops() * 32 == decode_full.flops()  # 128 of 4096 keys
    # a prefill reads every key (the last query sees the newest 128, the first the oldest)
    assert full[1].bytes_needed() == window[1].bytes_needed()
    # FLOPs: every (query, key) pair the mask keeps, counted one by one on small sequences
    for q_len, ctx, w in ((5, 5, 3), (7, 20, 4), (1, 9, 16), (6, 6, 6), (3, 10, None)):
        case = Case("c", "mixed", ((q_len, ctx),), 2, 1, 16, sliding_window=w)
        pairs = sum(
            1
            for r in range(q_len)
            for k in range(ctx)
            if k <= ctx - q_len + r and (w is None or k > ctx - q_len + r - w)
        )
        assert case.flops() == 4 * pairs * 2 * 16, (q_len, ctx, w)
        assert case.visible_keys(q_len, ctx) == len(
            {
                k
                for r in range(q_len)
                for k in range(ctx)
                if k <= ctx - q_len + r and (w is None or k > ctx - q_len + r - w)
            }
        )
    # the decode floor target follows the keys read, not the context
    record = {"params": {**decode_window.params(), "context_max": 4096}}
    assert report.decode_target(record) == 0.75
    assert report.decode_target({"params": decode_full.params()}) == 0.92


def test_variant_inputs_and_what_ours_is_given():
    plain = decode_case(2, 40, (4, 2), head_dim=64)
    fp8 = decode_case(2, 40, (4, 2), head_dim=64, kv_dtype=FP8)
    first = build_inputs(fp8, "cpu", seed=1)
    # the fp8 row's cache is the 16-bit row's, quantised as the fp8 probe and tool do
    quantised, exact = fp8_copy(build_inputs(plain, "cpu", seed=1))
    assert first["kv_cache"].dtype == torch.float8_e4m3fn
    assert torch.equal(first["kv_cache"].view(torch.uint8), quantised["kv_cache"].view(torch.uint8))
    assert torch.equal(first["query"], quantised["query"])
    # the scales are powers of two: the 16-bit twin holds exactly what the fp8 cache means
    back = quantise_kv(exact["kv_cache"])
    assert torch.equal(back.view(torch.uint8), first["kv_cache"].view(torch.uint8))
    assert torch.equal(exact["kv_cache"], dequantise_kv(first["kv_cache"], torch.bfloat16))
    assert "sinks" not in first
    assert op_attributes(fp8) == {
        "scale": 64**-0.5,
        "sliding_window": None,
        "k_scale": K_SCALE,
        "v_scale": V_SCALE,
    }
    sinks = mixed_case((4, 2), 64, sinks=True, sliding_window=8)
    sinks = dataclasses.replace(sinks, seqs=((9, 9), (1, 30)))
    inputs = build_inputs(sinks, "cpu", seed=1)
    meta = {k: v for k, v in inputs.items() if k not in ("query", "kv_cache")}
    again = build_inputs(sinks, "cpu", seed=2, metadata=meta)
    assert inputs["sinks"].shape == (4,)
    assert inputs["sinks"].dtype == torch.float32
    assert again["sinks"] is inputs["sinks"]  # one set of sinks for every copy
    assert inputs["kv_cache"].dtype == torch.bfloat16
    assert op_attributes(sinks) == {"scale": 64**-0.5, "sliding_window": 8}
    assert list(op_operands(inputs)) == [
        "query",
        "kv_cache",
        "context_lens",
        "block_tables",
        "query_start_loc",
        "num_seqs",
        "sinks",
    ]
    assert "sinks" not in op_operands(first)


def test_peers_say_why_they_do_not_take_a_variant():
    env = peers.BenchEnv(False)
    fp8 = decode_case(2, 40, (4, 2), head_dim=64, kv_dtype=FP8)
    sinks = decode_case(2, 40, (4, 2), head_dim=64, sinks=True, sliding_window=8)
    expected = {
        ("torch_sdpa_contiguous", sinks): "SDPA has no sink logit",
        ("torch_gather_sdpa", fp8): "SDPA reads no fp8",
        ("torch_gather_sdpa", sinks): "SDPA takes a window only as an explicit mask",
        ("torch_flex_paged", fp8): "cannot take an fp8 KV cache",
        ("jax_pallas_paged", sinks): "cannot take attention sinks; cannot take a sliding window",
        ("jax_composite", fp8): "cannot take an fp8 KV cache",
    }
    specs = {spec.name: spec for spec in peers.IMPLS}
    for (name, case), reason in expected.items():
        copies = [build_inputs(case, "cpu", seed=1)]
        with pytest.raises(peers.NotApplicable, match=reason):
            specs[name].prepare(env, case, copies)
    # SDPA on contiguous K/V takes the fp8 row: it reads the values the cache stands for
    runner = specs["torch_sdpa_contiguous"].prepare(env, fp8, [build_inputs(fp8, "cpu", seed=1)])
    assert "dequantised to bfloat16" in runner.notes
    assert runner.output().shape == (2, 4, 64)


def test_flashinfer_peers_and_their_modules():
    assert [s.name for s in peers.IMPLS if s.name.startswith("flashinfer")] == [
        "flashinfer_decode",
        "flashinfer_xqa",
        "flashinfer_prefill",
    ]
    window, plain = gpt_oss_cases(GPT_OSS_WINDOW)[0], gpt_oss_cases(None)[0]
    # ours: keys p > pos - w are visible, w of them; FlashInfer: pos - p <= window_left
    assert flashinfer_peer.window_left(window) == GPT_OSS_WINDOW - 1
    assert flashinfer_peer.window_left(plain) == -1
    # XQA compiles page size and group into its kernel; the tensor-core decode does not
    xqa = flashinfer_peer.module_key("flashinfer_xqa", window)
    assert xqa == ("flashinfer_xqa", "bfloat16", "bfloat16", 64, True, True, 16, 8)
    assert flashinfer_peer.module_key("flashinfer_decode", window)[-2:] == (True, True)
    assert flashinfer_peer.module_key("flashinfer_prefill", window) is None  # a decode row
    # every module is built from a one-page case that picks the same module
    for impl, small in flashinfer_peer.modules_needed(all_cases(quick=False)):
        assert small.batch == 1
        assert small.seqs[0][1] == small.page_size
        source = next(c for c in all_cases(quick=False) if small.name == f"one page of {c.name}")
        assert flashinfer_peer.module_key(impl, small) == flashinfer_peer.module_key(impl, source)
    assert not flashinfer_peer.modules_needed(all_cases(quick=True), set(flashinfer_peer.PEERS))
    # each fp8 row and each sink / window variant has its module
    keys = {
        flashinfer_peer.module_key(i, s)
        for i, s in flashinfer_peer.modules_needed(all_cases(quick=False))
    }
    for impl in flashinfer_peer.PEERS:
        for case in (*fp8_cases(), *gpt_oss_cases(None), *gpt_oss_cases(GPT_OSS_WINDOW)):
            key = flashinfer_peer.module_key(impl, case)
            assert key is None or key in keys, (impl, case.name)


def test_xqa_takes_every_decode_row_and_says_what_it_cannot():
    for case in all_cases(quick=False):
        if case.kind == "decode":
            assert flashinfer_peer.xqa_unsupported(case) is None, case.name
    anchor = decode_case(32, 4096, (32, 8))
    for change, words in (
        ({"dtype": "float32"}, "float16 or bfloat16 queries"),
        ({"page_size": 8}, "pages of 16 / 32 / 64 / 128 tokens, not 8"),
        ({"head_dim": 72}, "multiple of 16 up to 256, not 72"),
        ({"head_dim": 512}, "not 512"),
    ):
        case = dataclasses.replace(anchor, **change)
        assert words in flashinfer_peer.xqa_unsupported(case)
        assert flashinfer_peer.module_key("flashinfer_xqa", case) is None
        with pytest.raises(peers.NotApplicable, match=words.split(",")[0]):
            flashinfer_peer.prepare_xqa(peers.BenchEnv(False), case, [])
    assert flashinfer_peer.module_key("flashinfer_xqa", prefill_case(8, 2048)) is None


def test_xqa_on_an_fp8_cache_is_checked_with_its_own_tolerance():
    """XQA multiplies in fp8 on an fp8 cache: a 5e-2 difference from ours passes there only."""
    fp8, wide = fp8_cases()[0], decode_case(32, 4096, (32, 8))
    ours = torch.ones(8, 4, 16)
    theirs = ours * (1 + 5e-2)
    outputs = {"xgo_torch": ours, "flashinfer_decode": ours, "flashinfer_xqa": theirs}
    record = {"impls": {name: {"status": "ok"} for name in outputs}}
    for case, verdict in ((fp8, "ok"), (wide, "MISMATCH")):
        cross = case_runner.cross_check(
            record, outputs, lambda peer, case=case: case_runner._tolerance(case, peer)
        )
        assert cross["against"]["flashinfer_xqa"]["check"] == verdict
        assert cross["against"]["flashinfer_decode"]["check"] == "ok"
    text = report._cross_text({"cross_check": cross})
    assert text.startswith("FI ok 0e+00, XQA MISMATCH 5e-02")
    assert report._column("flashinfer_xqa") == "flashinfer_xqa"  # a column of its own
    assert report._column("flashinfer_prefill") == "flashinfer"


class _Recorder:
    """A stand-in for the flashinfer module: records each wrapper's construction, plan and run,
    and each XQA call, as (what, args, kwargs)."""

    def __init__(self):
        self.calls = []
        self.decode = type("decode", (), {"xqa_batch_decode_with_kv_cache": self._xqa})

    def _xqa(self, *args, **kwargs):
        self.calls.append(("xqa", args, kwargs))
        return kwargs["out"]

    def __getattr__(self, wrapper_name):
        recorder = self

        class Wrapper:
            def __init__(self, *args, **kwargs):
                recorder.calls.append((wrapper_name, args, kwargs))

            def plan(self, *args, **kwargs):
                recorder.calls.append(("plan", args, kwargs))

            def run(self, *args, **kwargs):
                recorder.calls.append(("run", args, kwargs))
                return kwargs["out"]

        return Wrapper


@pytest.fixture
def fake_flashinfer(monkeypatch):
    recorder = _Recorder()
    monkeypatch.setattr(flashinfer_peer, "_flashinfer", lambda env: recorder)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (9, 0))  # a Hopper
    monkeypatch.setattr(flashinfer_peer, "WORKSPACE_BYTES", 1024)
    monkeypatch.setattr(flashinfer_peer, "XQA_WORKSPACE_BYTES", 1024)
    return recorder


def _called(recorder, impl, case):
    """Prepare `impl` on the case, make its first call; {what: (args, kwargs)} it called."""
    copies = [build_inputs(case, "cpu", seed=1)]
    recorder.calls.clear()
    flashinfer_peer.PEERS[impl][1](peers.BenchEnv(False), case, copies).calls[0]()
    return {what: (args, kwargs) for what, args, kwargs in recorder.calls}, copies[0]


def test_flashinfer_calls_for_the_fp8_cache(fake_flashinfer):
    fp8 = decode_case(2, 40, (4, 2), head_dim=64, kv_dtype=FP8)
    scale = 64**-0.5
    called, inputs = _called(fake_flashinfer, "flashinfer_decode", fp8)
    _, kwargs = called["BatchDecodeWithPagedKVCacheWrapper"]
    assert kwargs == {"use_tensor_cores": True}
    _, plan = called["plan"]
    assert plan == {
        "q_data_type": torch.bfloat16,
        "kv_data_type": torch.float8_e4m3fn,
        "sm_scale": scale,
        "window_left": -1,
    }
    (_, (k, _)), run = called["run"]
    assert run["k_scale"] == K_SCALE
    assert run["v_scale"] == V_SCALE
    assert k.data_ptr() == inputs["kv_cache"].data_ptr()  # views of our cache
    assert k.dtype == torch.float8_e4m3fn
    # prefill: FA2 (FA3 reads fp8 K/V only with an fp8 query), the same scales
    prefill = prefill_case(2, 32, 64, heads=(4, 2), kv_dtype=FP8)
    called, _ = _called(fake_flashinfer, "flashinfer_prefill", prefill)
    assert called["BatchPrefillWithPagedKVCacheWrapper"][1] == {"backend": "fa2"}
    assert called["plan"][1]["causal"] is True
    assert called["run"][1]["k_scale"] == K_SCALE
    # XQA: logits x bmm1_scale, out x bmm2_scale
    called, inputs = _called(fake_flashinfer, "flashinfer_xqa", fp8)
    (_, (k, _), workspace, tables, lens, longest), xqa = called["xqa"]
    assert k.data_ptr() == inputs["kv_cache"].data_ptr()
    assert xqa["bmm1_scale"] == pytest.approx(scale * K_SCALE)
    assert xqa["bmm2_scale"] == V_SCALE
    assert xqa["window_left"] == -1
    assert xqa["sinks"] is None
    assert xqa["kv_layout"] == "NHD"
    assert tables is inputs["block_tables"]
    assert lens is inputs["context_lens"]
    assert longest == 40
    assert workspace.dtype == torch.uint8
    assert not workspace.any()  # zeroed before its first use


def test_flashinfer_calls_for_gpt_oss(fake_flashinfer):
    decode, prefill, _ = gpt_oss_cases(GPT_OSS_WINDOW)
    decode = dataclasses.replace(decode, seqs=((1, 300),) * 2)  # small, longer than the window
    prefill = dataclasses.replace(prefill, seqs=((200, 200),) * 2)
    for impl, case, backend in (
        ("flashinfer_decode", decode, "fa2"),
        ("flashinfer_prefill", prefill, "fa3"),
    ):
        called, inputs = _called(fake_flashinfer, impl, case)
        _, made = called["BatchAttentionWithAttentionSinkWrapper"]  # the sink variant
        assert made == {
            "backend": backend,
            "q_data_type": torch.bfloat16,
            "kv_data_type": torch.bfloat16,
            "head_dim_qk": 64,
            "head_dim_vo": 64,
            "window_left": GPT_OSS_WINDOW - 1,
        }
        assert called["plan"][1]["window_left"] == GPT_OSS_WINDOW - 1
        (_, _, sinks, scale), run = called["run"]
        assert sinks is inputs["sinks"]
        assert scale == 64**-0.5
        assert "k_scale" not in run
    called, inputs = _called(fake_flashinfer, "flashinfer_xqa", decode)
    xqa = called["xqa"][1]
    assert xqa["sinks"] is inputs["sinks"]
    assert xqa["window_left"] == GPT_OSS_WINDOW - 1
    assert xqa["bmm1_scale"] == 64**-0.5
    assert xqa["bmm2_scale"] == 1.0


# ------------------------------------------------------------------------------ speculative decoding
def test_spec_decode_rows_are_the_anchor_and_gpt_oss_verifying_2_4_8_tokens():
    rows = spec_decode_cases()
    full, quick = _by_name(all_cases(quick=False)), _by_name(all_cases(quick=True))
    assert [c.name for c in rows] == [
        f"decode_B32_ctx4k_{shape}_q{q}_p16"
        for shape in ("h32-8_d128", "h64-8_d64_sinks")
        for q in SPEC_Q_LENS
    ]
    assert SPEC_Q_LENS == (2, 4, 8)
    for case in rows:
        q_len = case.seqs[0][0]
        assert case.kind == SPEC_DECODE
        assert case.seqs == ((q_len, 4096),) * 32
        assert case.num_tokens == 32 * q_len
        assert not case.slow_peers  # not the anchor: the slow peers stay on their rows
        assert case.name in full
        # its q_len 1 twin: the same shape and variant, one query per sequence
        twin = full[spec_twin(case.name)]
        assert twin.kind == "decode"
        same = {
            "name": twin.name,
            "kind": "decode",
            "seqs": twin.seqs,
            "slow_peers": twin.slow_peers,
        }
        assert dataclasses.replace(case, **same) == twin
        assert set(select_cases(all_cases(quick=False), [twin.name])) == {twin}
    anchor_rows, gpt_oss_rows = rows[:3], rows[3:]

    def shape(c):
        return (c.num_q_heads, c.num_kv_heads, c.head_dim, c.page_size, c.dtype, c.features)

    assert {shape(c) for c in anchor_rows} == {(32, 8, 128, 16, "bfloat16", ())}
    assert {spec_twin(c.name) for c in anchor_rows} == {ANCHOR}
    # gpt-oss's full-attention layers: sinks, no window
    assert {shape(c) for c in gpt_oss_rows} == {(64, 8, 64, 16, "bfloat16", ("attention sinks",))}
    assert {spec_twin(c.name) for c in gpt_oss_rows} == {gpt_oss_cases(None)[0].name}
    # --quick: one spec row, the anchor's q_len 4, beside its twin
    assert [c.name for c in quick.values() if c.kind == SPEC_DECODE] == [anchor_rows[1].name]
    assert ANCHOR in quick
    # the CPU smoke run has one, so every spec-decode code path runs without a GPU
    (smoke,) = [c for c in smoke_cases() if c.kind == SPEC_DECODE]
    assert smoke.name == "smoke_decode_B4_ctx100_h4-2_d64_q4_p16"
    assert smoke.seqs == ((4, 100),) * 4
    assert spec_twin(smoke.name) in _by_name(smoke_cases())


def _pairs(q_len: int, ctx: int, window: int | None = None) -> int:
    """(query, key) pairs the causal mask keeps, counted one by one."""
    return sum(
        1
        for r in range(q_len)
        for k in range(ctx)
        if k <= ctx - q_len + r and (window is None or k > ctx - q_len + r - window)
    )


def test_spec_decode_bytes_and_flops():
    """The verify step reads each cached key once, like its q_len 1 twin; it adds q and out rows,
    and FLOPs for the causal pairs: row r of q_len sees ctx - q_len + r + 1 keys."""
    full = _by_name(all_cases(quick=False))
    for case in spec_decode_cases():
        twin = full[spec_twin(case.name)]
        q_len, ctx = case.seqs[0]
        hq, d = case.num_q_heads, case.head_dim
        kv = 32 * ctx * 2 * case.num_kv_heads * d * 2
        q_out = 2 * 32 * q_len * hq * d * 2
        metadata = 4 * (case.num_pages_used + 2 * 32 + 2)
        sinks = 4 * hq if case.sinks else 0
        assert case.bytes_needed() == kv + q_out + metadata + sinks, case.name
        assert case.bytes_needed() - twin.bytes_needed() == 2 * 32 * (q_len - 1) * hq * d * 2
        pairs = q_len * (ctx - q_len) + q_len * (q_len + 1) // 2
        assert case.flops() == 4 * 32 * pairs * hq * d, case.name
        # bound by bandwidth even at q_len 8: an H200's bf16 ridge is ~180 FLOPs a byte (790
        # TFLOP/s over 4.4 TB/s); these rows do under q_len x Hq / Hkv FLOPs a KV byte
        assert case.flops() / case.bytes_needed() < q_len * hq / case.num_kv_heads <= 64
    # small shapes, counted one by one, with and without a window
    for q_len, ctx, window in ((2, 9, None), (4, 100, None), (8, 20, None), (4, 30, 8), (8, 40, 3)):
        case = dataclasses.replace(
            decode_case(3, ctx, (4, 2), head_dim=16, q_len=q_len), sliding_window=window
        )
        assert case.flops() == 4 * 3 * _pairs(q_len, ctx, window) * 4 * 16, (q_len, ctx, window)
        keys = ctx if window is None else min(ctx, q_len - 1 + window)
        assert case.visible_keys(q_len, ctx) == keys


def test_spec_decode_peers_take_or_refuse_it():
    """SDPA (contiguous and gathered) matches the reference with its lower-right causal mask (the
    top-left one of is_causal would not); the one-query peers say why not."""
    env = peers.BenchEnv(False)
    case = decode_case(3, 45, (4, 2), head_dim=64, q_len=4)
    copies = [build_inputs(case, "cpu", seed=2)]
    specs = {spec.name: spec for spec in peers.IMPLS}
    expected = specs["reference"].prepare(env, case, copies).output()
    assert expected.shape == (12, 4, 64)
    for name in ("torch_sdpa_contiguous", "torch_gather_sdpa"):
        runner = specs[name].prepare(env, case, copies)
        assert rel_l2(runner.output(), expected) < 2e-2, name
    assert (
        "lower-right causal bias" in specs["torch_sdpa_contiguous"].prepare(env, case, copies).notes
    )
    q4 = copies[0]["query"].view(3, 4, 4, 64).transpose(1, 2).float()
    k, v = peers._gather_kv(case, copies[0], copies[0]["block_tables"][:, :3].long(), 3)
    top_left = torch.nn.functional.scaled_dot_product_attention(
        q4, k.float(), v.float(), is_causal=True, scale=64**-0.5, enable_gqa=True
    )
    assert rel_l2(peers._canon_dense(top_left, case), expected) > 0.1
    # a ragged batch of such rows (the gather's per-sequence path) too
    ragged = dataclasses.replace(case, seqs=((4, 45), (2, 30), (3, 3)))
    copies = [build_inputs(ragged, "cpu", seed=2)]
    out = specs["torch_gather_sdpa"].prepare(env, ragged, copies).output()
    assert rel_l2(out, specs["reference"].prepare(env, ragged, copies).output()) < 2e-2
    for name, words in (
        ("torch_flex_paged", "one query token per sequence"),
        ("jax_pallas_paged", "Pallas' paged_attention takes q"),
        ("jax_composite", "one-query decode program"),
    ):
        assert SPEC_DECODE in specs[name].kinds
        with pytest.raises(peers.NotApplicable, match=words):
            specs[name].prepare(env, case, [build_inputs(case, "cpu", seed=2)])
    for spec in peers.IMPLS:  # every paged implementation is listed, so a refusal says why
        if "decode" in spec.kinds:
            assert SPEC_DECODE in spec.kinds, spec.name


def test_flashinfer_calls_for_spec_decoding(fake_flashinfer):
    """The prefill wrapper (causal, ragged qo_indptr) and XQA's speculative decoding (q_len_per_req,
    a causal mask over the new tokens) run the verify rows; the decode wrapper says why not."""
    case = decode_case(2, 40, (4, 2), head_dim=64, q_len=4)
    with pytest.raises(peers.NotApplicable, match="one query token per request"):
        _called(fake_flashinfer, "flashinfer_decode", case)
    called, _ = _called(fake_flashinfer, "flashinfer_prefill", case)
    assert called["BatchPrefillWithPagedKVCacheWrapper"][1] == {"backend": "fa3"}
    (qo_indptr, *_), plan = called["plan"]
    assert qo_indptr.tolist() == [0, 4, 8]
    assert plan["causal"] is True
    called, _ = _called(fake_flashinfer, "flashinfer_xqa", case)
    (q, *_, longest), xqa = called["xqa"]
    assert q.shape == (8, 4, 64)
    assert longest == 40
    assert xqa["q_len_per_req"] == 4
    mask = xqa["mask"]
    assert mask.dtype == torch.uint16
    assert mask.shape == (2, 4, 2)  # [batch, q_len, 2 * ceil(q_len / 32)]
    # row i sees new tokens 0..i: bits 0..i of its first 32-bit word
    assert mask.view(torch.int32)[:, :, 0].tolist() == [[1, 3, 7, 15]] * 2
    word = flashinfer_peer.xqa_spec_mask(1, 32, "cpu").view(torch.int32)[0, :, 0]
    assert word[31].item() == -1  # all 32 bits
    assert word[7].item() == 255
    # a plain decode row calls XQA as before: no speculative-decoding arguments
    called, _ = _called(fake_flashinfer, "flashinfer_xqa", decode_case(2, 40, (4, 2), head_dim=64))
    assert "q_len_per_req" not in called["xqa"][1]
    assert "mask" not in called["xqa"][1]


def test_flashinfer_modules_of_the_spec_rows():
    """XQA compiles the q_len into its module: one per spec row; the prefill wrapper's module is the
    prefill rows' (same dtype, head dim, sinks); the decode wrapper loads none for them."""
    rows = spec_decode_cases()
    for case in rows:
        q_len = case.seqs[0][0]
        twin = decode_case(
            32, 4096, (case.num_q_heads, case.num_kv_heads), case.head_dim, sinks=case.sinks
        )
        xqa = flashinfer_peer.module_key("flashinfer_xqa", case)
        assert xqa == (*flashinfer_peer.module_key("flashinfer_xqa", twin), q_len)
        assert flashinfer_peer.module_key("flashinfer_decode", case) is None
        prefill = prefill_case(
            8, 2048, case.head_dim, (case.num_q_heads, case.num_kv_heads), sinks=case.sinks
        )
        assert flashinfer_peer.module_key("flashinfer_prefill", case) == (
            flashinfer_peer.module_key("flashinfer_prefill", prefill)
        )
    keys = {
        flashinfer_peer.module_key(i, s)
        for i, s in flashinfer_peer.modules_needed(all_cases(quick=False))
    }
    without = {
        flashinfer_peer.module_key(i, s)
        for i, s in flashinfer_peer.modules_needed(
            [c for c in all_cases(quick=False) if c.kind != SPEC_DECODE]
        )
    }
    assert len(keys - without) == len(rows)  # one XQA module per row, nothing else new
    ragged = dataclasses.replace(rows[0], seqs=((2, 4096), (4, 4096)))
    assert "one q_len for every request" in flashinfer_peer.xqa_unsupported(ragged)


def _spec_record(name, kind, q_len, us, repeat=None, **peer_us):
    entry = {"role": "ours", "status": "ok", "median_us": us, "p10_us": us, "p90_us": us}
    if repeat is not None:
        entry["median_us_repeat"] = repeat
    impls = {"xgo_torch": entry}
    for peer, value in peer_us.items():  # a time, or (status, reason)
        if isinstance(value, float):
            impls[peer] = {"role": "peer", "status": "ok", "median_us": value}
        else:
            impls[peer] = {"role": "peer", "status": value[0], "reason": value[1]}
    params = {"batch": 32, "num_tokens": 32 * q_len, "head_dim": 128, "context_max": 4096}
    return {"name": name, "kind": kind, "floor_us": 100.0, "params": params, "impls": impls}


def _spec_verdicts(cases):
    results = {"env": {"gpu": {"name": "NVIDIA H200"}}, "cases": cases, "ceilings": {}}
    return {
        (v["case"], report._short_target(v["target"])): v["verdict"]
        for v in report.verdicts(results)
        if v["case"] != "all rows"
    }


def test_spec_decode_verdicts():
    """q_len <= 4: our slower timing <= 1.2x the faster timing of the q_len 1 row of the shape; every
    spec row: <= FlashInfer's (its prefill wrapper) and <= XQA's time."""
    decline = ("n/a", "one query token per request")
    q1 = _spec_record(ANCHOR, "decode", 1, 110.0, repeat=100.0, flashinfer_decode=120.0)
    q2 = _spec_record(
        ANCHOR.replace("_p16", "_q2_p16"),
        SPEC_DECODE,
        2,
        115.0,
        flashinfer_decode=decline,
        flashinfer_prefill=150.0,
        flashinfer_xqa=112.0,
    )
    q4 = _spec_record(
        ANCHOR.replace("_p16", "_q4_p16"),
        SPEC_DECODE,
        4,
        118.0,
        repeat=125.0,
        flashinfer_decode=decline,
        flashinfer_prefill=130.0,
        flashinfer_xqa=140.0,
    )
    q8 = _spec_record(
        ANCHOR.replace("_p16", "_q8_p16"),
        SPEC_DECODE,
        8,
        180.0,
        flashinfer_decode=decline,
        flashinfer_prefill=("failed", "worker died"),
        flashinfer_xqa=170.0,
    )
    got = _spec_verdicts([q1, q2, q4, q8])
    q2v, q4v, q8v = (
        dict((t, v) for (c, t), v in got.items() if c == r["name"]) for r in (q2, q4, q8)
    )
    # against the faster of the q_len 1 row's two timings (100.0)
    assert (
        q2v["vs q_len 1"] == "met (1.15x ≤ 1.2x: 115.0 µs at q_len 2 against 100.0 µs at q_len 1)"
    )
    assert q4v["vs q_len 1"].startswith("MISSED by 4% (1.25x > 1.2x: 125.0 µs at q_len 4")  # slower
    assert "vs q_len 1" not in q8v  # q_len 8: the peers only
    assert q2v["FlashInfer"].startswith("met (115.0 ≤ 150.0 µs FlashInfer")
    assert q2v["XQA"].startswith("MISSED by 3% (115.0 > 112.0 µs XQA")
    assert q4v["FlashInfer"].startswith("met (125.0 ≤ 130.0 µs FlashInfer; the slower of two")
    assert q4v["XQA"].startswith("met (125.0 ≤ 140.0 µs XQA")
    # no FlashInfer number: the prefill wrapper's reason, not the decode wrapper's n/a
    assert q8v["FlashInfer"] == "no FlashInfer number (worker died)"
    assert q8v["XQA"].startswith("MISSED by 6% (180.0 > 170.0 µs XQA")
    assert set(q8v) == {"FlashInfer", "XQA"}
    # the q_len 1 row missing, skipped, or without our implementation: said so, no number made up
    assert _spec_verdicts([q2])[(q2["name"], "vs q_len 1")] == (
        "no q_len 1 number (its row is not in the run)"
    )
    skipped = {**q1, "skipped": "time limit of 540 s reached"}
    assert _spec_verdicts([skipped, q2])[(q2["name"], "vs q_len 1")] == (
        "no q_len 1 number (time limit of 540 s reached)"
    )
    failed = {**q1, "impls": {"xgo_torch": {"status": "failed", "reason": "worker died"}}}
    assert _spec_verdicts([failed, q2])[(q2["name"], "vs q_len 1")] == (
        "no q_len 1 number for xgo_torch (worker died)"
    )
    # a CPU smoke run judges nothing
    assert report.verdicts({"env": {"gpu": None}, "cases": [q1, q2]}) == []
    # the record comparison scales spec rows, bound by bandwidth, as it does decode rows
    assert SPEC_DECODE in report.BANDWIDTH_KINDS
