"""The Hydra speed layer (``repro/hydra_fast.py``) is the one user of Hydra's private API, and
what it relies on is still there: a Hydra upgrade that removes or changes one of them fails
here, naming it, before a sweep composes a job differently."""

from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
from pathlib import Path

import pytest

from repro.hydra_fast import HYDRA_INTERNALS

ROOT = Path(__file__).resolve().parents[2]
LAYER = ROOT / "repro" / "hydra_fast.py"
# Hydra's public entry points (the decorator, the callback base class, the compose API and its
# errors); anything else of Hydra's is the layer's
PUBLIC = ("hydra", "hydra.experimental.callback", "hydra.errors")


def _resolve(module: str, path: str):
    found = importlib.import_module(module)
    for part in path.split("."):
        if dataclasses.is_dataclass(found) and part in {f.name for f in dataclasses.fields(found)}:
            return found  # an instance field (Override.input_line)
        else:
            found = getattr(found, part)
    return found


@pytest.mark.parametrize("module, path, params", HYDRA_INTERNALS, ids=lambda x: str(x))
def test_every_hydra_internal_the_layer_uses_is_still_there(module, path, params):
    name = f"{module}.{path}"
    try:
        found = _resolve(module, path)
    except (ImportError, AttributeError) as e:
        pytest.fail(f"Hydra internal {name} is gone ({e}): repro/hydra_fast.py must follow")
    if params is None:
        return
    if dataclasses.is_dataclass(found):
        have = [f.name for f in dataclasses.fields(found)]
    else:
        have = list(inspect.signature(found).parameters)
    missing = [p for p in params if p not in have]
    assert not missing, (
        f"Hydra internal {name} changed: no parameter {missing} (it has {have}); "
        "repro/hydra_fast.py must follow"
    )
    assert have[: len(params)] == list(params) or not [p for p in params if p != "self"], (
        f"Hydra internal {name} changed the order of its parameters: {have}, "
        f"the layer passes {list(params)}"
    )


def test_the_plugin_scan_is_still_a_staticmethod_of_plugins():
    from hydra.core.plugins import Plugins

    assert isinstance(Plugins.__dict__.get("_scan_all_plugins"), staticmethod), (
        "Hydra internal hydra.core.plugins.Plugins._scan_all_plugins is no longer a "
        "staticmethod: repro.hydra_fast.scan_plugins_once must follow"
    )


def test_the_config_store_still_copies_a_node_shallowly_and_keeps_a_repo():
    """``ConfigStore.load`` hands out ``copy.copy`` of the stored node (the shared schema node
    relies on it) and the store's nodes live in ``ConfigStore.repo``."""
    from hydra.core.config_store import ConfigStore

    cs = ConfigStore.instance()
    assert isinstance(getattr(cs, "repo", None), dict), "Hydra internal ConfigStore.repo is gone"
    stored = cs.repo["mode"]["simulate.yaml"]
    loaded = cs.load("mode/simulate.yaml")
    assert loaded is not stored and type(loaded) is type(stored), (
        "Hydra internal ConfigStore.load no longer hands out a copy of the stored node"
    )


def _hydra_imports(path: Path) -> list[str]:
    tree = ast.parse(path.read_text())
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.append(node.module)
    return [n for n in names if n.split(".")[0] == "hydra" and n not in PUBLIC]


@pytest.mark.slow
def test_no_other_module_uses_hydras_internals():
    users = {
        str(p.relative_to(ROOT)): found
        for top in ("repro", "system")
        for p in sorted((ROOT / top).rglob("*.py"))
        if p != LAYER and (found := _hydra_imports(p))
    }
    assert users == {}, f"Hydra's internals outside repro/hydra_fast.py: {users}"
    assert _hydra_imports(LAYER), "the layer no longer imports Hydra's internals"
