"""A killed ``mode=train`` run leaves no rank, port or temporary folder behind.

``timeout`` and Slurm stop a job with SIGTERM and then SIGKILL; a closed terminal sends SIGHUP.
The job here is the main entry's CPU training run (pp=2, dp=2: a torchrun agent and 4 workers);
the test waits until every worker is up, kills the entry process, and looks for survivors.
"""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import pytest

from repro.checks.leftovers import cmdline, left_after, snapshot, start_job, stop
from system.lifeline import descendants

pytestmark = [pytest.mark.dist]


def _workers(pid: int, module: str) -> list[int]:
    """Descendants running ``python -m module`` (not the agent that names it as its program)."""
    return [
        d
        for d in descendants(pid)
        if module in cmdline(d) and "system.runtime.torchrun" not in cmdline(d)
    ]


def _wait_for_ranks(p: subprocess.Popen, module: str, n: int, timeout_s: float = 180.0):
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        assert p.poll() is None, f"the run ended early ({p.returncode}): {p.stdout.read()[-3000:]}"
        ranks = _workers(p.pid, module)
        if len(ranks) >= n:
            return ranks
        time.sleep(0.2)
    raise AssertionError(f"{n} ranks of {module} did not start within {timeout_s} s")


def _spec_folders(ranks: list[int]) -> set[str]:
    """The run folders the ranks were given (their spec file's folder)."""
    return {str(Path(a).parent) for r in ranks for a in cmdline(r) if a.endswith("spec.json")}


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGKILL])
def test_a_killed_train_run_leaves_nothing_behind(tmp_path, sig):
    p = start_job(
        "mode=train",
        "system=ours",
        "model=debug",
        "pp=2",
        "dp=2",
        "batch=8",
        "iters=20000",
        f"results_dir={tmp_path / 'R'}",
    )
    before = None
    try:
        ranks = _wait_for_ranks(p, "system.runtime.worker", 4)
        time.sleep(3.0)  # the ranks rendezvous and train: ports open, folders in use
        folders = _spec_folders(_workers(p.pid, "system.runtime.worker"))
        assert folders and all(Path(f).name.startswith("dtfm-run-") for f in folders), folders
        before = snapshot(p.pid, folders)
        assert len([q for q in before.procs if q in ranks]) == 4 and before.ports, before
        p.send_signal(sig)
        p.wait(timeout=60)
        left = left_after(before, timeout_s=30)
        assert left == {"processes": [], "ports": [], "folders": []}, left
        if sig != signal.SIGKILL:
            assert p.returncode in (128 + sig, -sig), p.returncode
    finally:
        stop(p, before)
