"""Lower bounds on TOTAL and exact optima on small instances: certified gaps for the scheduler.

TOTAL = DATAP-COST + 2·PIPELINEP-COST (paper §3.2–3.3). Every bound holds for *every* assignment
of the cluster, so ``(result − bound) / result`` is a certified gap (:func:`gap_pct`).

- Combinatorial (any size): d shares a group with dp − 1 peers and DP(C) is at least d's row sum
  in C, so ``dp_bound_s`` = max_d Σ (d's dp − 1 cheapest DP pair costs). With m_d d's fastest
  pipeline link, sorted: rooting the stage path at its cheapest stage maps boundaries one-to-one
  onto the other stages, the k-th cheapest stage maximum is ≥ m_(k·dp), so ``pp_bound_s`` =
  Σ_{k=2..pp} m_(k·dp).
- LP relaxation (``lp_bound_s``, ≤ :data:`MAX_LP_DEVICES` devices, SciPy's HiGHS; None at its
  time limit without an optimum), x_e (pair e shares a group), y_e (e is a pipeline link) in
  [0, 1]: minimise z + 2·w s.t. Σ_{e∋d} x_e = dp − 1, 1 ≤ Σ_{e∋d} y_e ≤ 2 (pp ≥ 2),
  Σ_e y_e = dp·(pp − 1), x_e + y_e ≤ 1, z ≥ Σ_{e∋d} pair_e·x_e for each d, w ≥ Σ_e link_e·y_e / dp,
  z ≥ dp_bound_s, w ≥ pp_bound_s. Any assignment is a feasible point with z ≤ DATAP and
  w ≤ PIPELINEP. ``integral=True`` solves the MILP; HiGHS's dual bound at its limit stays valid.
- Region bound (``region_bound_s``, :func:`_region_bound`, ≤ :data:`MAX_COMPOSITIONS` group
  compositions): each cost becomes the minimum over its (region, region) block, so a group is its
  composition n (devices per region) with DP ≥ DP̲(n) = max_{r∈n} Σ_s (n_s − [s = r])·P̲[r, s];
  every boundary costs ≥ e0 (the fastest link), one between compositions ≥ e1 (the fastest link
  between regions). With K(τ) the LP bound on how many distinct compositions with DP̲ ≤ τ make up
  the cluster (:func:`_min_compositions`) and τ_k the smallest DP̲ with K(τ_k) ≤ k (bisection):

      TOTAL ≥ min_k max(τ_k, dp_bound_s) + 2·max(pp_bound_s, (pp − 1)·e0 + (k − 1)·(e1 − e0)).

  Region cuts (:func:`_cut_thresholds`) charge L̲(A, rest) instead of e1 for a crossing out of a
  region set A whose device count per group cannot stay constant.
- Exact optimum (:func:`exact_optimum`): branch and bound over balanced partitions (the lowest
  free device's group first), pruned by the groups' DP cost so far + 2·``pp_bound_s``, leaves
  costed in batches by :class:`~system.cost.partition.PartitionEvaluator`.
"""

from __future__ import annotations

import itertools
import logging
import math
import time
from dataclasses import dataclass

import numpy as np

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
    "MAX_COMPOSITIONS",
]

MAX_LP_DEVICES = 128  # D·(D−1) variables: 64 devices solve in under a second, 256 take > 10 s
MAX_COMPOSITIONS = 20_000  # group compositions of the region bound (8 regions, dp = 8: 6,435)
MAX_CUT_REGIONS = 10  # region cuts of the region bound: all 2^(R-1) − 1 are scanned ...
MAX_CUTS = 16  # ... and the 16 with the dearest crossing are used (about 13 small LPs each)


