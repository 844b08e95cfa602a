"""Registered-prediction validation: settings, predictions, the registration check, scoring."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import given
from hypothesis import strategies as st

from repro.validation.predict import baseline_kwargs, predict_setting, scaled_cluster
from repro.validation.profile import shape_key
from repro.validation.score import kendall_tau_b, score
from repro.validation.settings import Setting, load_settings

BASE = {
    "name": "s1",
    "case": "5",
    "devices": [0, 8, 24, 40],
    "pp": 2,
    "dp": 2,
    "global_batch_size": 8,
    "hidden_size": 128,
    "bandwidth_scale": 0.1,
}


def _setting(**kw) -> Setting:
    return Setting.from_dict({**BASE, **kw})


def _profile(s: Setting, fwd=0.01, bwd=0.02, opt=0.005) -> dict:
    return {
        "profile_version": 1,
        "entries": {
            shape_key(s): {"fwd_s": [fwd] * s.pp, "bwd_s": [bwd] * s.pp, "opt_s": [opt] * s.pp}
        },
    }


# ---------------------------------------------------------------- settings


def test_settings_file_roundtrip(tmp_path):
    p = tmp_path / "s.json"
    p.write_text(
        json.dumps(
            {"settings": [BASE, {**BASE, "name": "s2", "case": 4, "devices": [0, 16, 32, 48]}]}
        )
    )
    got = load_settings(p)
    assert [s.name for s in got] == ["s1", "s2"] and got[1].case == "4"
    assert Setting.from_dict(got[0].to_dict()) == got[0]


@pytest.mark.parametrize(
    "change, match",
    [
        ({"pp": 3}, "must equal the 4 devices"),
        ({"devices": [0, 0, 8, 8]}, "repeat a device"),
        ({"bandwidth_scale": 1.5}, "bandwidth_scale"),
        ({"iters": 2, "warmup_iters": 2}, "must exceed warmup_iters"),
        ({"systems": ["ours", "tutel"]}, "systems must be"),
        ({"colour": "red"}, "unknown field"),
        ({"global_batch_size": 3}, "batch|divis"),
    ],
)
def test_bad_setting_names_the_problem(change, match):
    with pytest.raises(ValueError, match=match):
        _setting(**change)


def test_duplicate_setting_names_rejected(tmp_path):
    p = tmp_path / "s.json"
    p.write_text(json.dumps({"settings": [BASE, BASE]}))
    with pytest.raises(ValueError, match="duplicate"):
        load_settings(p)


def test_settings_file_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_settings(tmp_path / "none.json")
    (tmp_path / "x.json").write_text("[1, 2]")
    with pytest.raises(ValueError, match="expected"):
        load_settings(tmp_path / "x.json")


def test_committed_settings_are_valid_and_span_the_required_range():
    settings = load_settings(
        Path(__file__).resolve().parents[2] / "results/validation/settings.json"
    )
    assert len(settings) >= 12
    assert {s.case for s in settings} == {"4", "5"}
    assert any(s.num_devices == 8 for s in settings)
    assert max(s.bandwidth_scale for s in settings) == 1.0
    # pipelines inside a region (two devices per region) and one device per region
    from system.cases import get_case

    per_region = set()
    for s in settings:
        regions = [get_case(s.case).region_of[d] for d in s.devices]
        per_region.add(max(regions.count(r) for r in regions))
    assert per_region >= {1, 2}


# ---------------------------------------------------------------- predictions


def test_baseline_kwargs_match_the_baseline_models():
    """predict.py calls simulate_1f1b_ring directly (to pass a profile); without a profile it
    must equal baselines/*/perf.py's models exactly."""
    from baselines.deepspeed.perf import simulate_deepspeed
    from baselines.megatron.perf import simulate_megatron
    from baselines.space import BaselineConfig
    from system.simulator.collective import simulate_1f1b_ring
    from system.simulator.comm import GLOO

    s = _setting()
    cl, wl = scaled_cluster(s), s.workload
    for system, fn, zero in (
        ("megatron", simulate_megatron, 0),
        ("deepspeed", simulate_deepspeed, 1),
    ):
        cfg = BaselineConfig(system=system, tp=1, pp=2, dp=2, micro_batch_size=1, zero=zero)
        ref = fn(cl, wl, cfg, transport=GLOO).iter_time_s
        got = simulate_1f1b_ring(
            cl, wl, tp=1, pp=2, dp=2, transport=GLOO, **baseline_kwargs(system)
        ).iter_time_s
        assert got == pytest.approx(ref, rel=1e-12)
    with pytest.raises(ValueError, match="no baseline model"):
        baseline_kwargs("ours")


def test_1f1b_compute_profile_is_used():
    from system.simulator import StageCompute
    from system.simulator.collective import simulate_1f1b_ring
    from system.simulator.comm import GLOO

    s = _setting()
    cl, wl = scaled_cluster(s), s.workload
    kw = dict(tp=1, pp=2, dp=2, transport=GLOO, **baseline_kwargs("megatron"))
    fast = simulate_1f1b_ring(cl, wl, compute=StageCompute(0.01, 0.02, 0.0), **kw).iter_time_s
    slow = simulate_1f1b_ring(cl, wl, compute=StageCompute(0.51, 1.02, 0.0), **kw).iter_time_s
    # 2 micro-batches per replica: at least 2 x 1.5 s more compute on the critical path
    assert slow - fast >= 2 * 1.5 - 1e-9


def test_predict_setting_fixes_layouts_and_is_deterministic():
    s = _setting()
    a = predict_setting(s, _profile(s), schedule_trials=20)
    b = predict_setting(s, _profile(s), schedule_trials=20)
    assert a == b
    assert [p["system"] for p in a] == list(s.systems)
    by = {p["system"]: p for p in a}
    for name in ("ours", "ours_random"):
        st_ = np.asarray(by[name]["stages"])
        assert st_.shape == (2, 2) and sorted(st_.ravel()) == [0, 1, 2, 3]
    assert by["megatron"]["layout"] == by["deepspeed"]["layout"] == "launch"
    assert all(p["predicted_iter_time_s"] > 0 and 0 < p["predicted_compute_share"] <= 1 for p in a)


def test_prediction_grows_with_profiled_compute():
    s = _setting()
    lo = {
        p["system"]: p["predicted_iter_time_s"]
        for p in predict_setting(s, _profile(s), schedule_trials=20)
    }
    hi = {
        p["system"]: p["predicted_iter_time_s"]
        for p in predict_setting(s, _profile(s, fwd=0.2, bwd=0.4), schedule_trials=20)
    }
    assert all(hi[k] > lo[k] for k in lo)


def test_missing_profile_entry_is_one_clear_error():
    s = _setting()
    other = _setting(hidden_size=256)
    with pytest.raises(ValueError, match="no entry"):
        predict_setting(s, _profile(other))


# ---------------------------------------------------------------- scoring


@given(st.lists(st.floats(-1e3, 1e3, allow_nan=False), min_size=2, max_size=7))
def test_kendall_tau_identity_and_reversal(x):
    if len(set(x)) < 2:
        return
    assert kendall_tau_b(x, x) == pytest.approx(1.0)
    assert kendall_tau_b(x, [-v for v in x]) == pytest.approx(-1.0)


def _git(root, *a):
    subprocess.run(
        ["git", *a],
        cwd=root,
        check=True,
        capture_output=True,
        env={
            "GIT_AUTHOR_NAME": "t",
            "GIT_AUTHOR_EMAIL": "t@t",
            "GIT_COMMITTER_NAME": "t",
            "GIT_COMMITTER_EMAIL": "t@t",
            "PATH": "/usr/bin:/bin",
        },
    )


def _head(root) -> str:
    return subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, check=True
    ).stdout.strip()


def _predictions(s: Setting) -> dict:
    return {
        "prediction_version": 1,
        "settings": [s.to_dict()],
        "predictions": predict_setting(s, _profile(s), schedule_trials=20),
    }


def _rows(doc: dict, pred_file: Path, sha: str, when: str, scale=1.1) -> pd.DataFrame:
    from repro.validation.predict import sha256_file

    out = []
    for p in doc["predictions"]:
        for r in (1, 2, 3):
            out.append(
                {
                    "setting": p["setting"],
                    "system": p["system"],
                    "repeat": r,
                    "status": "ok",
                    "iter_time_s": p["predicted_iter_time_s"] * scale * (1 + 0.01 * r),
                    "timestamp_utc": when,
                    "predictions_sha256": sha256_file(pred_file),
                    "git_revision": sha,
                    "load_avg_1m_after": 1.0,
                    "delayer_mean_late_ms": 0.5,
                    "tcp_retransmits": 0,
                    "verify_ok": True,
                }
            )
    return pd.DataFrame(out)


@pytest.fixture
def repo(tmp_path):
    _git(tmp_path, "init", "-q")
    _git(tmp_path, "commit", "-q", "--allow-empty", "-m", "root")
    return tmp_path


def _now(offset_s: float = 0.0) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + offset_s))


def _registered(repo: Path) -> tuple[dict, Path, Path, str]:
    """Predictions for one setting written and committed in ``repo``: (document, predictions
    file, measured-rows path, registration commit)."""
    doc = _predictions(_setting())
    pf, mf = repo / "predictions.json", repo / "measured.csv"
    pf.write_text(json.dumps(doc))
    _git(repo, "add", "predictions.json")
    _git(repo, "commit", "-q", "-m", "register")
    return doc, pf, mf, _head(repo)


def test_score_registered_in_order(repo):
    doc, pf, mf, reg = _registered(repo)
    time.sleep(1.1)  # measured strictly after the registration commit (1 s resolution)
    _rows(doc, pf, reg, _now()).to_csv(mf, index=False)
    _git(repo, "add", "measured.csv")
    _git(repo, "commit", "-q", "-m", "measured")
    res = score(pf, mf)
    summ = res["summary"]
    assert summ["registration"]["registration_commit"] == reg
    assert summ["rows"] == 12
    # measured = predicted x 1.1 x (1.01..1.03): every error about -10%, ranking kept
    assert all(0.08 < m < 0.12 for m in summ["mape_per_system"].values())
    assert all(t == pytest.approx(1.0) for t in summ["kendall_tau_per_setting"].values())
    assert all(abs(r["error"]) < 1e-9 for r in summ["ratio_errors"])
    assert res["table"]["cv"].between(0.005, 0.02).all() and not res["table"]["cv_flagged"].any()
    assert summ["variance_verdict"] == "PASS" and summ["variance_configurations"] == 4
    from repro.validation.score import _markdown

    md = _markdown(res)
    assert reg[:10] in md and "PASS" in md and md.count("| s1 |") == 4 + 2  # 4 systems, 2 ratios


def test_score_refuses_predictions_committed_with_or_after_the_measurement(repo):
    s = _setting()
    doc = _predictions(s)
    pf, mf = repo / "predictions.json", repo / "measured.csv"
    pf.write_text(json.dumps(doc))
    _rows(doc, pf, "0" * 40, _now()).to_csv(mf, index=False)
    with pytest.raises(ValueError, match="never committed"):
        score(pf, mf)
    _git(repo, "add", "measured.csv")
    _git(repo, "commit", "-q", "-m", "measured first")
    _git(repo, "add", "predictions.json")
    _git(repo, "commit", "-q", "-m", "predictions after")
    with pytest.raises(ValueError, match="not a strict ancestor"):
        score(pf, mf)


def test_score_refuses_rows_measured_before_registration_or_edited_predictions(repo):
    doc, pf, mf, reg = _registered(repo)
    _rows(doc, pf, reg, _now(-3600)).to_csv(mf, index=False)  # an hour before registering
    _git(repo, "add", "measured.csv")
    _git(repo, "commit", "-q", "-m", "measured")
    with pytest.raises(ValueError, match="not after the registration"):
        score(pf, mf)
    doc["predictions"][0]["predicted_iter_time_s"] *= 0.5  # re-fit after seeing the scores
    pf.write_text(json.dumps(doc))
    with pytest.raises(ValueError, match="changed after its registration"):
        score(pf, mf)


def test_score_refuses_rows_of_another_predictions_file(repo):
    doc, pf, mf, reg = _registered(repo)
    time.sleep(1.1)
    rows = _rows(doc, pf, reg, _now())
    rows["predictions_sha256"] = "f" * 64
    rows.to_csv(mf, index=False)
    _git(repo, "add", "measured.csv")
    _git(repo, "commit", "-q", "-m", "measured")
    with pytest.raises(ValueError, match="another predictions file"):
        score(pf, mf)


def test_score_flags_a_large_spread_and_names_its_cause(repo):
    s = _setting()
    doc = _predictions(s)
    pf, mf = repo / "predictions.json", repo / "measured.csv"
    pf.write_text(json.dumps(doc))
    rows = _rows(doc, pf, "x", _now())
    spread = (rows["system"] == "ours") & (rows["repeat"] == 3)
    rows.loc[spread, "iter_time_s"] *= 1.5
    rows.loc[spread, "load_avg_1m_after"] = 9.0
    rows.to_csv(mf, index=False)
    res = score(pf, mf, check_registration=False)
    t = res["table"].set_index("system")
    assert t.loc["ours", "cv_flagged"] and "load" in t.loc["ours", "spread_causes"]
    assert not t.loc["megatron", "cv_flagged"]
    assert res["summary"]["variance_verdict"] == "FAIL"


# ---------------------------------------------------------------- measurement driver (no root)


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
    import repro.validation.measure as meas
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
    s = _setting(iters=5, warmup_iters=2)
    pf = tmp_path / "p.json"
    pf.write_text(json.dumps(_predictions(s)))
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
    s = _setting()
    pf = tmp_path / "p.json"
    pf.write_text(json.dumps(_predictions(s)))
    res = meas.measure(pf, tmp_path / "m.csv", repeats=3, deadline_utc="00:00")
    assert res["not_run"] == ["s1"] and not calls


@pytest.mark.dist
def test_profile_runs_every_stage_shape_with_a_process_cap():
    from repro.validation.profile import profile_setting

    s = _setting(hidden_size=32, seq_length=16, vocab_size=64)
    e = profile_setting(s, repeats=2, warmup=1, max_s=20.0, max_procs=1)
    assert e["key"].endswith("-n4-c1") and e["max_procs"] == 1
    for k in ("fwd_s", "bwd_s", "opt_s"):
        assert len(e[k]) == s.pp and all(x > 0 for x in e[k])
    assert e["params"][0] != e["params"][1]  # embedding on stage 0, head on stage 1
