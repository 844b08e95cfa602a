"""Hydra's joblib launcher runs a sweep's jobs in parallel processes: same rows as the serial
launcher, one ledger entry per job, the report built once at the end (the wall-time comparison
is a benchmark: ``python repro/run.py mode=bench_sweep``)."""

from __future__ import annotations

import importlib.util

import pandas as pd
import pytest

from repro.checks.bench.sweep import run_sweep

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        importlib.util.find_spec("hydra_plugins.hydra_joblib_launcher") is None,
        reason="pip install hydra-joblib-launcher",
    ),
]


@pytest.mark.parametrize("n_jobs", [2, 1])  # 1: joblib runs the jobs in this process
def test_joblib_sweep_writes_the_serial_sweeps_rows(tmp_path, n_jobs):
    extra = ["case=4,5", "batch=1024", "repeats=1"]
    _, serial = run_sweep("smoke", "serial", tmp_path / "serial", overrides=extra)
    _, par = run_sweep("smoke", "joblib", tmp_path / "joblib", n_jobs=n_jobs, overrides=extra)
    assert par == serial and len(par) > 0
    assert len(list((tmp_path / "joblib" / "jobs").glob("*.json"))) == 2
    a = pd.read_csv(tmp_path / "serial" / "runs.csv").sort_values("run_id")
    b = pd.read_csv(tmp_path / "joblib" / "runs.csv").sort_values("run_id")
    pd.testing.assert_series_equal(  # seeded: the same numbers (NaN: infeasible points)
        a["iter_time_s"].reset_index(drop=True), b["iter_time_s"].reset_index(drop=True)
    )
    log = (tmp_path / "joblib" / "sweep.log").read_text()
    assert log.count("REPORT.md:") == 1
    # each job ran with the Hydra config the serial launcher gives it (its log is named by the
    # job's name), though joblib's workers composed it in the pre-check
    assert _files(tmp_path / "joblib") == _files(tmp_path / "serial")


def _files(results_dir):
    sweep_dir = results_dir / "multirun"
    return sorted(str(p.relative_to(sweep_dir)) for p in sweep_dir.rglob("*") if p.is_file())
