"""Claims compare DeepSpeed's variants best against best, and variance ignores layout repeats."""

from __future__ import annotations

import pandas as pd

from repro.claims import _claim_deepspeed, _claim_variance


def _row(case, system, it, **kw):
    return {"case": case, "system": system, "num_layers": 24, "global_batch_size": 1024,
            "iter_time_s": it, "status": "ok", "mode": "simulate", **kw}


def test_deepspeed_variants_compared_best_against_best():
    rows = []
    for case in ("1", "2"):
        # zero3's mean is worse, but its best grid point beats pipeline+zero1's best
        rows += [_row(case, "deepspeed", 5.0, zero=3, pp=1, tp=1, dp=64),
                 _row(case, "deepspeed", 50.0, zero=3, pp=1, tp=1, dp=32),
                 _row(case, "deepspeed", 6.0, zero=1, pp=8, tp=1, dp=8),
                 _row(case, "deepspeed", 7.0, zero=1, pp=4, tp=1, dp=16)]
    (ours, _, verdict), _ = _claim_deepspeed(pd.DataFrame(rows))
    assert "0/1 in case 1" in ours and verdict == "FAIL"


def test_variance_ignores_random_layout_repeats():
    rows = [_row("5", "ours_random", t, repeat=i, pp=8, dp=8, tp=1) for i, t in enumerate((1, 2, 3))]
    rows += [_row("5", "ours", 1.0, repeat=i, pp=8, dp=8, tp=1) for i in range(3)]
    result, reason = _claim_variance(pd.DataFrame(rows).assign(mode="emulate"))  # timed runs
    assert result is None and "repeat exactly" in reason
