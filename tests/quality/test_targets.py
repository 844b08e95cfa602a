"""The study's arithmetic: iterations to a target, bootstrap intervals, the verdict word."""

from __future__ import annotations

import numpy as np
import pytest

from repro.studies.quality_curves.report import _ratio_ci
from repro.studies.quality_curves.targets import (
    bootstrap_median_ci,
    iters_to_target,
    loss_at,
    verdict,
)


def test_iterations_to_target_interpolate_between_evaluations():
    iters, losses = [0, 64, 128], [4.0, 3.0, 2.0]
    assert iters_to_target(iters, losses, 2.5) == pytest.approx(96.0)
    assert iters_to_target(iters, losses, 3.0) == 64.0
    assert iters_to_target(iters, losses, 4.5) == 0.0
    assert iters_to_target(iters, losses, 1.9) is None
    with pytest.raises(ValueError, match="differ in length"):
        iters_to_target([0, 1], [1.0], 0.5)


def test_loss_at_needs_an_evaluated_iteration():
    assert loss_at([0, 64], [4.0, 3.0], 64) == 3.0
    with pytest.raises(ValueError, match="iteration 32 was not evaluated"):
        loss_at([0, 64], [4.0, 3.0], 32)


def test_bootstrap_interval_holds_the_median_and_narrows_with_agreement():
    med, lo, hi = bootstrap_median_ci([10, 11, 12, 13, 30])
    assert med == 12 and lo <= med <= hi
    _, lo2, hi2 = bootstrap_median_ci([12, 12, 12, 12, 12])
    assert lo2 == hi2 == 12
    with pytest.raises(ValueError, match="finite"):
        bootstrap_median_ci([1.0, float("nan")])


def test_ratio_interval_and_verdict():
    ref = np.array([100.0, 102, 98, 101, 99])
    r, lo, hi = _ratio_ci(ref * 0.5, ref)
    assert r == pytest.approx(0.5) and hi < 1 and verdict(lo, hi) == "sooner"
    r, lo, hi = _ratio_ci(np.array([90.0, 130, 100, 110, 95]), ref)
    assert lo < 1 < hi and verdict(lo, hi) == "no difference"
    r, lo, hi = _ratio_ci(np.array([np.inf] * 5), ref)
    assert verdict(lo, hi) == "later" and not np.isfinite(r)
