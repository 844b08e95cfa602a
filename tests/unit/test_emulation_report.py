"""The emulation report's pooled Kendall τ (repro.report.emulation) against its definition."""

from __future__ import annotations

import itertools

import numpy as np
import pandas as pd
import pytest
from hypothesis import given
from hypothesis import strategies as st

from repro.report.emulation import pooled_kendall
from tests.strategies import seeds

# settings of 1-6 layouts each; distinct values (no ties), as measured and simulated times are
sizes = st.lists(st.integers(1, 6), min_size=1, max_size=4)


def _definition(df: pd.DataFrame, a: str, b: str) -> tuple[float, int]:
    """(concordant − discordant) / pairs over the layout pairs inside each setting."""
    score = pairs = 0
    for _, g in df.groupby("setting"):
        for (_, x), (_, y) in itertools.combinations(g.iterrows(), 2):
            score += np.sign(x[a] - y[a]) * np.sign(x[b] - y[b])
            pairs += 1
    return (score / pairs if pairs else float("nan")), pairs


@pytest.mark.slow
@given(sizes, seeds)
def test_pooled_kendall_is_concordance_over_all_pairs(sizes, seed):
    rng = np.random.default_rng(seed)
    n = sum(sizes)
    df = pd.DataFrame(
        {
            "setting": np.repeat([f"s{i}" for i in range(len(sizes))], sizes),
            "measured": rng.permutation(n) + 1.0,
            "simulated": rng.permutation(n) + 0.5,
        }
    )
    tau, pairs = pooled_kendall(df, "measured", "simulated")
    want, want_pairs = _definition(df, "measured", "simulated")
    assert pairs == want_pairs
    if pairs:
        assert abs(tau - want) < 1e-12
    else:
        assert np.isnan(tau)
