"""Hybrid genetic algorithm over balanced partitions (paper §3.4, after Kang & Moon).

Population of balanced partitions (``pp`` groups of ``dp`` devices). Each trial:

1. pick two distinct parents uniformly at random;
2. crossover: relabel parent 2's groups to best overlap parent 1's (Hungarian on the overlap
   counts), then take each device's group from parent 1 or parent 2 by a fair coin;
3. repair to balanced groups: overfull groups hand random members to underfull ones; then
   mutate by 0..``mutation_swaps`` random swaps between groups (lets every device move: the
   tailored search only moves each group's fastest pair);
4. local search (:mod:`system.scheduler.local_search`, tailored or KL gains, true TOTAL);
5. replace the WORST member if the child is better than it and not already in the population.

Fixes over the authors' code: one seeded Generator drives every choice; the worst member (not
the worse parent) is replaced, with a real comparison; local-search steps are checked against
TOTAL. Optional ``greedy_seeds`` put two greedy layouts (chains of fastest pipeline links; groups
of fastest DP peers) and the two best structure-aligned layouts (:mod:`system.scheduler.seeds`:
host or region blocks stacked at the same stages in every replica) in the initial population;
the statistics report where the best came from.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from system.cost.partition import PartitionEvaluator
from system.scheduler.local_search import Partition, local_search
from system.scheduler.seeds import structured_seeds

log = logging.getLogger(__name__)

__all__ = ["GeneticConfig", "GeneticStats", "genetic_search", "random_partition", "greedy_seeds"]


@dataclass(frozen=True, slots=True, kw_only=True)
class GeneticConfig:
    population: int = 100  # members (the authors: 100)
    trials: int = 4900  # offspring made (the authors: 4,900 → 5,000 evaluations with the start)
    local_search: str = "tailored"  # tailored | kl
    ls_max_steps: int = 50  # improving steps per local search
    swap_sample: int = 128  # plain swaps tried when the circular moves are stuck (0: none)
    tie_break: float = 0.5  # share of local searches that also take TOTAL-neutral steps that
    # lower the spread (drawn per trial; mixing both kinds keeps the population diverse)
    mutation_swaps: int = 2  # after crossover, 0..mutation_swaps random swaps (uniform count)
    greedy_seeds: bool = True  # add greedy and structure-aligned layouts to the start population
    time_limit_s: float | None = None  # stop after this much wall time (checked per trial)
    patience_trials: int | None = None  # stop after this many trials without a better best
    use_structure: bool = True  # block moves in the local search + structure-aligned seeds

    def __post_init__(self) -> None:
        if self.population < 2:
            raise ValueError(f"genetic: population must be >= 2, got {self.population}")
        if self.trials < 0:
            raise ValueError(f"genetic: trials must be >= 0, got {self.trials}")
        if self.time_limit_s is not None and self.time_limit_s <= 0:
            raise ValueError(f"genetic: time_limit_s must be > 0, got {self.time_limit_s}")
        if self.patience_trials is not None and self.patience_trials < 1:
            raise ValueError(f"genetic: patience_trials must be >= 1, got {self.patience_trials}")


@dataclass(slots=True)
class GeneticStats:
    trials: int = 0  # offspring made
    replacements: int = 0  # offspring that entered the population
    duplicates: int = 0  # offspring rejected as already present
    initial_best_s: float = float("inf")  # best TOTAL of the initial population (after seeds)
    best_from: str = "random"  # random | greedy_pipeline | greedy_dp | aligned_* | offspring
    stopped_by: str = "trials"  # trials | patience | time_limit
    history: list[tuple[int, float]] = field(default_factory=list)  # (trial, best TOTAL)

    def to_dict(self) -> dict:
        return {
            "trials": self.trials,
            "replacements": self.replacements,
            "duplicates": self.duplicates,
            "initial_best_s": self.initial_best_s,
            "best_from": self.best_from,
            "stopped_by": self.stopped_by,
        }


def _sorted(groups) -> Partition:
    return [tuple(sorted(int(x) for x in g)) for g in groups]


def random_partition(n: int, pp: int, rng: np.random.Generator) -> Partition:
    return _sorted(rng.permutation(n).reshape(pp, n // pp))


def greedy_seeds(ev: PartitionEvaluator) -> dict[str, Partition]:
    """Two deterministic greedy layouts, blind to region labels.

    ``greedy_pipeline``: grow each replica as a chain along the fastest pipeline link from the
    lowest free device; stage s of every chain forms group s. ``greedy_dp``: grow each group
    from the lowest free device by adding the free device that raises its DP cost least.
    """
    n, pp, dp = ev.cluster.num_devices, ev.pp, ev.dp
    link, pair = ev.pp_link_s, ev.dp_pair_s
    is_free = np.ones(n, dtype=bool)
    chains = np.empty((dp, pp), dtype=np.int64)
    for r in range(dp):
        cur = int(np.flatnonzero(is_free)[0])
        is_free[cur] = False
        chains[r, 0] = cur
        for s in range(1, pp):
            cur = int(np.argmin(np.where(is_free, link[cur], np.inf)))  # lowest id on ties
            is_free[cur] = False
            chains[r, s] = cur
    pipe = _sorted(chains.T)
    free = set(range(n))
    groups = []
    for _ in range(pp):
        g = [min(free)]
        free.remove(g[0])
        while len(g) < dp:
            # DP cost of g + [u] for every free u at once: the members' row sums grow by
            # pair[m, u], and u's own row sum is Σ_m pair[u, m]; ties go to the lowest u
            cand = np.array(sorted(free))
            rows = pair[np.ix_(g, g)].sum(axis=1)
            to_u = pair[np.ix_(g, cand)]  # (|g|, F)
            cost = np.maximum((rows[:, None] + to_u).max(axis=0), to_u.sum(axis=0))
            nxt = int(cand[int(np.argmin(cost))])
            g.append(nxt)
            free.remove(nxt)
        groups.append(g)
    return {"greedy_pipeline": pipe, "greedy_dp": _sorted(groups)}


def _labels(part: Partition, n: int) -> np.ndarray:
    lab = np.empty(n, dtype=np.int64)
    for k, g in enumerate(part):
        lab[list(g)] = k
    return lab


def crossover(a: Partition, b: Partition, rng: np.random.Generator) -> Partition:
    """Uniform crossover after normalising b's group labels to a's, then balance repair."""
    from scipy.optimize import linear_sum_assignment  # at first use (system/cost/matching.py)

    pp = len(a)
    n = sum(len(g) for g in a)
    dp = n // pp
    la, lb = _labels(a, n), _labels(b, n)
    overlap = np.zeros((pp, pp), dtype=np.int64)
    np.add.at(overlap, (lb, la), 1)
    rows, cols = linear_sum_assignment(-overlap)  # b's group r ↔ a's group cols[r]
    lb = cols[np.argsort(rows)][lb]
    child = np.where(rng.random(n) < 0.5, la, lb)
    # repair: overfull groups release random members, which fill underfull groups at random
    spare: list[int] = []
    for k in range(pp):
        members = np.flatnonzero(child == k)
        if len(members) > dp:
            spare.extend(rng.choice(members, len(members) - dp, replace=False).tolist())
    spare = [spare[i] for i in rng.permutation(len(spare))]
    for k in range(pp):
        need = dp - int(np.count_nonzero(child == k))
        for _ in range(max(0, need)):
            child[spare.pop()] = k
    return _sorted([np.flatnonzero(child == k) for k in range(pp)])


def mutate(part: Partition, swaps: int, rng: np.random.Generator) -> Partition:
    """Swap two random devices of two random groups, ``swaps`` times."""
    groups = [list(g) for g in part]
    for _ in range(swaps):
        p, q = rng.choice(len(groups), 2, replace=False)
        i, j = rng.integers(len(groups[p])), rng.integers(len(groups[q]))
        groups[p][i], groups[q][j] = groups[q][j], groups[p][i]
    return _sorted(groups)


def genetic_search(
    ev: PartitionEvaluator,
    config: GeneticConfig,
    rng: np.random.Generator,
    on_progress: Callable[[int, float], None] | None = None,
    extra_seeds: dict[str, Partition] | None = None,
) -> tuple[Partition, float, GeneticStats]:
    """Run the hybrid GA; returns (best partition, its TOTAL, statistics).

    ``extra_seeds`` (e.g. a previous plan, for re-planning) join the start population first.
    """
    t0 = time.perf_counter()
    deadline = None if config.time_limit_s is None else t0 + config.time_limit_s
    n, pp = ev.cluster.num_devices, ev.pp
    stats = GeneticStats()
    pop = [random_partition(n, pp, rng) for _ in range(config.population)]
    origin = ["random"] * len(pop)
    if config.greedy_seeds:
        seeds = dict(extra_seeds or {})
        seeds.update(greedy_seeds(ev))
        if config.use_structure:
            seeds.update(structured_seeds(ev, deadline=deadline))
        for k, (name, part) in enumerate(list(seeds.items())[: len(pop)]):
            pop[k], origin[k] = part, name
    # cost the start population in chunks so a time limit also bounds huge instances (>= 2 kept)
    parts: list[np.ndarray] = []
    step = 10 if pp <= 16 else 1  # beyond 16 stages one partition is already a large batch
    for s in range(0, len(pop), step):
        if s >= 2 and deadline is not None and time.perf_counter() >= deadline:
            pop, origin = pop[:s], origin[:s]
            break
        parts.append(ev.totals(pop[s : s + step]))
    totals = np.concatenate(parts)
    keys = {tuple(p) for p in pop}
    best = int(np.argmin(totals))
    stats.initial_best_s = float(totals[best])
    stats.best_from = origin[best]
    stats.history.append((0, float(totals[best])))
    if on_progress:
        on_progress(0, float(totals[best]))
    last_gain = 0  # trial that last lowered the best TOTAL
    for trial in range(1, config.trials + 1):
        if deadline is not None and time.perf_counter() >= deadline:
            stats.stopped_by = "time_limit"
            break
        if config.patience_trials is not None and trial - 1 - last_gain >= config.patience_trials:
            stats.stopped_by = "patience"
            break
        i, j = rng.choice(len(pop), 2, replace=False)
        child = crossover(pop[i], pop[j], rng)
        if config.mutation_swaps and pp > 1:
            child = mutate(child, int(rng.integers(config.mutation_swaps + 1)), rng)
        child, total = local_search(
            ev,
            child,
            ev.total(child),
            rng,
            rule=config.local_search,
            max_steps=config.ls_max_steps,
            swap_sample=config.swap_sample,
            tie_break=bool(rng.random() < config.tie_break),
            deadline=deadline,
            block_moves=config.use_structure,
        )
        stats.trials = trial
        worst = int(np.argmax(totals))
        key = tuple(child)
        if key in keys:
            stats.duplicates += 1
        elif total < totals[worst]:
            keys.discard(tuple(pop[worst]))
            pop[worst], totals[worst], origin[worst] = child, total, "offspring"
            keys.add(key)
            stats.replacements += 1
        best = int(np.argmin(totals))
        if totals[best] < stats.history[-1][1] - 1e-12:
            last_gain = trial
        stats.history.append((trial, float(totals[best])))
        if on_progress:
            on_progress(trial, float(totals[best]))
    stats.best_from = origin[best]
    log.debug(
        "genetic: %d trials, best %.3f s in %.2f s",
        stats.trials,
        totals[best],
        time.perf_counter() - t0,
    )
    return pop[best], float(totals[best]), stats
