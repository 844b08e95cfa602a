"""Lower bounds on TOTAL and exact optima on small instances: certified gaps for the scheduler.

TOTAL = DATAP-COST + 2·PIPELINEP-COST (paper §3.2–3.3). Every bound below holds for *every*
assignment of the cluster, so ``(result − bound) / result`` is a certified gap.

Combinatorial bounds (any size, microseconds):

- ``dp_bound_s``: device d shares a group with dp − 1 peers, and DP(C) is at least d's row sum
  in C, so DATAP ≥ max_d (sum of d's dp − 1 cheapest DP pair costs).
- ``pp_bound_s``: let m_d be d's fastest pipeline link. A boundary's bottleneck is at least the
  largest m_d over its two stages; rooting the stage path at its cheapest stage maps boundaries
  one-to-one onto the other stages, and the k-th cheapest stage maximum is at least the
  (k·dp)-th smallest m_d, so PIPELINEP ≥ Σ_{k=2..pp} m_(k·dp).

LP relaxation (``lp_bound_s``, up to :data:`MAX_LP_DEVICES` devices, SciPy's HiGHS; None if
HiGHS stops at its time limit without an optimum): variables
x_e (the pair e shares a group) and y_e (e is a pipeline link of some replica), in [0, 1]:

    minimise  z + 2·w
    s.t.      Σ_{e∋d} x_e = dp − 1,   1 ≤ Σ_{e∋d} y_e ≤ 2  (pp ≥ 2),   Σ_e y_e = dp·(pp − 1),
              x_e + y_e ≤ 1  (a pipeline link joins two different groups),
              z ≥ Σ_{e∋d} pair_e·x_e  (each device's row sum in its group),
              w ≥ Σ_e link_e·y_e / dp  (the bottlenecks sum to at least the mean replica's path),
              z ≥ dp_bound_s,  w ≥ pp_bound_s.

Any assignment gives a feasible point with z ≤ DATAP and w ≤ PIPELINEP, so the LP value is a
lower bound. It couples the two terms: cheap pairs cannot serve both as group mates and as
pipeline links. With ``integral=True`` x, y are binary (a MILP); HiGHS's dual bound at its time
limit is still a valid bound.

Exact optimum (:func:`exact_optimum`): branch and bound over balanced partitions (the group of
the lowest free device first), pruned by the DP cost of the groups so far plus 2·``pp_bound_s``,
with :class:`~system.cost.partition.PartitionEvaluator` costing the leaves in batches.
"""

from __future__ import annotations

import itertools
import logging
import math
import time
from dataclasses import dataclass

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp
from scipy.sparse import coo_matrix, vstack

from system.cluster import Cluster
from system.cost.model import check_sizes, dp_cost_matrix_s
from system.cost.partition import PartitionEvaluator
from system.workload import TaskletSizes

log = logging.getLogger(__name__)

__all__ = [
    "LowerBound",
    "lower_bound",
    "exact_optimum",
    "count_partitions",
    "gap_pct",
    "MAX_LP_DEVICES",
]

MAX_LP_DEVICES = 128  # D·(D−1) variables: 64 devices solve in under a second, 256 take > 10 s


@dataclass(frozen=True, slots=True)
class LowerBound:
    dp_bound_s: float  # DATAP-COST >= this
    pp_bound_s: float  # PIPELINEP-COST >= this
    lp_bound_s: float | None  # TOTAL >= this (None: not computed)
    method: str  # "combinatorial" | "lp" | "milp"
    solve_time_s: float

    @property
    def total_bound_s(self) -> float:
        comb = self.dp_bound_s + 2.0 * self.pp_bound_s
        return comb if self.lp_bound_s is None else max(comb, self.lp_bound_s)

    def to_dict(self) -> dict:
        return {
            "bound_total_s": self.total_bound_s,
            "bound_dp_s": self.dp_bound_s,
            "bound_pp_s": self.pp_bound_s,
            "bound_lp_s": self.lp_bound_s,
            "bound_method": self.method,
            "bound_time_s": self.solve_time_s,
        }


def gap_pct(total_s: float, bound_s: float) -> float:
    """Certified gap in percent of the result: 100·(total − bound)/total (0 when total is 0)."""
    return 0.0 if total_s <= 0 else 100.0 * max(0.0, total_s - bound_s) / total_s


