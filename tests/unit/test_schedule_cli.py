"""mode=schedule, mode=bench_scheduler and mode=scheduler_ablation on tiny settings."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from repro.checks.bench import scheduler as bench_scheduler
from repro.config import validate
from repro.modes.schedule.run import schedule_case
from repro.studies.scheduler_ablation import run as scheduler_ablation
from system.assignment import Assignment
from system.cases import get_case
from system.cost.model import assignment_cost
from system.workload import DTFM_REFERENCE

ROOT = Path(__file__).resolve().parents[2]


def _schedule(**kw):
    scheduler = {k: kw.pop(k) for k in ("name", "trials", "population") if k in kw}
    return validate({"mode": "schedule", "scheduler": scheduler, **kw})


def test_schedule_writes_the_promised_json(tmp_path):
    from repro.run import run

    out = tmp_path / "a.json"
    cfg = _schedule(case="debug", name="genetic", seed=3, trials=4, population=4, out=str(out))
    run(cfg)
    record = schedule_case(cfg)
    data = json.loads(out.read_text())
    assert data.keys() == json.loads(json.dumps(record)).keys()
    assert data["stages"] == record["stages"]  # same seed, same layout
    for key in (
        "case",
        "num_devices",
        "dp",
        "pp",
        "stages",
        "dp_cost_s",
        "pp_cost_s",
        "total_cost_s",
        "search_time_s",
        "method",
        "seed",
        "trials",
        "history",
    ):
        assert key in data, key
    assert (data["pp"], data["dp"], data["num_devices"]) == (2, 4, 8)  # default_layout
    a = Assignment.from_stages(data["stages"])
    cost = assignment_cost(get_case("debug"), a, DTFM_REFERENCE)
    assert data["total_cost_s"] == cost.total_cost_s == data["dp_cost_s"] + 2 * data["pp_cost_s"]


def test_schedule_derived_workload_and_layout_flags(tmp_path):
    record = schedule_case(
        _schedule(case="debug", workload="debug", pp=4, name="random", trials=10)
    )
    assert (record["pp"], record["dp"]) == (4, 2)
    assert record["c_pp_bytes"] > 0 and record["workload"] == "debug"


def test_bad_arguments_are_reported():
    with pytest.raises(ValueError, match="cases"):
        validate({"mode": "schedule", "cases": "5"})
    with pytest.raises(ValueError, match="annealing"):
        _schedule(case="debug", name="annealing")


@pytest.mark.slow
def test_schedule_command_line(tmp_path):
    out = tmp_path / "s.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [
            sys.executable,
            "repro/run.py",
            "mode=schedule",
            "case=debug",
            "scheduler.trials=2",
            "scheduler.population=4",
            f"out={out}",
            f"hydra.run.dir={tmp_path}/hydra",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(out.read_text())["num_devices"] == 8


def test_replicated_case5_keeps_the_region_links():
    c = bench_scheduler.replicated_case5(16)
    c5 = get_case("5")
    assert c.num_devices == 128
    assert c.bandwidth_gbps[0, 1] == c5.bandwidth_gbps[0, 1]  # inside Oregon
    assert c.bandwidth_gbps[0, 16] == c5.bandwidth_gbps[0, 8]  # Oregon - Virginia
    assert c.delay_ms[20, 127] == c5.delay_ms[9, 63]


def test_ablation_tables_and_figure(tmp_path):
    cfg = validate(
        {
            "mode": "scheduler_ablation",
            "cases": ["debug"],
            "seeds": [0, 1],
            "trials": 2,
            "population": 4,
            "random_layouts": 20,
            "results_dir": str(tmp_path),
        }
    )
    scheduler_ablation.run(cfg)
    long = pd.read_csv(tmp_path / "ablation.csv")
    summary = pd.read_csv(tmp_path / "ablation_summary.csv")
    assert set(long.method) == {"tailored", "kl", "random"}
    assert list(long.columns[:5]) == ["case", "method", "seed", "trial", "best_total_cost_s"]
    assert not list(tmp_path.glob("*.png"))  # Fig. 4 is drawn by the study report only
    from repro.report.figures.fig4 import plot_fig4

    assert plot_fig4(long, tmp_path / "fig4.png").stat().st_size > 1000
    assert (tmp_path / "ablation.csv").exists() and (tmp_path / "ablation_summary.csv").exists()
    row = summary.iloc[0]
    assert row.ratio_random_over_tailored == pytest.approx(
        row.random_total_s / row.tailored_total_s
    )
    # curves never go up
    for _, d in long.groupby(["method", "seed"]):
        assert np.all(np.diff(d.sort_values("trial").best_total_cost_s.values) <= 1e-12)
