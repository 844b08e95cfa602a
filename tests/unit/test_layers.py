"""Layering rules of the code base, checked on the source itself.

* The core (devices and links, workload, cost model, scheduler, simulator) imports no torch, Hydra
  or pandas, so a user can schedule and simulate with NumPy and SciPy alone.
* Only ``system/runtime`` and ``baselines/`` talk to ``torch.distributed``.
* The core imports nothing from ``baselines/``: the frameworks call the simulator (their perf
  models hand it their op-order programs), never the other way round.
* No import cycle between packages (``system.cost`` → ``system.scheduler`` → ``system.cost``).

Imports are read from the syntax tree, including those inside functions: a lazy import is still a
dependency. A second check imports the core in a fresh interpreter and looks at ``sys.modules``,
which catches what a static read cannot (an import through a helper).
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("system", "baselines", "repro")
CORE = (
    "system.cluster",
    "system.cases",
    "system.workload",
    "system.assignment",
    "system.cost",
    "system.scheduler",
    "system.simulator",
)
HEAVY = ("torch", "hydra", "omegaconf", "pandas", "pyarrow")
DISTRIBUTED_OK = ("system.runtime", "baselines")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _sources() -> dict[str, Path]:
    out = {}
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            out[_module_name(path)] = path
    return out


def _imports(module: str, path: Path) -> set[str]:
    """Absolute names of every module that ``path`` imports (relative imports resolved)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                prefix = ".".join(base)
                names.add(f"{prefix}.{node.module}" if node.module else prefix)
            elif node.module:
                names.add(node.module)
    return names


def _in(module: str, prefixes: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


SOURCES = _sources()
IMPORTS = {m: _imports(m, p) for m, p in SOURCES.items()}


def test_the_tree_is_found():
    assert _in("system.cost.partition", CORE)
    assert any(_in(m, ("system.scheduler",)) for m in SOURCES), "no scheduler sources found"


def test_core_imports_no_torch_hydra_or_pandas():
    bad = sorted(
        f"{m} imports {i}"
        for m, names in IMPORTS.items()
        if _in(m, CORE)
        for i in names
        if _in(i, HEAVY)
    )
    assert not bad, "core modules with heavy imports:\n" + "\n".join(bad)


def test_only_runtime_and_baselines_use_torch_distributed():
    bad = sorted(
        f"{m} imports {i}"
        for m, names in IMPORTS.items()
        if not _in(m, DISTRIBUTED_OK)
        for i in names
        if _in(i, ("torch.distributed",))
    )
    assert not bad, "torch.distributed outside system/runtime and baselines/:\n" + "\n".join(bad)


def _core_importing_baselines(imports: dict[str, set[str]]) -> list[str]:
    return sorted(
        f"{m} imports {i}"
        for m, names in imports.items()
        if _in(m, CORE)
        for i in names
        if _in(i, ("baselines",))
    )


def test_core_imports_no_baseline():
    bad = _core_importing_baselines(IMPORTS)
    assert not bad, "core modules importing baselines/:\n" + "\n".join(bad)


def test_a_core_import_of_a_baseline_would_be_found(monkeypatch):
    monkeypatch.setitem(IMPORTS, "system.simulator.fake", {"baselines.megatron.schedule"})
    assert _core_importing_baselines(IMPORTS) == [
        "system.simulator.fake imports baselines.megatron.schedule"
    ]


def _package(module: str) -> str:
    """The package a module belongs to, two levels deep (``system.cost.tsp`` → ``system.cost``)."""
    return ".".join(module.split(".")[:2])


def _package_cycles() -> list[list[str]]:
    graph: dict[str, set[str]] = {}
    for m, names in IMPORTS.items():
        src = _package(m)
        for i in names:
            if _in(i, PACKAGES) and _package(i) != src and _package(i) != i.split(".")[0]:
                graph.setdefault(src, set()).add(_package(i))
    cycles, state = [], {}

    def visit(node: str, stack: list[str]) -> None:  # depth-first search, bounded by graph size
        state[node] = "open"
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                cycles.append(stack[stack.index(nxt) :] + [nxt])
            elif nxt not in state:
                visit(nxt, stack + [nxt])
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    return cycles


def test_no_import_cycle_between_packages():
    cycles = _package_cycles()
    assert not cycles, "package import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)


def test_a_cycle_would_be_found(monkeypatch):
    monkeypatch.setitem(IMPORTS, "system.cost.fake", {"system.scheduler.api"})
    monkeypatch.setitem(IMPORTS, "system.scheduler.fake", {"system.cost.model"})
    assert any({"system.cost", "system.scheduler"} <= set(c) for c in _package_cycles())


@pytest.mark.slow
def test_importing_the_core_loads_no_heavy_module_and_no_baseline():
    modules = [m for m in SOURCES if _in(m, CORE)]
    banned = HEAVY + ("baselines",)
    code = (
        "import importlib, sys\n"
        f"for m in {modules!r}: importlib.import_module(m)\n"
        f"print(sorted({{k.split('.')[0] for k in sys.modules}} & set({banned!r})))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert out.stdout.strip() == "[]", out.stdout + out.stderr