def _combinatorial(pair: np.ndarray, link: np.ndarray, pp: int, dp: int) -> tuple[float, float]:
    d = pair.shape[0]
    off = ~np.eye(d, dtype=bool)
    rows = np.sort(pair[off].reshape(d, d - 1), axis=1)
    dp_b = float(rows[:, : dp - 1].sum(axis=1).max()) if dp > 1 else 0.0
    if pp < 2:
        return dp_b, 0.0
    m = np.sort(link[off].reshape(d, d - 1).min(axis=1))
    pp_b = float(sum(m[k * dp - 1] for k in range(2, pp + 1)))
    return dp_b, pp_b


def _lp(
    pair: np.ndarray,
    link: np.ndarray,
    pp: int,
    dp: int,
    dp_b: float,
    pp_b: float,
    integral: bool,
    time_limit_s: float,
) -> float:
    d = pair.shape[0]
    ii, jj = np.triu_indices(d, k=1)
    n_e = ii.size
    # variable layout: x (n_e), y (n_e), z, w
    nv = 2 * n_e + 2
    iz, iw = 2 * n_e, 2 * n_e + 1
    c = np.zeros(nv)
    c[iz], c[iw] = 1.0, 2.0
    e = np.arange(n_e)
    inc_rows = np.concatenate([ii, jj])  # device-edge incidence (d rows, n_e columns)
    inc_cols = np.concatenate([e, e])
    ones = np.ones(2 * n_e)
    blocks, lo, hi = [], [], []
    # Σ_{e∋d} x_e = dp − 1
    blocks.append(coo_matrix((ones, (inc_rows, inc_cols)), shape=(d, nv)))
    lo.append(np.full(d, dp - 1.0))
    hi.append(np.full(d, dp - 1.0))
    if pp >= 2:
        # 1 <= Σ_{e∋d} y_e <= 2 and Σ_e y_e = dp·(pp − 1)
        blocks.append(coo_matrix((ones, (inc_rows, inc_cols + n_e)), shape=(d, nv)))
        lo.append(np.ones(d))
        hi.append(np.full(d, 2.0))
        blocks.append(coo_matrix((np.ones(n_e), (np.zeros(n_e, int), e + n_e)), shape=(1, nv)))
        lo.append([dp * (pp - 1.0)])
        hi.append([dp * (pp - 1.0)])
        # x_e + y_e <= 1
        blocks.append(
            coo_matrix(
                (np.ones(2 * n_e), (np.concatenate([e, e]), np.concatenate([e, e + n_e]))),
                shape=(n_e, nv),
            )
        )
        lo.append(np.full(n_e, -np.inf))
        hi.append(np.ones(n_e))
        # Σ_e link_e·y_e / dp − w <= 0
        row = np.concatenate([link[ii, jj] / dp, [-1.0]])
        blocks.append(
            coo_matrix((row, (np.zeros(n_e + 1, int), np.append(e + n_e, iw))), shape=(1, nv))
        )
        lo.append([-np.inf])
        hi.append([0.0])
    # Σ_{e∋d} pair_e·x_e − z <= 0
    pw = np.concatenate([pair[ii, jj], pair[ii, jj]])
    blocks.append(
        coo_matrix(
            (
                np.append(pw, -np.ones(d)),
                (np.append(inc_rows, np.arange(d)), np.append(inc_cols, np.full(d, iz))),
            ),
            shape=(d, nv),
        )
    )
    lo.append(np.full(d, -np.inf))
    hi.append(np.zeros(d))
    a = vstack(blocks).tocsr()
    ub = np.ones(nv)
    lb = np.zeros(nv)
    if pp < 2:
        ub[n_e : 2 * n_e] = 0.0
    lb[iz], ub[iz] = dp_b, np.inf
    lb[iw], ub[iw] = pp_b, np.inf
    integrality = np.zeros(nv)
    if integral:
        integrality[: 2 * n_e] = 1
    res = milp(
        c,
        constraints=LinearConstraint(a, np.concatenate(lo), np.concatenate(hi)),
        bounds=Bounds(lb, ub),
        integrality=integrality,
        options={"time_limit": time_limit_s, "disp": False},
    )
    if integral:
        got = getattr(res, "mip_dual_bound", None)
        if got is not None and np.isfinite(got):
            return float(got)
    if res.status != 0 or res.fun is None:  # e.g. the time limit: no bound from the LP
        log.warning("lower_bound: HiGHS stopped without an optimum (%s)", res.message)
        return None
    return float(res.fun)


