"""Registered-prediction validation: the registration check (predictions committed before the
rows that score them) and the score itself."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pandas as pd
import pytest
from hypothesis import given
from hypothesis import strategies as st

from repro.studies.validation.score import kendall_tau_b, score
from tests.unit._validation import predictions as _predictions
from tests.unit._validation import profile as _profile
from tests.unit._validation import setting as _setting

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


def _rows(doc: dict, pred_file: Path, sha: str, when: str, scale=1.1) -> pd.DataFrame:
    from repro.studies.validation.predict import sha256_file

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


@pytest.mark.slow
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
    from repro.studies.validation.score import _markdown

    md = _markdown(res)
    assert reg[:10] in md and "PASS" in md and md.count("| s1 |") == 4 + 2  # 4 systems, 2 ratios


@pytest.mark.slow
def test_a_round_moved_into_its_folder_still_scores(repo):
    """Moving a round's files (``git mv`` into ``roundN/``) keeps the registration: the commit
    that first added the predictions, whose content is unchanged."""
    doc, pf, mf, reg = _registered(repo)
    time.sleep(1.1)
    _rows(doc, pf, reg, _now()).to_csv(mf, index=False)
    _git(repo, "add", "measured.csv")
    _git(repo, "commit", "-q", "-m", "measured")
    (repo / "round1").mkdir()
    _git(repo, "mv", "predictions.json", "measured.csv", "round1/")
    _git(repo, "commit", "-q", "-m", "round 1 into its folder")
    res = score(repo / "round1" / "predictions.json", repo / "round1" / "measured.csv")
    assert res["summary"]["registration"]["registration_commit"] == reg


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


@pytest.mark.slow
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


def test_tied_ranks_anchor_at_the_group_minimum():
    from repro.studies.validation.score import tied_ranks

    assert tied_ranks([2.0, 1.0, 1.04], 0.05) == [1, 0, 0]
    assert tied_ranks([1.0, 1.04, 1.08, 1.12], 0.05) == [0, 0, 1, 1]  # no chaining
    assert tied_ranks([3.0, 1.0, 2.0], 0.0) == [2, 0, 1]


def test_registered_tie_rule_scores_a_secondary_tau_beside_the_plain_one(tmp_path):
    """Megatron and DeepSpeed predicted 2% apart and measured in the other order: the plain τ
    counts the swap, the registered 5% tie rule does not; without a rule there is no
    secondary τ. The predictions' rules are what the score reads."""
    from repro.studies.validation.score import _markdown

    doc = _predictions(_setting())
    pred = {"ours": 1.0, "ours_random": 1.5, "megatron": 2.0, "deepspeed": 2.04}
    meas = {"ours": 1.0, "ours_random": 1.5, "megatron": 2.1, "deepspeed": 2.0}
    for p in doc["predictions"]:
        p["predicted_iter_time_s"] = pred[p["system"]]
    pf, mf = tmp_path / "p.json", tmp_path / "m.csv"
    pf.write_text(json.dumps(doc))
    rows = _rows(doc, pf, "x", _now())
    rows["iter_time_s"] = rows["system"].map(meas) * (1 + 0.001 * rows["repeat"])
    rows.to_csv(mf, index=False)
    plain = score(pf, mf, check_registration=False)["summary"]
    assert plain["kendall_tau_mean"] == pytest.approx(4 / 6)
    assert "kendall_tau_tied_mean" not in plain
    pf.write_text(json.dumps({**doc, "rules": {"tie_tolerance": 0.05}}))
    res = score(pf, mf, check_registration=False)
    s = res["summary"]
    assert s["kendall_tau_mean"] == pytest.approx(4 / 6)  # the plain τ is unchanged
    assert s["kendall_tau_tied_mean"] == pytest.approx(5 / (5 * 6) ** 0.5)
    assert "registered before the runs" in _markdown(res)


def test_settings_rules_are_checked_and_registered(tmp_path):
    from repro.studies.validation.predict import predict_file
    from repro.studies.validation.settings import load_rules

    s = _setting()
    sf, prof = tmp_path / "s.json", tmp_path / "prof.json"
    prof.write_text(json.dumps(_profile(s)))
    for bad, match in (({"tie": 0.1}, "unknown rule"), ({"tie_tolerance": 0.7}, r"\[0, 0.5\)")):
        sf.write_text(json.dumps({"settings": [s.to_dict()], "rules": bad}))
        with pytest.raises(ValueError, match=match):
            load_rules(sf)
    sf.write_text(json.dumps({"settings": [s.to_dict()], "rules": {"tie_tolerance": 0.05}}))
    assert predict_file(sf, prof, schedule_trials=10)["rules"] == {"tie_tolerance": 0.05}
    sf.write_text(json.dumps({"settings": [s.to_dict()]}))
    assert predict_file(sf, prof, schedule_trials=10)["rules"] == {}
