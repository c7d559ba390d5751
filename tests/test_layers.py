"""The packages' layering, checked over every import statement (function-level and
``TYPE_CHECKING`` imports included), so CI keeps it without anyone remembering to.

Lowest first: ``models`` < ``trainables`` < ``cluster`` < ``hpo`` < ``dashboards`` < the
CLI (the package ``hpo.cli`` and its submodules). A module imports only from its own layer
or the layers below, and no two modules import each other, directly or around a cycle, at
any level.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("models", "trainables", "cluster", "hpo", "dashboards")
CLI = "hpo.cli"  # a package inside hpo, a layer of its own
LAYERS = (*PACKAGES, "cli")  # lowest first


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def project_modules() -> dict[str, Path]:
    return {
        module_name(path): path for package in PACKAGES for path in (ROOT / package).rglob("*.py")
    }


def imported_names(module: str, source: str, *, is_package: bool) -> Iterator[tuple[str, int]]:
    """``(dotted name, line)`` of everything ``module``'s source imports, at any depth;
    ``from a import b`` yields ``a.b`` (a module or a name in ``a``)."""
    package = module if is_package else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(source, module)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                yield f"{base}.{alias.name}", node.lineno


def resolve(name: str, modules: dict[str, Path]) -> str | None:
    """The project module ``name`` is, or is inside of; None outside the project."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def layer_of(module: str) -> int:
    if module == CLI or module.startswith(f"{CLI}."):
        return LAYERS.index("cli")
    return LAYERS.index(module.split(".")[0])


def import_graph() -> dict[str, dict[str, int]]:
    """module -> {imported project module: first line}."""
    modules = project_modules()
    graph: dict[str, dict[str, int]] = {}
    for module, path in modules.items():
        edges = graph.setdefault(module, {})
        source = path.read_text()
        for name, line in imported_names(module, source, is_package=path.name == "__init__.py"):
            target = resolve(name, modules)
            if target is not None and target != module:
                edges.setdefault(target, line)
    return graph


def cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, {})))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_no_module_imports_from_a_layer_above_its_own() -> None:
    graph = import_graph()
    upward = [
        f"{module} (line {line}) imports {target}: {LAYERS[layer_of(module)]} may not "
        f"depend on {LAYERS[layer_of(target)]}"
        for module, edges in sorted(graph.items())
        for target, line in sorted(edges.items())
        if layer_of(target) > layer_of(module)
    ]
    assert not upward, "\n".join(upward)


def test_no_import_cycle_at_any_level() -> None:
    graph = import_graph()
    assert len(graph) > 70  # every module of the five packages was read
    found = cycles(graph)
    described = [
        " <-> ".join(component)
        + ": "
        + "; ".join(
            f"{a} imports {b} (line {graph[a][b]})"
            for a in component
            for b in component
            if b in graph[a]
        )
        for component in found
    ]
    assert not found, "\n".join(described)


def test_the_checks_see_a_planted_cycle_and_an_upward_import() -> None:
    """The checks themselves, on made-up input: a cycle, the layer order, and a relative
    import inside a function."""
    graph = {"a": {"b": 1}, "b": {"c": 3}, "c": {"a": 7}, "d": {"a": 2}}
    assert cycles(graph) == [["a", "b", "c"]]
    assert layer_of("models.kan") < layer_of("cluster.packing") < layer_of("hpo.sweep")
    assert layer_of("hpo.sweep") < layer_of("dashboards.report") < layer_of("hpo.cli")
    assert layer_of("hpo.cli._sweeps") == layer_of("hpo.cli") > layer_of("hpo.cli_like")
    source = "import os\n\ndef f():\n    from ..storage import SweepLocation\n"
    names = list(imported_names("cluster.sub.mod", source, is_package=False))
    assert names == [("os", 1), ("cluster.storage.SweepLocation", 4)]
