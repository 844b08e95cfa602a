"""The validation drivers without root: the measurement (a fresh network per repeat, rotated
systems, resume, deadline), the in-situ calibration (its layout is not the scored random one, one
network per setting, a profile the predictions read unchanged) and the stage-shape profile."""

from __future__ import annotations

import json

import pandas as pd
import pytest

import repro.studies.validation.calibrate as cal
from repro.studies.validation.predict import predict_setting
from repro.studies.validation.profile import load_profile, shape_key
from tests.unit._validation import predictions, setting

# ---------------------------------------------------------------- measurement driver


class _FakeEmulation:
    made: list[str] = []

    def __init__(self, plan, backend="auto"):
        self.plan, self.backend = plan, "fake"
        _FakeEmulation.made.append(plan.tag)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return None

    def delayer_stats(self):
        return {}

    def tcp_retransmits(self):
        return [0] * self.plan.num_devices


def _fake_driver(monkeypatch, calls):
    import repro.studies.validation.measure as meas
    import system.emulation.netns as netns
    import system.emulation.verify as verify

    _FakeEmulation.made = []
    monkeypatch.setattr(netns, "Emulation", _FakeEmulation)
    monkeypatch.setattr(
        verify,
        "verify_links",
        lambda plan, **kw: {
            "ok": True,
            "max_abs_rtt_err": 0.0,
            "max_abs_bw_err": 0.0,
            "max_abs_tcp_err": 0.0,
        },
    )
    monkeypatch.setattr(meas, "cleanup_own", lambda prefix=meas.TAG_PREFIX: [])

    def fake_run(s, pred, emu, margin_s, timeout_s):
        calls.append((emu.plan.tag, pred["system"]))
        return {"iter_times_s": [9.0, 9.0, 1.0, 2.0, 3.0], "final_loss": 1.0}

    monkeypatch.setattr(meas, "_run_ours", fake_run)
    monkeypatch.setattr(meas, "_run_baseline", fake_run)
    return meas


def test_driver_fresh_network_per_repeat_rotation_and_resume(tmp_path, monkeypatch):
    calls: list = []
    meas = _fake_driver(monkeypatch, calls)
    s = setting(iters=5, warmup_iters=2)
    pf = tmp_path / "p.json"
    pf.write_text(json.dumps(predictions(s)))
    out = tmp_path / "m.csv"
    res = meas.measure(pf, out, repeats=3)
    assert res["done"] == ["s1"] and not res["not_run"]
    assert _FakeEmulation.made == [meas.tag_for(0, r) for r in (1, 2, 3)]  # one per repeat
    firsts = [calls[4 * k][1] for k in range(3)]
    assert firsts == ["ours", "ours_random", "megatron"]  # rotated order
    rows = pd.read_csv(out)
    assert len(rows) == 12 and (rows["iter_time_s"] == 2.0).all()  # median after 2 warm-ups
    # resume: drop two rows of repeat 2; only those two run again, in a fresh network
    rows[~((rows["repeat"] == 2) & rows["system"].isin(["ours", "deepspeed"]))].to_csv(
        out, index=False
    )
    calls.clear()
    _FakeEmulation.made = []
    meas.measure(pf, out, repeats=3)
    assert sorted(c[1] for c in calls) == ["deepspeed", "ours"]
    assert _FakeEmulation.made == [meas.tag_for(0, 2)]
    assert len(pd.read_csv(out)) == 12


def test_driver_deadline_skips_whole_settings(tmp_path, monkeypatch):
    calls: list = []
    meas = _fake_driver(monkeypatch, calls)
    s = setting()
    pf = tmp_path / "p.json"
    pf.write_text(json.dumps(predictions(s)))
    res = meas.measure(pf, tmp_path / "m.csv", repeats=3, deadline_utc="00:00")
    assert res["not_run"] == ["s1"] and not calls


