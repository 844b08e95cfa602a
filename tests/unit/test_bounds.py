"""Lower bounds and exact optima: every bound is below the enumerated optimum (certified gaps)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from system.cases import get_case, spot_cluster
from system.cluster import Cluster
from system.cost.partition import PartitionEvaluator
from system.scheduler import schedule
from system.scheduler.bounds import count_partitions, exact_optimum, gap_pct, lower_bound
from system.workload import DTFM_REFERENCE, TaskletSizes
from tests.strategies import random_cluster, seeds

SIZES = DTFM_REFERENCE


def brute_force(cluster: Cluster, sizes: TaskletSizes, pp: int, dp: int) -> float:
    """Every balanced partition costed, no pruning (independent of exact_optimum's search)."""
    import itertools

    def rec(left):
        if not left:
            yield []
            return
        for others in itertools.combinations(left[1:], dp - 1):
            g = (left[0], *others)
            rest = tuple(x for x in left[1:] if x not in others)
            for tail in rec(rest):
                yield [g, *tail]

    ev = PartitionEvaluator(cluster, sizes, pp=pp, dp=dp)
    return float(ev.totals(list(rec(tuple(range(cluster.num_devices))))).min())


@given(seeds, st.sampled_from([(4, 2), (2, 4), (3, 3), (2, 3)]), st.floats(0.01, 10.0))
def test_bounds_never_exceed_the_enumerated_optimum(seed, shape, scale):
    pp, dp = shape
    c = random_cluster(pp * dp, seed)
    sizes = TaskletSizes(c_dp_bytes=0.65e9 * scale, c_pp_bytes=0.47e9 / scale)
    best = brute_force(c, sizes, pp, dp)
    opt, part = exact_optimum(c, sizes, pp=pp, dp=dp)
    assert opt == pytest.approx(best, rel=1e-12)
    assert PartitionEvaluator(c, sizes, pp=pp, dp=dp).total(part) == pytest.approx(opt, rel=1e-12)
    b = lower_bound(c, sizes, pp=pp, dp=dp)
    assert b.dp_bound_s + 2 * b.pp_bound_s <= best + 1e-9
    assert b.lp_bound_s is not None and b.lp_bound_s <= best + 1e-9
    mb = lower_bound(c, sizes, pp=pp, dp=dp, integral=True, time_limit_s=5.0)
    assert b.total_bound_s - 1e-9 <= mb.total_bound_s <= best + 1e-9


@pytest.mark.slow
def test_exact_optimum_on_16_devices_is_at_most_the_scheduler_result():
    c = random_cluster(16, 0)
    r = schedule(c, SIZES, pp=4, dp=4, seed=0)
    opt, _ = exact_optimum(c, SIZES, pp=4, dp=4, incumbent_s=r.cost.total_cost_s)
    assert r.bound is not None and r.bound.total_bound_s <= opt + 1e-9
    assert opt <= r.cost.total_cost_s + 1e-9


def test_spot_shapes_are_proven_optimal_by_the_bound():
    for host_sizes in [(4, 4) + (1,) * 8, (2,) * 4 + (1,) * 8]:
        c = spot_cluster("s16", host_sizes=host_sizes, across_gbps=1.25, inside_gbps=100.0)
        r = schedule(c, SIZES, pp=4, dp=4, seed=0)
        assert r.gap_pct == pytest.approx(0.0, abs=1e-9)  # bound == result: optimal
    r = schedule(get_case("2", "dtfm_code"), SIZES, pp=8, dp=8, seed=0, trials=2, population=6)
    assert r.cost.total_cost_s == pytest.approx(r.bound.total_bound_s, rel=1e-9)


def test_results_carry_the_bound_and_refuse_huge_enumerations():
    c = get_case("debug")
    d = schedule(c, SIZES, pp=4, dp=2, seed=0, trials=3, population=4).to_dict()
    assert d["bound_total_s"] <= d["total_cost_s"] and d["gap_pct"] >= 0
    assert d["bound_method"] == "lp"
    assert count_partitions(8, 4) == 105
    assert gap_pct(10.0, 7.5) == 25.0 and gap_pct(0.0, 0.0) == 0.0
    with pytest.raises(ValueError, match="max_partitions"):
        exact_optimum(get_case("5"), SIZES, pp=8, dp=8)
