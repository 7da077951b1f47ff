"""HLO / StableHLO: each front end emits our custom call with the right target and shapes; it is
not constant-folded (all-zero constant inputs, optimised HLO); it survives torch.compile(openxla)
and StableHLO export. Dumps land in $XLA_GPU_OPS_ARTIFACTS/hlo/. Run by `nox -s hlo`."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
from paged_inputs import library_call

from xla_gpu_ops import hlo
from xla_gpu_ops.ops import OPS, PAGED_ATTENTION, Op

pytestmark = pytest.mark.hlo
ROOT = Path(__file__).resolve().parent.parent


def _importable(*modules: str) -> bool:
    return all(importlib.util.find_spec(m) is not None for m in modules)


FRONTEND_MODULES = {
    "torch_xla": ("torch", "torch_xla"),
    "jax": ("jax",),
    "torchax": ("torch", "torchax", "jax"),
}
FRONTEND_PARAMS = [
    pytest.param(
        f, marks=pytest.mark.skipif(not _importable(*mods), reason=f"needs {', '.join(mods)}")
    )
    for f, mods in FRONTEND_MODULES.items()
]
needs_torch_xla = pytest.mark.skipif(
    not _importable("torch", "torch_xla"), reason="needs torch_xla"
)


def expected_call(op: Op, zeros: bool = False) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(operand shapes, result shapes) of the op's custom call on `hlo.sample_inputs`: the
    operands as given, the results as the library describes them (scratch space included)."""
    inputs = list(hlo.sample_inputs(op, zeros=zeros).values())
    names = {"float32": "f32", "int32": "s32"}

    def text(dtype, shape):
        return f"{names[str(dtype)]}[{','.join(map(str, shape))}]"

    results = library_call(op, inputs, op.sample_attrs)[1]
    return (
        tuple(text(a.dtype, a.shape) for a in inputs),
        tuple(text(r.dtype, r.shape) for r in results),
    )


def assert_has_call(calls: list[hlo.CustomCall], op: Op, where: str, zeros: bool = False) -> None:
    ours = [c for c in calls if c.target == op.ffi_target]
    assert len(ours) == 1, f"{where}: expected one {op.ffi_target} custom call, found {calls}"
    operands, results = expected_call(op, zeros)
    assert ours[0].api_version == 4, f"{where}: {ours[0]}"
    assert ours[0].operand_shapes == operands, f"{where}: {ours[0]}"
    assert ours[0].result_shapes == results, f"{where}: {ours[0]}"


# ---------------------------------------------------------------------------- parsing
def test_parse_hlo_text_both_printer_styles():
    text = """
ENTRY %main (p0: f32[2,3]) -> f32[2,3] {
  %p0 = f32[2,3]{1,0} parameter(0)
  %c = s32[1]{0} constant({0})
  %cc = (f32[2,3]{1,0}, f32[7]{0}) custom-call(f32[2,3]{1,0} %p0, s32[1]{0} %c), custom_call_target="t1", api_version=API_VERSION_TYPED_FFI, backend_config={a = 1 : i64}
  ROOT cc2 = f32[2,3]{1,0} custom-call(p0, /*index=1*/c), custom_call_target="t2", api_version=API_VERSION_STATUS_RETURNING, backend_config="\\000x"
  %x = f32[2] custom-call(p0), custom_call_target="t3", operand_layout_constraints={f32[2,3]{1,0}}
  %y = bf16[2] custom-call(f8e4m3fn[2,16,4,64]{3,2,1,0} %kv, pred[] %p), custom_call_target="t4"
}"""
    calls = hlo.custom_calls_in_hlo(text)
    assert calls == [
        hlo.CustomCall("t1", 4, ("f32[2,3]", "s32[1]"), ("f32[2,3]", "f32[7]")),
        hlo.CustomCall("t2", 2, ("f32[2,3]", "s32[1]"), ("f32[2,3]",)),
        hlo.CustomCall("t3", 1, ("f32[2,3]",), ("f32[2]",)),
        hlo.CustomCall("t4", 1, ("f8e4m3fn[2,16,4,64]", "pred[]"), ("bf16[2]",)),
    ]
    assert "t1" in hlo.format_table(calls)


def test_parse_stablehlo_pretty_generic_and_jax_forms():
    text = """
    %0 = stablehlo.custom_call @t1(%a, %b) {api_version = 4 : i32, backend_config = {s = 1.0 : f32}} : (tensor<4x8xf32>, tensor<1xi32>) -> tuple<tensor<4x8xbf16>, tensor<9xf32>>
    %1 = stablehlo.custom_call @t2(%a) {mhlo.backend_config = {}, operand_layouts = [dense<[1, 0]> : tensor<2xindex>]} : (tensor<4x8xf32>) -> tensor<4x8xf32>
    %2 = "stablehlo.custom_call"(%a) <{api_version = 2 : i32, call_target_name = "t3"}> : (tensor<f32>) -> tensor<i1>
    """
    assert hlo.custom_calls_in_stablehlo(text) == [
        hlo.CustomCall("t1", 4, ("f32[4,8]", "s32[1]"), ("bf16[4,8]", "f32[9]")),
        hlo.CustomCall("t2", 4, ("f32[4,8]",), ("f32[4,8]",)),
        hlo.CustomCall("t3", 2, ("f32[]",), ("pred[]",)),
    ]


