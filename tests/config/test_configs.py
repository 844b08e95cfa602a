"""Every sweep file and every config option composes (Hydra compose API), with known values."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.override_parser.overrides_parser import OverridesParser

from repro.config import MODES, validate
from repro.modes.simulate.config import SimulatedSystem
from system.cases import CASES
from system.workload import MODELS

CONF = Path(__file__).resolve().parents[2] / "conf"
SWEEPS = sorted(p.stem for p in (CONF / "sweep").glob("*.yaml"))
SYSTEMS = {s.value for s in SimulatedSystem}


def _compose(overrides, hydra: bool = True):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose("config", overrides=list(overrides), return_hydra_config=hydra)


def _jobs(cfg):
    """Expand the sweeper params into one override list per job."""
    parsed = OverridesParser.create().parse_overrides(
        [f"{k}={v}" for k, v in (cfg.hydra.sweeper.params or {}).items()]
    )
    axes = [[f"{o.get_key_element()}={v}" for v in o.sweep_string_iterator()] for o in parsed]
    return [list(c) for c in itertools.product(*axes)]


@pytest.mark.parametrize("name", SWEEPS)
def test_sweep_file_shape(name):
    lines = (CONF / "sweep" / f"{name}.yaml").read_text().splitlines()
    assert lines[0] == "# @package _global_"  # Hydra ignores it anywhere else
    assert lines[1].startswith("# python repro/run.py -m sweep=" + name)


def _check_sweep(name: str, every_job: bool) -> None:
    cfg = _compose([f"sweep={name}"])
    assert str(cfg.hydra.mode) == "RunMode.MULTIRUN"
    assert cfg.study == name or name.startswith(f"{cfg.study}_")  # baselines_<part> -> baselines
    assert cfg.hydra.callbacks.workflow._target_ == "repro.sweep.WorkflowCallback"
    jobs = _jobs(cfg)
    assert jobs
    picked = range(len(jobs)) if every_job else sorted({0, len(jobs) // 2, len(jobs) - 1})
    for i in picked:
        job = _compose([f"sweep={name}", *jobs[i]])
        assert job.mode in MODES and str(job.get("case", "5")) in CASES and job.model in MODELS
        assert "system" not in job or str(job.system) in SYSTEMS  # mode=quality runs a list
        validate(_compose([f"sweep={name}", *jobs[i], "results_dir=elsewhere"], hydra=False))


@pytest.mark.parametrize(
    "name",
    [s if s in ("smoke", "paper") else pytest.param(s, marks=pytest.mark.slow) for s in SWEEPS],
)
def test_sweep_composes_and_its_first_middle_last_jobs_compose(name):
    """Every job of a sweep shares one schema, so this composes three of them (a Hydra compose
    costs about 0.1 s; the fast tier checks the smoke and paper sweeps, the slow tier the rest);
    a slow test composes every job."""
    _check_sweep(name, every_job=False)


@pytest.mark.slow
@pytest.mark.parametrize("name", SWEEPS)
def test_every_job_of_every_sweep_composes(name):
    _check_sweep(name, every_job=True)


@pytest.mark.slow
def test_paper_sweep_is_the_fig3_grid():
    cfg = _compose(["sweep=paper"])
    jobs = _jobs(cfg)
    # the 45 settings of Fig. 3, and case 5's 9 again under link_sharing pair and nic
    assert len(jobs) == 7 * 3 * 3 and cfg.repeats == 3 and cfg.mode == "simulate"
    assert cfg.system == "all"  # each job simulates all systems
    cases, sharing = [], []
    for setting in sorted({o for j in jobs for o in j if o.startswith("setting=")}):
        job = _compose(["sweep=paper", setting], hydra=False)
        cases.append(str(job.case))
        sharing.append(str(job.link_sharing))
    assert sorted(zip(cases, sharing, strict=True)) == [
        *((str(c), "tc_class") for c in range(1, 5)),
        ("5", "nic"),
        ("5", "pair"),
        ("5", "tc_class"),
    ]


# option -> the other overrides it needs to make a valid run (the debug and small models have 4
# layers, so they take the debug case's pipeline depth; a report reads an existing folder; a
# validation step names its input files)
ROOT = CONF.parent
VAL = "results/validation/round6"
NEEDS = {
    "model=debug": ["case=debug"],
    "model=small": ["case=debug"],
    **{
        f"mode={m}": ["results_dir=results/smoke"]
        for m in ("report", "collect", "emulation_report", "compare_baselines")
    },
    "mode=profile": [f"settings={VAL}/settings.json"],
    "mode=calibrate": [f"settings={VAL}/settings.json"],
    "mode=predict": [f"settings={VAL}/settings.json", f"profile={VAL}/compute_profile.json"],
    "mode=measure": [f"predictions={VAL}/predictions.json"],
    "mode=score": [f"predictions={VAL}/predictions.json", f"measured={VAL}/measured.csv"],
    "mode=external": ["plans=tests/external/fixtures/tiny/plans"],
    "mode=sailor_planner": ["data_dir=tests/external/fixtures/tiny"],
    "mode=bench_plan_sailor": ["profiles=tests/external/fixtures/tiny"],
}


@pytest.mark.parametrize(
    "override",
    [
        *(f"mode={m}" for m in MODES),
        *(f"case={c}" for c in CASES),
        *(f"model={m}" for m in MODELS),
        *(f"system={s}" for s in sorted(SYSTEMS)),
        "scheduler.name=genetic",
        "scheduler.name=genetic_kl",
        "scheduler.name=random",
        "case_variant=dtfm_code",
        "logger=wandb",
        "wandb.mode=online",
        "workflow.skip_finished=false",
        "results_dir=elsewhere",
        "layers=40",
        "batch=4096",
    ],
)
def test_every_option_passes_its_mode_checks(override, monkeypatch):
    """Each documented value composes and passes the typed checks of the mode it runs under
    (:func:`repro.config.validate`), which hold it under its own key."""
    monkeypatch.chdir(ROOT)
    cfg = validate(_compose([override, *NEEDS.get(override, [])], hydra=False))
    key, value = override.split("=")
    node = cfg
    for part in key.split("."):
        node = getattr(node, part)
    assert str(node[0] if isinstance(node, list) else node).lower() == value


def test_results_dir_follows_the_study():
    assert validate(_compose(["study=xyz"], hydra=False)).results_dir == "results/xyz"


def test_every_command_the_readme_lists_is_one_entry():
    """The README's commands go through ``repro/run.py`` (or ``python -m repro``, the same): no
    second script, no module of its own with a hand-written argument parser."""
    import re

    text = (ROOT / "README.md").read_text()
    scripts = set(re.findall(r"python (repro/(?:\w+/)*\w+\.py)", text))
    assert scripts == {"repro/run.py"}, scripts
    modules = set(re.findall(r"python -m (repro[\w.]*)", text))
    assert modules <= {"repro"}, modules


def test_every_mode_is_listed_by_help():
    """``python repro/run.py --help`` lists every mode, and a mode's ``--help`` its options."""
    from repro.config import mode_help
    from repro.modes.simulate.config import SimulateConfig

    text = mode_help("simulate")
    for name in MODES:
        assert f"  {name} " in text, name
    import dataclasses

    for f in dataclasses.fields(SimulateConfig):
        if not dataclasses.is_dataclass(f.default_factory) and f.name != "mode":
            assert f"  {f.name} (" in text or f"  {f.name}." in text, f.name
