"""Re-planning after devices leave or join, and the pre-emption trace replay (mode=replan)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from repro.config import validate
from repro.studies.replan import run as replan_mode
from system.cases import get_case
from system.cost.partition import PartitionEvaluator
from system.scheduler import schedule
from system.scheduler.replan import moved_tasklets, replan, warm_partition
from system.workload import DTFM_REFERENCE
from tests.strategies import seeds

SIZES = DTFM_REFERENCE


@given(seeds, st.integers(0, 4))
def test_warm_partition_is_balanced_and_keeps_whole_stages(seed, joined):
    c = get_case("4").subset(list(range(0, 64, 2)))  # 32 devices
    rng = np.random.default_rng(seed)
    prev = rng.permutation(np.repeat(np.arange(8), 4))  # 8 stages of 4
    prev[rng.choice(32, joined * 4, replace=False)] = -1  # these devices just joined
    ev = PartitionEvaluator(c, SIZES, pp=8, dp=4)
    part = warm_partition(ev, prev)
    assert sorted(d for g in part for d in g) == list(range(32))
    assert all(len(g) == 4 for g in part)
    for s in range(8):  # a stage that kept all its devices stays one group
        kept = {int(d) for d in np.flatnonzero(prev == s)}
        if len(kept) == 4:
            assert tuple(sorted(kept)) in part


def test_replan_after_a_region_leaves_is_no_worse_than_its_warm_start():
    c = get_case("5")
    old = schedule(c, SIZES, pp=8, dp=8, seed=0, trials=2, population=6, bound=False)
    keep = [d for d in range(64) if c.region_of[d] not in ("Tokyo", "Seoul")]  # 48 devices
    prev = old.assignment.stage_of[keep]
    r = replan(c.subset(keep), SIZES, pp=6, dp=8, prev_stage=prev, seed=0, time_limit_s=1.0)
    assert r.cost.total_cost_s <= r.warm_cost_s + 1e-9
    assert r.moved_tasklets == moved_tasklets(r.assignment, prev)
    assert r.moved_tasklets >= 16  # stages 6 and 7 are gone: their 16 kept devices must move
    assert r.moved_param_bytes == r.moved_tasklets * SIZES.c_dp_bytes
    with pytest.raises(ValueError, match="one entry per device"):
        replan(c.subset(keep), SIZES, pp=6, dp=8, prev_stage=prev[:-1])


def test_trace_stays_between_half_and_all_devices():
    sizes = [len(p) for p in replan_mode.trace(64, 20, 16, seed=3)]
    assert sizes[0] == 64 and all(32 <= n <= 64 and n % 16 == 0 for n in sizes)
    assert len(set(sizes)) > 1


def test_replan_mode_writes_rows_and_figure(tmp_path):
    cfg = {
        "mode": "replan",
        "case": "debug",
        "results_dir": str(tmp_path),
        "events": 2,
        "step_devices": 2,
        "dp": 2,
        "time_limit_s": 0.3,
    }
    summary = replan_mode.run(validate(cfg))
    assert set(summary) == {"warm", "scratch"}
    rows = (tmp_path / "replan.csv").read_text().splitlines()
    assert len(rows) == 1 + 2 * 3  # header + (warm, scratch) per trace point
    assert (tmp_path / "replan.png").stat().st_size > 0
    with pytest.raises(ValueError, match="multiple of"):
        validate({**cfg, "step_devices": 3})
