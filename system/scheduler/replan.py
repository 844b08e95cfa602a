"""Re-planning when devices leave or join: a new assignment warm-started from the old one.

Given the previous stage of every device of the new cluster (``-1`` for a device that just
joined), :func:`replan` repairs the old layout into a balanced partition of the new cluster and
improves it by local search for about ``time_limit_s``; it reports the new cost and how many
tasklets move. A *tasklet move* is a device that must fetch a stage's parameters it does not
hold: a joined device, or a kept device whose stage changed. Stage order comes from the open TSP
(paper §3.3), whose direction is free; the direction that keeps more devices on their stage is
taken, so a plan is never charged for a mere reversal.

The search: a local search from the repaired layout, then a short GA whose start population
holds its result (plus the greedy and structure-aligned layouts); the GA's result is taken only
if it is cheaper.

Repair: group s starts with the kept devices of old stage s (in a stage with more than ``dp``
kept devices, those with the cheapest DP pairs to the rest of the group stay); the others and
the joined devices fill the groups with room, each time the (device, group) pair that raises
the group's DP cost least.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import numpy as np

from system.assignment import Assignment
from system.cluster import Cluster
from system.cost.model import CostBreakdown, assignment_cost, check_sizes
from system.cost.partition import PartitionEvaluator
from system.scheduler.genetic import GeneticConfig, genetic_search
from system.scheduler.local_search import Partition, local_search
from system.workload import TaskletSizes

log = logging.getLogger(__name__)

__all__ = ["ReplanResult", "replan", "moved_tasklets", "warm_partition", "spot_trace"]


@dataclass(frozen=True, slots=True)
class ReplanResult:
    assignment: Assignment
    cost: CostBreakdown
    moved_tasklets: int  # devices that fetch a stage they do not hold
    moved_param_bytes: float  # moved_tasklets × c_dp bytes (one stage's parameters)
    warm_cost_s: float  # TOTAL of the repaired layout before the local search
    search_time_s: float

    def to_dict(self) -> dict:
        return {
            **self.assignment.to_dict(),
            **self.cost.to_dict(),
            "moved_tasklets": self.moved_tasklets,
            "moved_param_bytes": self.moved_param_bytes,
            "warm_cost_s": self.warm_cost_s,
            "search_time_s": self.search_time_s,
        }


def _check_prev(prev_stage, num_devices: int) -> np.ndarray:
    prev = np.asarray(prev_stage, dtype=np.int64)
    if prev.shape != (num_devices,):
        raise ValueError(
            f"replan: prev_stage needs one entry per device ({num_devices}), got shape {prev.shape}"
        )
    if np.any(prev < -1):
        raise ValueError("replan: prev_stage entries must be a stage id >= 0 or -1 (joined)")
    return prev


def warm_partition(ev: PartitionEvaluator, prev_stage) -> Partition:
    """The old layout repaired into ``pp`` groups of ``dp`` devices of the new cluster."""
    prev = _check_prev(prev_stage, ev.cluster.num_devices)
    pp, dp, pair = ev.pp, ev.dp, ev.dp_pair_s
    groups: list[list[int]] = [[] for _ in range(pp)]
    spare = [int(d) for d in np.flatnonzero((prev < 0) | (prev >= pp))]
    for s in range(pp):
        members = [int(d) for d in np.flatnonzero(prev == s)]
        if len(members) > dp:  # keep the dp members with the cheapest pairs inside the stage
            inside = pair[np.ix_(members, members)].sum(axis=1)
            order = np.argsort(inside, kind="stable")
            spare += [members[k] for k in order[dp:]]
            members = [members[k] for k in sorted(order[:dp])]
        groups[s] = members
    while spare:
        best = None
        for s in range(pp):
            if len(groups[s]) >= dp:
                continue
            g = groups[s]
            rows = pair[np.ix_(g, g)].sum(axis=1) if g else np.zeros(0)
            to_u = pair[np.ix_(g, spare)] if g else np.zeros((0, len(spare)))
            cost = to_u.sum(axis=0)
            if g:
                cost = np.maximum((rows[:, None] + to_u).max(axis=0), cost)
            k = int(np.argmin(cost))
            if best is None or cost[k] < best[0]:
                best = (float(cost[k]), s, k)
        _, s, k = best
        groups[s].append(spare.pop(k))
    return [tuple(sorted(g)) for g in groups]


def moved_tasklets(a: Assignment, prev_stage) -> int:
    """Devices of ``a`` that hold a different stage than before (joined devices count)."""
    prev = _check_prev(prev_stage, a.num_devices)
    return int(np.count_nonzero(a.stage_of != prev))


def _best_direction(a: Assignment, prev: np.ndarray) -> Assignment:
    flipped = Assignment(a.stages[::-1])
    return flipped if moved_tasklets(flipped, prev) < moved_tasklets(a, prev) else a


def replan(
    cluster: Cluster,
    sizes: TaskletSizes,
    *,
    pp: int,
    dp: int,
    prev_stage,
    seed: int = 0,
    time_limit_s: float = 1.0,
    max_steps: int = 50,
    population: int = 20,
) -> ReplanResult:
    """A new assignment for ``cluster`` warm-started from each device's previous stage.

    Args:
        cluster: the devices present now.
        prev_stage: per device of ``cluster``, the stage it ran before, or -1 if it just joined.
        pp, dp: the new layout (``pp · dp`` = devices now).
        time_limit_s: budget: half for a local search from the repaired old layout, the rest
            for a short GA (``population``) seeded with its result and the greedy and
            structure-aligned layouts (the call returns within about this much).
    """
    check_sizes(cluster, pp, dp)
    prev = _check_prev(prev_stage, cluster.num_devices)
    t0 = time.perf_counter()
    ev = PartitionEvaluator(cluster, sizes, pp=pp, dp=dp)
    part = warm_partition(ev, prev)
    warm = ev.total(part)
    rng = np.random.default_rng(seed)
    part, total = local_search(
        ev,
        part,
        warm,
        rng,
        max_steps=max_steps,
        swap_sample=128,
        tie_break=True,
        deadline=t0 + 0.5 * time_limit_s,
    )
    left = t0 + time_limit_s - time.perf_counter()
    if left > 0:  # a short GA from the improved warm layout and the greedy/aligned seeds
        config = GeneticConfig(
            population=population, trials=10_000, time_limit_s=left, patience_trials=5
        )
        best, best_total, _ = genetic_search(ev, config, rng, extra_seeds={"warm": part})
        if best_total < total - 1e-12:
            part = best
    a = _best_direction(ev.assignment(part), prev)
    moved = moved_tasklets(a, prev)
    elapsed = time.perf_counter() - t0
    log.info(
        "replan %s: warm %.3f s -> %.3f s, %d tasklets move, %.2f s",
        cluster.name,
        warm,
        assignment_cost(cluster, a, sizes).total_cost_s,
        moved,
        elapsed,
    )
    return ReplanResult(
        assignment=a,
        cost=assignment_cost(cluster, a, sizes),
        moved_tasklets=moved,
        moved_param_bytes=moved * sizes.c_dp_bytes,
        warm_cost_s=warm,
        search_time_s=elapsed,
    )


def spot_trace(num_devices: int, events: int, step: int, seed: int) -> list[list[int]]:
    """A seeded spot pre-emption trace: the present device ids after each event (entry 0: all
    devices). An event takes ``step`` devices away (never below half the cluster) or brings up
    to ``step`` absent ones back, each with probability 1/2 when both are possible."""
    rng = np.random.default_rng(seed)
    present = list(range(num_devices))
    out = [list(present)]
    for _ in range(events):
        absent = sorted(set(range(num_devices)) - set(present))
        leave = len(present) - step >= num_devices // 2 and (not absent or rng.random() < 0.5)
        if leave:
            gone = set(rng.choice(present, step, replace=False).tolist())
            present = [d for d in present if d not in gone]
        else:
            back = rng.choice(absent, min(step, len(absent)), replace=False).tolist()
            present = sorted(present + back)
        out.append(list(present))
    return out
