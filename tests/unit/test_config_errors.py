"""Every bad input of the command line is one clear error before any work (and wrote nothing).

Each case goes through the entry's ``repro.run.run`` (validation, then the mode), so it fails
on code that accepted the input silently or crashed with a traceback.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

import repro.config  # noqa: F401  (the schema conf/config.yaml names)
from repro.checks.probe_inputs.run import TOPOLOGY

ROOT = Path(__file__).resolve().parents[2]


def _cfg(*overrides):
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        return compose("config", overrides=list(overrides))


def _run(tmp_path, *overrides):
    from repro.run import run

    return run(_cfg(*overrides))


# (overrides, what the single error line must say); {tmp} is a fresh folder, {file} a file
RUN_CASES = [
    (["case=debug", "model=debug", "pp=0"], "pp=0: must be >= 1"),
    (["case=debug", "model=debug", "dp=0"], "dp=0: must be >= 1"),
    (["results_dir=''"], "results_dir=''"),
    (["results_dir={file}"], "is a file"),
    (["results_dir={file}/sub"], "is a file"),
    (["case=5", "pp=3"], "pp=3 does not divide case 5's 64 devices"),
    (["case=5", "dp=3"], "dp=3 does not divide"),
    (["case=5", "pp=4", "dp=4"], "pp=4 x dp=4 = 16"),
    (["case=9"], "case='9': unknown case"),
    (["case=debug", "model=debug", "batch=1000000000"], "limits.max_micro_batches"),
    (
        ["mode=train", "system=ours", "model=debug", "pp=2", "dp=100", "batch=200"],
        "limits.max_local_ranks",
    ),
    (["mode=train", "system=megatron", "grid=true", "grid_devices=500"], "limits.max_local_ranks"),
    (["mode=train", "zero=5"], "zero=5"),
    (["mode=train", "iters=0"], "iters=0"),
    (["micro_batch_size=0"], "micro_batch_size=0"),
    (["repeats=0"], "repeats=0"),
    (["study=''"], "study=''"),
    (["scheduler.time_limit_s=-1"], "scheduler.time_limit_s=-1"),
    (["mode=plan", "case=5", "budget_device_sims=0"], "budget_device_sims=0: must be >= 1"),
    (
        ["mode=plan", "case=5", "framework=sailor", "profiles={tmp}", "budget_device_sims=5"],
        "budget_device_sims",
    ),
    (["mode=emulate", "case=5", "devices=[0,99]"], "devices=[0, 99]"),
    (["compute_efficiency=nan"], "compute_efficiency=nan: must be a finite number"),
    (["case=debug", "model=debug", "layers=3"], "not divisible into pp=2"),
    (["case={topo_extra}"], "unknown column(s) ['note']"),
    (["case={topo_bool}"], "bandwidth_gbps=True is not a number"),
    (["case={tmp}/missing.yaml"], "does not exist"),
    # the report's ablation table: a folder failed the report after the run
    (["case=debug", "model=debug", "workflow.ablation_csv={tmp}"], "not a file"),
]


@pytest.mark.parametrize("overrides,message", RUN_CASES, ids=[" ".join(c[0]) for c in RUN_CASES])
def test_bad_run_input_is_one_error_naming_it(tmp_path, overrides, message):
    (tmp_path / "file").write_text("x")
    (tmp_path / "extra.yaml").write_text(TOPOLOGY % ("1", ", note: x"))
    (tmp_path / "bool.yaml").write_text(TOPOLOGY % ("true", ""))
    subs = {
        "{tmp}": str(tmp_path),
        "{file}": str(tmp_path / "file"),
        "{topo_extra}": str(tmp_path / "extra.yaml"),
        "{topo_bool}": str(tmp_path / "bool.yaml"),
    }
    args = []
    for o in overrides:
        for k, v in subs.items():
            o = o.replace(k, v)
        args.append(o)
    if not any(a.startswith("results_dir=") for a in args):
        args.append(f"results_dir={tmp_path}/out")
    with pytest.raises(ValueError, match=None) as err:
        _run(tmp_path, *args)
    assert message in str(err.value), str(err.value)
    assert len(str(err.value).splitlines()) == 1
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "overrides,message",
    [
        (["layers=24.9"], "layers"),
        (["batch=1e9"], "batch"),
        (["scheduler=genetic"], "scheduler"),
        (["bogus_key=1"], "bogus_key"),
        (["mode=train", "runtime.lr=fast"], "runtime.lr"),
        (["logger=bogus"], "Invalid value 'bogus', expected one of [none, wandb]"),
        (
            ["mode=train", "system=pytorch"],
            "'pytorch', expected one of [ours, megatron, deepspeed]",
        ),
        (["mode=train", "system=ours_random"], "'ours_random'"),
        (["mode=bogus"], "mode/bogus"),
        (["model=gpt5"], "'gpt5'"),
        (["scheduler.name=annealing"], "'annealing'"),
        (["case_variant=dtfm"], "'dtfm'"),
        (["mode=train", "runtime.dp_mode=ring"], "'ring'"),
        (["wandb.mode=sometimes"], "'sometimes'"),
        (["mode=emulate", "layouts=[best]"], "'best'"),
        (["baseline_placements=[fair]"], "'fair', expected one of [launch, topology]"),
        (["iters=3"], "Key 'iters' not in 'SimulateConfig'"),  # a key of mode=train only
    ],
)
def test_wrong_types_keys_and_choices_stop_at_composition(overrides, message):
    from hydra.errors import ConfigCompositionException, MissingConfigException

    with pytest.raises((ConfigCompositionException, MissingConfigException)) as err:
        _cfg(*overrides)
    assert message in str(err.value) + str(err.value.__cause__)


def test_default_results_folders_are_per_mode():
    from repro.config import validate

    assert validate(_cfg()).results_dir == "results/adhoc/simulate"
    assert validate(_cfg("mode=train", "model=debug")).results_dir == "results/adhoc/train"
    assert validate(_cfg("study=paper")).results_dir == "results/paper"


def test_a_local_train_run_has_no_case():
    from repro.config import validate

    assert not hasattr(validate(_cfg("mode=train", "model=debug", "pp=2", "dp=2")), "case")


@pytest.mark.parametrize("mode", ["simulate", "schedule", "emulate", "replan"])
def test_a_case_alias_is_its_number_everywhere(mode):
    """``case=worldwide`` is case 5 in every mode that takes a case (rows, claims, file names)."""
    from repro.config import validate

    cfg = validate(_cfg(f"mode={mode}", "case=worldwide", "results_dir=elsewhere"))
    assert cfg.case == (["5"] if mode == "simulate" else "5")
    assert validate(_cfg("case=[worldwide,1]")).case == ["5", "1"]


def test_limits_can_be_raised_explicitly():
    from repro.config import validate

    over = ("mode=train", "model=debug", "pp=2", "dp=100", "batch=200")
    with pytest.raises(ValueError, match=r"over limits.max_local_ranks=\d+ "):
        validate(_cfg(*over))
    with pytest.raises(ValueError, match=r"200 ranks on this machine: over limits.max_memory_gib"):
        validate(_cfg(*over, "limits.max_local_ranks=200"))  # 200 interpreters: ~75 GiB
    cfg = validate(_cfg(*over, "limits.max_local_ranks=200", "limits.max_memory_gib=100"))
    assert cfg.dp == 100


@pytest.mark.parametrize(
    "overrides,message",
    [
        (["case=9"], "unknown case"),
        (["pp=3"], "pp=3"),
        (["scheduler.trials=0"], "scheduler.trials=0"),
        (["out="], "out=''"),
    ],
)
def test_schedule_bad_values_are_one_line(tmp_path, overrides, message):
    from repro.run import run

    with pytest.raises(ValueError) as err:
        run(_cfg("mode=schedule", *overrides, f"results_dir={tmp_path}"))
    assert message in str(err.value) and len(str(err.value).splitlines()) == 1


def test_schedule_stops_on_convergence_by_default():
    from repro.config import validate

    cfg = validate(_cfg("mode=schedule", "case=5"))
    s = cfg.scheduler
    assert s.time_limit_s is None and s.trials is None  # the scheduler's convergence rule
    assert validate(_cfg("mode=schedule", "scheduler.time_limit_s=3")).scheduler.time_limit_s == 3


@contextlib.contextmanager
def _mode_made_here(name: str):
    """A mode defined in a function (a class no pickle can name), with one key of its own
    (``probe_trials``), stored for the ``with`` block and removed after it."""
    from dataclasses import dataclass

    from repro.config import MODES, RunConfig, option, register_mode, store_schemas

    @dataclass
    @register_mode(name, "repro.modes.schedule.run:run")
    class ProbeConfig(RunConfig):
        """A mode for this test."""

        probe_trials: int = option(3, "the new key", ge=1)

    try:
        store_schemas()
        yield ProbeConfig
    finally:
        MODES.pop(name)
        store_schemas()


@pytest.mark.slow
def test_a_new_mode_and_its_key_are_one_class(tmp_path):
    """A mode's own key composes, reaches that mode typed, and is refused for other modes."""
    from repro.config import validate
    from repro.run import run

    with _mode_made_here("probe"):
        out = f"results_dir={tmp_path}"
        assert validate(_cfg("mode=probe", "probe_trials=7", out)).probe_trials == 7
        with pytest.raises(ValueError, match="probe_trials=0: must be >= 1"):
            run(_cfg("mode=probe", "probe_trials=0", out))
        from hydra.errors import ConfigCompositionException

        with pytest.raises(ConfigCompositionException):
            _cfg("probe_trials=7", out)  # not a key of mode=simulate
        assert not hasattr(validate(_cfg("case=debug", "model=debug", out)), "probe_trials")


