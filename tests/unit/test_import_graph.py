"""The import graph of ``repro/``: no circle, every lazy (function-level) import included."""

from __future__ import annotations

import ast
import graphlib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _module(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(package: str = "repro") -> dict[str, set[str]]:
    """Module -> the modules of ``package`` it imports anywhere in its body (an import of
    ``a.b.c`` counts as one of ``a.b.c``, the deepest of them that is a module of the package;
    ``from a.b import c`` as one of ``a.b.c`` when ``c`` is a module, else of ``a.b``)."""
    files = sorted((ROOT / package).rglob("*.py"))
    modules = {_module(f) for f in files}
    graph: dict[str, set[str]] = {}
    for f in files:
        me, deps = _module(f), set()
        package_of_me = me if f.name == "__init__.py" else me.rpartition(".")[0]
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package_of_me.split(".")[: len(package_of_me.split(".")) - node.level + 1]
                    base = ".".join([*up, base] if base else up)
                names = [f"{base}.{a.name}" for a in node.names] + [base]
            else:
                continue
            for name in names:
                while name and name not in modules:
                    name = name.rpartition(".")[0]
                if name and name != me:
                    deps.add(name)
        graph[me] = deps
    return graph


def test_the_graph_is_read_from_the_sources():
    g = import_graph()
    assert "repro.config.base" in g["repro.config"]
    assert "repro.modes.baselines" in g["repro.modes.emulate"]  # a function-level import
    assert "repro.config" in g["repro.run"]


def test_repro_has_no_import_cycle():
    g = import_graph()
    try:
        order = list(graphlib.TopologicalSorter(g).static_order())
    except graphlib.CycleError as e:
        raise AssertionError(f"import cycle in repro/: {' -> '.join(e.args[1])}") from None
    assert set(order) == set(g)


def test_a_cycle_would_be_found():
    g = {"a": {"b"}, "b": {"a"}}
    try:
        list(graphlib.TopologicalSorter(g).static_order())
    except graphlib.CycleError:
        return
    raise AssertionError("graphlib did not report the cycle")
