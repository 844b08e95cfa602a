"""Bottleneck matching, open TSP and partition cost (paper §3.2–3.3) against brute force."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from system.assignment import Assignment
from system.cases import get_case
from system.cluster import Cluster
from system.cost.matching import bottleneck_matching, bottleneck_values
from system.cost.model import assignment_cost
from system.cost.partition import PartitionEvaluator, partition_cost
from system.cost.tsp import open_tsp_path, open_tsp_values, path_cost
from system.workload import DTFM_REFERENCE, TaskletSizes
from tests.strategies import random_cluster, seeds

SIZES = DTFM_REFERENCE


def brute_bottleneck(m: np.ndarray) -> float:
    n = m.shape[0]
    return min(max(m[i, p[i]] for i in range(n)) for p in itertools.permutations(range(n)))


small_matrices = st.integers(1, 6).flatmap(
    lambda n: arrays(np.float64, (n, n), elements=st.integers(0, 6).map(float))
)


@given(small_matrices)
def test_bottleneck_matching_equals_brute_force(m):
    value, perm = bottleneck_matching(m)
    assert value == brute_bottleneck(m)
    assert sorted(perm.tolist()) == list(range(m.shape[0]))
    assert m[np.arange(m.shape[0]), perm].max() == value  # the matching attains the value
    assert bottleneck_values(m[None])[0] == value


@pytest.mark.parametrize("n", [8, 13, 16])
def test_bottleneck_batch_agrees_with_hopcroft_karp(n):
    rng = np.random.default_rng(n)
    mats = np.concatenate([rng.random((40, n, n)), rng.integers(0, 3, (40, n, n)).astype(float)])
    got = bottleneck_values(mats)
    assert np.array_equal(got, [bottleneck_matching(x)[0] for x in mats])


def test_bottleneck_rejects_bad_input():
    with pytest.raises(ValueError, match="square"):
        bottleneck_matching(np.zeros((2, 3)))
    with pytest.raises(ValueError, match="finite"):
        bottleneck_matching(np.array([[np.inf]]))
    with pytest.raises(ValueError, match="NaN"):
        bottleneck_values(np.array([[[1.0, np.nan], [0.0, 2.0]]]))


@given(st.integers(1, 7), seeds)
def test_open_tsp_equals_brute_force(m, seed):
    rng = np.random.default_rng(seed)
    w = rng.random((m, m))
    w = w + w.T
    np.fill_diagonal(w, 0.0)
    best = min(path_cost(w, list(p)) for p in itertools.permutations(range(m)))
    cost, order = open_tsp_path(w)
    assert sorted(order) == list(range(m))
    assert cost == pytest.approx(best, abs=1e-12)
    assert path_cost(w, order) == pytest.approx(cost, abs=1e-12)
    assert open_tsp_values(w[None])[0] == pytest.approx(best, abs=1e-12)


def test_tsp_heuristic_beyond_16_is_a_valid_path_no_worse_than_nearest_neighbour():
    rng = np.random.default_rng(0)
    w = rng.random((20, 20))
    w = w + w.T
    cost, order = open_tsp_path(w)
    assert sorted(order) == list(range(20))
    assert cost == pytest.approx(path_cost(w, order))
    assert cost < path_cost(w, list(range(20)))


def all_stage_tables(n: int, pp: int, dp: int) -> np.ndarray:
    """Every rank map of n devices, (n!, pp, dp)."""
    return np.array(list(itertools.permutations(range(n)))).reshape(-1, pp, dp)


def brute_assignment_costs(cluster: Cluster, tables: np.ndarray, sizes: TaskletSizes) -> np.ndarray:
    """Vectorized assignment_cost of many (pp, dp) tables."""
    from system.cost.model import dp_cost_matrix_s

    dp = tables.shape[2]
    pair = dp_cost_matrix_s(cluster, sizes.c_dp_bytes, dp)
    link = cluster.link_time_s(sizes.c_pp_bytes)
    dps = pair[tables[:, :, :, None], tables[:, :, None, :]].sum(-1).max(-1).max(-1)
    pps = link[tables[:, :-1], tables[:, 1:]].max(-1).sum(-1)
    return dps + 2 * pps


@pytest.mark.parametrize("pp,dp", [(4, 2), (2, 4)])
def test_partition_cost_is_the_best_over_all_orders_and_matchings(pp, dp):
    """8 devices: min over all 8! rank maps of a partition's orders/matchings = partition_cost."""
    c = get_case("debug")
    tables = all_stage_tables(8, pp, dp)
    costs = brute_assignment_costs(c, tables, SIZES)
    keys = [tuple(sorted(tuple(sorted(r)) for r in t)) for t in tables.tolist()]
    best: dict = {}
    for k, v in zip(keys, costs, strict=True):
        best[k] = min(best.get(k, np.inf), v)
    ev = PartitionEvaluator(c, SIZES, pp=pp, dp=dp)
    parts = list(best)
    got = ev.totals([list(p) for p in parts])
    assert np.allclose(got, [best[p] for p in parts], rtol=1e-12, atol=1e-12)
    for p in parts[:20]:
        cost, a = partition_cost(c, np.array(p), SIZES)
        assert cost.total_cost_s == pytest.approx(best[p], abs=1e-12)


