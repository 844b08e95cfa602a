"""Iterations to a target loss, and medians with bootstrap intervals: the study's arithmetic."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = ["iters_to_target", "loss_at", "bootstrap_median_ci", "verdict"]


def iters_to_target(iters: Sequence[int], losses: Sequence[float], target: float) -> float | None:
    """The first iteration count at which the held-out loss reaches ``target``, linearly
    interpolated between the two evaluations around the crossing; None if never reached."""
    if len(iters) != len(losses):
        raise ValueError("iters_to_target: iters and losses differ in length")
    for k, (it, loss) in enumerate(zip(iters, losses, strict=True)):
        if loss <= target:
            if k == 0:
                return float(it)
            i0, l0 = iters[k - 1], losses[k - 1]
            return float(i0 + (it - i0) * (l0 - target) / (l0 - loss))
    return None


def loss_at(iters: Sequence[int], losses: Sequence[float], at: int) -> float:
    """The held-out loss evaluated at iteration ``at`` (it must be an evaluation point)."""
    where = list(iters).index(int(at)) if int(at) in iters else None
    if where is None:
        raise ValueError(f"loss_at: iteration {at} was not evaluated ({list(iters)[:4]}...)")
    return float(losses[where])


def bootstrap_median_ci(
    values: Sequence[float], *, level: float = 0.95, resamples: int = 10_000, seed: int = 0
) -> tuple[float, float, float]:
    """(median, low, high): the median of ``values`` and the percentile bootstrap interval of
    the median (Efron & Tibshirani 1993, ch. 13), resampling ``values`` with replacement."""
    x = np.asarray(values, dtype=float)
    if x.size == 0 or not np.isfinite(x).all():
        raise ValueError("bootstrap_median_ci: needs one or more finite values")
    rng = np.random.default_rng(seed)
    meds = np.median(x[rng.integers(0, x.size, size=(resamples, x.size))], axis=1)
    a = (1 - level) / 2
    low, high = np.quantile(meds, [a, 1 - a], method="inverted_cdf")
    return float(np.median(x)), float(low), float(high)


def verdict(low: float, high: float) -> str:
    """A ratio's word (method time / reference time): ``sooner`` or ``later`` only where its
    interval excludes 1, else ``no difference``."""
    if high < 1:
        return "sooner"
    if low > 1:
        return "later"
    return "no difference"
