"""The package's layering, read from its source with `ast`, and what importing it loads:

- front ends (the public modules a program calls to run an op) never import one another, at top
  level or inside a function: what two of them share lives in a private module;
- private modules (leading underscore) import no front end, except `_torch_library`, the torch op,
  which gathers its device kernels (CPU reference, `_torch_cuda`, `torch_xla`); the kernels share
  helpers (`_torch`), not each other's code;
- no module reaches into another module's private names;
- the torch_xla release where the GPU route changes is one constant, and no code compares a
  version with a literal;
- `_SUBMODULES` (lazy attribute access in `__init__`) lists exactly the public modules, and
  `import xla_gpu_ops` (with the route modules) imports no framework.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import xla_gpu_ops

PACKAGE = Path(xla_gpu_ops.__file__).resolve().parent
FRONT_ENDS = {
    "torch_ops",
    "jax",
    "torchax",
    "sharding",
    "torch_xla",
    "xla_cuda",
    "torch_xla_plugin",
    "torch_xla_sharding",
}
# Tools over every front end (HLO dumps of each, the command line): they may import any module.
TOOLS = {"hlo", "__main__", "__init__"}
# The torch op registers the kernel of each device; torch_xla is the XLA one.
DEVICE_KERNELS = {"_torch_library": {"torch_xla"}}
KERNELS = ("_torch_cuda", "torch_xla")  # the CUDA and XLA kernels of the torch op


def sources() -> dict[str, ast.Module]:
    return {path.stem: ast.parse(path.read_text(), str(path)) for path in PACKAGE.glob("*.py")}


def package_imports(tree: ast.Module) -> dict[str, str]:
    """{package module imported: local name bound to it} of every import in the module, at top
    level or in a function (`from xla_gpu_ops import x`, `import xla_gpu_ops.x`, `from
    xla_gpu_ops.x import name`: x)."""
    found: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "xla_gpu_ops":
            for alias in node.names:
                found[alias.name] = alias.asname or alias.name
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("xla_gpu_ops."):
            found.setdefault(node.module.split(".")[1], "")
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("xla_gpu_ops."):
                    found[alias.name.split(".")[1]] = alias.asname or ""
    return found


def test_the_front_ends_are_the_public_modules_that_exist():
    modules = {path.stem for path in PACKAGE.glob("*.py")}
    assert modules >= FRONT_ENDS | TOOLS | set(DEVICE_KERNELS)


@pytest.mark.parametrize("module", sorted(FRONT_ENDS))
def test_no_front_end_imports_another(module):
    imported = set(package_imports(sources()[module]))
    assert not imported & (FRONT_ENDS - {module}), (
        f"xla_gpu_ops.{module} imports the front end(s) {sorted(imported & FRONT_ENDS)}: "
        "move what they share into a private module"
    )


def test_private_modules_import_no_front_end():
    for module, tree in sources().items():
        if module.startswith("_") and module not in TOOLS:
            front_ends = set(package_imports(tree)) & FRONT_ENDS
            assert front_ends <= DEVICE_KERNELS.get(module, set()), (module, front_ends)


def test_device_kernels_share_helpers_not_each_other():
    cuda, xla = (set(package_imports(sources()[kernel])) for kernel in KERNELS)
    assert KERNELS[1] not in cuda
    assert KERNELS[0] not in xla


def test_no_module_reaches_into_another_modules_private_names():
    for module, tree in sources().items():
        bound = {name for name in package_imports(tree).values() if name}
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.ImportFrom)
                and (node.module or "").startswith("xla_gpu_ops.")
                and any(alias.name.startswith("_") for alias in node.names)
            ):
                pytest.fail(f"{module}: from {node.module} import a private name")
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id in bound
                and node.attr.startswith("_")
            ):
                pytest.fail(f"{module}: {node.value.id}.{node.attr} (line {node.lineno})")


def _literal(node: ast.AST) -> tuple | None:
    """The value of a tuple of int literals, else None."""
    if isinstance(node, ast.Tuple) and all(
        isinstance(e, ast.Constant) and type(e.value) is int for e in node.elts
    ):
        return tuple(e.value for e in node.elts)
    return None


def _binds_the_release(value: ast.AST) -> bool:
    """(2, 9) itself, or another name for the constant."""
    name = value.attr if isinstance(value, ast.Attribute) else getattr(value, "id", "")
    return _literal(value) == (2, 9) or name == "FIRST_RELEASE_WITHOUT_CUDA"


def _reads_the_version(node: ast.AST) -> bool:
    """A call of torch_xla_version(), or a name a version was read into ("version", "release")."""
    if isinstance(node, ast.Call):
        node = node.func
    name = node.attr if isinstance(node, ast.Attribute) else getattr(node, "id", "")
    return name in ("torch_xla_version", "version", "release")


def test_the_torch_xla_release_switch_is_one_constant():
    """One name holds (2, 9), under no alias; the installed version is compared with it, never
    with a literal (the tables of per-release facts keep their release keys)."""
    definitions, comparisons = [], []
    for module, tree in sources().items():
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign) and _binds_the_release(node.value):
                definitions += [(module, ast.unparse(target)) for target in node.targets]
            if isinstance(node, ast.Compare):
                sides = [node.left, *node.comparators]
                if any(map(_reads_the_version, sides)) and any(_literal(n) for n in sides):
                    comparisons.append(f"{module}, line {node.lineno}: {ast.unparse(node)}")
    assert definitions == [("_torch_xla_version", "FIRST_RELEASE_WITHOUT_CUDA")], definitions
    assert not comparisons, comparisons


def test_submodules_list_the_public_modules():
    public = {path.stem for path in PACKAGE.glob("*.py") if not path.stem.startswith("_")}
    assert set(xla_gpu_ops._SUBMODULES) == public
    assert len(xla_gpu_ops._SUBMODULES) == len(public)


FRAMEWORKS = ("torch", "torch_xla", "jax", "torchax")
IMPORT_SCRIPT = """
import sys
{block}
import xla_gpu_ops
import xla_gpu_ops.head_sharding, xla_gpu_ops.ops, xla_gpu_ops.torch_xla_plugin, xla_gpu_ops.xla_cuda
print(sorted(name for name in {frameworks!r} if sys.modules.get(name) is not None))
{check}
"""
TORCH_OPS_DEFINED = """
import torch
print(all(hasattr(torch.ops.xla_gpu, op.name) for op in xla_gpu_ops.ops.OPS))
"""
WRAPPER_NEEDS_TORCH = """
try:
    xla_gpu_ops.paged_attention
except ImportError as error:
    print(error)
"""


@pytest.mark.parametrize("torch_found", [False, True], ids=["no_torch", "torch"])
def test_import_needs_no_framework(torch_found):
    """Without torch (made unimportable) nothing but the package loads, and the torch wrappers
    say what they need; with torch, the torch ops are defined and still nothing else loads."""
    code = IMPORT_SCRIPT.format(
        block="" if torch_found else "sys.modules['torch'] = None  # as if torch were absent",
        frameworks=FRAMEWORKS,
        check=TORCH_OPS_DEFINED if torch_found else WRAPPER_NEEDS_TORCH,
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=False, timeout=600
    )
    assert out.returncode == 0, out.stderr[-4000:]
    if torch_found:
        assert out.stdout.split() == ["['torch']", "True"]
    else:
        expected = "[]\nxla_gpu_ops.paged_attention needs torch: pip install torch\n"
        assert out.stdout == expected