@given(st.sampled_from([(2, 3), (3, 2), (2, 4), (4, 2), (3, 3)]), seeds)
def test_partition_cost_equals_assignment_cost_of_its_assignment(shape, seed):
    pp, dp = shape
    c = random_cluster(pp * dp, seed)
    groups = np.random.default_rng(seed).permutation(pp * dp).reshape(pp, dp)
    cost, a = partition_cost(c, groups, SIZES)
    assert cost == assignment_cost(c, a, SIZES)
    assert sorted(map(sorted, a.stages.tolist())) == sorted(map(sorted, groups.tolist()))
    ev = PartitionEvaluator(c, SIZES, pp=pp, dp=dp)
    assert ev.total([tuple(sorted(g)) for g in groups.tolist()]) == pytest.approx(cost.total_cost_s)


@given(seeds, st.floats(1.01, 10.0))
def test_raising_a_bandwidth_never_raises_partition_cost(seed, factor):
    pp, dp = 3, 3
    c = random_cluster(9, seed)
    rng = np.random.default_rng(seed + 1)
    groups = rng.permutation(9).reshape(pp, dp)
    i, j = rng.choice(9, 2, replace=False)
    bw = c.bandwidth_gbps.copy()
    np.fill_diagonal(bw, 0.0)
    bw[i, j] *= factor
    bw[j, i] *= factor
    faster = Cluster(
        name="faster",
        region_of=c.region_of,
        host_of=c.host_of,
        delay_ms=c.delay_ms,
        bandwidth_gbps=bw,
    )
    before, _ = partition_cost(c, groups, SIZES)
    after, _ = partition_cost(faster, groups, SIZES)
    assert after.total_cost_s <= before.total_cost_s + 1e-12
    assert after.dp_cost_s <= before.dp_cost_s + 1e-12
    assert after.pp_cost_s <= before.pp_cost_s + 1e-12


@given(seeds)
def test_relabelling_devices_leaves_partition_cost_unchanged(seed):
    pp, dp = 3, 4
    c = random_cluster(12, seed)
    rng = np.random.default_rng(seed)
    groups = rng.permutation(12).reshape(pp, dp)
    perm = rng.permutation(12)  # new device i is old device perm[i]
    inverse = np.argsort(perm)  # old device d is new device inverse[d]
    before, _ = partition_cost(c, groups, SIZES)
    after, _ = partition_cost(c.permuted(perm), inverse[groups], SIZES)
    assert after.total_cost_s == pytest.approx(before.total_cost_s, rel=1e-12)


def test_case5_one_pipeline_per_region_costs_49_218():
    c = get_case("5")
    cost, a = partition_cost(c, np.arange(64).reshape(8, 8).T, SIZES)
    assert cost.total_cost_s == pytest.approx(49.2184, abs=1e-3)
    same = assignment_cost(c, Assignment(np.arange(64).reshape(8, 8).T), SIZES)
    assert cost.total_cost_s == pytest.approx(same.total_cost_s, abs=1e-9)


def test_partition_cost_rejects_bad_groups():
    c = get_case("debug")
    with pytest.raises(ValueError, match="exactly once"):
        partition_cost(c, np.array([[0, 1], [1, 2], [3, 4], [5, 6]]), SIZES)
    with pytest.raises(ValueError, match="holds 6 devices"):
        partition_cost(c, np.arange(6).reshape(3, 2), SIZES)


