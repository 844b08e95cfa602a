"""The validation driver leaves nothing behind: not on SIGTERM, and after SIGKILL its own
cleanup removes its namespaces (qdiscs, iptables rules and delayers live and die in them)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from repro.checks.leftovers import guard_of
from repro.studies.validation.predict import predict_setting
from repro.studies.validation.profile import shape_key
from repro.studies.validation.settings import Setting
from system.emulation.netns import STATE_ROOT
from system.emulation.shell import netns_list
from tests.emulation._poll import wait_for
from tests.emulation._skip import _why_skip

pytestmark = [
    pytest.mark.emulation,
    pytest.mark.skipif(bool(_why_skip()), reason=_why_skip() or "ok"),
]

PREFIX = "v14t"  # not the measurement's own prefix: never touches a running measurement
ROOT = Path(__file__).resolve().parents[2]


def _mine() -> list[str]:
    return [ns for ns in netns_list() if ns.startswith(f"dtfm-{PREFIX}")]


def _host_rules() -> str:
    return subprocess.run(["iptables", "-S"], capture_output=True, text=True).stdout


def _predictions(tmp_path: Path) -> Path:
    s = Setting.from_dict(
        {
            "name": "kill",
            "case": "5",
            "devices": [0, 8],
            "pp": 2,
            "dp": 1,
            "global_batch_size": 4,
            "hidden_size": 64,
            "iters": 40,
            "warmup_iters": 1,
            "systems": ["ours"],
        }
    )
    prof = {
        "profile_version": 1,
        "entries": {shape_key(s): {"fwd_s": [0.01] * 2, "bwd_s": [0.02] * 2, "opt_s": [0.0] * 2}},
    }
    doc = {
        "prediction_version": 1,
        "settings": [s.to_dict()],
        "predictions": predict_setting(s, prof, schedule_trials=5),
    }
    path = tmp_path / "predictions.json"
    path.write_text(json.dumps(doc))
    return path


def _start(tmp_path: Path, pred: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(
        [
            sys.executable,
            "repro/run.py",
            "mode=measure",
            f"predictions={pred}",
            f"out={tmp_path / 'm.csv'}",
            "repeats=1",
            f"tag_prefix={PREFIX}",
            f"results_dir={tmp_path}",
            f"hydra.run.dir={tmp_path}/hydra",
        ],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def _cleanup_own() -> None:
    """The driver's own cleanup of this test's tag prefix (what a user runs after a SIGKILL)."""
    import tempfile

    cmd = [sys.executable, "repro/run.py", "mode=measure", "cleanup_only=true"]
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(
            [*cmd, f"tag_prefix={PREFIX}", f"results_dir={tmp}", f"hydra.run.dir={tmp}/hydra"],
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            capture_output=True,
            timeout=60,
        )


@pytest.fixture
def clean():
    _cleanup_own()
    assert not _mine()
    rules = _host_rules()
    yield
    _cleanup_own()
    assert _host_rules() == rules, "the host's iptables rules changed"


def test_sigterm_leaves_nothing(tmp_path, clean):
    p = _start(tmp_path, _predictions(tmp_path))
    try:
        # wait until the network exists and a run (or the verification) is under way
        assert wait_for(lambda: len(_mine()) == 3, 90), "the driver built no namespaces"
        time.sleep(3)
        p.send_signal(signal.SIGTERM)
        p.wait(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
    assert wait_for(lambda: not _mine(), 10), f"left behind: {_mine()}"
    assert not list(STATE_ROOT.glob(f"dtfm-{PREFIX}*"))


def test_sigkill_leftovers_are_removed_by_the_next_start(tmp_path, clean):
    """A driver SIGKILLed together with its guard (the guard alone cleans up a SIGKILLed
    driver): the driver's own cleanup removes what is left."""
    p = _start(tmp_path, _predictions(tmp_path))
    try:
        assert wait_for(lambda: len(_mine()) == 3, 90), "the driver built no namespaces"
        time.sleep(3)
        os.kill(guard_of(p.pid), signal.SIGKILL)  # its guard first: nothing cleans up after it
        p.kill()  # no handler runs: the namespaces outlive the driver
        p.wait(timeout=30)
    finally:
        if p.poll() is None:
            p.kill()
    assert _mine(), "SIGKILL left nothing: this test would not notice a leak"
    out = subprocess.run(
        [
            sys.executable,
            "repro/run.py",
            "mode=measure",
            "cleanup_only=true",
            f"tag_prefix={PREFIX}",
            f"results_dir={tmp_path}",
            f"hydra.run.dir={tmp_path}/hydra",
        ],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr[-500:]
    assert len(json.loads(out.stdout.strip().splitlines()[-1])["removed"]) == 3
    assert not _mine() and not list(STATE_ROOT.glob(f"dtfm-{PREFIX}*"))
