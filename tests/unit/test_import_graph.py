"""The import graph of every package (``system/``, ``baselines/``, ``repro/``): no circle, every
lazy (function-level) import and every ``importlib.import_module("literal")`` included."""

from __future__ import annotations

import ast
import functools
import graphlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("system", "baselines", "repro")


def _module(path: Path, root: Path) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _ancestors(name: str) -> list[str]:
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def _imported_names(node: ast.AST, package_of_me: str) -> list[str]:
    """The dotted names one AST node imports (none for other nodes)."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if isinstance(node, ast.ImportFrom):
        base = node.module or ""
        if node.level:
            up = package_of_me.split(".")[: len(package_of_me.split(".")) - node.level + 1]
            base = ".".join([*up, base] if base else up)
        return [f"{base}.{a.name}" for a in node.names] + [base]
    if (  # importlib.import_module("a.b") / import_module("a.b") with a literal name
        isinstance(node, ast.Call)
        and getattr(node.func, "attr", getattr(node.func, "id", None)) == "import_module"
        and node.args
        and isinstance(node.args[0], ast.Constant)
        and isinstance(node.args[0].value, str)
    ):
        return [node.args[0].value]
    return []


def import_graph(packages=PACKAGES, root: Path = ROOT) -> dict[str, set[str]]:
    """Module -> the modules of ``packages`` it imports anywhere in its body, functions
    included. An import of ``a.b.c`` counts as one of ``a.b.c`` (the deepest of them that is a
    module here; ``from a.b import c`` as one of ``a.b.c`` when ``c`` is a module, else of
    ``a.b``) and of the packages ``a`` and ``a.b`` it runs first — except the importer's own
    packages, which are already being imported when it runs."""
    files = sorted(f for p in packages for f in (root / p).rglob("*.py"))
    modules = {_module(f, root) for f in files}
    graph: dict[str, set[str]] = {}
    for f in files:
        me, deps = _module(f, root), set()
        package_of_me = me if f.name == "__init__.py" else me.rpartition(".")[0]
        mine = {*_ancestors(me), me}
        for node in ast.walk(ast.parse(f.read_text(), str(f))):
            for name in _imported_names(node, package_of_me):
                while name and name not in modules:
                    name = name.rpartition(".")[0]
                if not name:
                    continue
                deps.update(m for m in (*_ancestors(name), name) if m in modules and m not in mine)
        graph[me] = deps
    return graph


@functools.cache
def _repo_graph_read() -> dict[str, frozenset[str]]:
    return {m: frozenset(d) for m, d in import_graph().items()}


def repo_graph() -> dict[str, set[str]]:
    """The repository's graph, read from the sources once per test process; a fresh copy."""
    return {m: set(d) for m, d in _repo_graph_read().items()}


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    try:
        list(graphlib.TopologicalSorter(graph).static_order())
    except graphlib.CycleError as e:
        return list(e.args[1])
    return None


@pytest.mark.slow
def test_the_graph_is_read_from_the_sources():
    g = repo_graph()
    assert {m.split(".")[0] for m in g} == set(PACKAGES)
    assert "repro.config.base" in g["repro.config"]
    # a function-level import
    assert "repro.modes.train.baselines" in g["repro.modes.emulate.run"]
    assert "repro.config" in g["repro.run"]
    assert "system.cluster" in g["system.simulator.sharing"]
    assert "system.cases" in g["repro.studies.quality.report"]  # across packages, inside a function
    # importing system.simulator.sharing runs system/simulator/__init__.py first
    assert {"system.simulator.sharing", "system.simulator"} <= g["repro.modes.simulate.run"]
    # ... but not for a module inside that package, which it is already importing
    assert "system.simulator" not in g["system.simulator.ours"]
    assert "system.simulator.replay" in g["baselines.megatron.schedule"]


def test_no_package_has_an_import_cycle():
    g = repo_graph()
    cycle = _cycle(g)
    assert cycle is None, f"import cycle: {' -> '.join(cycle)}"


def test_a_lazy_cycle_across_packages_would_be_found(tmp_path):
    (tmp_path / "p" / "sub").mkdir(parents=True)
    (tmp_path / "q").mkdir()
    (tmp_path / "p" / "__init__.py").write_text("")
    (tmp_path / "p" / "sub" / "__init__.py").write_text("from p.sub import a\n")
    (tmp_path / "p" / "sub" / "a.py").write_text("X = 1\n")
    (tmp_path / "q" / "__init__.py").write_text("")
    # q.b imports p.sub.a at module level, so p/sub/__init__ runs first ...
    (tmp_path / "q" / "b.py").write_text("from p.sub.a import X\n")
    g = import_graph(("p", "q"), tmp_path)
    assert _cycle(g) is None and "p.sub" in g["q.b"] and "p.sub" not in g["p.sub.a"]
    # ... and a function of p.sub.a importing q.b (by name) closes a circle
    (tmp_path / "p" / "sub" / "a.py").write_text(
        "import importlib\n\ndef f():\n    return importlib.import_module('q.b')\n"
    )
    assert set(_cycle(import_graph(("p", "q"), tmp_path))) >= {"p.sub.a", "q.b"}


def test_the_mode_registry_closes_no_circle():
    """``repro/__init__.py`` imports every mode's ``config.py`` by its path
    (:func:`repro.config.base.discover_modes`, names no literal can show): with those imports
    drawn, the graph still has no circle, and no ``config.py`` imports a mode's work."""
    from repro.config.base import MODE_CONFIGS

    g = repo_graph()
    configs = {_module(p, ROOT) for pattern in MODE_CONFIGS for p in (ROOT / "repro").glob(pattern)}
    assert {"repro.modes.simulate.config", "repro.report.config"} <= configs
    assert "repro.config.base" in g["repro"]
    g["repro"] |= configs
    cycle = _cycle(g)
    assert cycle is None, f"import cycle: {' -> '.join(cycle)}"
    work = {c: sorted(d for d in g[c] if d.endswith(".run") or ".report." in d) for c in configs}
    assert {c: d for c, d in work.items() if d} == {}