@pytest.mark.parametrize(
    "text,message",
    [
        (
            "region_a,region_b,delay_ms,bandwidth_gbps\nA,B,10,1,extra\n",
            "more cells than the header",
        ),
        (
            "region_a,region_b,delay_ms,bandwidth_gbps,note\nA,B,10,1,x\n",
            "unknown column(s) ['note']",
        ),
        ("region_a,region_b,delay_ms,bandwidth_gbps\nA,B,10,fast\n", "bandwidth_gbps='fast'"),
    ],
)
def test_pair_tables_refuse_extra_cells_and_non_numbers(tmp_path, text, message):
    from system.cases import read_pair_table

    (tmp_path / "pairs.csv").write_text(text)
    with pytest.raises(ValueError) as err:
        read_pair_table(tmp_path / "pairs.csv")
    assert message in str(err.value)


@pytest.mark.slow
def test_scheduling_is_a_mode_of_run_py(tmp_path):
    import json

    from repro.run import run

    out = run(_cfg("mode=schedule", "case=debug", "scheduler.trials=2", f"results_dir={tmp_path}"))
    record = json.loads(Path(out["out"]).read_text())
    assert record["num_devices"] == 8 and record["time_limit_s"] is None


@pytest.mark.slow  # a fresh interpreter
def test_a_bad_value_on_the_command_line_is_one_line_and_exit_2(tmp_path):
    """Through ``python repro/run.py``: one ``error:`` line and exit 2, before any work."""
    import subprocess
    import sys

    p = subprocess.run(
        [sys.executable, "repro/run.py", "mode=bench_scheduler", "per_regions=[0]"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert p.returncode == 2, p.stdout + p.stderr
    assert "error: per_regions[]=0: must be >= 1" in p.stderr, p.stderr


def test_validation_leaves_the_schema_it_merges_into_unchanged():
    """Each mode's structured schema is made once and merged into for every config: neither a
    good nor a bad config changes it."""
    from omegaconf import OmegaConf

    from repro.config import MODES, ConfigError, validate
    from repro.config.base import _structured

    fresh = OmegaConf.to_yaml(OmegaConf.structured(MODES["simulate"].schema))
    got = validate({"mode": "simulate", "case": "5", "layers": 40, "scheduler": {"trials": 7}})
    assert got.layers == 40 and got.scheduler.trials == 7
    with pytest.raises(ConfigError, match="layers"):
        validate({"mode": "simulate", "layers": -3})
    assert OmegaConf.to_yaml(_structured(MODES["simulate"].schema)) == fresh
    assert validate({"mode": "simulate"}).layers != 40


def test_stored_schemas_are_shared_copied_safely_and_pickled_by_name():
    """The ConfigStore's schemas are shared by every composition's copy of the store, never
    changed through a copy ``ConfigStore.load`` hands out, and pickled as their class's name
    (a launcher ships the store with every job): the receiving process takes its own node."""
    import copy
    import pickle

    import cloudpickle
    from hydra.core.config_store import ConfigStore
    from omegaconf import OmegaConf

    from repro.config import MODES

    cs = ConfigStore.instance()
    stored = cs.repo["mode"]["simulate.yaml"]
    fresh = OmegaConf.to_yaml(OmegaConf.structured(MODES["simulate"].schema))
    assert OmegaConf.to_yaml(stored.node) == fresh
    assert copy.deepcopy(cs.repo)["mode"]["simulate.yaml"] is stored
    loaded = cs.load("mode/simulate.yaml")
    assert loaded is not stored and loaded.node is not stored.node
    loaded.node.layers = 3  # a composition changes its copy, never the stored node
    assert OmegaConf.to_yaml(stored.node) == fresh
    shipped = cloudpickle.dumps(cs)
    assert pickle.loads(shipped).repo["mode"]["simulate.yaml"] is stored
    assert len(cloudpickle.dumps(stored)) < len(cloudpickle.dumps(stored.node)) / 10


@pytest.mark.slow
def test_a_schema_made_at_run_time_is_pickled_whole():
    """A mode class no pickle can name (defined in a function) travels with its node."""
    import pickle

    import cloudpickle
    from omegaconf import OmegaConf

    from repro.hydra_fast import _SCHEMA_NODES

    with _mode_made_here("probe_pickle"):
        node = _SCHEMA_NODES[("mode", "probe_pickle.yaml")]
        back = pickle.loads(cloudpickle.dumps(node))
        assert back is not node and back.schema is None
        assert OmegaConf.to_yaml(back.node) == OmegaConf.to_yaml(node.node)
        assert back.node.probe_trials == 3
