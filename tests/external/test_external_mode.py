"""``mode=external source=sailor``: what it writes, on hand-made plans and on the shipped set."""

from __future__ import annotations

import pandas as pd
import pytest

from repro.run import run
from tests.external._tiny import plan, write_data, write_plan
from tests.external.test_sailor_importers import SHARED, shipped


def test_mode_writes_predictions_and_a_report_where_plans_are_measured(tmp_path, capsys):
    data = write_data(tmp_path / "data")
    write_plan(
        data, "clariden/OPT-350/N2/plan_config_N2_D1.json", plan([[0, 1], [2, 3]], 1, real=0.7)
    )
    write_plan(data, "mit/N1/plan_config_N1_D1.json", plan([[0, 1, 2, 3]], 1))
    out = tmp_path / "out"
    summary = run({"mode": "external", "plans": str(data / "plans"), "results_dir": str(out)})
    assert summary["plans"] == 2 and summary["excluded"] == []
    pred = pd.read_csv(out / "predictions.csv")
    assert pred["plan"].tolist() == [
        "clariden/OPT-350/N2/plan_config_N2_D1.json",
        "mit/N1/plan_config_N1_D1.json",
    ]
    for col in (
        "predicted_iter_time_s",
        "pipeline_s",
        "data_parallel_s",
        "optimizer_s",
        "predicted_peak_memory_bytes",
    ):
        assert pred[col].notna().all()
    # the hand computation of test_two_stage_one_micro_batch_by_hand: 0.7705710 s
    assert pred["predicted_iter_time_s"].iloc[0] == pytest.approx(0.7705710, abs=1e-6)
    err = pd.read_csv(out / "errors.csv")
    assert err["signed_error_pct"].iloc[0] == pytest.approx(100 * (0.7705710 - 0.7) / 0.7, abs=1e-4)
    report = (out / "REPORT.md").read_text()
    assert "| clariden/OPT-350 | 1 | 0 | 10.1% |" in report
    assert "Sets without measurements (predicted only): mit." in report
    assert (out / "predicted_vs_measured.png").stat().st_size > 0
    assert "clariden/OPT-350" in capsys.readouterr().out  # the MAPE table


def test_mode_without_measurements_writes_no_report(tmp_path):
    data = write_data(tmp_path / "data")
    write_plan(data, "mit/N1/plan_config_N1_D1.json", plan([[0, 1, 2, 3]], 1))
    out = tmp_path / "out"
    run({"mode": "external", "plans": str(data / "plans"), "results_dir": str(out)})
    assert (out / "predictions.csv").is_file() and not (out / "REPORT.md").exists()


@shipped
def test_mode_on_the_shipped_set(tmp_path):
    out = tmp_path / "out"
    summary = run({"mode": "external", "plans": str(SHARED / "plans"), "results_dir": str(out)})
    assert summary["plans"] == 36
    assert summary["excluded"] == ["clariden/GPT-NEO/N4/plan_config_N4_D4.json"]
    assert set(summary["mape_pct"]) == {"clariden/OPT-350", "clariden/GPT-NEO"}
    pred = pd.read_csv(out / "predictions.csv")
    assert len(pred) == 36 and (pred["set"] == "mit").sum() == 9
    assert "mit/N4/plan_config_N4_D2.json" in set(pred["plan"])


def test_the_committed_fixture_is_the_hand_made_set(tmp_path):
    """``tests/external/fixtures/tiny`` (the config tests' plans folder) is what ``_tiny``
    writes, so the hand computations hold for it too."""
    from pathlib import Path

    fixture = Path(__file__).parent / "fixtures" / "tiny"
    fresh = write_data(tmp_path)
    for f in sorted(p.name for p in fixture.glob("*.json")):
        assert (fixture / f).read_text() == (fresh / f).read_text(), f
    summary = run(
        {"mode": "external", "plans": str(fixture / "plans"), "results_dir": str(tmp_path / "o")}
    )
    # 0.7705710 s (test_two_stage_one_micro_batch_by_hand) against 0.7 s: +10.08%
    assert summary["mape_pct"] == {"clariden/OPT-350": pytest.approx(10.08, abs=0.01)}
