"""The scheduler (paper §3.4): optimum on enumerable instances, validity, determinism, API."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from system.cases import get_case
from system.cluster import Cluster
from system.cost.model import assignment_cost
from system.cost.partition import PartitionEvaluator
from system.scheduler import SCHEDULERS, ScheduleResult, schedule
from system.scheduler.genetic import crossover, random_partition
from system.workload import DTFM_REFERENCE
from tests.strategies import random_cluster

SIZES = DTFM_REFERENCE


def balanced_partitions(n: int, pp: int):
    """Every partition of 0..n-1 into pp unordered groups of n/pp (group of device 0 first)."""
    dp = n // pp

    def rec(left: tuple[int, ...]):
        if not left:
            yield []
            return
        first, rest = left[0], left[1:]
        for others in itertools.combinations(rest, dp - 1):
            g = (first, *others)
            remaining = tuple(x for x in rest if x not in others)
            for tail in rec(remaining):
                yield [g, *tail]

    yield from rec(tuple(range(n)))


def brute_optimum(cluster: Cluster, pp: int, dp: int) -> float:
    ev = PartitionEvaluator(cluster, SIZES, pp=pp, dp=dp)
    parts = list(balanced_partitions(cluster.num_devices, pp))
    return float(ev.totals(parts).min())


def test_partition_enumeration_counts():
    assert sum(1 for _ in balanced_partitions(8, 4)) == 105  # 8! / (2!^4 · 4!)
    assert sum(1 for _ in balanced_partitions(12, 3)) == 5775  # 12! / (4!^3 · 3!)


@pytest.mark.parametrize("pp,dp", [(4, 2), (2, 4)])
def test_ga_finds_the_optimum_on_8_devices(pp, dp):
    c = get_case("debug")
    best = brute_optimum(c, pp, dp)
    for seed in range(5):
        r = schedule(c, SIZES, pp=pp, dp=dp, seed=seed, trials=30, population=8, greedy_seeds=False)
        assert r.cost.total_cost_s == pytest.approx(best, abs=1e-9), (seed, r.cost, best)


@pytest.mark.slow
@pytest.mark.parametrize("pp,dp", [(3, 4), (4, 3), (2, 6)])
def test_ga_finds_the_optimum_on_12_devices(pp, dp):
    """12 random case-5 devices: the GA (random start, no greedy seeds) hits the enumerated
    optimum."""
    c5 = get_case("5")
    for k in range(3):
        devices = np.random.default_rng(k).choice(64, 12, replace=False).tolist()
        c = c5.subset(devices)
        best = brute_optimum(c, pp, dp)
        for seed in range(3):
            r = schedule(
                c, SIZES, pp=pp, dp=dp, seed=seed, trials=150, population=32, greedy_seeds=False
            )
            assert r.cost.total_cost_s == pytest.approx(best, abs=1e-9), (k, seed, r.cost, best)


def test_random_method_is_the_best_of_its_random_rank_maps():
    from system.assignment import random_assignment

    c = get_case("debug")
    r = schedule(c, SIZES, pp=4, dp=2, method="random", seed=7, trials=40)
    rng = np.random.default_rng(7)
    costs = [
        assignment_cost(c, random_assignment(4, 2, rng), SIZES).total_cost_s for _ in range(40)
    ]
    assert r.cost.total_cost_s == pytest.approx(min(costs))
    assert r.trials == 40 and r.evaluations == 40


@pytest.mark.slow
@settings(max_examples=15, deadline=None)
@given(
    st.sampled_from([(2, 3), (3, 2), (2, 4), (4, 2), (3, 3)]),
    st.integers(0, 2**32 - 1),
    st.sampled_from(SCHEDULERS),
)
def test_every_device_gets_exactly_one_slot_and_cost_is_its_assignment_cost(shape, seed, method):
    pp, dp = shape
    c = random_cluster(pp * dp, seed % 1000)
    r = schedule(c, SIZES, pp=pp, dp=dp, method=method, seed=seed, trials=5, population=4)
    assert r.assignment.stages.shape == (pp, dp)
    assert sorted(r.assignment.devices()) == list(range(pp * dp))
    assert r.cost == assignment_cost(c, r.assignment, SIZES)
    assert r.cost.total_cost_s == pytest.approx(r.history[-1][1])
    bests = [v for _, v in r.history]
    assert all(b <= a + 1e-12 for a, b in zip(bests, bests[1:], strict=False))  # elitism


@pytest.mark.slow
@settings(max_examples=10, deadline=None)
@given(st.integers(0, 2**32 - 1), st.sampled_from(SCHEDULERS))
def test_same_seed_same_assignment(seed, method):
    c = random_cluster(8, seed % 97)
    a = schedule(c, SIZES, pp=4, dp=2, method=method, seed=seed, trials=6, population=5)
    b = schedule(c, SIZES, pp=4, dp=2, method=method, seed=seed, trials=6, population=5)
    assert np.array_equal(a.assignment.stages, b.assignment.stages)
    assert a.history == b.history


def test_a_generator_seed_is_accepted_and_reported_as_none():
    c = get_case("debug")
    r = schedule(c, SIZES, pp=4, dp=2, seed=np.random.default_rng(1), trials=3, population=4)
    assert r.seed is None
    d = r.to_dict()
    for key in ("stages", "dp_cost_s", "pp_cost_s", "total_cost_s", "search_time_s", "history"):
        assert key in d
    assert d["total_cost_s"] == pytest.approx(d["dp_cost_s"] + 2 * d["pp_cost_s"])
    assert isinstance(r, ScheduleResult)


def test_crossover_children_are_balanced():
    rng = np.random.default_rng(0)
    for _ in range(50):
        a, b = random_partition(24, 4, rng), random_partition(24, 4, rng)
        child = crossover(a, b, rng)
        assert [len(g) for g in child] == [6] * 4
        assert sorted(x for g in child for x in g) == list(range(24))
    a = random_partition(24, 4, rng)
    assert sorted(crossover(a, a, rng)) == sorted(a)  # same parents, same child


@pytest.mark.slow
def test_time_limit_stops_the_search():
    c = get_case("5")
    r = schedule(c, SIZES, pp=8, dp=8, seed=0, time_limit_s=0.2, population=10)
    assert r.trials < 4900
    assert r.search_time_s < 5.0


def test_bad_input_is_rejected():
    c = get_case("debug")
    with pytest.raises(ValueError, match="unknown method"):
        schedule(c, SIZES, pp=4, dp=2, method="annealing")
    with pytest.raises(ValueError, match="does not match"):
        schedule(c, SIZES, pp=3, dp=2)
    with pytest.raises(ValueError, match="population"):
        schedule(c, SIZES, pp=4, dp=2, population=1)


def test_default_budget_stops_once_the_best_stops_improving():
    c = random_cluster(12, 3)
    r = schedule(c, SIZES, pp=3, dp=4, seed=0, population=8)
    assert r.stats["stopped_by"] == "patience"
    totals = [v for _, v in r.history]
    gains = [t for (t, v), prev in zip(r.history[1:], totals, strict=False) if v < prev]
    last_gain = max([0, *gains])
    assert r.trials - last_gain == 20  # DEFAULT_PATIENCE_TRIALS trials without a lower best


def test_explicit_trials_switch_the_patience_off_unless_asked():
    c = get_case("debug")
    r = schedule(c, SIZES, pp=4, dp=2, seed=0, trials=30, population=4)
    assert r.trials == 30 and r.stats["stopped_by"] == "trials"
    r = schedule(c, SIZES, pp=4, dp=2, seed=0, trials=30, population=4, patience_trials=3)
    assert r.trials < 30 and r.stats["stopped_by"] == "patience"
    with pytest.raises(ValueError, match="patience_trials"):
        schedule(c, SIZES, pp=4, dp=2, trials=3, population=4, patience_trials=0)


def test_bounded_cache_forgets_its_oldest_half():
    from system.cost.partition import BoundedCache

    cache = BoundedCache(4)
    for k in range(5):
        cache[k] = k
    assert list(cache) == [2, 3, 4] and cache.evicted == 2
    with pytest.raises(ValueError, match="capacity"):
        BoundedCache(1)


def test_batched_tailored_gains_are_the_single_gains():
    """The cycle search takes a step's gains in one batch: the same floats as one at a time."""
    from system.cases import get_case
    from system.cost.partition import PartitionEvaluator
    from system.scheduler.local_search import _Gains
    from system.workload import DTFM_REFERENCE

    ev = PartitionEvaluator(get_case("5"), DTFM_REFERENCE, pp=8, dp=8)
    rng = np.random.default_rng(3)
    for rule in ("tailored", "kl"):
        gains = _Gains(ev, rule)
        for _ in range(50):
            groups = [set(g) for g in rng.permutation(64).reshape(8, 8).tolist()]
            groups[1].add(groups[0].pop())  # groups of 7, 9 and 8 devices
            v = next(iter(groups[1]))
            dsts = [groups[k] for k in rng.permutation(8).tolist() if k != 1]
            same = [d for d in dsts if len(d) == 8]
            for batch in (dsts, same):  # mixed sizes, then one size (the batch)
                want = [gains.gain(v, groups[1], d) for d in batch]
                assert gains.gains(v, groups[1], batch) == want
