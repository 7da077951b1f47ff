"""The benchmarks package imports one way: no cycle, and no import of one of its modules hidden
inside a function (which is how a cycle hides). Read from the sources with ast; nothing runs."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "benchmarks"


def _imports(path: Path, modules: set[str]) -> tuple[set[str], list[str]]:
    """(benchmarks modules `path` imports anywhere, its imports of them inside functions)."""
    found: set[str] = set()
    nested: list[str] = []

    def targets(node: ast.AST) -> list[str]:
        if isinstance(node, ast.ImportFrom) and node.module == "benchmarks":
            return [alias.name for alias in node.names if alias.name in modules]
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("benchmarks."):
            return [node.module.split(".")[1]]
        if isinstance(node, ast.Import):
            return [a.name.split(".")[1] for a in node.names if a.name.startswith("benchmarks.")]
        return []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            for name in targets(child):
                found.add(name)
                if in_function:
                    nested.append(f"{path.name}:{child.lineno} imports {name}")
            function = isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)
            visit(child, in_function or function)

    visit(ast.parse(path.read_text(), filename=str(path)), False)
    return found - {path.stem}, nested


def _graph() -> tuple[dict[str, set[str]], list[str]]:
    paths = sorted(PACKAGE.glob("*.py"))
    modules = {p.stem for p in paths}
    graph, nested = {}, []
    for path in paths:
        graph[path.stem], inside = _imports(path, modules)
        nested += inside
    return graph, nested


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of `graph`, or None."""
    state: dict[str, str] = {}  # "open" while on the path, "done" after

    def walk(module: str, path: list[str]) -> list[str] | None:
        state[module] = "open"
        for target in sorted(graph[module]):
            if state.get(target) == "open":
                return [*path[path.index(target) :], target]
            if target not in state and (found := walk(target, [*path, target])):
                return found
        state[module] = "done"
        return None

    for module in sorted(graph):
        if module not in state and (found := walk(module, [module])):
            return found
    return None


def test_benchmarks_import_graph_has_no_cycle():
    graph, _ = _graph()
    assert {"cli", "run", "record", "report", "peers", "workers"} <= set(graph)
    assert graph["cli"] >= {"run", "record", "report"}  # the graph is read, not empty
    assert _cycle(graph) is None, " -> ".join(_cycle(graph))


def test_benchmarks_modules_are_imported_at_module_level_only():
    _, nested = _graph()
    assert nested == []


def test_the_cycle_finder_finds_a_cycle():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None
