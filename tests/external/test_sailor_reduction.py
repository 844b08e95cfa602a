"""Held-out plans are read through their configuration only; the logged gradient reduction
(``red_grads``) is scored beside the iteration on the plans that carry it."""

from __future__ import annotations

import pytest

import baselines.deepspeed.schedule  # noqa: F401  (registers the "deepspeed" op order)
from repro.studies.external.report import render_report
from repro.studies.external.score import (
    errors_frame,
    mape_table,
    predictions_frame,
    profile_rows_table,
)
from system.external.sailor.plan import load_plan
from system.external.sailor.predict import CONFIG_FIELDS, held_out, predict_plans
from tests.external._tiny import plan, write_data, write_plan


def _measured(d: dict, **fields) -> dict:
    return {**d, **fields}


def test_held_out_plans_keep_no_measurement(tmp_path):
    # a held-out plan that (against the data's description) carries measurements: none of
    # them may reach the row, the prediction or a score
    write_data(tmp_path)
    leak = _measured(plan([[0, 1, 2, 3]], 2, gbs=4), real=9.0, red_grads=3.0, max_mem=1e9)
    write_plan(tmp_path, "mit/N2/plan_config_N2_D2.json", leak)
    bad = _measured(plan([[0, 1, 2]], 1), real=9.0, red_grads=3.0)  # excluded: 3 of 4 layers
    write_plan(tmp_path, "mit/N1/plan_config_bad.json", bad)
    rows = predict_plans(tmp_path / "plans")
    assert [r.set for r in rows] == ["mit", "mit"]
    for r in rows:
        assert r.real_s is None and r.red_grads_s is None and r.max_mem_bytes is None
    assert rows[0].prediction is None and rows[1].prediction is not None
    assert len(errors_frame(rows)) == 0 and len(mape_table(rows)) == 0
    assert predictions_frame(rows)["predicted_red_grads_s"].iloc[1] == pytest.approx(0.88088)


def test_held_out_is_the_cluster_folder():
    assert held_out("mit/N4/plan_config_N4_D2.json")
    assert held_out("MIT/N4/plan_config_N4_D2.json")
    assert not held_out("clariden/OPT-350/N4/plan_config_N4_D2.json")
    assert not held_out("plan_config_mit.json")


def test_load_plan_reads_only_the_named_fields(tmp_path):
    write_data(tmp_path)
    path = write_plan(tmp_path, "x/plan_config_x.json", plan([[0, 1, 2, 3]], 1, real=2.0))
    assert load_plan(path, "OPT-350", 4).real_s == 2.0
    assert load_plan(path, "OPT-350", 4, fields=CONFIG_FIELDS).real_s is None


def test_red_grads_is_scored_per_set(tmp_path):
    # one stage, dp 2: rank 0's predicted reduction is 0.88088 s (test_sailor_framework's
    # hand computation); logged 1.1 s -> -19.92%; a dp-1 plan's prediction is the copies,
    # 0.00088 s for 220e6 parameters, against a logged 0.0011 s -> -20%
    write_data(tmp_path)
    dp2 = _measured(plan([[0, 1, 2, 3]], 2, gbs=4), real=3.0, red_grads=1.1)
    dp1 = _measured(plan([[0, 1, 2, 3]], 1, gbs=2), real=2.0, red_grads=0.0011)
    write_plan(tmp_path, "clariden/OPT-350/N2/plan_config_N2_D2.json", dp2)
    write_plan(tmp_path, "clariden/OPT-350/N1/plan_config_N1_D1.json", dp1)
    rows = predict_plans(tmp_path / "plans")
    err = errors_frame(rows).set_index("plan")
    e2 = err.loc["clariden/OPT-350/N2/plan_config_N2_D2.json"]
    assert e2["measured_red_grads_s"] == 1.1
    assert e2["red_grads_signed_error_pct"] == pytest.approx(100 * (0.88088 - 1.1) / 1.1)
    e1 = err.loc["clariden/OPT-350/N1/plan_config_N1_D1.json"]
    assert e1["red_grads_signed_error_pct"] == pytest.approx(-20.0)
    t = mape_table(rows).iloc[0]
    assert t["red_grads_plans"] == 2 and t["red_grads_dp_plans"] == 1
    assert t["red_grads_mape_pct"] == pytest.approx((100 * 0.21912 / 1.1 + 20.0) / 2)
    assert t["red_grads_dp_median_ratio"] == pytest.approx(1.1 / 0.88088)
    split = profile_rows_table(rows)
    assert split["rows"].tolist() == ["profiler"] and split["plans"].tolist() == [2]
    report = render_report(rows, command="x", figure=None)
    assert "## The logged gradient reduction (`red_grads`)" in report
    assert "| clariden/OPT-350 | 2 | 20.0% | 1 | 19.9% | 1.25× |" in report
