"""Cost of a partition into DP groups with optimal matchings and stage order (paper §3.2–3.3).

A partition is ``pp`` unordered groups of ``dp`` devices. Its cost is

    DATAP-COST  = max over groups of DP(C)                      (§3.2)
    PIPELINEP-COST = open-loop TSP over the coarse graph whose edge (Ci, Cj) is the bottleneck
                     perfect matching value of the link-time matrix between Ci and Cj  (§3.3)
    TOTAL = DATAP-COST + 2 · PIPELINEP-COST

:func:`partition_cost` also builds the :class:`Assignment` that attains it (TSP order for the
stages, the bottleneck matchings to chain replicas), so the runtime pays exactly this cost.
:class:`PartitionEvaluator` is the scheduler's cached, batched version of the same arithmetic.

Example (debug case, one pipeline per region pair):
    >>> from system.cases import get_case
    >>> from system.workload import DTFM_REFERENCE
    >>> from system.cost.model import assignment_cost
    >>> c = get_case("debug")
    >>> cost, a = partition_cost(c, np.array([[0, 2], [1, 3], [4, 6], [5, 7]]), DTFM_REFERENCE)
    >>> cost == assignment_cost(c, a, DTFM_REFERENCE)
    True
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

import numpy as np

from system.assignment import Assignment
from system.cluster import Cluster
from system.compiled import kernel
from system.cost.matching import bottleneck_matching, bottleneck_values
from system.cost.model import CostBreakdown, assignment_cost, check_sizes, dp_cost_matrix_s
from system.cost.tsp import MAX_EXACT_TSP, open_tsp_path, open_tsp_values
from system.workload import TaskletSizes

log = logging.getLogger(__name__)

__all__ = ["partition_cost", "PartitionEvaluator", "BoundedCache", "check_groups"]

Group = tuple[int, ...]  # sorted device ids of one DP group

# Cache capacities (entries). A group cost's key and a group id's are a tuple of dp ints (about
# 0.2 kB per entry at dp = 8), an edge's key one int: the caches stay below about 400 MB however
# long the search runs.
MAX_GROUP_CACHE = 1 << 18
MAX_EDGE_CACHE = 1 << 19
MAX_GROUP_IDS = 1 << 20  # groups known by id (:meth:`PartitionEvaluator.edges`)
TOTALS_CHUNK = 32  # partitions costed between two deadline checks


class BoundedCache(dict):
    """A dict that forgets its oldest half once it holds more than ``capacity`` entries.

    Insertion order is age (Python dicts keep it), so eviction is one slice of the keys; a
    forgotten value is simply recomputed. ``evicted`` counts entries dropped.
    """

    def __init__(self, capacity: int) -> None:
        super().__init__()
        if capacity < 2:
            raise ValueError(f"BoundedCache: capacity must be >= 2, got {capacity}")
        self.capacity = int(capacity)
        self.evicted = 0

    def __setitem__(self, key, value) -> None:
        super().__setitem__(key, value)
        if len(self) > self.capacity:
            old = list(self.keys())[: len(self) // 2]
            for k in old:
                del self[k]
            self.evicted += len(old)


def check_groups(groups: np.ndarray, num_devices: int) -> np.ndarray:
    """Validate a (pp, dp) table of device ids covering 0..num_devices-1 once each."""
    g = np.asarray(groups)
    if g.ndim != 2 or g.size == 0:
        raise ValueError(f"groups: need a non-empty (pp, dp) table, got shape {g.shape}")
    if g.size != num_devices:
        raise ValueError(f"groups: table holds {g.size} devices, the cluster has {num_devices}")
    if sorted(g.ravel().tolist()) != list(range(num_devices)):
        raise ValueError(f"groups: must hold each device 0..{num_devices - 1} exactly once")
    return g.astype(np.int64)


@kernel
def _lower_edges(link: np.ndarray, groups: np.ndarray) -> np.ndarray:
    """(K, pp, pp): for each pair of groups a, b of each partition, max(largest row minimum,
    largest column minimum) of ``link`` between them, a lower bound of their bottleneck matching
    value (every device is matched). Minima and maxima only: exact."""
    k, m, d = groups.shape
    w = np.zeros((k, m, m))
    for p in range(k):
        for a in range(m):
            for b in range(a + 1, m):
                lower = -np.inf
                for x in range(d):
                    row_min = np.inf
                    col_min = np.inf
                    for y in range(d):
                        row_min = min(row_min, link[groups[p, a, x], groups[p, b, y]])
                        col_min = min(col_min, link[groups[p, a, y], groups[p, b, x]])
                    lower = max(lower, row_min, col_min)
                w[p, a, b] = lower
                w[p, b, a] = lower
    return w


class PartitionEvaluator:
    """Cached partition costs for one cluster, tasklet sizes and layout (the GA's inner loop).

    Group DP costs are cached per sorted member tuple, coarse edges per (group, group) pair; new
    edges are computed in one compiled batch (:func:`bottleneck_values`), TSPs likewise.
    ``evaluations`` counts partitions costed.
    """

    def __init__(self, cluster: Cluster, sizes: TaskletSizes, *, pp: int, dp: int) -> None:
        check_sizes(cluster, pp, dp)
        self.cluster, self.sizes, self.pp, self.dp = cluster, sizes, pp, dp
        self.dp_pair_s = dp_cost_matrix_s(cluster, sizes.c_dp_bytes, dp)  # (D, D) seconds
        self.pp_link_s = cluster.link_time_s(sizes.c_pp_bytes)  # (D, D) seconds
        self._dp_cache: dict[Group, float] = BoundedCache(MAX_GROUP_CACHE)
        # coarse edges by the pair of their groups' ids (:meth:`_edge_values`)
        self._edge_cache: dict[int, float] = {}
        self._ids: dict[Group, int] = {}
        self._groups: list[Group] = []
        self.evaluations = 0
        self.forgotten = 0  # times the edge cache and group ids were dropped

    # ---- pieces --------------------------------------------------------------------------------
    def group_dp_cost(self, g: Group) -> float:
        got = self._dp_cache.get(g)
        return float(self._group_costs([[g]])[0, 0]) if got is None else got

    def _group_costs(self, partitions: Sequence[Sequence[Group]]) -> np.ndarray:
        """(K, pp) DP cost of every group of each partition; groups not cached yet in one batch
        (a group's cost: the largest of its members' summed DP times to the others). The values
        are read once, so a cache that forgets entries while the new ones go in loses none."""
        cache = self._dp_cache
        got: dict[Group, float | None] = {}
        for p in partitions:
            for g in p:
                if g not in got:
                    got[g] = cache.get(g)
        new = [g for g, v in got.items() if v is None]
        if new:
            idx = np.array(new, dtype=np.int64)  # (M, dp)
            costs = self.dp_pair_s[idx[:, :, None], idx[:, None, :]].sum(axis=2).max(axis=1)
            for g, c in zip(new, costs.tolist(), strict=True):
                got[g] = cache[g] = c if len(g) > 1 else 0.0
        return np.array([[got[g] for g in p] for p in partitions])

    def _intern(self, groups: Sequence[Group]) -> list[int]:
        """The id of each group (:meth:`edges` keys pairs of ids); new groups get new ids."""
        ids, known = self._ids, self._groups
        out = []
        for g in groups:
            i = ids.get(g)
            if i is None:
                i = ids[g] = len(known)
                known.append(g)
            out.append(i)
        return out

    def _edge_values(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """Bottleneck values of the pairs of groups with ids ``a[k]``, ``b[k]``; unseen pairs in
        one batch. A value belongs to the unordered pair: it is computed with the
        lexicographically smaller group's devices as rows, so it does not depend on the order
        the pairs were asked in, and forgetting it (the caches' bound) changes nothing."""
        keys = ((np.minimum(a, b) << 32) | np.maximum(a, b)).ravel().tolist()
        cache = self._edge_cache
        got = [cache.get(k) for k in keys]
        todo = list(dict.fromkeys(k for k, v in zip(keys, got, strict=True) if v is None))
        if todo:
            groups = self._groups
            pairs = [(groups[k >> 32], groups[k & 0xFFFFFFFF]) for k in todo]
            rows = np.array([min(x, y) for x, y in pairs])
            cols = np.array([max(x, y) for x, y in pairs])
            mats = self.pp_link_s[rows[:, :, None], cols[:, None, :]]  # (K, dp, dp)
            new = dict(zip(todo, bottleneck_values(mats).tolist(), strict=True))
            got = [new[k] if v is None else v for k, v in zip(keys, got, strict=True)]
            if len(cache) + len(new) > MAX_EDGE_CACHE or len(groups) > MAX_GROUP_IDS:
                self._forget()  # the new values' keys name ids that are gone: not kept
            else:
                cache.update(new)
        return np.array(got, dtype=float)

    def _forget(self) -> None:
        """Drop the edge cache and the group ids (bounded memory; every value is recomputed
        the same)."""
        self._edge_cache.clear()
        self._ids.clear()
        self._groups.clear()
        self.forgotten += 1

    def edges(self, pairs: Sequence[tuple[Group, Group]]) -> np.ndarray:
        """Bottleneck values of many (group, group) pairs (sorted groups); unseen ones in one
        batch (:meth:`_edge_values`)."""
        if not pairs:
            return np.zeros(0)
        ids = np.array(self._intern([g for pair in pairs for g in pair]), dtype=np.int64)
        return self._edge_values(ids[0::2], ids[1::2])

    def coarse_weights(self, groups: Sequence[Group]) -> np.ndarray:
        return self._weights([groups])[0]

    def _weights(self, partitions: Sequence[Sequence[Group]]) -> np.ndarray:
        """(K, pp, pp) coarse edge weights of K partitions, all new edges in one batch."""
        m = self.pp
        ii, jj = np.triu_indices(m, k=1)
        ids = np.array([self._intern(p) for p in partitions], dtype=np.int64).reshape(-1, m)
        vals = self._edge_values(ids[:, ii], ids[:, jj]).reshape(len(partitions), len(ii))
        w = np.zeros((len(partitions), m, m))
        w[:, ii, jj] = vals
        w[:, jj, ii] = vals
        return w

    def _lower_weights(self, partitions: Sequence[Sequence[Group]]) -> np.ndarray:
        """(K, pp, pp) lower bounds of the coarse edges (every row/column must be matched)."""
        g = np.array([list(p) for p in partitions], dtype=np.int64)  # (K, pp, dp)
        n = self.pp_link_s.shape[0]
        if g.size and (g.min() < 0 or g.max() >= n):  # the kernel indexes without checking
            raise ValueError(f"partitions: device ids must lie in 0..{n - 1}")
        return _lower_edges(self.pp_link_s, g)

    # ---- whole partitions ----------------------------------------------------------------------
    def _extra(self, partitions: Sequence[Sequence[Group]]) -> np.ndarray:
        """A per-partition term added to TOTAL (none here; subclasses add e.g. compute time)."""
        return np.zeros(len(partitions))

    def totals(
        self,
        partitions: Sequence[Sequence[Group]],
        bound: float | None = None,
        deadline: float | None = None,
    ) -> np.ndarray:
        """TOTAL of each partition (a sequence of pp sorted groups), batched.

        With ``bound``, partitions that provably cost more than ``bound`` (DP cost alone, or DP +
        2·TSP over edge lower bounds) are not costed further and get ``inf``: a local search only
        needs candidates that improve on, or tie with, its current TOTAL. Up to
        :data:`MAX_EXACT_TSP` groups the candidates are costed best-first (lowest lower bound
        first) and the bound falls to the best TOTAL found so far: the partitions whose TOTAL is
        at most min(``bound``, batch minimum) + 1e-12 still get their exact values, so the argmin
        and, when nothing beats ``bound``, the ties with it are those of the full batch; others
        may get ``inf`` (never a wrong finite value). With ``deadline`` (a
        ``time.perf_counter()`` value) the batch is costed in chunks and the partitions not
        reached by then get ``inf`` too, so one large batch cannot overrun a time limit.
        """
        # a chunk holds about TOTALS_CHUNK · 64 coarse edges: one partition has pp·(pp−1)/2
        chunk = max(1, min(TOTALS_CHUNK, TOTALS_CHUNK * 64 // (self.pp * self.pp)))
        if bound is not None and self.pp <= MAX_EXACT_TSP and len(partitions):
            return self._totals_best_first(partitions, float(bound), deadline, chunk)
        if deadline is None or len(partitions) <= chunk:
            return self._totals(partitions, bound)
        out = np.full(len(partitions), np.inf)
        for s in range(0, len(partitions), chunk):
            if s > 0 and time.perf_counter() >= deadline:
                break
            out[s : s + chunk] = self._totals(partitions[s : s + chunk], bound)
        return out

    def _totals_best_first(
        self,
        partitions: Sequence[Sequence[Group]],
        bound: float,
        deadline: float | None,
        chunk: int,
    ) -> np.ndarray:
        n = len(partitions)
        self.evaluations += n
        out = np.full(n, np.inf)
        extra = self._extra(partitions)
        dps = self._group_costs(partitions).max(axis=1)
        keep = np.flatnonzero(dps + extra < bound)
        if keep.size == 0:
            return out
        # cheap lower bound first: each coarse edge >= max(row minima, column minima)
        lbs = (
            dps[keep]
            + extra[keep]
            + 2.0 * open_tsp_values(self._lower_weights([partitions[k] for k in keep]))
        )
        rank = np.argsort(lbs, kind="stable")
        keep, lbs = keep[rank], lbs[rank]
        step = max(1, chunk // 4)  # small steps: the bound tightens between them
        for s in range(0, keep.size, step):
            if lbs[s] > bound + 1e-12:
                break  # sorted: no later candidate can reach the bound either
            if s > 0 and deadline is not None and time.perf_counter() >= deadline:
                break
            sel = keep[s : s + step][lbs[s : s + step] <= bound + 1e-12]
            pps = open_tsp_values(self._weights([partitions[k] for k in sel]))
            out[sel] = dps[sel] + 2.0 * pps + extra[sel]
            bound = min(bound, float(out[sel].min()))
        return out

    def _totals(self, partitions: Sequence[Sequence[Group]], bound: float | None) -> np.ndarray:
        if not partitions:
            return np.zeros(0)
        self.evaluations += len(partitions)
        extra = self._extra(partitions)
        dps = self._group_costs(partitions).max(axis=1)
        out = np.full(len(partitions), np.inf)
        keep = (
            np.flatnonzero(dps + extra < bound) if bound is not None else np.arange(len(partitions))
        )
        if keep.size == 0:
            return out
        ws = self._weights([partitions[k] for k in keep])
        if self.pp <= MAX_EXACT_TSP:
            pps = open_tsp_values(ws)
        else:
            # beyond exact TSP: one nearest-neighbour start + 2-opt per candidate (the final
            # assignment uses 8 starts, including this one, so it is never worse)
            pps = np.array([open_tsp_path(w, starts=1)[0] for w in ws])
        out[keep] = dps[keep] + 2.0 * pps + extra[keep]
        return out

    def spread(self, partitions: Sequence[Sequence[Group]]) -> np.ndarray:
        """Tie-breaker for plateaus of TOTAL: mean group DP cost + 2·(pp−1)·mean coarse edge.

        TOTAL only sees the slowest group and the bottleneck links; this smooth companion also
        rewards making the other groups and edges cheaper, so a search can cross a plateau.
        """
        ws = self._weights(partitions)
        m = self.pp
        mean_edge = ws.sum(axis=(1, 2)) / max(1, m * (m - 1))
        mean_dp = self._group_costs(partitions).mean(axis=1)
        return mean_dp + 2.0 * (m - 1) * mean_edge

    def smooth_spread(self, partitions: Sequence[Sequence[Group]]) -> np.ndarray:
        """Second tie-breaker: mean group DP cost + 2·(path over smooth edges).

        A coarse edge gets faster only when *all* of its matched pairs do, so single moves can
        leave both TOTAL and :meth:`spread` flat. The smooth edge weight, the mean over both
        groups' devices of their fastest link into the other group, falls with every pair that
        becomes fast. The path is the open TSP over smooth weights (exact up to 16 groups;
        beyond, (pp−1)·mean smooth edge).
        """
        g = np.array([list(p) for p in partitions])  # (K, pp, dp)
        m = self.pp
        mean_dp = self._group_costs(partitions).mean(axis=1)
        if m == 1:
            return mean_dp
        ii, jj = np.triu_indices(m, k=1)
        sub = self.pp_link_s[g[:, ii, :, None], g[:, jj, None, :]]  # (K, E, dp, dp)
        smooth = 0.5 * (sub.min(axis=3).mean(axis=2) + sub.min(axis=2).mean(axis=2))
        if m <= MAX_EXACT_TSP:
            w = np.zeros((len(partitions), m, m))
            w[:, ii, jj] = smooth
            w[:, jj, ii] = smooth
            return mean_dp + 2.0 * open_tsp_values(w)
        return mean_dp + 2.0 * (m - 1) * smooth.mean(axis=1)

    def total(self, partition: Sequence[Group]) -> float:
        return float(self.totals([partition])[0])

    def assignment(self, partition: Sequence[Group], starts: int = 8) -> Assignment:
        """The assignment attaining the partition cost: TSP stage order, chained matchings.

        ``starts``: nearest-neighbour starts of the TSP heuristic beyond 16 groups (1 gives the
        order :meth:`totals` priced).
        """
        groups = [list(g) for g in partition]
        _, order = open_tsp_path(self.coarse_weights([tuple(g) for g in groups]), starts=starts)
        stages = np.empty((self.pp, self.dp), dtype=np.int64)
        stages[0] = groups[order[0]]  # replica r of stage 0 = r-th member of the first group
        for s in range(1, self.pp):
            nxt = np.asarray(groups[order[s]])
            m = self.pp_link_s[np.ix_(stages[s - 1], nxt)]
            _, perm = bottleneck_matching(m)  # attains the coarse edge value
            stages[s] = nxt[perm]
        return Assignment(stages)


def _as_partition(groups: np.ndarray) -> list[Group]:
    return [tuple(sorted(int(x) for x in row)) for row in groups]


def partition_cost(
    cluster: Cluster, groups: np.ndarray, sizes: TaskletSizes
) -> tuple[CostBreakdown, Assignment]:
    """Cost of a partition into DP groups with optimal matchings + TSP, and its assignment.

    Args:
        cluster: devices and links.
        groups: (pp, dp) device ids; each row is one (unordered) DP group.
        sizes: c_dp / c_pp bytes.

    Returns:
        ``(cost, assignment)`` with ``cost == assignment_cost(cluster, assignment, sizes)``
        exactly (the cost is computed from the assignment). For pp > 16 the stage order comes
        from a TSP heuristic, so the cost is an upper bound on the partition's optimum.
    """
    g = check_groups(groups, cluster.num_devices)
    ev = PartitionEvaluator(cluster, sizes, pp=g.shape[0], dp=g.shape[1])
    a = ev.assignment(_as_partition(g))
    return assignment_cost(cluster, a, sizes), a
