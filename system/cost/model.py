"""Communication cost of a concrete assignment (paper §3.2–3.3), seconds per iteration.

DATAP-COST = max over stages of the slowest device's sharded-parameter-server exchange;
PIPELINEP-COST = Σ over consecutive stage boundaries of the slowest replica's activation send;
TOTAL = DATAP-COST + 2·PIPELINEP-COST (activations forward, their gradients backward).

This is what the runtime pays for the layout as given; the partition cost in
:mod:`system.cost.partition` equals it when matchings and stage order are the optimal ones.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from system.assignment import Assignment
from system.cluster import Cluster
from system.workload import TaskletSizes

__all__ = ["CostBreakdown", "dp_group_cost_s", "dp_cost_matrix_s", "assignment_cost", "check_sizes"]


@dataclass(frozen=True, slots=True)
class CostBreakdown:
    dp_cost_s: float
    pp_cost_s: float

    @property
    def total_cost_s(self) -> float:
        return self.dp_cost_s + 2.0 * self.pp_cost_s

    def to_dict(self) -> dict:
        return {
            "dp_cost_s": self.dp_cost_s,
            "pp_cost_s": self.pp_cost_s,
            "total_cost_s": self.total_cost_s,
        }


def check_sizes(cluster: Cluster, pp: int, dp: int) -> None:
    if pp * dp != cluster.num_devices:
        raise ValueError(
            f"pp={pp} x dp={dp} = {pp * dp} does not match the {cluster.num_devices} devices of "
            f"cluster {cluster.name!r}"
        )


def dp_cost_matrix_s(cluster: Cluster, c_dp_bytes: float, dp: int) -> np.ndarray:
    """(D, D) per-pair DP exchange cost 2·(α + 8·c_dp/(dp·β)), zero diagonal (§3.2)."""
    m = 2.0 * cluster.link_time_s(c_dp_bytes / dp)
    np.fill_diagonal(m, 0.0)
    return m


def dp_group_cost_s(pair_cost: np.ndarray, group) -> float:
    """DP(C) = max_{d∈C} Σ_{d'∈C} pair_cost[d, d'] for one group C."""
    g = np.asarray(group)
    return float(pair_cost[np.ix_(g, g)].sum(axis=1).max()) if g.size > 1 else 0.0


def assignment_cost(cluster: Cluster, assignment: Assignment, sizes: TaskletSizes) -> CostBreakdown:
    """Cost of ``assignment`` exactly as given (its stage order and replica chains)."""
    check_sizes(cluster, assignment.pp, assignment.dp)
    pair = dp_cost_matrix_s(cluster, sizes.c_dp_bytes, assignment.dp)
    st = assignment.stages
    dp_cost = max(dp_group_cost_s(pair, st[s]) for s in range(assignment.pp))
    link = cluster.link_time_s(sizes.c_pp_bytes)
    pp_cost = float(link[st[:-1], st[1:]].max(axis=1).sum()) if assignment.pp > 1 else 0.0
    return CostBreakdown(dp_cost_s=dp_cost, pp_cost_s=pp_cost)
