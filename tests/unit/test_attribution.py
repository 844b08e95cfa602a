"""The speed-up attribution ladder: real simulations whose step speed-ups multiply to the gap."""

from __future__ import annotations

import numpy as np
import pytest

from repro.studies.attribution import STEPS, ladder, plot_attribution


@pytest.fixture(scope="module")
def rungs():
    return ladder("debug", 4, 64)


def test_rungs_multiply_to_the_total_gap(rungs):
    assert [r["step"] for r in rungs] == [s for s, _ in STEPS]
    times = np.array([r["iter_time_s"] for r in rungs])
    assert np.all(times > 0)
    steps = np.array([r["speedup_step"] for r in rungs])
    assert np.prod(steps) == pytest.approx(times[0] / times[-1])
    assert rungs[-1]["speedup_cumulative"] == pytest.approx(times[0] / times[-1])
    # topology-aware placement never loses to launch order (launch is one of its candidates)
    assert times[1] <= times[0] + 1e-9
    # dropping two all-reduces cannot make an iteration slower
    assert times[2] <= times[1] + 1e-9


def test_figure_is_written(rungs, tmp_path):
    import pandas as pd

    path = plot_attribution(pd.DataFrame(rungs), tmp_path / "a.png")
    assert path.exists() and path.stat().st_size > 1000