# ---------------------------------------------------------------------------- every front end
@pytest.mark.parametrize("zeros", [False, True], ids=["random", "zeros"])
@pytest.mark.parametrize("op", OPS, ids=[op.name for op in OPS])
@pytest.mark.parametrize("frontend", FRONTEND_PARAMS)
def test_custom_call_present_and_not_folded(frontend, op, zeros, artifacts_dir):
    """Zeros are baked in as graph constants: the optimised HLO must still call our target."""
    dump = hlo.dump_op(frontend, op, zeros=zeros)
    dump.write(artifacts_dir)
    found = dump.custom_calls()
    assert_has_call(found["hlo"], op, "HLO", zeros)
    assert_has_call(found["stablehlo"], op, "StableHLO", zeros)
    if frontend != "torch_xla":  # torch_xla: optimised HLO only via XLA_FLAGS, see the CLI test
        assert_has_call(found["after_optimizations"], op, "optimised HLO", zeros)


@needs_torch_xla
@pytest.mark.parametrize("op", OPS, ids=[op.name for op in OPS])
def test_cli_torch_xla_after_optimizations_with_zero_constants(op, artifacts_dir):
    """A fresh process (XLA_FLAGS must be set before XLA starts) through the CLI."""
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "PYTHONPATH": path, "JAX_PLATFORMS": "cpu"}
    env.pop("XLA_FLAGS", None)
    out = artifacts_dir / "cli"
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "xla_gpu_ops",
            "hlo",
            "--frontend",
            "torch_xla",
            "--op",
            op.name,
            "--out",
            str(out),
            "--zeros",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    (artifacts_dir / "cli.log").write_text(run.stdout + run.stderr)
    assert run.returncode == 0, run.stdout + run.stderr
    assert op.ffi_target in run.stdout
    # XLA:CPU has no handler of ours: the expected outcome, not printed as a failure
    assert f"# note: compiled; not run: no {op.ffi_target} handler" in run.stdout, run.stdout
    assert "failed" not in run.stdout + run.stderr, run.stdout + run.stderr
    assert "ERROR" not in run.stderr, run.stderr
    dumps = hlo.collect_xla_dumps(out / "xla_dump")
    after = {n: t for n, t in dumps.items() if n.endswith("after_optimizations.txt")}
    assert after, f"no after-optimizations dump in {out / 'xla_dump'}: {sorted(dumps)}"
    with_call = [
        n
        for n, t in after.items()
        if any(c.target == op.ffi_target for c in hlo.custom_calls_in_hlo(t))
    ]
    assert with_call, f"custom call folded away or missing in {sorted(after)}"
    assert_has_call(hlo.custom_calls_in_hlo(after[with_call[-1]]), op, with_call[-1], zeros=True)


def test_cli_fails_without_custom_call(monkeypatch, capsys, tmp_path):
    from xla_gpu_ops import __main__ as cli

    monkeypatch.setenv("XLA_FLAGS", f"--xla_dump_to={tmp_path / 'unused'}")
    monkeypatch.setattr(hlo, "dump_op", lambda *a, **k: hlo.Dump("jax", hlo="ENTRY %m {}"))
    assert cli.main(["hlo", "--frontend", "jax", "--op", "simple_add", "--out", str(tmp_path)]) == 1
    assert "no custom call" in capsys.readouterr().err


# ---------------------------------------------------------------------------- torch_xla paths
@pytest.fixture
def torch_xla_custom_call(monkeypatch):
    pytest.importorskip("torch_xla")
    from xla_gpu_ops import torch_xla as xgo_torch_xla

    monkeypatch.setenv(xgo_torch_xla.IMPL_ENV, "custom_call")


def _torch_args(op: Op):
    import torch
    import torch_xla

    return [torch.from_numpy(a).to(torch_xla.device()) for a in hlo.sample_inputs(op).values()]


@needs_torch_xla
def test_torch_compile_openxla_keeps_the_custom_call(torch_xla_custom_call):
    """XLA:CPU has no handler of ours: the compiled graph failing on exactly our target shows the
    custom call reached XLA intact through dynamo (execution with the composite: test_torch_xla)."""
    import torch

    compiled = torch.compile(hlo.op_function("torch_xla", PAGED_ATTENTION), backend="openxla")
    with pytest.raises(
        (RuntimeError, ValueError),
        match=f"No FFI handler registered for {PAGED_ATTENTION.ffi_target}\\b",
    ):
        compiled(*_torch_args(PAGED_ATTENTION)).cpu()
    assert torch.ops.xla_gpu.simple_add is not None


@needs_torch_xla
@pytest.mark.parametrize("op", OPS, ids=[op.name for op in OPS])
def test_stablehlo_export_keeps_the_custom_call(torch_xla_custom_call, op, artifacts_dir):
    import torch
    from torch_xla.stablehlo import exported_program_to_stablehlo

    fn = hlo.op_function("torch_xla", op)

    class Model(torch.nn.Module):
        def forward(self, *args):
            return fn(*args)

    args = tuple(torch.from_numpy(a) for a in hlo.sample_inputs(op).values())
    text = exported_program_to_stablehlo(torch.export.export(Model(), args)).get_stablehlo_text()
    (artifacts_dir / "exported.mlir").write_text(text)
    assert_has_call(hlo.custom_calls_in_stablehlo(text), op, "exported StableHLO")
