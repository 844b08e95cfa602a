"""``schedule()``: the scheduler's one entry point (paper §3.4) and its result.

Methods (:data:`SCHEDULERS`):

- ``genetic``: hybrid GA with the tailored local search (the paper's scheduler);
- ``genetic_kl``: the same GA with Kernighan–Lin gains (the ablation baseline);
- ``random``: best of ``trials`` uniformly random rank maps (no matching, no TSP), costed as
  given: what a user gets from an arbitrary launch order.

For the GA methods the returned assignment is built from the best partition with its TSP stage
order and bottleneck matchings, and ``cost`` is :func:`assignment_cost` of that assignment.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from system.assignment import Assignment, random_assignment
from system.cluster import Cluster
from system.cost.iteration import IterationTimeEvaluator
from system.cost.model import CostBreakdown, assignment_cost, check_sizes
from system.cost.partition import PartitionEvaluator
from system.scheduler.bounds import LowerBound, gap_pct, lower_bound
from system.scheduler.genetic import GeneticConfig, genetic_search
from system.workload import TaskletSizes, Workload

log = logging.getLogger(__name__)

__all__ = [
    "schedule",
    "ScheduleResult",
    "SCHEDULERS",
    "OBJECTIVES",
    "DEFAULT_TRIALS",
    "DEFAULT_POPULATION",
    "layers_in_stage_order",
]

SCHEDULERS = ("genetic", "genetic_kl", "random")
OBJECTIVES = ("comm", "iteration_time")
DEFAULT_TRIALS = {"genetic": 4900, "genetic_kl": 4900, "random": 5000}
DEFAULT_POPULATION = 100
# Default budget (neither ``trials`` nor ``time_limit_s`` given): stop once the best TOTAL has not
# improved for DEFAULT_PATIENCE_TRIALS trials (deterministic for a seed), and in any case after
# DEFAULT_TIME_CAP_S seconds of wall time or DEFAULT_TRIALS trials, whichever comes first.
DEFAULT_PATIENCE_TRIALS = 20
DEFAULT_TIME_CAP_S = 60.0
# Share of a time limit given to the GA loop; the rest covers building the final assignment
# (TSP order with 8 starts and the matchings), so the whole call stays inside the limit.
_SEARCH_SHARE = 0.95
_SEARCH_SHARE_LARGE = 0.8  # beyond LARGE_PP stages one costing takes seconds: keep more back
LARGE_PP = 64  # beyond this the final TSP order uses one start (the one the search priced)


@dataclass(frozen=True)
class ScheduleResult:
    """A scheduled assignment, its cost (as the runtime pays it) and search statistics."""

    assignment: Assignment
    cost: CostBreakdown  # == assignment_cost(cluster, assignment, sizes)
    method: str
    seed: int | None  # None when a Generator was passed
    search_time_s: float
    trials: int  # offspring made (GA) or random layouts drawn
    evaluations: int  # partitions / layouts costed
    history: tuple[tuple[int, float], ...]  # (trial, best TOTAL so far)
    stats: dict | None = None  # method-specific extras (GA: replacements, best_from, ...)
    bound: LowerBound | None = None  # a lower bound on TOTAL over all assignments

    @property
    def gap_pct(self) -> float | None:
        """Certified gap: 100·(TOTAL − bound)/TOTAL, None without a bound."""
        return (
            None
            if self.bound is None
            else gap_pct(self.cost.total_cost_s, self.bound.total_bound_s)
        )

    def to_dict(self) -> dict:
        return {
            "method": self.method,
            "seed": self.seed,
            **self.assignment.to_dict(),
            **self.cost.to_dict(),
            "search_time_s": self.search_time_s,
            "trials": self.trials,
            "evaluations": self.evaluations,
            "history": [list(h) for h in self.history],
            "stats": self.stats or {},
            **(self.bound.to_dict() if self.bound is not None else {}),
            "gap_pct": self.gap_pct,
        }


def layers_in_stage_order(
    ev: IterationTimeEvaluator,
    partition,
    assignment: Assignment,
) -> list[int]:
    """The surrogate's layer split of ``partition``, listed in the assignment's stage order."""
    layers = ev.layers(partition)
    if layers is None:
        return []
    where = {frozenset(g): k for k, g in enumerate(partition)}
    return [int(layers[where[frozenset(assignment.group(s))]]) for s in range(assignment.pp)]


def _random_search(
    cluster: Cluster,
    sizes: TaskletSizes,
    pp: int,
    dp: int,
    trials: int,
    rng: np.random.Generator,
    time_limit_s: float | None,
    on_progress: Callable[[int, float], None] | None,
):
    t0 = time.perf_counter()
    best: tuple[float, Assignment, CostBreakdown] | None = None
    history = []
    done = 0
    for t in range(1, max(1, trials) + 1):
        if (
            best is not None
            and time_limit_s is not None
            and time.perf_counter() - t0 >= time_limit_s
        ):
            break
        a = random_assignment(pp, dp, rng)
        c = assignment_cost(cluster, a, sizes)
        done = t
        if best is None or c.total_cost_s < best[0]:
            best = (c.total_cost_s, a, c)
        history.append((t, best[0]))
        if on_progress and (t % 50 == 0 or t == trials):
            on_progress(t, best[0])
    assert best is not None
    return best[1], best[2], done, done, history, {}


def schedule(
    cluster: Cluster,
    sizes: TaskletSizes,
    *,
    pp: int,
    dp: int,
    method: str = "genetic",
    seed: int | np.random.Generator = 0,
    trials: int | None = None,
    population: int | None = None,
    time_limit_s: float | None = None,
    on_progress: Callable[[int, float], None] | None = None,
    greedy_seeds: bool = True,
    ls_max_steps: int = 50,
    patience_trials: int | None = None,
    bound: bool = True,
    use_structure: bool = True,
    objective: str = "comm",
    workload: Workload | None = None,
) -> ScheduleResult:
    """Assign every device a (stage, replica) to minimise TOTAL = DP + 2·PP (paper §3).

    Args:
        cluster: devices and links; ``pp · dp`` must equal its device count.
        sizes: tasklet sizes (c_dp, c_pp bytes).
        pp, dp: pipeline stages and data-parallel replicas.
        method: ``genetic`` | ``genetic_kl`` | ``random``.
        seed: int or Generator; the same int gives the same assignment.
        trials: GA offspring (default 4,900) or random layouts (default 5,000).
        population: GA population (default 100).
        time_limit_s: stop the search after about this much wall time (the call returns within
            it, plus at most one batch of candidates).
        patience_trials: GA: stop after this many trials without a lower best TOTAL. Default:
            when neither ``trials`` nor ``time_limit_s`` is given, the convergence budget
            (:data:`DEFAULT_PATIENCE_TRIALS` trials, capped at :data:`DEFAULT_TIME_CAP_S` s);
            otherwise off (the search runs the trials or the time asked for).
        bound: compute :func:`~system.scheduler.bounds.lower_bound` (combinatorial, plus the
            LP relaxation up to 128 devices) and report the certified gap; not counted in
            ``search_time_s``.
        use_structure: GA: block moves over hosts/regions in the local search and
            structure-aligned start layouts (False: the search as the paper describes it).
        objective: ``comm`` (the paper's TOTAL) or ``iteration_time`` (GA only: the surrogate
            of :mod:`system.cost.iteration`, compute by GPU type + TOTAL, layers split by
            stage speed; needs ``workload``). With ``iteration_time``, ``stats`` holds
            ``iteration_time_s`` and ``layers_per_stage`` (stage order of the assignment), and
            no bound is computed (the bound is on TOTAL).
        on_progress: called as ``on_progress(trial, best_total_s)``.
        greedy_seeds: put two greedy layouts in the GA's initial population (the rest is
            random); ``ScheduleResult.stats["best_from"]`` says whether the best came from one.
        ls_max_steps: improving steps per local search.

    Raises:
        ValueError: unknown method, or ``pp · dp`` not the device count.
    """
    if method not in SCHEDULERS:
        raise ValueError(f"schedule: unknown method {method!r}; known: {', '.join(SCHEDULERS)}")
    if objective not in OBJECTIVES:
        raise ValueError(
            f"schedule: unknown objective {objective!r}; known: {', '.join(OBJECTIVES)}"
        )
    if objective == "iteration_time" and (method == "random" or not isinstance(workload, Workload)):
        raise ValueError(
            "schedule: objective=iteration_time needs a GA method and a Workload "
            "(model and batch), not only tasklet sizes"
        )
    check_sizes(cluster, pp, dp)
    seed_value = None if isinstance(seed, np.random.Generator) else int(seed)
    rng = np.random.default_rng(seed)
    if trials is None and time_limit_s is None:  # the default budget: stop on convergence
        if patience_trials is None:
            patience_trials = DEFAULT_PATIENCE_TRIALS
        time_limit_s = DEFAULT_TIME_CAP_S
    trials = DEFAULT_TRIALS[method] if trials is None else int(trials)
    t0, cpu0 = time.perf_counter(), time.process_time()
    if method == "random":
        a, cost, done, evals, history, stats = _random_search(
            cluster, sizes, pp, dp, trials, rng, time_limit_s, on_progress
        )
    else:
        config = GeneticConfig(
            population=DEFAULT_POPULATION if population is None else int(population),
            trials=trials,
            local_search="kl" if method == "genetic_kl" else "tailored",
            ls_max_steps=ls_max_steps,
            greedy_seeds=greedy_seeds,
            time_limit_s=None
            if time_limit_s is None
            else time_limit_s * (_SEARCH_SHARE if pp <= LARGE_PP else _SEARCH_SHARE_LARGE),
            patience_trials=patience_trials,
            use_structure=use_structure,
        )
        if objective == "iteration_time":
            ev = IterationTimeEvaluator(cluster, sizes, pp=pp, dp=dp, workload=workload)
        else:
            ev = PartitionEvaluator(cluster, sizes, pp=pp, dp=dp)
        part, total, gstats = genetic_search(ev, config, rng, on_progress)
        a = ev.assignment(part, starts=8 if pp <= LARGE_PP else 1)
        cost = assignment_cost(cluster, a, sizes)
        if objective == "iteration_time":
            extra = {
                "iteration_time_s": total,
                "layers_per_stage": layers_in_stage_order(ev, part, a),
            }
        elif not np.isclose(cost.total_cost_s, total, rtol=1e-9, atol=1e-9) and pp <= 16:
            raise AssertionError(
                f"schedule: assignment cost {cost.total_cost_s} != partition {total}"
            )
        done, evals, history = gstats.trials, ev.evaluations, gstats.history
        stats = gstats.to_dict()
        if objective == "iteration_time":
            stats.update(extra)
    elapsed = time.perf_counter() - t0
    stats["search_cpu_s"] = time.process_time() - cpu0  # wall time is noisy on a shared machine
    log.info(
        "schedule %s on %s: TOTAL %.3f s after %d trials in %.2f s",
        method,
        cluster.name,
        cost.total_cost_s,
        done,
        elapsed,
    )
    lb = lower_bound(cluster, sizes, pp=pp, dp=dp) if bound and objective == "comm" else None
    return ScheduleResult(
        assignment=a,
        cost=cost,
        method=method,
        seed=seed_value,
        bound=lb,
        search_time_s=elapsed,
        trials=done,
        evaluations=evals,
        history=tuple((int(t), float(v)) for t, v in history),
        stats=stats,
    )
