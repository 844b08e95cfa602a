"""The in-situ compute calibration: its layout is none the predictions score, its output is a
compute profile the predictions read unchanged, and every shape runs in a network of its own."""

from __future__ import annotations

import json

import pytest

import repro.validation.calibrate as cal
from repro.validation.predict import predict_setting
from repro.validation.profile import load_profile, shape_key
from repro.validation.settings import Setting


def _setting(name="s1", **kw) -> Setting:
    base = {
        "name": name,
        "case": "5",
        "devices": [0, 8, 24, 40],
        "pp": 2,
        "dp": 2,
        "global_batch_size": 8,
        "hidden_size": 128,
        "bandwidth_scale": 0.1,
        "iters": 3,
        "warmup_iters": 1,
    }
    return Setting.from_dict({**base, **kw})


class _Network:
    """Stands in for the emulated network: records the tags it was built with."""

    tags: list[str] = []

    def __init__(self, plan, backend="auto"):
        self.plan = plan
        _Network.tags.append(plan.tag)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return None


@pytest.fixture
def fake_runs(monkeypatch):
    import repro.validation.measure as meas
    import system.emulation.netns as netns

    _Network.tags = []
    runs = []

    def run(s, pred, emu, margin_s, timeout_s):
        runs.append((s.name, pred["stages"], emu.plan.tag))
        scale = 2.0 if s.hidden_size > 128 else 1.0
        return {
            "iter_times_s": [3.0, 1.0, 1.0],
            "run_fwd_s": [0.01 * scale] * s.pp,
            "run_bwd_s": [0.02 * scale] * s.pp,
            "run_opt_s": [0.005] * s.pp,
            "final_loss": 1.0,
        }

    monkeypatch.setattr(netns, "Emulation", _Network)
    monkeypatch.setattr(meas, "_run_ours", run)
    monkeypatch.setattr(meas, "cleanup_own", lambda prefix=meas.TAG_PREFIX: [])
    return runs


def test_calibration_layout_is_not_the_scored_random_layout():
    for seed in range(40):
        s = _setting(seed=seed)
        prof = {
            "entries": {
                shape_key(s): {"fwd_s": [0.01] * 2, "bwd_s": [0.02] * 2, "opt_s": [0.0] * 2}
            }
        }
        scored = {p["system"]: p for p in predict_setting(s, prof, schedule_trials=3)}
        stages, layout_seed = cal.calibration_stages(s)
        assert stages != scored["ours_random"]["stages"] and layout_seed >= seed + 2000
        flat = sorted(d for row in stages for d in row)
        assert flat == list(range(s.num_devices))  # a permutation of the setting's devices


def test_one_network_per_shape_and_a_profile_the_predictions_read(tmp_path, fake_runs):
    a, b, a_again = _setting("a"), _setting("b", hidden_size=256), _setting("a2")
    doc = cal.calibrate([a, b, a_again], tag_prefix="v4u")
    assert [r[0] for r in fake_runs] == ["a", "b", "a2"]  # one run per setting, same shape too
    assert _Network.tags == ["v4u00r0", "v4u01r0", "v4u02r0"]
    assert doc["method"] == "in_situ" and doc["max_procs"] is None
    path = tmp_path / "prof.json"
    path.write_text(json.dumps(doc))
    prof = load_profile(path)
    slow = {p["system"]: p for p in predict_setting(b, prof, schedule_trials=3)}
    fast = {p["system"]: p for p in predict_setting(a, prof, schedule_trials=3)}
    assert prof["entries"][cal.entry_key(b)]["fwd_s"] == [0.02, 0.02]
    assert shape_key(a) == shape_key(a_again) and cal.entry_key(a) != cal.entry_key(a_again)
    assert slow["ours"]["predicted_compute_s"] > fast["ours"]["predicted_compute_s"]


def test_merge_keeps_old_entries_and_runs_only_new_shapes(fake_runs):
    a, b = _setting("a"), _setting("b", hidden_size=256)
    first = cal.calibrate([a], tag_prefix="v4u")
    fake_runs.clear()
    merged = cal.calibrate([a, b], tag_prefix="v4u", old=first)
    assert [r[0] for r in fake_runs] == ["b"]
    assert merged["entries"][cal.entry_key(a)] == first["entries"][cal.entry_key(a)]


def test_cli_needs_root_and_known_names(tmp_path, monkeypatch):
    settings = tmp_path / "s.json"
    settings.write_text(json.dumps({"settings": [_setting().to_dict()]}))
    monkeypatch.setattr(cal.os, "geteuid", lambda: 1000)
    assert cal.main([str(settings), str(tmp_path / "o.json")]) == 2
    monkeypatch.setattr(cal.os, "geteuid", lambda: 0)
    with pytest.raises(SystemExit):
        cal.main([str(settings), str(tmp_path / "o.json"), "--only", "nope"])
    assert not (tmp_path / "o.json").exists()
