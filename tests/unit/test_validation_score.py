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

from repro.validation.score import kendall_tau_b, score
from tests.unit._validation import predictions as _predictions
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