@dataclass(frozen=True, slots=True)
class LowerBound:
    dp_bound_s: float  # DATAP-COST >= this
    pp_bound_s: float  # PIPELINEP-COST >= this
    lp_bound_s: float | None  # TOTAL >= this (None: not computed)
    method: str  # "combinatorial" | "lp" | "milp"
    solve_time_s: float
    region_bound_s: float | None = None  # TOTAL >= this (None: not computed)

    @property
    def total_bound_s(self) -> float:
        comb = self.dp_bound_s + 2.0 * self.pp_bound_s
        return max([comb] + [b for b in (self.lp_bound_s, self.region_bound_s) if b is not None])

    def to_dict(self) -> dict:
        return {
            "bound_total_s": self.total_bound_s,
            "bound_dp_s": self.dp_bound_s,
            "bound_pp_s": self.pp_bound_s,
            "bound_lp_s": self.lp_bound_s,
            "bound_region_s": self.region_bound_s,
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
    from scipy.optimize import Bounds, LinearConstraint, milp  # at first use (cost/matching.py)
    from scipy.sparse import coo_matrix, vstack

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


def _compositions(counts: np.ndarray, dp: int) -> np.ndarray:
    """Every vector n with Σ n = dp and 0 <= n_r <= counts[r], shape (C, R)."""
    out: list[list[int]] = []

    def rec(r: int, left: int, head: list[int]) -> None:
        if len(out) > MAX_COMPOSITIONS:
            return
        if r == len(counts) - 1:
            if left <= counts[r]:
                out.append([*head, left])
            return
        for k in range(min(left, int(counts[r])), -1, -1):
            rec(r + 1, left - k, [*head, k])

    rec(0, dp, [])
    return np.array(out, dtype=np.int64).reshape(-1, len(counts))


def _block_min(m: np.ndarray, lab: np.ndarray, n_reg: int) -> np.ndarray:
    """(R, R) minimum of ``m`` over each region block, the diagonal of ``m`` left out
    (inf for a one-device region's own block)."""
    off = np.where(np.eye(m.shape[0], dtype=bool), np.inf, m)
    out = np.full((n_reg, n_reg), np.inf)
    for r in range(n_reg):
        rows = off[lab == r]
        for s in range(n_reg):
            out[r, s] = rows[:, lab == s].min()
    return out


def _min_compositions(
    comp: np.ndarray, cap: np.ndarray, counts: np.ndarray, pp: int, sel: np.ndarray
) -> float:
    """A lower bound on how many distinct compositions among ``sel`` can make up the cluster:
    the LP relaxation of min Σ z_n with m_n <= cap_n·z_n, i.e. min Σ m_n / cap_n subject to
    Σ m_n = pp and Σ m_n·n = counts, rounded up (inf if infeasible)."""
    from scipy.optimize import linprog  # at first use (system/cost/matching.py says why)

    if not sel.any():
        return np.inf
    a_eq = np.vstack([np.ones(int(sel.sum())), comp[sel].T.astype(float)])
    res = linprog(
        1.0 / cap[sel],
        A_eq=a_eq,
        b_eq=np.concatenate([[pp], counts]).astype(float),
        bounds=np.stack([np.zeros(int(sel.sum())), cap[sel]], axis=1),
        method="highs",
    )
    if res.status == 2:  # infeasible: these compositions cannot make up the cluster
        return np.inf
    if res.status != 0:
        raise RuntimeError(f"region bound: HiGHS failed on the composition LP ({res.message})")
    return float(max(1, math.ceil(res.fun - 1e-6)))


def _region_bound(
    cluster: Cluster,
    pair: np.ndarray,
    link: np.ndarray,
    pp: int,
    dp: int,
    dp_b: float,
    pp_b: float,
) -> float | None:
    """The region bound of the module docstring; None beyond :data:`MAX_COMPOSITIONS`."""
    _, lab = np.unique(np.asarray(cluster.region_of, dtype=str), return_inverse=True)
    n_reg = int(lab.max()) + 1
    counts = np.bincount(lab, minlength=n_reg)
    comp = _compositions(counts, dp)
    if len(comp) > MAX_COMPOSITIONS:
        return None
    pb = _block_min(pair, lab, n_reg)
    lb = _block_min(link, lab, n_reg)
    # DP̲(n): row sum of a region-r device, Σ_s (n_s − [s = r])·P̲[r, s] (a one-device region's
    # own block is inf, but then n_r − 1 = 0 and the term is left out)
    own = comp[:, None, :] - np.eye(n_reg, dtype=np.int64)[None, :, :]  # (C, r, s)
    with np.errstate(invalid="ignore"):
        rows = np.where(own > 0, own * pb[None, :, :], 0.0).sum(axis=2)  # (C, R)
    dp_lo = np.where(comp > 0, rows, -np.inf).max(axis=1)
    e0 = float(lb.min())
    e1 = float(lb[~np.eye(n_reg, dtype=bool)].min()) if n_reg > 1 else e0
    delta = max(0.0, e1 - e0)
    # at most cap_n groups of composition n fit in the cluster
    cap = np.where(comp > 0, counts[None, :] // np.maximum(comp, 1), pp).min(axis=1)
    cap = np.minimum(cap, pp).astype(float)
    # K(τ): fewest compositions with DP̲ <= τ that make up the cluster (a lower bound), a step
    # function falling in τ. A layout whose slowest group costs τ* and that uses K* compositions
    # has K(τ*) <= K*, so TOTAL >= min over steps k of max(τ_k, dp_b) + 2·max(pp_b,
    # (pp − 1)·e0 + (k − 1)·Δ), τ_k the smallest τ with K(τ) <= k.
    taus = np.unique(dp_lo)
    memo: dict[int, float] = {}

    def k_at(i: int) -> float:
        if i not in memo:
            memo[i] = _min_compositions(comp, cap, counts, pp, dp_lo <= taus[i] + 1e-12)
        return memo[i]

    first: dict[float, int] = {}  # K value -> smallest index of taus with that K

    def steps(lo: int, hi: int) -> None:  # K known at lo and hi; find every change between
        if k_at(lo) == k_at(hi) or hi - lo <= 1:
            return
        mid = (lo + hi) // 2
        steps(lo, mid)
        steps(mid, hi)

    last = len(taus) - 1
    if not np.isfinite(k_at(last)):
        return None  # cannot happen for a valid cluster (every assignment is a witness)
    steps(0, last)
    for i in sorted(memo):
        first.setdefault(memo[i], i)
    cuts = _cut_thresholds(comp, cap, counts, pp, lb, e1, dp_lo, taus)
    best = np.inf
    for i in sorted(set(first.values()) | {t for t, _ in cuts if t <= last}):
        k = k_at(i)
        if not np.isfinite(k):
            continue
        # cuts whose device count per group cannot stay constant at this DP level
        surplus = max([x for t, x in cuts if t > i], default=0.0)
        if surplus > 0.0:
            k = max(k, 2.0)
        pp_term = max(pp_b, (pp - 1) * e0 + (k - 1.0) * delta + surplus)
        best = min(best, max(float(taus[i]), dp_b) + 2.0 * pp_term)
    return float(best)


def _cut_thresholds(
    comp: np.ndarray,
    cap: np.ndarray,
    counts: np.ndarray,
    pp: int,
    lb: np.ndarray,
    e1: float,
    dp_lo: np.ndarray,
    taus: np.ndarray,
) -> list[tuple[int, float]]:
    """Region cuts (A, rest) that make a crossing dearer than e1, as (threshold index, surplus).

    If the groups' count of A-devices differs somewhere, a boundary where it changes matches an
    A-device to a non-A device: that crossing costs at least L̲(A, rest), ``surplus`` = L̲(A, rest)
    − e1 more than the e1 the K − 1 crossings are already charged. The count can stay constant
    only if A's devices split evenly (pp divides them) and compositions with that count and
    DP̲ <= τ make up the cluster (an LP); the threshold is the first index of ``taus`` where they
    do (len(taus): never). Up to :data:`MAX_CUT_REGIONS` regions; the :data:`MAX_CUTS` cuts with
    the largest surplus (any subset of cuts keeps the bound valid).
    """
    n_reg = len(counts)
    if n_reg < 2 or n_reg > MAX_CUT_REGIONS:
        return []
    found = []
    for mask in range(1, 1 << (n_reg - 1)):  # A never holds the last region: each cut once
        in_a = np.array([(mask >> r) & 1 for r in range(n_reg)], dtype=bool)
        cross = float(lb[np.ix_(in_a, ~in_a)].min())
        if cross > e1 + 1e-12:
            found.append((cross - e1, in_a))
    found.sort(key=lambda x: -x[0])
    out = []
    for surplus, in_a in found[:MAX_CUTS]:
        n_a = int(counts[in_a].sum())
        if n_a % pp:
            out.append((len(taus), surplus))
            continue
        same = comp[:, in_a].sum(axis=1) == n_a // pp
        lo, hi = 0, len(taus)  # smallest feasible index in [lo, hi]; hi = never
        while lo < hi:
            mid = (lo + hi) // 2
            sel = same & (dp_lo <= taus[mid] + 1e-12)
            if np.isfinite(_min_compositions(comp, cap, counts, pp, sel)):
                hi = mid
            else:
                lo = mid + 1
        out.append((lo, surplus))
    return out


def lower_bound(
    cluster: Cluster,
    sizes: TaskletSizes,
    *,
    pp: int,
    dp: int,
    use_lp: bool = True,
    integral: bool = False,
    time_limit_s: float = 10.0,
    use_region: bool = True,
) -> LowerBound:
    """A lower bound on TOTAL for every assignment of ``cluster`` with ``pp × dp``.

    Args:
        use_lp: also solve the LP relaxation (skipped above :data:`MAX_LP_DEVICES` devices).
        integral: solve the relaxation as a MILP (tighter, slower; the dual bound at
            ``time_limit_s`` is returned if HiGHS stops early).
        time_limit_s: HiGHS time limit (each of the LP and the region MILP).
        use_region: also solve the region bound's MILP (up to :data:`MAX_COMPOSITIONS` group
            compositions).
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
    region_b = None
    if use_region and pp >= 1 and dp >= 1:
        region_b = _region_bound(cluster, pair, link, pp, dp, dp_b, pp_b)
    return LowerBound(
        dp_bound_s=dp_b,
        pp_bound_s=pp_b,
        lp_bound_s=lp_b,
        method=method,
        solve_time_s=time.perf_counter() - t0,
        region_bound_s=region_b,
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
