"""Lower bounds and exact optima: every bound is below the enumerated optimum (certified gaps)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
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


@pytest.mark.slow
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


@pytest.mark.slow
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


def regional_cluster(n: int, n_regions: int, seed: int, uniform: bool) -> Cluster:
    """``n`` devices spread over ``n_regions`` regions; links either one value per (region,
    region) block (``uniform``, the structure the region bound is exact on) or drawn per pair."""
    import numpy as np

    rng = np.random.default_rng(seed)
    lab = np.sort(rng.integers(n_regions, size=n))
    lab[:n_regions] = np.arange(n_regions)  # every region holds a device
    lab = np.sort(lab)
    if uniform:
        bw_r = rng.uniform(0.2, 2.0, (n_regions, n_regions))
        delay_r = rng.uniform(1.0, 150.0, (n_regions, n_regions))
        np.fill_diagonal(bw_r, rng.uniform(2.0, 20.0, n_regions))  # fast inside a region
        np.fill_diagonal(delay_r, rng.uniform(0.1, 5.0, n_regions))
        bw, delay = bw_r[np.ix_(lab, lab)], delay_r[np.ix_(lab, lab)]
    else:
        bw = rng.uniform(0.2, 2.0, (n, n)) * np.where(lab[:, None] == lab[None, :], 5.0, 1.0)
        delay = rng.uniform(1.0, 150.0, (n, n))
    return Cluster(
        name=f"reg{n}-{n_regions}-{seed}",
        region_of=tuple(f"r{x}" for x in lab),
        host_of=tuple(range(n)),
        delay_ms=(delay + delay.T) / 2,
        bandwidth_gbps=(bw + bw.T) / 2,
    )


@pytest.mark.slow
@settings(deadline=None)
@given(
    seeds,
    st.sampled_from([(4, 2), (2, 4), (3, 3), (2, 3), (4, 3), (3, 4)]),
    st.integers(1, 5),
    st.booleans(),
    st.floats(0.01, 10.0),
)
def test_region_bound_never_exceeds_the_enumerated_optimum(seed, shape, n_regions, uniform, scale):
    pp, dp = shape
    c = regional_cluster(pp * dp, n_regions, seed, uniform)
    sizes = TaskletSizes(c_dp_bytes=0.65e9 * scale, c_pp_bytes=0.47e9 / scale)
    best = brute_force(c, sizes, pp, dp)
    b = lower_bound(c, sizes, pp=pp, dp=dp, use_lp=False)
    assert b.region_bound_s is not None
    assert b.region_bound_s <= best + 1e-9
    assert b.total_bound_s <= best + 1e-9


def test_region_bound_proves_cases_3_and_4_optimal():
    """Cases 3 and 4 (64 devices): the region bound equals the scheduler's results (10.391 and
    34.802 s, each stage holding devices of every region), so they are optimal."""
    for case, result in (("3", 10.390848437717983), ("4", 34.80204101721226)):
        b = lower_bound(get_case(case), SIZES, pp=8, dp=8, use_lp=False)
        assert b.region_bound_s == pytest.approx(result, rel=1e-9)
        r = schedule(get_case(case), SIZES, pp=8, dp=8, seed=0, trials=2, population=6)
        assert r.cost.total_cost_s >= b.region_bound_s - 1e-9
        assert r.cost.total_cost_s == pytest.approx(result, rel=1e-9)


@pytest.mark.parametrize("dp_scale", [0.01, 0.05, 0.2, 1.0])
def test_region_bound_with_cuts_is_exact_on_a_far_region(dp_scale):
    """Three regions of 4 devices, one far from the other two: the optimum keeps one device of
    each region per stage (the far region's count per group constant); the bound, which charges
    a dearer crossing only where that count must vary, equals the brute-force optimum."""
    import numpy as np

    lab = np.repeat(np.arange(3), 4)
    bw = np.array([[10.0, 1.0, 0.2], [1.0, 10.0, 0.25], [0.2, 0.25, 10.0]])
    delay = np.array([[1.0, 20.0, 150.0], [20.0, 1.0, 120.0], [150.0, 120.0, 1.0]])
    c = Cluster(
        name="far-region",
        region_of=tuple(f"r{x}" for x in lab),
        host_of=tuple(range(12)),
        delay_ms=delay[np.ix_(lab, lab)],
        bandwidth_gbps=bw[np.ix_(lab, lab)],
    )
    sizes = TaskletSizes(c_dp_bytes=0.65e9 * dp_scale, c_pp_bytes=0.47e9)
    opt = brute_force(c, sizes, 4, 3)
    b = lower_bound(c, sizes, pp=4, dp=3, use_lp=False)
    assert b.region_bound_s == pytest.approx(opt, rel=1e-9)