@pytest.mark.dist
def test_profile_runs_every_stage_shape_with_a_process_cap():
    from repro.studies.validation.profile import profile_setting

    s = setting(hidden_size=32, seq_length=16, vocab_size=64)
    e = profile_setting(s, repeats=2, warmup=1, max_s=20.0, max_procs=1)
    assert e["key"].endswith("-n4-c1") and e["max_procs"] == 1
    for k in ("fwd_s", "bwd_s", "opt_s"):
        assert len(e[k]) == s.pp and all(x > 0 for x in e[k])
    assert e["params"][0] != e["params"][1]  # embedding on stage 0, head on stage 1


# ---------------------------------------------------------------- in-situ calibration


@pytest.fixture
def fake_runs(monkeypatch):
    import repro.studies.validation.measure as meas
    import system.emulation.netns as netns

    _FakeEmulation.made = []
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

    monkeypatch.setattr(netns, "Emulation", _FakeEmulation)
    monkeypatch.setattr(meas, "_run_ours", run)
    monkeypatch.setattr(meas, "cleanup_own", lambda prefix=meas.TAG_PREFIX: [])
    return runs


@pytest.mark.slow
def test_calibration_layout_is_not_the_scored_random_layout():
    for seed in range(40):
        s = setting(seed=seed)
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
    a, b, a_again = setting(name="a"), setting(name="b", hidden_size=256), setting(name="a2")
    doc = cal.calibrate([a, b, a_again], tag_prefix="v4u")
    assert [r[0] for r in fake_runs] == ["a", "b", "a2"]  # one run per setting, same shape too
    assert _FakeEmulation.made == ["v4u00r0", "v4u01r0", "v4u02r0"]
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
    a, b = setting(name="a"), setting(name="b", hidden_size=256)
    first = cal.calibrate([a], tag_prefix="v4u")
    fake_runs.clear()
    merged = cal.calibrate([a, b], tag_prefix="v4u", old=first)
    assert [r[0] for r in fake_runs] == ["b"]
    assert merged["entries"][cal.entry_key(a)] == first["entries"][cal.entry_key(a)]


def test_calibrate_needs_root_and_known_names(tmp_path, monkeypatch):
    import repro.studies.validation.measure as meas
    from repro.run import run

    settings = tmp_path / "s.json"
    settings.write_text(json.dumps({"settings": [setting().to_dict()]}))
    cfg = {"mode": "calibrate", "settings": str(settings), "results_dir": str(tmp_path)}
    monkeypatch.setattr(meas.os, "geteuid", lambda: 1000)
    with pytest.raises(RuntimeError, match="needs root"):
        run(cfg)
    monkeypatch.setattr(meas.os, "geteuid", lambda: 0)
    with pytest.raises(ValueError, match="unknown setting name"):
        run({**cfg, "only": ["nope"]})
    assert not (tmp_path / "compute_profile.json").exists()


def test_baseline_runs_with_the_registered_rank_map(monkeypatch):
    """A topology row runs the framework with the predictions' rank map; a launch row with
    none; a topology prediction without a map is refused before anything starts."""
    import baselines.grid as grid
    import repro.studies.validation.measure as meas

    seen = []

    def fake_point(spec, *, timeout_s, rank_map=None, **kw):
        seen.append((spec.system, spec.zero, rank_map))
        return {"status": "ok", "iter_times_s": [1.0, 1.0], "losses": [2.0, 1.5]}

    monkeypatch.setattr(grid, "run_point", fake_point)
    monkeypatch.setattr(grid, "emulation_kwargs", lambda emu: {})
    s = setting(systems=["megatron", "deepspeed_topology"])
    doc = predictions(s)
    by = {p["system"]: p for p in doc["predictions"]}
    meas._run_baseline(s, by["megatron"], None, 1.0, 60.0)
    meas._run_baseline(s, by["deepspeed_topology"], None, 1.0, 60.0)
    assert seen == [
        ("megatron", None, None),
        ("deepspeed", 1, by["deepspeed_topology"]["rank_map"]),
    ]
    with pytest.raises(ValueError, match="no rank_map"):
        meas._run_baseline(s, {**by["deepspeed_topology"], "rank_map": None}, None, 1.0, 60.0)
