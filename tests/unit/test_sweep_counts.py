"""A sweep's summary counts its jobs from the study's ledger, whichever launcher ran them."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from repro.sweep import count_outcomes, ledger_path, ledger_stamps
from tests.unit._workflow_rows import TWO_DEBUG_JOBS

ROOT = Path(__file__).resolve().parents[2]
ENV = {
    **os.environ,
    "OMP_NUM_THREADS": "1",
    "WANDB_MODE": "disabled",
    "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
}
SUMMARY = re.compile(r"(\d+) jobs ran, (\d+) skipped \(already finished\), (\d+) failed")


def _entry(results_dir: Path, key: str, sweep_dir: Path, status: str = "ok") -> None:
    p = ledger_path(results_dir, key)
    p.parent.mkdir(parents=True, exist_ok=True)
    rec = {"job_key": key, "status": status, "output_dir": str(sweep_dir / key), "run_ids": []}
    if status != "ok":
        rec["error"] = "ValueError: boom"
    p.write_text(json.dumps(rec))


def test_count_outcomes_reads_ran_skipped_failed_and_missing_from_the_ledger(tmp_path):
    ours, other = tmp_path / "mr-ours", tmp_path / "mr-other"
    _entry(tmp_path, "done-before", other)  # finished by an earlier sweep: skipped
    _entry(tmp_path, "failed-before", other, status="error")  # runs again below
    keys = ["done-before", "failed-before", "ran", "failed", "by-other", "missing"]
    before = ledger_stamps(tmp_path, keys)
    assert before["done-before"] is not None and before["ran"] is None
    time.sleep(0.01)  # a new mtime for every rewritten entry
    _entry(tmp_path, "failed-before", ours)  # rerun by this sweep, now finished
    _entry(tmp_path, "ran", ours)
    _entry(tmp_path, "failed", ours, status="error")
    _entry(tmp_path, "by-other", other)  # a concurrent sweep into the same study ran it
    out = count_outcomes(tmp_path, before, str(ours))
    assert (out.ran, out.skipped) == (2, 2)
    assert sorted(f["job_key"] for f in out.failed) == ["failed", "missing"]
    assert "boom" in next(f["error"] for f in out.failed if f["job_key"] == "failed")


def _sweep(results_dir: Path, sweep_dir: Path, launcher: str) -> str:
    extra = ["hydra/launcher=joblib", "hydra.launcher.n_jobs=2"] if launcher == "joblib" else []
    cmd = [
        sys.executable,
        "repro/run.py",
        "-m",
        *TWO_DEBUG_JOBS,
        f"results_dir={results_dir}",
        f"hydra.sweep.dir={sweep_dir}",
        *extra,
    ]
    p = subprocess.run(cmd, cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    found = SUMMARY.findall(p.stdout + p.stderr)
    assert len(found) == 1, (p.stdout + p.stderr)[-3000:]
    return "{} ran, {} skipped, {} failed".format(*found[0])


@pytest.mark.slow
def test_joblib_sweep_summary_counts_jobs_run_in_its_workers(tmp_path):
    pytest.importorskip("hydra_plugins.hydra_joblib_launcher", reason="needs extra `launchers`")
    assert _sweep(tmp_path, tmp_path / "mr1", "joblib") == "2 ran, 0 skipped, 0 failed"
    assert _sweep(tmp_path, tmp_path / "mr2", "joblib") == "0 ran, 2 skipped, 0 failed"
    assert _sweep(tmp_path, tmp_path / "mr3", "serial") == "0 ran, 2 skipped, 0 failed"
