"""The quality study's metric and report from made-up rows (no emulation): target, time to
target, speed-ups, bytes and the report's files."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from repro.studies.quality.report import smooth, summarize, target_loss, time_to_target


def test_smoothing_and_time_to_target():
    assert smooth([2.0, 4.0, 6.0], 8).tolist() == [2.0, 3.0, 4.0]
    assert time_to_target([3.0, 2.0, 1.0], [1.0, 2.5, 4.0], target=2.0, window=1) == 2.5
    assert time_to_target([3.0, 2.0, 1.0], [1.0, 2.5, 4.0], target=0.5, window=1) is None
    with pytest.raises(ValueError, match="differ in length"):
        time_to_target([1.0], [1.0, 2.0], target=1.0, window=1)
    with pytest.raises(ValueError, match="shorter"):
        target_loss([[1.0, 2.0]], target_iters=3, window=1)


def _row(system, seed, losses, s_per_iter, **extra):
    n = len(losses)
    return {
        "case": "5",
        "system": system,
        "seed": seed,
        "status": "ok",
        "losses": list(losses),
        "elapsed_s": list(np.arange(1, n + 1) * s_per_iter),
        "window": 1,
        "target_iters": 5,
        "global_batch_size": 4,
        "seq_length": 8,
        **extra,
    }


def test_summary_orders_systems_and_decomposes_the_speedup():
    curve = np.linspace(4.0, 2.0, 10)  # loss 3.111 after 5 iterations: the target
    rows = pd.DataFrame(
        [
            _row(
                "ours",
                s,
                curve,
                1.0,
                pipe_bytes=[10.0] * 10,
                dp_bytes=[5.0] * 10,
                predicted_pipe_bytes=[10.0] * 10,
                predicted_dp_bytes=[5.0] * 10,
            )
            for s in range(3)
        ]
        + [_row("diloco_h4", s, curve, 0.5) for s in range(3)]  # same curve, half the time
        + [_row("ours_dp_topk", s, curve + 5.0, 0.4) for s in range(3)]  # never reaches it
    )
    out = summarize(rows, ["ours", "ours_dp_topk", "diloco_h4"]).set_index("system")
    assert list(out.index) == ["ours", "ours_dp_topk", "diloco_h4"]
    assert math.isclose(out.loc["ours", "target_loss"], curve[4])
    assert out.loc["ours", "ttt_median_s"] == 5.0 and out.loc["ours", "reached"] == 3
    assert out.loc["diloco_h4", "speedup_vs_ours"] == 2.0
    assert out.loc["diloco_h4", "iters_to_target"] == 5
    assert out.loc["ours_dp_topk", "reached"] == 0
    assert np.isnan(out.loc["ours_dp_topk", "ttt_median_s"])
    assert out.loc["ours", "bytes_per_iter"] == 15.0 == out.loc["ours", "sim_bytes_per_iter"]
    assert out.loc["ours", "target_tokens"] == 5 * 4 * 8


def test_mode_report_rebuilds_the_quality_report_of_a_quality_folder():
    """``mode=report`` on a folder of ``mode=quality`` rows builds that study's own report (the
    paper's report does not fit its rows)."""
    from importlib import import_module

    from repro.report.build import _own_report

    own = _own_report(pd.DataFrame({"mode": ["quality", "quality"]}))
    module, func = own.split(":")
    assert getattr(import_module(module), func).__name__ == "build_quality_report"
    assert _own_report(pd.DataFrame({"mode": ["quality", "simulate"]})) is None