def _random_partitions(n: int, pp: int, k: int, rng: np.random.Generator):
    dp = n // pp
    out = []
    for _ in range(k):
        perm = rng.permutation(n)
        out.append([tuple(sorted(int(x) for x in perm[g * dp : (g + 1) * dp])) for g in range(pp)])
    return out


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_pruned_totals_keep_the_argmin_and_every_value_within_the_bound(seed):
    """Best-first costing with a bound: same minimum and argmin as the full batch, exact values
    for every partition at or below min(bound, batch minimum), never a wrong finite value."""
    from system.cost.iteration import IterationTimeEvaluator
    from system.workload import get_workload, tasklet_sizes

    rng = np.random.default_rng(seed)
    work = get_workload("gpt3_xl_b1024")
    c = get_case("mixed")
    sizes = tasklet_sizes(work, 8, 8)
    for make in (
        lambda: PartitionEvaluator(c, sizes, pp=8, dp=8),
        lambda: IterationTimeEvaluator(c, sizes, pp=8, dp=8, workload=work),
    ):
        parts = _random_partitions(64, 8, 200, rng)
        full = make().totals(parts)
        for bound in (np.inf, float(np.quantile(full, 0.3)), float(full.min())):
            got = make().totals(parts, bound=bound)
            assert int(np.argmin(got)) == int(np.argmin(full))
            assert got.min() == full.min()
            within = full <= min(bound, full.min()) + 1e-12
            assert np.array_equal(got[within], full[within])
            finite = np.isfinite(got)
            assert np.array_equal(got[finite], full[finite])


def test_costs_are_the_same_when_the_caches_forget_entries_midway(monkeypatch):
    """The group-cost cache drops its oldest half when full, also while one batch's new entries
    go in; the edge cache and the group ids are dropped together when either is full: every
    partition still gets the value an unbounded evaluator gives it."""
    import system.cost.partition as partition
    from system.cost.partition import BoundedCache
    from system.workload import get_workload, tasklet_sizes

    c = get_case("mixed")
    sizes = tasklet_sizes(get_workload("gpt3_xl_b1024"), 8, 8)
    parts = _random_partitions(64, 8, 60, np.random.default_rng(4))
    want = PartitionEvaluator(c, sizes, pp=8, dp=8).totals(parts)
    monkeypatch.setattr(partition, "MAX_EDGE_CACHE", 60)
    monkeypatch.setattr(partition, "MAX_GROUP_IDS", 40)
    small = PartitionEvaluator(c, sizes, pp=8, dp=8)
    small._dp_cache = BoundedCache(3)
    for k in range(0, len(parts), 7):  # batches that cross the capacities many times
        assert np.array_equal(small.totals(parts[k : k + 7]), want[k : k + 7])
    assert small._dp_cache.evicted > 0 and small.forgotten > 1


def test_an_edge_is_the_same_whichever_order_its_groups_are_asked_in():
    """With one-way link times (a matrix that is not symmetric) the bottleneck value of
    (a, b) and of (b, a) differ; the coarse edge is the unordered pair's: the value with the
    lexicographically smaller group as rows, whatever the order of the questions."""
    from system.cost.matching import bottleneck_values
    from system.workload import get_workload, tasklet_sizes

    c = get_case("mixed")
    sizes = tasklet_sizes(get_workload("gpt3_xl_b1024"), 8, 8)
    link = np.random.default_rng(5).random((64, 64))
    a, b = tuple(range(0, 8)), tuple(range(8, 16))
    ab = bottleneck_values(link[np.ix_(a, b)][None])[0]
    ba = bottleneck_values(link[np.ix_(b, a)][None])[0]
    assert ab != ba  # the test needs one-way links that matter
    for pairs in ([(a, b), (b, a)], [(b, a), (a, b)], [(b, a)]):
        ev = PartitionEvaluator(c, sizes, pp=8, dp=8)
        ev.pp_link_s = link
        assert np.array_equal(ev.edges(pairs), np.full(len(pairs), ab))


def test_the_compiled_lower_bounds_refuse_a_device_the_cluster_lacks():
    """The kernel reads the link matrix without bounds checks: ids are checked before it."""
    from system.workload import get_workload, tasklet_sizes

    c = get_case("mixed")
    ev = PartitionEvaluator(c, tasklet_sizes(get_workload("gpt3_xl_b1024"), 8, 8), pp=8, dp=8)
    part = [tuple(range(8 * i, 8 * i + 8)) for i in range(8)]
    for bad in (64, -1):
        stray = [*part[:-1], (*part[-1][:-1], bad)]
        with pytest.raises(ValueError, match="device ids must lie in 0..63"):
            ev._lower_weights([stray])
