"""The link-sharing experiment's registration and verdict (no root: the measurement itself runs
under ``python repro/run.py mode=link_sharing step=measure``)."""

from __future__ import annotations

import pandas as pd
import pytest

from repro.config import ConfigError, validate
from repro.run import run as run_job
from repro.studies.link_sharing.experiment import RUNS, SharingExperiment, predict, verdict


def test_predictions_separate_the_models_and_the_verdict_names_the_right_one():
    reg = predict(SharingExperiment())
    pred = pd.DataFrame(reg["predictions"])
    assert len(pred) == len(RUNS) * 5
    p = pred.set_index(["exchange", "capped", "model"]).predicted_s
    # the cap slows nic's exchanges and nothing else; several destinations split it
    assert p["sharded_ps", True, "nic"] > 2 * p["sharded_ps", True, "pair"]
    assert p["ring", True, "nic"] > 1.5 * p["ring", True, "pair"]
    assert p["sharded_ps", False, "pair"] == p["sharded_ps", True, "pair"]
    # runs measured exactly at pair's (uncapped) and nic's (capped) predictions
    rows = []
    for ex, capped in RUNS:
        truth = p[ex, capped, "nic" if capped else "pair"]
        rows += [
            {"exchange": ex, "capped": capped, "measured_s": truth * f} for f in (0.98, 1, 1.03)
        ]
    table = verdict(reg, pd.DataFrame(rows)).set_index(["exchange", "capped"])
    assert table.loc[("sharded_ps", True), "closest"] == "nic"
    assert table.loc[("ring", True), "closest"] == "nic"
    assert table.loc[("sharded_ps", False), "closest"] == "pair"
    assert "flow" not in table.loc[("ring", False), "within_tolerance"]
    assert table.loc[("ring", True), "err_nic"] == pytest.approx(0.0)


def _step(step: str, folder) -> str:
    """The one error line ``mode=link_sharing step=STEP results_dir=FOLDER`` stops with."""
    with pytest.raises(ConfigError) as e:
        validate({"mode": "link_sharing", "step": step, "results_dir": str(folder)})
    return str(e.value)


# a registration as a user could edit it: (what is changed, what the error line says)
BAD_REGISTRATIONS = [
    ("not json", "registration"),
    ("[1]", "no 'experiment' mapping"),
    ({"bogus": 1}, "unknown key(s) ['bogus']"),
    ({"repeats": 1000000000}, "repeats=1000000000: an integer in 1..100"),
    ({"nbytes": 2**40}, "nbytes=1099511627776"),
    ({"devices": [0, 0]}, "devices=[0, 0]"),
    ({"devices": [0, 99]}, "devices=[0, 99]"),
    ({"case": "R/x.yaml"}, "a named case, not a topology file"),
    ({"case": "9"}, "unknown case '9'"),
    ({"models": ["bogus"]}, "models=['bogus']"),
    ({"bandwidth_scale": "x"}, "bandwidth_scale='x'"),
    ({"egress_cap_gbps": 1e-9}, "egress cap:"),
    ({"tolerance": float("nan")}, "tolerance=nan"),
    ({"predictions": [{"model": "pair"}]}, "a prediction without"),
]


@pytest.mark.parametrize("change,message", BAD_REGISTRATIONS, ids=[m for _, m in BAD_REGISTRATIONS])
def test_a_bad_registration_is_one_line_naming_it_before_any_emulation(
    tmp_path, monkeypatch, change, message
):
    """``step=measure`` and ``step=verdict`` read the registration a user may have edited; each
    bad one is one line (exit 2), not a traceback or a run of a billion repeats."""
    import json

    from repro.studies.link_sharing import experiment

    reg = predict(SharingExperiment())
    if isinstance(change, str):
        text = change
    else:
        for key, value in change.items():
            target = reg if key in ("tolerance", "predictions") else reg["experiment"]
            target[key] = value
        text = json.dumps(reg)
    (tmp_path / "predictions.json").write_text(text)
    called = []
    monkeypatch.setattr(experiment, "measure", lambda *a, **k: called.append(1) or [])
    for step in ("measure", "verdict"):
        err = _step(step, tmp_path)
        assert message in err and len(err.splitlines()) == 1, err
        assert "predictions.json" in err
    assert called == []


@pytest.mark.parametrize(
    "text,message",
    [
        ("exchange,capped\nring,False\n", "no column(s) ['measured_s']"),
        ("exchange,capped,measured_s\nring,False,nan\n", "measured_s: no rows"),
        ("exchange,capped,measured_s\n", "measured_s: no rows"),
    ],
)
def test_bad_measured_rows_are_one_line_naming_the_file(tmp_path, text, message):
    import json

    (tmp_path / "predictions.json").write_text(json.dumps(predict(SharingExperiment())))
    (tmp_path / "measured.csv").write_text(text)
    err = _step("verdict", tmp_path)
    assert message in err and "measured.csv" in err and len(err.splitlines()) == 1, err


def test_a_missing_folder_is_one_line(tmp_path):
    err = _step("verdict", tmp_path / "none")
    assert "predictions.json" in err and len(err.splitlines()) == 1, err


def test_register_then_verdict_through_the_mode(tmp_path, monkeypatch):
    """The steps as ``python repro/run.py mode=link_sharing`` runs them: the registration it
    writes is the one :func:`predict` makes, and the verdict scores rows measured at pair's
    (uncapped) and nic's (capped) predictions."""
    import json

    run_job({"mode": "link_sharing", "step": "register", "results_dir": str(tmp_path)})
    reg = json.loads((tmp_path / "predictions.json").read_text())
    assert reg["predictions"] == predict(SharingExperiment())["predictions"]
    p = pd.DataFrame(reg["predictions"]).set_index(["exchange", "capped", "model"]).predicted_s
    rows = [
        {"exchange": ex, "capped": capped, "measured_s": p[ex, capped, "nic" if capped else "pair"]}
        for ex, capped in RUNS
    ]
    pd.DataFrame(rows).to_csv(tmp_path / "measured.csv", index=False)
    run_job({"mode": "link_sharing", "step": "verdict", "results_dir": str(tmp_path)})
    table = pd.read_csv(tmp_path / "verdict.csv").set_index(["exchange", "capped"])
    assert table.loc[("sharded_ps", True), "closest"] == "nic"
    assert (tmp_path / "verdict.md").read_text().startswith("| exchange")
