"""The package's layout holds: no import circles, each layer imports only the layers below it, small modules.

The module graph is read from the source with ``ast``: every ``import`` and ``from ... import`` (at module level,
inside functions, under ``if TYPE_CHECKING``, relative ones) and every ``importlib.import_module("...")`` or
``__import__("...")`` with a literal name (or a module-level constant holding one). ``from package import name``
is an edge to the submodule when ``name`` is one, else to the package. A parent package's ``__init__`` running
first is not counted as an edge.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "otelprof"
MAX_LINES = 800

BASE = {"otelprof._arguments", "otelprof._log", "otelprof._version", "otelprof._warnings",
        "otelprof.tensor_collections", "otelprof.config", "otelprof.dcgm_series", "otelprof.environment_variables",
        "otelprof.semconv", "otelprof.semconv_attributes", "otelprof.tensor_checks", "otelprof.thresholds"}
"""The catalog, the configuration and the checks' thresholds: they import nothing of otelprof but each other."""
FACADES = {"otelprof", "otelprof.torch"}
"""The public API: the runtime and the integrations behind ``otelprof`` and ``otelprof.torch``."""


def module_names(root: Path) -> dict[str, Path]:
    """Dotted module name -> file, for every ``.py`` under ``root`` (a package directory)."""
    names = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        names[".".join(parts)] = path
    return names


def _resolve(name: str, modules: Mapping[str, Path]) -> str | None:
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def imports_of(module: str, path: Path, modules: Mapping[str, Path]) -> set[str]:
    """The modules of ``modules`` that ``module`` (at ``path``) imports, anywhere in its source."""
    top = next(iter(modules)).split(".")[0]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str | None] = set()
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    constants = {target.id: node.value.value for node in tree.body if isinstance(node, ast.Assign)
                 and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)
                 for target in node.targets if isinstance(target, ast.Name)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(_resolve(alias.name, modules) for alias in node.names if alias.name.split(".")[0] == top)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[:len(package.split(".")) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            if source.split(".")[0] != top:
                continue
            for alias in node.names:
                child = f"{source}.{alias.name}"
                found.add(child if child in modules else _resolve(source, modules))
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], (ast.Constant, ast.Name)):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
            argument = node.args[0]
            target = argument.value if isinstance(argument, ast.Constant) else constants.get(argument.id)
            if name in ("import_module", "__import__") and isinstance(target, str) and target.split(".")[0] == top:
                found.add(_resolve(target, modules))
    found.discard(None)
    found.discard(module)
    return {name for name in found if name is not None}


def import_graph(root: Path) -> dict[str, set[str]]:
    modules = module_names(root)
    return {name: imports_of(name, path, modules) for name, path in modules.items()}


