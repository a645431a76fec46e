"""verl_sf's import graph, read from the source (ast), has no cycle.

Every import counts, also one inside a function or under TYPE_CHECKING: a lazy import that
closes a circle only hides it from the interpreter, not from a reader who has to change one side.
"""

from __future__ import annotations

import ast
from pathlib import Path

import verl_sf

ROOT = Path(verl_sf.__file__).parent
PACKAGE = "verl_sf"


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(path): path for path in sorted(ROOT.rglob("*.py"))}


def imported(module: str, path: Path, known: set[str]) -> set[str]:
    """The package's modules that `module` imports: `from a import b` names `a.b` when that is a module."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    targets: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                source = f"{base}.{node.module}" if node.module else base
            else:
                source = node.module or ""
            submodules = {f"{source}.{alias.name}" for alias in node.names} & known
            targets.update(submodules or {source})
    return {target for target in targets if target in known and target != module}


def import_graph() -> dict[str, set[str]]:
    found = modules()
    known = set(found)
    return {module: imported(module, path, known) for module, path in found.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected component of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph[node]):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component: list[str] = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(components)


def test_the_graph_is_read_from_the_package() -> None:
    graph = import_graph()
    assert len(graph) > 50 and PACKAGE in graph
    # A known edge of each import form: `from package.module import`, `from package import module`,
    # `from package import name`, and one inside a function.
    assert "verl_sf.models" in graph["verl_sf.backends.base"]
    assert "verl_sf.serve_cli" in graph["verl_sf.cli"]
    assert "verl_sf.executor" in graph["verl_sf.backends.local"]
    assert "verl_sf.pool" in graph["verl_sf.tools.dispatch"]


def test_cycle_finder_finds_a_circle_and_only_that() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert cycles(graph) == [["a", "b", "c"]]


def test_no_import_cycles() -> None:
    found = cycles(import_graph())
    assert found == [], "import cycles:\n" + "\n".join(" <-> ".join(component) for component in found)