def lower_bound(
    cluster: Cluster,
    sizes: TaskletSizes,
    *,
    pp: int,
    dp: int,
    use_lp: bool = True,
    integral: bool = False,
    time_limit_s: float = 10.0,
) -> LowerBound:
    """A lower bound on TOTAL for every assignment of ``cluster`` with ``pp × dp``.

    Args:
        use_lp: also solve the LP relaxation (skipped above :data:`MAX_LP_DEVICES` devices).
        integral: solve the relaxation as a MILP (tighter, slower; the dual bound at
            ``time_limit_s`` is returned if HiGHS stops early).
        time_limit_s: HiGHS time limit.
    """
    check_sizes(cluster, pp, dp)
    t0 = time.perf_counter()
    pair = dp_cost_matrix_s(cluster, sizes.c_dp_bytes, dp)
    link = cluster.link_time_s(sizes.c_pp_bytes)
    dp_b, pp_b = _combinatorial(pair, link, pp, dp)
    lp_b, method = None, "combinatorial"
    if use_lp and 1 < cluster.num_devices <= MAX_LP_DEVICES:
        lp_b = _lp(pair, link, pp, dp, dp_b, pp_b, integral, time_limit_s)
        method = "combinatorial" if lp_b is None else "milp" if integral else "lp"
    return LowerBound(
        dp_bound_s=dp_b,
        pp_bound_s=pp_b,
        lp_bound_s=lp_b,
        method=method,
        solve_time_s=time.perf_counter() - t0,
    )


def count_partitions(n: int, pp: int) -> int:
    """Balanced partitions of n devices into pp unordered groups: n! / ((n/pp)!^pp · pp!)."""
    dp = n // pp
    return math.factorial(n) // (math.factorial(dp) ** pp * math.factorial(pp))


def exact_optimum(
    cluster: Cluster,
    sizes: TaskletSizes,
    *,
    pp: int,
    dp: int,
    incumbent_s: float = math.inf,
    max_partitions: int = 3_000_000,
    batch: int = 4096,
) -> tuple[float, list[tuple[int, ...]]]:
    """The optimal TOTAL and a partition attaining it, by pruned enumeration.

    Partial partitions whose largest group DP cost plus 2·``pp_bound_s`` already reaches the
    incumbent (``incumbent_s``, e.g. a scheduler result, or the best leaf so far) are cut.

    Raises:
        ValueError: more than ``max_partitions`` balanced partitions (the search would not end
            in reasonable time), or bad sizes.
    """
    check_sizes(cluster, pp, dp)
    n = cluster.num_devices
    if count_partitions(n, pp) > max_partitions:
        raise ValueError(
            f"exact_optimum: {count_partitions(n, pp)} partitions of {n} devices "
            f"into {pp} groups exceed max_partitions={max_partitions}"
        )
    ev = PartitionEvaluator(cluster, sizes, pp=pp, dp=dp)
    _, pp_b = _combinatorial(ev.dp_pair_s, ev.pp_link_s, pp, dp)
    best = [incumbent_s + 1e-9, None]  # allow ties with the incumbent to be found
    leaves: list[list[tuple[int, ...]]] = []

    def flush() -> None:
        if leaves:
            tot = ev.totals(leaves, bound=best[0])
            k = int(np.argmin(tot))
            if tot[k] < best[0] or (best[1] is None and tot[k] <= best[0]):
                best[0], best[1] = float(tot[k]), list(leaves[k])
            leaves.clear()

    def rec(free: tuple[int, ...], groups: list[tuple[int, ...]], dp_max: float) -> None:
        if not free:
            leaves.append(list(groups))
            if len(leaves) >= batch:
                flush()
            return
        first, rest = free[0], free[1:]
        for others in itertools.combinations(rest, dp - 1):
            g = (first, *others)
            cost = max(dp_max, ev.group_dp_cost(g))
            if cost + 2.0 * pp_b >= best[0]:
                continue
            remaining = tuple(x for x in rest if x not in others)
            rec(remaining, [*groups, g], cost)

    rec(tuple(range(n)), [], 0.0)
    flush()
    if best[1] is None:
        raise RuntimeError("exact_optimum: no partition beats the incumbent (it was not valid?)")
    return best[0], best[1]