def cycles(graph: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """One circle per strongly connected component of more than one module, as a path that ends where it
    starts (``a -> b -> a``); Tarjan's algorithm, iterative."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[set[str]] = []
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
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    components.append(component)
    return [_circle(component, graph) for component in components]


def _circle(component: set[str], graph: Mapping[str, Iterable[str]]) -> list[str]:
    """A shortest path from the component's first module back to itself, inside the component."""
    start = min(component)
    previous: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for child in sorted(graph[node]):
                if child == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(previous[path[-1]])
                    return [*reversed(path), start]
                if child in component and child not in previous:
                    previous[child] = node
                    following.append(child)
        frontier = following
    raise AssertionError(f"no circle in {sorted(component)}")  # a strongly connected component has one


def layer(module: str) -> str:
    """The layer a module of otelprof belongs to (see docs/development.md)."""
    if module in FACADES:
        return "facade"
    if module in BASE:
        return "base"
    parts = module.split(".")
    if parts[1] in ("_bootstrap", "__main__"):  # otelprof run's sitecustomize, python -m otelprof
        return "cli"
    return parts[1]


ALLOWED = {
    "base": {"base"},
    "recording": {"base", "recording"},
    "shared": {"base", "recording", "shared"},
    "runtime": {"base", "recording", "shared", "runtime"},
    "integrations": {"base", "recording", "shared", "runtime", "integrations"},
    "mixin": {"base", "mixin", "dashboards"},
    "dashboards": {"base", "mixin", "dashboards"},
    "analysis": {"base", "recording", "shared", "mixin", "analysis"},
    "report": {"base", "recording", "shared", "mixin", "analysis", "report"},
    "cli": {"base", "recording", "shared", "runtime", "integrations", "mixin", "dashboards", "analysis", "report",
            "cli", "facade"},
    "facade": {"base", "runtime", "integrations", "facade"},
}
"""Which layers each layer may import. The runtime core (``runtime``, with ``shared`` and ``recording`` below it)
never imports an integration, the command line, the analysis, the report or the monitoring mixin; the analysis
and the report read a recording or Prometheus, never the runtime; integrations sit on the runtime."""


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    return import_graph(PACKAGE)


def test_the_package_has_no_import_circles(graph: dict[str, set[str]]) -> None:
    found = [" -> ".join(circle) for circle in cycles(graph)]
    assert not found, "import circles:\n" + "\n".join(found)


def test_each_layer_imports_only_the_layers_below_it(graph: dict[str, set[str]]) -> None:
    wrong = sorted(f"{module} ({layer(module)}) imports {target} ({layer(target)})"
                   for module, targets in graph.items() for target in targets
                   if layer(target) not in ALLOWED.get(layer(module), {layer(target)}))
    assert not wrong, "\n".join(wrong)


def test_every_module_belongs_to_a_known_layer(graph: dict[str, set[str]]) -> None:
    unplaced = sorted(module for module in graph if layer(module) not in ALLOWED)
    assert not unplaced, f"modules outside the layers of docs/development.md (move them into one): {unplaced}"


def test_each_package_says_what_it_owns_and_may_import() -> None:
    for init in sorted(PACKAGE.rglob("*/__init__.py")):
        doc = ast.get_docstring(ast.parse(init.read_text(encoding="utf-8"))) or ""
        assert "import" in doc, f"{init.relative_to(ROOT)}: no docstring saying what the package may import"


def test_no_module_is_longer_than_800_lines() -> None:
    long = sorted(f"{path.relative_to(ROOT)}: {lines} lines" for path in PACKAGE.rglob("*.py")
                  if (lines := len(path.read_text(encoding="utf-8").splitlines())) > MAX_LINES)
    assert not long, f"modules over {MAX_LINES} lines (split them by concern):\n" + "\n".join(long)


# ------------------------------------------------------------------ the reader itself, on a package made here
def _package(tmp_path: Path, files: dict[str, str]) -> Path:
    root = tmp_path / "pkg"
    for name, source in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(source, encoding="utf-8")
    return root


@pytest.mark.parametrize(("source", "form"), [
    ("import pkg.b\n", "import at module level"),
    ("def f() -> None:\n    from pkg.b import thing\n", "import in a function"),
    ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg import b\n", "import for types only"),
    ("from . import b\n", "relative import of a module"),
    ("from .b import thing\n", "relative import of a name"),
    ("import importlib\nm = importlib.import_module('pkg.b')\n", "importlib.import_module"),
    ("m = __import__('pkg.b')\n", "__import__"),
    ("import importlib\nB = 'pkg.b'\ndef f() -> None:\n    importlib.import_module(B)\n", "a constant's name"),
])
def test_every_form_of_import_closes_a_circle(tmp_path: Path, source: str, form: str) -> None:
    root = _package(tmp_path, {"__init__.py": "", "a.py": source, "b.py": "from pkg.sub import c\nthing = 1\n",
                               "sub/__init__.py": "", "sub/c.py": "from .. import a\n"})
    assert cycles(import_graph(root)) == [["pkg.a", "pkg.b", "pkg.sub.c", "pkg.a"]], form


def test_a_name_imported_from_a_package_is_an_edge_to_the_package_and_no_import_is_no_circle(
        tmp_path: Path) -> None:
    root = _package(tmp_path, {"__init__.py": "from pkg.a import x\n", "a.py": "from pkg import y\nx = 1\n",
                               "b.py": "'import pkg.a'\nimport json\n"})
    graph = import_graph(root)
    assert graph == {"pkg": {"pkg.a"}, "pkg.a": {"pkg"}, "pkg.b": set()}
    assert cycles(graph) == [["pkg", "pkg.a", "pkg"]]
