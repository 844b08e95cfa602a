"""The speed-up attribution ladder: real simulations whose step speed-ups multiply to the gap."""

from __future__ import annotations

import numpy as np
import pytest

from repro.studies.attribution.run import STEPS, ladder, plot_attribution


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
    step = {r["step"]: r for r in rungs}
    # topology-aware placement never loses to launch order (launch is one of its candidates),
    # and the grid re-picked for it never loses to the launch pick on its best map
    assert step["topology"]["iter_time_s"] <= step["megatron_launch"]["iter_time_s"] + 1e-9
    assert step["retune"]["iter_time_s"] <= step["topology"]["iter_time_s"] + 1e-9
    # dropping the grad-norm all-reduce cannot make an iteration slower
    assert step["no_grad_norm"]["iter_time_s"] <= step["untie"]["iter_time_s"] + 1e-9
    # the configuration search is never worse than the paper's configuration
    assert step["ours_best"]["iter_time_s"] <= step["ours"]["iter_time_s"] + 1e-9
    # every rung fits in memory, and a GPipe rung says how many passes memory forces
    assert all(r["memory_gib"] <= 15.0 + 1e-9 for r in rungs)
    assert "micro-batches" in step["gpipe"]["constraint"]
    assert {r["link_sharing"] for r in rungs} == {"tc_class"}


def test_figure_is_written(rungs, tmp_path):
    import pandas as pd

    path = plot_attribution(pd.DataFrame(rungs), tmp_path / "a.png")
    assert path.exists() and path.stat().st_size > 1000
