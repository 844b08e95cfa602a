"""The link-sharing experiment's registration and verdict (no root: the measurement itself runs
under ``python -m system.emulation sharing measure``)."""

from __future__ import annotations

import pandas as pd
import pytest

from system.emulation.sharing_check import RUNS, SharingExperiment, predict, verdict


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
