"""Every bad input of the command line is one clear error before any work (and wrote nothing).

Each case goes through the public entry points that existed before the typed config
(``repro.run.run``, ``repro.train.spec_from_args``, ``repro.schedule.main``), so each of them
fails on code that accepted the input silently or crashed with a traceback.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from repro.probe_inputs import TOPOLOGY

try:  # the schema conf/config.yaml names (absent before the typed config: tests then fail)
    import repro.config  # noqa: F401
except ImportError:
    pass

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
    (["logger=bogus"], "logger='bogus': expected one of none, wandb"),
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
    (["mode=train", "system=pytorch"], "system='pytorch'"),
    (["mode=train", "system=ours_random"], "system='ours_random'"),
    (["mode=bogus"], "mode='bogus'"),
    (["model=gpt5"], "model='gpt5'"),
    (["zero=5"], "zero=5"),
    (["iters=0"], "iters=0"),
    (["micro_batch_size=0"], "micro_batch_size=0"),
    (["repeats=0"], "repeats=0"),
    (["study=''"], "study=''"),
    (["scheduler.name=annealing"], "scheduler.name='annealing'"),
    (["scheduler.time_limit_s=-1"], "scheduler.time_limit_s=-1"),
    (["case_variant=dtfm"], "case_variant='dtfm'"),
    (["runtime.dp_mode=ring"], "runtime.dp_mode='ring'"),
    (["wandb.mode=sometimes"], "wandb.mode='sometimes'"),
    (["mode=emulate", "case=5", "emulate.devices=[0,99]"], "emulate.devices"),
    (["mode=emulate", "case=5", "emulate.layouts=[best]"], "emulate.layouts"),
    (["case=debug", "model=debug", "layers=3"], "not divisible into pp=2"),
    (["case={topo_extra}"], "unknown column(s) ['note']"),
    (["case={topo_bool}"], "bandwidth_gbps=True is not a number"),
    (["case={tmp}/missing.yaml"], "does not exist"),
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
    "override,message",
    [
        ("layers=24.9", "layers"),
        ("batch=1e9", "batch"),
        ("scheduler=genetic", "scheduler"),
        ("bogus_key=1", "bogus_key"),
        ("runtime.lr=fast", "runtime.lr"),
    ],
)
def test_wrong_types_and_keys_stop_at_composition(override, message):
    from hydra.errors import ConfigCompositionException

    with pytest.raises(ConfigCompositionException) as err:
        _cfg(override)
    assert message in str(err.value) + str(err.value.__cause__)


def test_default_results_folders_are_per_mode():
    from repro.config import validate

    assert validate(_cfg()).results_dir == "results/adhoc/simulate"
    assert validate(_cfg("mode=train", "model=debug")).results_dir == "results/adhoc/train"
    assert validate(_cfg("study=paper")).results_dir == "results/paper"


def test_a_local_train_run_is_not_case_5():
    from repro.config import validate

    assert validate(_cfg("mode=train", "model=debug", "pp=2", "dp=2")).case == "local"


def test_limits_can_be_raised_explicitly():
    from repro.config import validate

    cfg = validate(
        _cfg(
            "mode=train", "model=debug", "pp=2", "dp=100", "batch=200", "limits.max_local_ranks=200"
        )
    )
    assert cfg.dp == 100


@pytest.mark.parametrize(
    "args,message",
    [
        (["pp=2", "dp=100", "batch=200"], "max_local_ranks"),
        (["pp=x"], "pp"),
        (["layers=2.5"], "layers"),
        (["bogus=1"], "unknown key 'bogus'"),
        (["batch=1000000000"], "max_micro_batches"),
    ],
)
def test_train_script_checks_its_arguments(args, message):
    from repro.train import spec_from_args

    with pytest.raises(ValueError, match=message):
        spec_from_args(args)


@pytest.mark.parametrize(
    "args,message",
    [
        (["case=9"], "unknown case"),
        (["time_limit_s=x"], "time_limit_s"),
        (["pp=3"], "pp=3"),
        (["pp=abc"], "pp"),
        (["workload=huge"], "workload='huge'"),
        (["trials=0"], "trials=0"),
    ],
)
def test_schedule_script_bad_values_exit_2_with_one_line(capsys, args, message):
    from repro.schedule import main

    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err and message in err[-1]


def test_schedule_script_stops_on_convergence_by_default():
    from repro.schedule import parse_args

    cfg = parse_args(["case=5"])
    assert cfg.time_limit_s is None and cfg.trials is None  # the scheduler's convergence rule
    assert parse_args(["case=5", "time_limit_s=3"]).time_limit_s == 3.0


def test_a_new_mode_and_its_key_are_one_class(tmp_path):
    """A mode's own key composes, reaches that mode typed, and is refused for other modes."""
    from dataclasses import dataclass

    from repro.config import MODES, ConfigError, RunConfig, register_mode, store_schemas, validate

    @register_mode("probe", module="repro.modes.simulate")
    @dataclass
    class ProbeConfig(RunConfig):
        probe_objective: str = "comm"  # the new key

        def __post_init__(self) -> None:
            super().__post_init__()
            if self.probe_objective not in ("comm", "iteration_time"):
                raise ConfigError(
                    f"probe_objective={self.probe_objective!r}: expected comm or iteration_time"
                )

    try:
        store_schemas()
        out = f"results_dir={tmp_path}"
        assert validate(
            _cfg("mode=probe", "probe_objective=iteration_time", out)
        ).probe_objective == ("iteration_time")
        with pytest.raises(ConfigError, match="probe_objective='x'"):
            validate(_cfg("mode=probe", "probe_objective=x", out))
        with pytest.raises(ConfigError, match="a mode=probe key; mode=simulate does not take it"):
            validate(_cfg("probe_objective=iteration_time", out))
        assert "probe_objective" not in validate(_cfg("case=debug", "model=debug", out))
    finally:
        MODES.pop("probe")
        store_schemas()


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


def test_scheduling_is_a_mode_of_run_py(tmp_path):
    import json

    from repro.run import run

    out = run(_cfg("mode=schedule", "case=debug", "scheduler.trials=2", f"results_dir={tmp_path}"))
    record = json.loads(Path(out["out"]).read_text())
    assert record["num_devices"] == 8 and record["time_limit_s"] is None
    with pytest.raises(ValueError, match="workload='huge'"):
        run(_cfg("mode=schedule", "case=debug", "workload=huge", f"results_dir={tmp_path}"))


@pytest.mark.slow  # a fresh interpreter per script
@pytest.mark.parametrize(
    "script, arg, message",
    [
        ("ablation", "seeds=a,b", "seeds='a,b': expected comma-separated integers"),
        ("ablation", "trials=0", "trials=0: must be >= 1"),
        ("bench_scheduler", "per_regions=0", "per_regions='0'"),
        ("bench_scheduler", "bogus=1", "unknown key 'bogus'"),
        ("bench_hetero", "seeds=x", "seeds='x'"),
        ("bench_runtime", "micro=a", "micro='a'"),
        ("bench_runtime", "pp=x", "pp: Value 'x'"),
        ("bench_launchers", "rounds=0", "rounds=0: must be >= 1"),
    ],
)
def test_benchmark_scripts_share_the_typed_parser(script, arg, message):
    """Every benchmark the README lists: a bad argument is one error line and exit 2, before
    any work (no hand-written key=value parser of its own)."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    p = subprocess.run(
        [sys.executable, str(root / "repro" / f"{script}.py"), arg],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=root,
    )
    assert p.returncode == 2, p.stdout + p.stderr
    assert message in " ".join((p.stdout + p.stderr).split()), p.stdout + p.stderr
