"""A sweep through Hydra's submitit launcher on a real single-node Slurm (slurmctld + slurmd).

``.ci/slurm.sh start`` brings up munged, slurmctld and slurmd on this machine (root, Debian's
slurm-wlm + munge); the test submits a two-setting smoke sweep with
``hydra/launcher=submitit_slurm``, waits for it with a bounded timeout, checks that each setting
ran as its own Slurm job and left its rows and ledger entry, submits the sweep again (every
setting skipped, no new rows) and stops the daemons it started. It skips, with the script's
reason, where Slurm cannot start.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[2]
SLURM_SH = ROOT / ".ci" / "slurm.sh"
SWEEP_TIMEOUT_S = 300  # two simulate jobs take seconds; queueing on one idle node too

pytestmark = [pytest.mark.slurm, pytest.mark.slow]


def _slurm_sh(cmd: str, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(SLURM_SH), cmd], capture_output=True, text=True, timeout=90, env=env
    )


@pytest.fixture(scope="module")
def slurm():
    """SLURM_CONF of a running single-node Slurm; stops it afterwards if this fixture started it."""
    pytest.importorskip(
        "hydra_plugins.hydra_submitit_launcher", reason="pip install hydra-submitit-launcher"
    )
    env = dict(os.environ)  # DTFM_SLURM_DIR picks the folder (default: <tmp>/dtfm-slurm)
    conf = Path(_slurm_sh("env", env).stdout.split("SLURM_CONF=", 1)[-1].strip())
    before = _slurm_sh("status", env).stdout
    started = "slurmctld running" not in before
    p = _slurm_sh("start", env)
    if p.returncode == 3:
        pytest.skip(p.stderr.strip() or "Slurm cannot start here")
    assert p.returncode == 0, f"slurm.sh start failed:\n{p.stdout}\n{p.stderr}"
    try:
        yield {**env, "SLURM_CONF": str(conf)}
    finally:
        if started:
            out = _slurm_sh("stop", env)
            assert out.returncode == 0, out.stderr
            assert "running" not in _slurm_sh("status", env).stdout


def _sweep(results: Path, env: dict) -> subprocess.CompletedProcess:
    cmd = [
        sys.executable,
        "repro/run.py",
        "-m",
        "sweep=smoke",
        "case=4,5",
        "batch=1024",
        "repeats=1",
        f"results_dir={results}",
        f"hydra.sweep.dir={results}/multirun",
        "hydra/launcher=submitit_slurm",
        "hydra.launcher.timeout_min=5",
        "hydra.launcher.partition=debug",
    ]
    env = {
        **env,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")])),
        "OMP_NUM_THREADS": "1",
        "WANDB_MODE": "disabled",
    }
    return subprocess.run(
        cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=SWEEP_TIMEOUT_S
    )


def test_smoke_sweep_runs_as_slurm_jobs(slurm, tmp_path):
    results = tmp_path / "study"
    p = _sweep(results, slurm)
    assert p.returncode == 0, p.stderr[-3000:]
    # one Slurm job per setting: submitit's folder holds one log per array task (<job>_<task>)
    logs = sorted((results / "multirun" / ".submitit").glob("*/*_log.out"))
    assert len(logs) == 2, logs
    assert all(log.name.split("_")[0].isdigit() for log in logs)  # Slurm job ids
    ledger = sorted((results / "jobs").glob("*.json"))
    assert len(ledger) == 2
    runs = pd.read_csv(results / "runs.csv")
    assert sorted(runs["case"].astype(str).unique()) == ["4", "5"]
    ids = {r for f in ledger for r in json.loads(f.read_text())["run_ids"]}
    assert ids == set(runs["run_id"]) and len(ids) == len(runs) > 0
    assert (results / "REPORT.md").stat().st_size > 0
    # the report is built once, by the submitting process, after the last job
    assert (p.stdout + p.stderr).count("REPORT.md:") == 1
    assert not any("REPORT.md:" in f.read_text(errors="replace") for f in logs)
    # the summary counts the jobs that ran in Slurm, from the ledger, not in this process
    assert "2 jobs ran, 0 skipped (already finished), 0 failed" in p.stdout + p.stderr

    # resubmitted: the ledger skips both settings inside their Slurm jobs; no rows are added
    report_mtime = (results / "REPORT.md").stat().st_mtime_ns
    p = _sweep(results, slurm)
    assert p.returncode == 0, p.stderr[-3000:]
    assert len(pd.read_csv(results / "runs.csv")) == len(runs)
    logs2 = sorted((results / "multirun" / ".submitit").glob("*/*_log.*"))
    skipped = sum("skip job" in f.read_text(errors="replace") for f in logs2)
    assert skipped == 2, [f.name for f in logs2]
    assert "0 jobs ran, 2 skipped (already finished), 0 failed" in p.stdout + p.stderr
    assert (results / "REPORT.md").stat().st_mtime_ns >= report_mtime
