"""Search at scale: region and host levels first, then device moves costed incrementally.

TOTAL = max_g DP(g) + 2·Σ bottleneck(g_k, g_k+1) along the pipeline order of the pp groups
(paper §3.2–3.3). At 1,024 devices and more, one full re-costing of a partition (pp·(pp−1)/2
coarse edges and a heuristic open TSP) costs seconds, so the GA of §3.4 barely finishes a trial.
This module keeps one partition *and* its pipeline order and changes them by local moves whose
cost change touches only what the move changes:

- ``swap``: exchange one device between groups a and b. New DP cost of a and b only
  (:meth:`PartitionEvaluator.group_dp_cost`), new bottleneck matchings only for the (at most four)
  path edges at a and b (:meth:`PartitionEvaluator.edges`); max DP over a kept array.
- ``reverse``: 2-opt on the open path, reversing positions i..j: two edges change.

Coarse levels (regions, then hosts, then devices as ``Cluster.region_of`` / ``host_of`` give).
Region level: :func:`coarse_layouts` splits the regions into clusters whose stages take devices
of every region in the cluster, chained in the cheapest cluster order; and for the given groups,
:func:`region_order` labels each group by the region holding most of its devices; the regions
are ordered by an exact open TSP (Held–Karp, :func:`open_tsp_path`) over the cheapest coarse
edge between their groups, and groups are chained region by region, each region's groups ordered
by nearest neighbour from the group nearest the previous region. That order is kept only if it
is cheaper than the start's. Host level: the host- and region-aligned stackings of
:func:`~system.scheduler.seeds.aligned_partition` (each replica takes whole hosts in consecutive
stages), in stage order. The cheapest of these starts is kept if it beats the given one. Device
swaps and 2-opt reversals then refine; a swap prefers (4 in 5) a partner device from a region
that group a already holds, so cheap moves are tried first.

Cost functions are those of :mod:`system.cost.partition` (one cost model); the state's TOTAL
equals :func:`~system.cost.tsp.path_cost` over :meth:`PartitionEvaluator.coarse_weights` in the
state's order plus the max group DP cost, which the tests check after random moves.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field

import numpy as np

from system.cost.partition import PartitionEvaluator
from system.cost.tsp import open_tsp_path, path_cost
from system.scheduler.seeds import aligned_partition

__all__ = [
    "PathState",
    "HierarchicalStats",
    "aligned_layouts",
    "coarse_layouts",
    "hierarchical_search",
    "region_order",
]

Group = tuple[int, ...]


class PathState:
    """A partition with its pipeline order and cached pieces of TOTAL.

    ``groups[k]``: sorted device tuple of group k; ``order``: group indices along the pipeline;
    ``dp[k]``: DP cost of group k; ``edge[i]``: bottleneck of (order[i], order[i+1]).
    """

    def __init__(self, ev: PartitionEvaluator, groups, order) -> None:
        self.ev = ev
        self.groups: list[Group] = [tuple(sorted(int(x) for x in g)) for g in groups]
        self.order = np.asarray(order, dtype=np.int64).copy()
        if sorted(self.order.tolist()) != list(range(len(self.groups))):
            raise ValueError(
                f"PathState: order {self.order.tolist()} is not a permutation of "
                f"the {len(self.groups)} groups"
            )
        self.pos = np.empty(len(self.groups), dtype=np.int64)
        self.pos[self.order] = np.arange(len(self.order))
        self.dp = np.array([ev.group_dp_cost(g) for g in self.groups])
        self.edge = self._path_edges(self.order)

    def _path_edges(self, order: np.ndarray) -> np.ndarray:
        pairs = [(self.groups[a], self.groups[b]) for a, b in itertools.pairwise(order)]
        return self.ev.edges(pairs) if pairs else np.zeros(0)

    @property
    def total(self) -> float:
        return float(self.dp.max() + 2.0 * self.edge.sum())

    def full_total(self) -> float:
        """TOTAL recomputed from scratch (no cached piece of this state)."""
        ev = self.ev
        dp = max(
            float(ev.dp_pair_s[np.ix_(g, g)].sum(axis=1).max()) if len(g) > 1 else 0.0
            for g in map(np.asarray, self.groups)
        )
        w = ev.coarse_weights(self.groups)
        return dp + 2.0 * path_cost(w, self.order.tolist())

    # ---- swap ----------------------------------------------------------------------------------
    def _edges_at(self, ks: tuple[int, ...]) -> list[int]:
        """Path-edge indices touching any group in ``ks``."""
        out: set[int] = set()
        for k in ks:
            p = int(self.pos[k])
            if p > 0:
                out.add(p - 1)
            if p < len(self.order) - 1:
                out.add(p)
        return sorted(out)

    def swap_delta(self, a: int, da: int, b: int, db: int):
        """TOTAL after exchanging device ``da`` of group a with ``db`` of group b (not applied).

        Returns ``(new_total, pending)``; ``pending`` is passed to :meth:`apply_swap`.
        """
        ga = tuple(sorted([x for x in self.groups[a] if x != da] + [db]))
        gb = tuple(sorted([x for x in self.groups[b] if x != db] + [da]))
        new_a, new_b = self.ev.group_dp_cost(ga), self.ev.group_dp_cost(gb)
        old_a, old_b = self.dp[a], self.dp[b]
        self.dp[a], self.dp[b] = new_a, new_b
        dp_max = float(self.dp.max())
        self.dp[a], self.dp[b] = old_a, old_b
        idx = self._edges_at((a, b))
        sub = {a: ga, b: gb}
        pairs = []
        for i in idx:
            u, v = int(self.order[i]), int(self.order[i + 1])
            pairs.append((sub.get(u, self.groups[u]), sub.get(v, self.groups[v])))
        new_edges = self.ev.edges(pairs)
        edge_sum = float(self.edge.sum() - self.edge[idx].sum() + new_edges.sum())
        return dp_max + 2.0 * edge_sum, (a, b, ga, gb, new_a, new_b, idx, new_edges)

    def apply_swap(self, pending) -> None:
        a, b, ga, gb, new_a, new_b, idx, new_edges = pending
        self.groups[a], self.groups[b] = ga, gb
        self.dp[a], self.dp[b] = new_a, new_b
        self.edge[idx] = new_edges

    # ---- 2-opt ---------------------------------------------------------------------------------
    def reverse_delta(self, i: int, j: int):
        """TOTAL after reversing path positions i..j (i < j); ``(new_total, pending)``."""
        o, m = self.order, len(self.order)
        pairs, idx = [], []
        if i > 0:
            pairs.append((self.groups[o[i - 1]], self.groups[o[j]]))
            idx.append(i - 1)
        if j < m - 1:
            pairs.append((self.groups[o[i]], self.groups[o[j + 1]]))
            idx.append(j)
        new_edges = self.ev.edges(pairs) if pairs else np.zeros(0)
        edge_sum = float(self.edge.sum() - self.edge[idx].sum() + new_edges.sum())
        return float(self.dp.max()) + 2.0 * edge_sum, (i, j, idx, new_edges)

    def apply_reverse(self, pending) -> None:
        i, j, idx, new_edges = pending
        self.order[i : j + 1] = self.order[i : j + 1][::-1].copy()
        self.edge[i:j] = self.edge[i:j][::-1].copy()  # inner edges keep their weights
        self.edge[idx] = new_edges
        self.pos[self.order] = np.arange(len(self.order))


def region_order(ev: PartitionEvaluator, groups) -> np.ndarray:
    """Coarse pipeline order: regions by exact open TSP, groups chained region by region."""
    groups = [tuple(sorted(int(x) for x in g)) for g in groups]
    names, lab_dev = np.unique(np.asarray(ev.cluster.region_of, dtype=str), return_inverse=True)
    lab = np.array([np.bincount(lab_dev[list(g)], minlength=len(names)).argmax() for g in groups])
    regs = np.unique(lab)
    members = {int(r): np.flatnonzero(lab == r).tolist() for r in regs}
    link = ev.pp_link_s
    # region-level weight: cheapest device link between the regions' devices (a lower bound on
    # any coarse edge between their groups, cheap to compute at any size)
    dev = {int(r): np.array([d for k in members[int(r)] for d in groups[k]]) for r in regs}
    w = np.zeros((len(regs), len(regs)))
    for x, rx in enumerate(regs):
        for y, ry in enumerate(regs):
            if x != y:
                w[x, y] = link[np.ix_(dev[int(rx)], dev[int(ry)])].min()
    _, rorder = open_tsp_path(w) if len(regs) > 1 else (0.0, [0])
    order: list[int] = []
    for r in (int(regs[k]) for k in rorder):
        todo = list(members[r])
        while todo:
            if order:
                prev = groups[order[-1]]
                cand = ev.edges([(prev, groups[k]) for k in todo])
                k = todo[int(np.argmin(cand))]
            else:
                k = todo[0]
            order.append(k)
            todo.remove(k)
    return np.array(order, dtype=np.int64)


def _region_devices(ev: PartitionEvaluator) -> list[list[int]]:
    """Devices of each region (sorted region names), hosts kept together (host, then index)."""
    c = ev.cluster
    names = sorted(set(c.region_of))
    return [
        sorted(
            (d for d in range(c.num_devices) if c.region_of[d] == r),
            key=lambda d: (str(c.host_of[d]), d),
        )
        for r in names
    ]


def _splits(items: list[int], sizes: tuple[int, ...]):
    """Every split of ``items`` into unordered clusters with sizes in ``sizes`` (the first item
    anchors a cluster, so each split appears once)."""
    if not items:
        yield []
        return
    head, rest = items[0], items[1:]
    for s in sizes:
        if s - 1 > len(rest):
            continue
        for mates in itertools.combinations(rest, s - 1):
            left = [x for x in rest if x not in mates]
            for tail in _splits(left, sizes):
                yield [(head, *mates), *tail]


def _cluster_layout(regs: list[list[int]], clusters, dp: int) -> list[Group]:
    """Groups in pipeline order: each cluster of s regions holds n·s/dp consecutive stages, each
    stage dp/s devices of every region in the cluster (each replica stays inside one region
    while the pipeline is in that cluster, so only cluster boundaries cross regions)."""
    out: list[Group] = []
    for cl in clusters:
        per = dp // len(cl)
        n = len(regs[cl[0]])
        for t in range(n // per):
            out.append(tuple(sorted(d for r in cl for d in regs[r][t * per : (t + 1) * per])))
    return out


def coarse_layouts(
    ev: PartitionEvaluator,
    keep: int = 3,
    max_splits: int = 2000,
) -> list[list[Group]]:
    """Region-level search: the ``keep`` best region-cluster layouts (groups in path order).

    The coarse problem is the scheduling problem one level up: regions are split into clusters
    of s regions each (s dividing dp, sizes may differ between clusters; s = 1: each stage inside
    one region, s = dp: each stage spans dp regions), clusters are chained in a pipeline order.
    Its cost is estimated from one
    representative stage per cluster (DP cost, edge to the next stage) plus the exact boundary
    edges, all with the evaluator's cost functions; cluster orders are enumerated up to 6
    clusters, beyond that ordered by an exact open TSP over the boundary edges. Only clusters of
    regions with equal device counts that split into whole stages are formed; none if the
    regions do not allow it. At most ``max_splits`` region splits (in the
    deterministic order of :func:`_splits`).
    """
    dp = ev.dp
    regs = _region_devices(ev)
    n = len(regs[0])
    if any(len(r) != n for r in regs):
        return []
    scored: list[tuple[float, list[Group]]] = []
    # a cluster of s regions needs dp/s devices of each region per stage
    sizes = tuple(s for s in range(1, min(dp, len(regs)) + 1) if dp % s == 0 and n % (dp // s) == 0)
    blocks: dict[tuple[int, ...], list[Group]] = {}
    for split in itertools.islice(_splits(list(range(len(regs))), sizes), max_splits):
        for cl in split:
            if cl not in blocks:
                blocks[cl] = _cluster_layout(regs, [cl], dp)
        bl = [blocks[cl] for cl in split]
        dp_max = max(ev.group_dp_cost(b[0]) for b in bl)
        inner = sum((len(b) - 1) * float(ev.edges([(b[0], b[1])])[0]) for b in bl if len(b) > 1)
        q = len(bl)
        w = np.zeros((q, q))
        for x in range(q):
            for y in range(q):
                if x != y:
                    w[x, y] = float(ev.edges([(bl[x][-1], bl[y][0])])[0])
        if q <= 6:
            path = min(
                (list(p) for p in itertools.permutations(range(q))),
                key=lambda o, w=w: path_cost(w, o),
            )
        else:
            # w is asymmetric (last stage of x, first of y); the symmetric TSP over
            # min(w, w.T) only picks the order, the layout is then costed exactly
            path = open_tsp_path(np.minimum(w, w.T))[1]
        groups = [g for k in path for g in bl[k]]
        scored.append((dp_max + 2.0 * (inner + path_cost(w, path)), groups))
    scored.sort(key=lambda x: x[0])
    return [g for _, g in scored[:keep]]


def aligned_layouts(ev: PartitionEvaluator) -> list[list[Group]]:
    """Host- and region-aligned layouts (:func:`aligned_partition`) in stage order, chunk lengths
    1..8 and the block sizes up to pp; only labels with a block of two or more devices."""
    c, out = ev.cluster, []
    for labels in (c.host_of, c.region_of):
        blocks: dict = {}
        for d, lab in enumerate(labels):
            blocks.setdefault(lab, []).append(d)
        bl = list(blocks.values())
        if max(len(b) for b in bl) < 2:
            continue
        sizes = {len(b) for b in bl if len(b) <= ev.pp}
        for chunk in sorted(set(range(1, min(ev.pp, 8) + 1)) | sizes):
            part = aligned_partition(bl, ev.pp, ev.dp, chunk)
            if part not in out:
                out.append(part)
    return out


@dataclass
class HierarchicalStats:
    start_total_s: float
    best_total_s: float = 0.0
    moves_tried: int = 0
    moves_applied: int = 0
    time_to_best_s: float = 0.0
    stopped_by: str = "max_moves"
    curve: list[tuple[float, float]] = field(default_factory=list)  # (seconds, best TOTAL)


def _same_block(ev: PartitionEvaluator, g: Group, d: int) -> bool:
    c = ev.cluster
    return any(c.region_of[x] == c.region_of[d] for x in g)


def hierarchical_search(
    ev: PartitionEvaluator,
    groups,
    order,
    rng: np.random.Generator,
    *,
    time_limit_s: float | None = 60.0,
    max_moves: int = 200_000,
    patience_moves: int | None = None,
) -> tuple[PathState, HierarchicalStats]:
    """Improve ``groups`` in pipeline ``order``; never returns a TOTAL above the start's.

    Coarse step: :func:`region_order`, kept if cheaper. Fine step: random swap and 2-opt moves,
    each accepted when it lowers TOTAL, or keeps it and lowers the sum of group DP costs plus
    twice the path's edge sum (a smooth companion that lets the search walk plateaus of the max).
    Stops after ``max_moves`` tried moves, ``patience_moves`` without a lower TOTAL, or
    ``time_limit_s`` (the move count makes a run deterministic for a seed when it binds first).
    """
    t0 = time.perf_counter()
    state = PathState(ev, groups, order)
    stats = HierarchicalStats(start_total_s=state.total)
    stats.curve.append((0.0, state.total))
    cands = [PathState(ev, state.groups, region_order(ev, state.groups))]
    cands += [PathState(ev, g, np.arange(len(g))) for g in coarse_layouts(ev)]
    # host level: the hosts (and regions) stacked into aligned stage columns, stage order
    for g in aligned_layouts(ev):
        cands += [PathState(ev, g, np.arange(len(g))), PathState(ev, g, region_order(ev, g))]
    for coarse in cands:
        if coarse.total < state.total - 1e-12:
            state = coarse
            stats.time_to_best_s = time.perf_counter() - t0
            stats.curve.append((stats.time_to_best_s, state.total))
    best = state.total
    smooth = float(state.dp.sum() + 2.0 * state.edge.sum())
    m, dpn = len(state.groups), len(state.groups[0])
    since = 0
    for move in range(max_moves):
        if time_limit_s is not None and move % 64 == 0 and time.perf_counter() - t0 > time_limit_s:
            stats.stopped_by = "time_limit"
            break
        if patience_moves is not None and since >= patience_moves:
            stats.stopped_by = "patience"
            break
        stats.moves_tried += 1
        since += 1
        r = rng.random()
        if r < 0.25 and m > 2:
            i, j = sorted(rng.choice(m, size=2, replace=False).tolist())
            new, pend = state.reverse_delta(i, j)
            kind = "reverse"
        elif m > 1:
            if r < 0.5:
                a = int(np.argmax(state.dp))  # the group that sets DATAP
            else:
                a = int(state.order[rng.integers(m)])
            if r < 0.75:  # a path neighbour of a: the edge between them may get cheaper
                p = int(state.pos[a])
                nb = [q for q in (p - 1, p + 1) if 0 <= q < m]
                b = int(state.order[nb[rng.integers(len(nb))]])
            else:
                b = int(rng.integers(m - 1))
                b += b >= a
            da = state.groups[a][rng.integers(dpn)]
            # prefer a partner device from the block (region) group a mostly lives in
            cand = [d for d in state.groups[b] if _same_block(ev, state.groups[a], d)]
            pool = cand if cand and rng.random() < 0.8 else list(state.groups[b])
            db = pool[rng.integers(len(pool))]
            new, pend = state.swap_delta(a, da, b, db)
            kind = "swap"
        else:
            break
        if new > best + 1e-12:
            continue
        if kind == "swap":
            a, b, _, _, na, nbv, idx, ne = pend
            new_smooth = (
                smooth
                - state.dp[a]
                - state.dp[b]
                + na
                + nbv
                + 2.0 * (ne.sum() - state.edge[idx].sum())
            )
        else:
            _, _, idx, ne = pend
            new_smooth = smooth + 2.0 * (ne.sum() - state.edge[idx].sum())
        if new < best - 1e-12 or new_smooth < smooth - 1e-12:
            (state.apply_swap if kind == "swap" else state.apply_reverse)(pend)
            smooth = float(new_smooth)
            stats.moves_applied += 1
            if new < best - 1e-12:
                best = new
                since = 0
                stats.time_to_best_s = time.perf_counter() - t0
                stats.curve.append((stats.time_to_best_s, best))
    stats.best_total_s = state.total
    stats.curve.append((time.perf_counter() - t0, state.total))
    return state, stats
