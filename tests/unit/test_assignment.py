"""Assignment checks and the cost of a concrete assignment (paper §3)."""

from __future__ import annotations

import numpy as np
import pytest

from system.assignment import Assignment, identity_assignment, random_assignment
from system.cases import get_case
from system.cost.model import assignment_cost
from system.workload import DTFM_REFERENCE, TaskletSizes


def test_assignment_validates_permutation():
    with pytest.raises(ValueError, match="exactly once"):
        Assignment.from_stages([[0, 1], [1, 2]])
    with pytest.raises(ValueError, match="pp, dp"):
        Assignment(np.arange(4))


def test_round_trip_and_relabel(tmp_path):
    a = random_assignment(4, 2, seed=3)
    p = tmp_path / "a.json"
    import json

    p.write_text(json.dumps(a.to_dict()))
    b = Assignment.load(p)
    assert np.array_equal(a.stages, b.stages)
    assert np.array_equal(random_assignment(4, 2, seed=3).stages, a.stages)
    perm = np.array([7, 6, 5, 4, 3, 2, 1, 0])
    r = a.relabel(perm)
    assert r.stage_of[perm[a.stages[1, 0]]] == 1
    with pytest.raises(ValueError, match="disagrees"):
        Assignment.from_dict({"pp": 3, "stages": a.stages.tolist()})


def test_one_pipeline_per_region_costs_the_authors_value():
    # case 5 with the authors' constants, one pipeline per region -> 49.22 s
    c = get_case("5")
    a = Assignment(np.arange(64).reshape(8, 8).T)
    cost = assignment_cost(c, a, DTFM_REFERENCE)
    assert cost.total_cost_s == pytest.approx(49.21, abs=0.01)
    assert cost.total_cost_s == pytest.approx(cost.dp_cost_s + 2 * cost.pp_cost_s)


def test_cost_by_hand_on_two_devices():
    c = get_case("debug").subset([0, 2])  # Oregon - Virginia: 67 ms, 0.79 Gbit/s
    sizes = TaskletSizes(c_dp_bytes=1e8, c_pp_bytes=2e8)
    pp = assignment_cost(c, identity_assignment(2, 1), sizes)
    assert pp.dp_cost_s == 0 and pp.pp_cost_s == pytest.approx(0.067 + 1.6e9 / 0.79e9)
    dp = assignment_cost(c, identity_assignment(1, 2), sizes)
    assert dp.pp_cost_s == 0 and dp.dp_cost_s == pytest.approx(2 * (0.067 + 0.4e9 / 0.79e9))
    with pytest.raises(ValueError, match="does not match the 2 devices"):
        assignment_cost(c, identity_assignment(2, 2), sizes)
