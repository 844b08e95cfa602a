"""A mode is one folder: its options in ``config.py``, its work in ``run.py``; the registry
imports the ``config.py`` files and nothing of the modes' work."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from repro.config import MODES
from repro.config.base import MODE_CONFIGS

ROOT = Path(__file__).resolve().parents[2]


def test_every_config_file_registers_a_mode_and_every_mode_comes_from_one():
    files = {p for pattern in MODE_CONFIGS for p in (ROOT / "repro").glob(pattern)}
    modules = {".".join(p.relative_to(ROOT).with_suffix("").parts) for p in files}
    registered = {spec.schema.__module__ for spec in MODES.values()}
    assert modules <= registered, f"config.py files that register no mode: {modules - registered}"
    assert registered - modules == set(), "modes registered outside a mode folder's config.py"


def test_a_single_mode_folder_runs_the_run_py_beside_its_config():
    for spec in MODES.values():
        package = spec.schema.__module__.rpartition(".")[0]
        if (
            spec.schema.__module__.endswith(".config")
            and Path(ROOT, *package.split("."), "run.py").is_file()
        ):
            assert spec.runner.startswith(f"{package}.run:"), spec


@pytest.mark.slow
def test_importing_the_registry_imports_no_modes_work():
    code = (
        "import sys, json, repro.config as c; "
        "print(json.dumps([len(c.MODES), sorted(m for m in sys.modules "
        "if m.startswith(('repro.modes', 'repro.studies', 'repro.checks', 'repro.report')))]))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    n, loaded = json.loads(out.stdout.strip().splitlines()[-1])
    assert n == len(MODES)
    configs = [m for m in loaded if m.endswith(".config")]
    packages = {m.rsplit(".", k)[0] for m in configs for k in (1, 2)}
    assert [m for m in loaded if m not in configs and m not in packages] == []


@pytest.mark.slow
def test_a_mode_config_imported_first_is_still_stored_for_hydra():
    code = (
        "import repro.modes.simulate.config; "
        "from hydra.core.config_store import ConfigStore; "
        "print('simulate.yaml' in ConfigStore.instance().repo['mode'])"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip().splitlines()[-1] == "True"


def _layout_table() -> str:
    text = (ROOT / "README.md").read_text()
    start = text.index("## Layout")
    return text[start : text.index("\n## ", start + 1)]


def test_the_readme_layout_names_paths_that_exist_and_every_mode_folder():
    """The README's layout section matches the tree: every path it names in its first column
    exists, and every folder of a mode, study or check is named in it."""
    import re

    table = _layout_table()
    rows = [line for line in table.splitlines() if line.startswith("| `")]
    named = [p for row in rows for p in re.findall(r"`([\w./-]+)`", row.split(" | ")[0])]
    assert named, "no layout table"
    missing = [p for p in named if not (ROOT / p).exists()]
    assert missing == [], f"README layout names paths that do not exist: {missing}"
    folders = [
        p
        for parent in ("modes", "studies", "checks")
        for p in sorted((ROOT / "repro" / parent).iterdir())
        if p.is_dir() and (p / "__init__.py").is_file()
    ]
    unnamed = [f"{p.parent.name}/{p.name}" for p in folders if f"`{p.name}/`" not in table]
    assert unnamed == [], f"mode folders the README's layout does not name: {unnamed}"
