"""Repeats of a setting: CV, flags, the best configuration per setting (repro.report.variance)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from repro.report.variance import best_configs, variance_table


def _rows(times, system="ours", **extra):
    n = len(times)
    return pd.DataFrame(
        {
            "case": [5] * n,
            "system": [system] * n,
            "num_layers": [24] * n,
            "global_batch_size": [1024] * n,
            "status": ["ok"] * n,
            "iter_time_s": times,
            **{k: [v] * n for k, v in extra.items()},
        }
    )


def test_cv_is_sample_std_over_mean_and_flags_over_five_percent():
    t = variance_table(pd.concat([_rows([10.0, 11.0, 12.0]), _rows([5.0, 5.0, 5.05], "megatron")]))
    ours = t[t.system == "ours"].iloc[0]
    assert ours.cv == pytest.approx(np.std([10, 11, 12], ddof=1) / 11)
    assert ours.spread == pytest.approx(2 / 11)
    assert bool(ours.flagged) and not bool(t[t.system == "megatron"].flagged.iloc[0])
    assert set(t.case) == {"5"}  # case normalised to text


def test_single_repeat_has_no_cv_and_is_not_flagged():
    t = variance_table(_rows([3.0]))
    assert t.n_repeats.iloc[0] == 1 and np.isnan(t.cv.iloc[0]) and not t.flagged.iloc[0]


def test_failed_rows_are_left_out():
    rows = _rows([10.0, 10.0, 99.0])
    rows.loc[2, "status"] = "error"
    assert variance_table(rows).n_repeats.iloc[0] == 2


def test_best_config_is_the_fastest_mean():
    rows = pd.concat(
        [
            _rows([4.0, 4.2], "megatron", tp=1, pp=8, dp=8),
            _rows([3.0, 3.1], "megatron", tp=2, pp=4, dp=8),
        ]
    )
    b = best_configs(rows)
    assert len(b) == 1 and (b.tp.iloc[0], b.pp.iloc[0], b.n_configs.iloc[0]) == (2, 4, 2)


def test_bad_input_is_one_clear_error():
    with pytest.raises(ValueError, match="missing columns"):
        variance_table(pd.DataFrame({"case": [1]}))
    with pytest.raises(ValueError, match="cv_limit"):
        variance_table(_rows([1.0]), cv_limit=5)


def test_configurations_that_differ_only_in_a_framework_feature_are_not_repeats():
    # Megatron with and without its distributed optimizer (same tp/pp/dp/...): two
    # configurations, the faster one the pick, not the mean of both
    base = dict(tp=1, pp=8, dp=8, micro_batch_size=1, zero=0, recompute="none")
    plain = _rows([50.0] * 3, "megatron", distributed_optimizer=False, **base)
    sharded = _rows([30.0] * 3, "megatron", distributed_optimizer=True, **base)
    t = variance_table(pd.concat([plain, sharded]))
    assert len(t) == 2 and not t.flagged.any()
    best = best_configs(pd.concat([plain, sharded]))
    assert best.iter_time_s_mean.tolist() == [30.0]
    assert bool(best.distributed_optimizer.iloc[0])
