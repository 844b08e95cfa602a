"""The in-situ calibration on a real emulated network: a tiny setting calibrates, the profile
feeds the predictions, and the calibration's namespaces are gone afterwards."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from repro.studies.validation.calibrate import entry_key
from repro.studies.validation.predict import predict_setting
from repro.studies.validation.profile import load_profile
from repro.studies.validation.settings import Setting
from system.emulation.shell import netns_list
from tests.emulation._skip import _why_skip

pytestmark = [
    pytest.mark.emulation,
    pytest.mark.skipif(bool(_why_skip()), reason=_why_skip() or "ok"),
]

PREFIX = "v4e"  # this test's namespaces only
ROOT = Path(__file__).resolve().parents[2]


def test_in_situ_calibration_runs_cleans_up_and_feeds_the_predictions(tmp_path):
    s = Setting.from_dict(
        {
            "name": "tiny",
            "case": "5",
            "devices": [0, 1, 40, 41],
            "pp": 2,
            "dp": 2,
            "global_batch_size": 8,
            "hidden_size": 64,
            "bandwidth_scale": 0.2,
            "iters": 3,
            "warmup_iters": 1,
        }
    )
    settings, out = tmp_path / "settings.json", tmp_path / "profile.json"
    settings.write_text(json.dumps({"settings": [s.to_dict()]}))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "repro/run.py", "mode=calibrate", f"settings={settings}", f"out={out}"]
    res = subprocess.run(
        [*cmd, f"tag_prefix={PREFIX}", "timeout_s=120", f"results_dir={tmp_path}"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert res.returncode == 0, res.stderr[-2000:]
    assert not [ns for ns in netns_list() if ns.startswith(f"dtfm-{PREFIX}")]
    prof = load_profile(out)
    entry = prof["entries"][entry_key(s)]
    assert entry["method"] == "in_situ" and len(entry["iter_times_s"]) == s.iters
    for k in ("fwd_s", "bwd_s", "opt_s"):
        assert len(entry[k]) == s.pp and all(0 < x < 5 for x in entry[k])
    preds = predict_setting(s, prof, schedule_trials=3)
    assert {p["system"] for p in preds} == set(s.systems)
    assert all(p["predicted_compute_s"] > 0 for p in preds)
