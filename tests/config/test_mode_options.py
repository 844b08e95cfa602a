"""One bad value per mode: every mode's typed options refuse it with one line naming the key,
before any work (a new mode adds its line to :data:`BAD`)."""

from __future__ import annotations

import pytest

from repro.config import MODES, ConfigError, validate

VAL = "results/validation/round6"
# mode -> (a bad option, the other options its check needs, what the error line says)
BAD = {
    "simulate": ({"repeats": 0}, {"case": "debug", "model": "debug"}, "repeats=0: must be >= 1"),
    "schedule": ({"scheduler": {"population": 1}}, {}, "scheduler.population=1: must be >= 2"),
    "train": ({"timeout_s": 0.0}, {}, "timeout_s=0.0: must be > 0"),
    "emulate": ({"bandwidth_scale": -1.0}, {}, "bandwidth_scale=-1.0: must be > 0"),
    "report": ({"results_dir": "no/such/study"}, {}, "no such results folder"),
    "collect": ({"results_dir": "no/such/study"}, {}, "no such results folder"),
    "emulation_report": ({"results_dir": "no/such/study"}, {}, "no such results folder"),
    "compare_baselines": ({"results_dir": "no/such/study"}, {}, "no such results folder"),
    "attribution": ({"cases": ["7"]}, {}, "case='7'"),
    "sensitivity": ({"seed": -1}, {}, "seed=-1: must be >= 0"),
    "scheduler_worth": ({"sailor_dir": "no/such/folder"}, {}, "no such file"),
    "scheduler_ablation": ({"population": 1}, {}, "population=1: must be >= 2"),
    "replan": ({"step_devices": 3}, {"dp": 2, "case": "debug"}, "multiple of dp=2"),
    "bench_scheduler": ({"per_regions": [0]}, {}, "per_regions[]=0: must be >= 1"),
    "bench_hetero": ({"workload": "dtfm_reference"}, {}, "a model workload"),
    "bench_runtime": ({"table": "../x.csv"}, {}, "table='../x.csv': a file name"),
    "bench_store": ({"rounds": 0}, {}, "rounds=0: must be >= 1"),
    "bench_sweep": ({"sweep_name": "nope"}, {}, "sweep_name='nope': expected one of"),
    "bench_plan_sailor": ({"points": ["geo_X_p9"]}, {}, "points=['geo_X_p9']: expected some of"),
    "gpu_check": ({"dry": "maybe"}, {}, "dry"),
    "probe_inputs": ({"limits": {"max_micro_batches": 0}}, {}, "max_micro_batches=0"),
    "profile": ({"repeats": 0}, {"settings": f"{VAL}/settings.json"}, "repeats=0: must be >= 1"),
    "calibrate": ({"settings": "none.json"}, {}, "settings='none.json': no such file"),
    "predict": ({"schedule_trials": 0}, {}, "schedule_trials=0: must be >= 1"),
    "measure": (
        {"deadline": "25:00"},
        {"predictions": f"{VAL}/predictions.json"},
        "deadline='25:00': expected HH:MM",
    ),
    "score": ({"measured": None}, {"predictions": f"{VAL}/predictions.json"}, "measured: give"),
    "external": ({"plans": "no/such/plans"}, {}, "plans='no/such/plans': no such folder"),
    "sailor_planner": ({"data_dir": "no/such"}, {}, "data_dir='no/such': lacks profiles_tmp.json"),
    "quality": ({"target_iters": 100}, {}, "target_iters=100 is past iters=64"),
    "plan": ({"max_iter_time_s": 10.0}, {"case": "debug"}, "applies to objective=cost only"),
    "quality_curves": ({"eval_every": 40}, {}, "eval_every=40 must be a multiple of diloco_h16"),
    "quality_links": ({"timing_warmup": 12}, {}, "timing_warmup=12 must be below timing_iters"),
    "link_sharing": ({"step": "verdict"}, {}, "predictions.json"),
    "collectives": ({"step": "verdict"}, {}, "experiment.json"),
}


def test_every_mode_has_its_bad_value():
    assert set(BAD) == set(MODES)


@pytest.mark.parametrize("mode", sorted(BAD))
def test_one_bad_value_is_one_line_naming_it(mode, monkeypatch, tmp_path):
    from pathlib import Path

    monkeypatch.chdir(Path(__file__).resolve().parents[2])
    bad, needs, message = BAD[mode]
    cfg = {"mode": mode, "results_dir": str(tmp_path), **needs, **bad}
    with pytest.raises(ConfigError) as err:
        validate(cfg)
    assert message in str(err.value) and len(str(err.value).splitlines()) == 1, str(err.value)


def test_emulate_refuses_an_objective_it_would_not_use(tmp_path):
    cfg = {"mode": "emulate", "results_dir": str(tmp_path)}
    with pytest.raises(ConfigError, match="scheduler.objective=iteration_time: mode=emulate"):
        validate({**cfg, "scheduler": {"objective": "iteration_time"}})


def test_one_search_spelling_for_every_mode_that_schedules():
    from repro.config.shared import SchedulerOptions

    s = SchedulerOptions(trials=7)
    got = s.search_kwargs("W", trials=300, time_limit_s=60.0)
    assert got["trials"] == 7 and got["time_limit_s"] == 60.0 and got["population"] is None
    assert got["method"] == "genetic" and got["objective"] == "comm" and got["workload"] is None
    timed = SchedulerOptions(objective="iteration_time").search_kwargs("W")
    assert timed["workload"] == "W" and timed["trials"] is None


# mode=quality builds an emulation and trains every system: each of these used to pass the
# check and fail (or silently run on other links) only after the scheduling and the namespaces
QUALITY_BAD = [
    ({"bandwidth_scale": 1e300}, "bandwidth_scale=1e+300: must be <= 100"),
    ({"delay_scale": 1e6}, "delay_scale=1000000.0: must be <= 100"),
    ({"bandwidth_scale": 1e-12}, "bandwidth_scale/delay_scale: emulated link 0->1"),
    ({"layers": 100000}, "limits.max_memory_gib"),
    ({"batch": None}, "batch"),
]


@pytest.mark.parametrize("bad,message", QUALITY_BAD, ids=[str(b) for b, _ in QUALITY_BAD])
def test_quality_refuses_links_and_models_it_cannot_run(bad, message, tmp_path):
    with pytest.raises(ConfigError) as err:
        validate({"mode": "quality", "results_dir": str(tmp_path), **bad})
    assert message in str(err.value) and len(str(err.value).splitlines()) == 1, str(err.value)


def test_quality_emulates_the_first_device_of_each_region(tmp_path):
    cfg = validate({"mode": "quality", "results_dir": str(tmp_path)})
    assert cfg.picked_devices() == [0, 8, 16, 24]  # case 5: 8 regions of 8 devices
    cfg = validate({"mode": "quality", "results_dir": str(tmp_path), "devices": [3, 1, 2, 0]})
    assert cfg.picked_devices() == [3, 1, 2, 0]
