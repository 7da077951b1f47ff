"""The scaffold (tools/new_op.py) on the table as it is, without a build: what it writes parses,
imports and lists the new ops, once and again; bad names and taken names are refused. The built
and tested scaffold is `nox -s new_op -- NAME --try`, which CI runs (.ci/readme.py)."""

from __future__ import annotations

import ast
import importlib.util
import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def load(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while it executes
    spec.loader.exec_module(module)
    return module


new_op = load(ROOT / "tools" / "new_op.py", "new_op")


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    """The files the scaffold edits, copied."""
    (tmp_path / "xla_gpu_ops").mkdir()
    (tmp_path / "kernels" / "ops").mkdir(parents=True)
    for name in ("ops.py", "reference.py"):
        shutil.copy(ROOT / "xla_gpu_ops" / name, tmp_path / "xla_gpu_ops" / name)
    return tmp_path


def test_two_scaffolded_ops_join_the_table(checkout):
    for name in ("probe_one", "probe_two"):
        written = new_op.scaffold(checkout, name)
        assert [p.relative_to(checkout).as_posix() for p in written] == [
            f"kernels/ops/{name}/{name}.cu",
            "xla_gpu_ops/ops.py",
            "xla_gpu_ops/reference.py",
        ]
    for path in ("xla_gpu_ops/ops.py", "xla_gpu_ops/reference.py"):
        ast.parse((checkout / path).read_text())
    table = load(checkout / "xla_gpu_ops" / "ops.py", "scaffolded_ops")
    assert [op.name for op in table.OPS][-2:] == ["probe_one", "probe_two"]
    assert [op.name for op in table.OPS][:-2] == [op.name for op in load_table().OPS]
    assert table.BY_NAME["probe_two"].sample(False)["x"].shape == (4, 256)
    source = (checkout / "kernels/ops/probe_two/probe_two.cu").read_text()
    assert 'kName = "probe_two"' in source
    assert "XGO_DEFINE_OP(ProbeTwo);" in source
    assert "def probe_two(x: torch.Tensor" in (checkout / "xla_gpu_ops/reference.py").read_text()


def load_table():
    return load(ROOT / "xla_gpu_ops" / "ops.py", "current_ops")


@pytest.mark.parametrize(
    ("name", "match"),
    [("RmsNorm", "snake_case"), ("a" * 30, "snake_case"), ("rms_norm", "exists")],
)
def test_bad_or_taken_names_are_refused(checkout, name, match):
    with pytest.raises(SystemExit, match=match):
        new_op.scaffold(checkout, name)
