"""The package's import graph, read from the source (ast): no import circles, and the layers in order.

Every import counts, module-level or inside a function (a lazy import hides a
circle from Python's loader, not from a reader), except those under
`if TYPE_CHECKING:`, which only annotations see. `from P import name` is an
edge to the module P.name when that is a module, else to P.
"""

from __future__ import annotations

import ast
from pathlib import Path

import gnnio_cli

PACKAGE = Path(gnnio_cli.__file__).resolve().parent

KNOWN_CIRCLES: list = []


def module_names() -> dict[str, Path]:
    names = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        names[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return names


def runtime_nodes(tree: ast.AST):
    """Every node of `tree` except the bodies of `if TYPE_CHECKING:` (imports for annotations only)."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            yield from (n for child in node.orelse for n in [child, *runtime_nodes(child)])
            continue
        yield node
        yield from runtime_nodes(node)


def import_graph() -> dict[str, set[str]]:
    """module -> the gnnio_cli modules it imports."""
    modules = module_names()
    graph = {}
    for name, path in modules.items():
        targets = set()
        for node in runtime_nodes(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                for alias in node.names:
                    submodule = f"{node.module}.{alias.name}"
                    targets.add(submodule if submodule in modules else node.module)
        graph[name] = {target for target in targets if target in modules and target != name}
    return graph


def circles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(node):
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
            component = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.add(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(component)

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_the_graph_sees_lazy_and_from_imports():
    graph = import_graph()
    assert "gnnio_cli.bench.report" in graph["gnnio_cli.cli.run"]  # imported inside the command function
    assert "gnnio_cli.native" in graph["gnnio_cli.ops.dispatch"]  # `from gnnio_cli import native`


def test_circles_are_found():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [{"a", "b", "c"}]
    assert circles({"a": {"b"}, "b": set()}) == []


def test_no_import_circles():
    found = [circle for circle in circles(import_graph()) if circle not in KNOWN_CIRCLES]
    assert found == [], f"import circles: {[sorted(circle) for circle in found]}"


def test_bench_sits_below_cli():
    """The command line may use the benchmarks; the benchmarks never import the command line."""
    offenders = {
        module: sorted(target for target in targets if target.startswith("gnnio_cli.cli"))
        for module, targets in import_graph().items()
        if module.startswith("gnnio_cli.bench")
    }
    assert {module: targets for module, targets in offenders.items() if targets} == {}


def test_the_layer_package_exports_every_layer():
    """gnnio_cli.nn's __all__ names every layer of LAYERS, each a class of the package."""
    import gnnio_cli.nn as gnnio_nn

    assert set(gnnio_nn.LAYERS) <= set(gnnio_nn.__all__)
    assert all(isinstance(getattr(gnnio_nn, name), type) for name in gnnio_nn.LAYERS)
