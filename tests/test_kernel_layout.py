"""The kernel tree's layout, read from its #include lines: one folder per op over one core folder,
includes that only go down (ops -> core -> the public C header), no cycle, and one public header.
Layout and reasons: docs/KERNELS.md, "Sources, one concern each"."""

from __future__ import annotations

import re
from graphlib import CycleError, TopologicalSorter
from pathlib import Path

import pytest

KERNELS = Path(__file__).resolve().parents[1] / "kernels"
SUFFIXES = {".h", ".cuh", ".cc", ".cu"}
INCLUDE = re.compile(r'^\s*#include\s+"([^"]+)"', re.MULTILINE)


def sources() -> list[Path]:
    return sorted(p for p in KERNELS.rglob("*") if p.suffix in SUFFIXES)


def resolve(name: str) -> Path | None:
    """Where a quoted include points: the kernels/ root, or the public include/ folder."""
    for root in (KERNELS, KERNELS / "include"):
        if (root / name).is_file():
            return root / name
    return None


def include_graph() -> dict[Path, set[Path]]:
    graph: dict[Path, set[Path]] = {}
    for path in sources():
        found = {resolve(name) for name in INCLUDE.findall(path.read_text())}
        graph[path] = {p for p in found if p is not None}
    return graph


def area(path: Path) -> tuple[str, ...]:
    """("include",), ("core",) or ("ops", name)."""
    parts = path.relative_to(KERNELS).parts
    return ("ops", parts[1]) if parts[0] == "ops" else (parts[0],)


def test_every_project_include_resolves():
    unresolved = [
        f"{path.relative_to(KERNELS)}: {name}"
        for path in sources()
        for name in INCLUDE.findall(path.read_text())
        if resolve(name) is None and not name.startswith("xla/")  # the XLA FFI headers
    ]
    assert not unresolved, unresolved


def test_includes_only_go_down_and_never_across_ops():
    rank = {"include": 0, "core": 1, "ops": 2}
    wrong = [
        f"{path.relative_to(KERNELS)} -> {target.relative_to(KERNELS)}"
        for path, targets in include_graph().items()
        for target in targets
        if rank[area(target)[0]] > rank[area(path)[0]]
        or (area(path)[0] == area(target)[0] == "ops" and area(path) != area(target))
    ]
    assert not wrong, wrong


def test_the_include_graph_has_no_cycle():
    try:
        order = list(TopologicalSorter(include_graph()).static_order())
    except CycleError as error:
        pytest.fail(f"include cycle: {[str(p.relative_to(KERNELS)) for p in error.args[1]]}")
    assert len(order) == len(sources())


def test_the_only_public_header_is_the_c_api():
    public = sorted(p.relative_to(KERNELS).as_posix() for p in (KERNELS / "include").rglob("*"))
    assert public == ["include/xla_gpu_ops", "include/xla_gpu_ops/c_api.h"]


def test_each_op_folder_registers_its_op_once():
    """An op is in the library by its folder's XGO_DEFINE_OP; the folder is named after the op."""
    for folder in sorted((KERNELS / "ops").iterdir()):
        text = "".join(p.read_text() for p in folder.iterdir() if p.suffix in SUFFIXES)
        defines = re.findall(r"^XGO_DEFINE_OP\((\w+)\);", text, re.MULTILINE)
        names = re.findall(r'static constexpr const char\* kName = "(\w+)";', text)
        assert len(defines) == 1, (folder.name, defines)
        assert names == [folder.name], (folder.name, names)
