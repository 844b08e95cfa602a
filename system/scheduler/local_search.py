"""Local search for the hybrid GA (paper §3.4): circular move sequences, tailored or KL gains.

A *circular move sequence* (cyclic Kernighan–Lin, Kang & Moon) moves v0: p0→p1, v1: p1→p2, …
and is closed by a move back into p0, so every closed prefix is a balanced partition. Which
vertex moves next is chosen by a gain:

- ``tailored`` (the paper's): each group's fastest internal pair (d1, d2) by pipeline link time
  are the movable candidates; gain(v: p→q) = mean PP link time from v to q − v's fastest PP link
  inside p (moving one end of a fast pair out keeps the DP cost, and the fast link can become a
  pipeline link).
- ``kl``: classic external − internal gain with edge weight 1/β (bit/s⁻¹), blind to pipelines.

Unlike the authors' code, every candidate partition is costed with the true TOTAL (batched in a
:class:`PartitionEvaluator`) and a step is taken only if it lowers TOTAL. The tailored search also
tries the paper's four swaps d1↔d1', d1↔d2', d2↔d1', d2↔d2' for every pair of groups.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

import numpy as np

from system.cost.partition import PartitionEvaluator

log = logging.getLogger(__name__)

__all__ = ["local_search", "LOCAL_SEARCHES", "Partition"]

Partition = list[tuple[int, ...]]  # pp sorted groups
LOCAL_SEARCHES = ("tailored", "kl")
# Neighbourhood limits per step: all of it for pp <= 8 groups; sampled beyond (256+ devices).
MAX_STARTS = 8  # start groups of circular sequences


def _fast_pair(link: np.ndarray, g: tuple[int, ...]) -> tuple[int, int]:
    """The two members of group ``g`` joined by its fastest pipeline link."""
    idx = np.asarray(g)
    sub = link[np.ix_(idx, idx)] + np.diag(np.full(len(g), np.inf))
    i, j = np.unravel_index(int(np.argmin(sub)), sub.shape)
    return int(idx[i]), int(idx[j])


def _apply(part: Partition, moves: Sequence[tuple[int, int, int]]) -> Partition:
    """Apply moves (device, from_group, to_group); returns new sorted groups."""
    groups = [set(g) for g in part]
    for v, a, b in moves:
        groups[a].remove(v)
        groups[b].add(v)
    return [tuple(sorted(g)) for g in groups]


class _Gains:
    """Gain of moving v from group p to group q for one gain rule."""

    def __init__(self, ev: PartitionEvaluator, rule: str) -> None:
        self.link = ev.pp_link_s
        self.rule = rule
        self._pairs: dict[tuple[int, ...], list[int]] = {}
        if rule == "kl":
            w = 1.0 / ev.cluster.bandwidth_bps  # weight ∝ 1/β; diagonal is 1/inf = 0
            self.w = w

    def candidates(self, g: set[int]) -> list[int]:
        if self.rule == "tailored" and len(g) >= 2:
            key = tuple(sorted(g))
            got = self._pairs.get(key)
            if got is None:
                got = self._pairs[key] = list(_fast_pair(self.link, key))
            return got
        return sorted(g)

    def gains(self, v: int, src: set[int], dsts: list[set[int]]) -> list[float]:
        """:meth:`gain` of moving v from ``src`` to each of ``dsts``, the same floats. Tailored
        gains into groups of one size are taken in one batch: numpy's mean along the rows of a
        matrix adds in the order and grouping of the mean of each row alone."""
        sizes = {len(d) for d in dsts}
        if self.rule != "tailored" or len(sizes) != 1 or 0 in sizes:
            return [self.gain(v, src, d) for d in dsts]
        others = [u for u in src if u != v]
        inside = float(self.link[v, others].min()) if others else 0.0
        means = self.link[v][np.array([list(d) for d in dsts])].mean(axis=1)
        return [m - inside for m in means.tolist()]

    def gain(self, v: int, src: set[int], dst: set[int]) -> float:
        others = [u for u in src if u != v]
        dst_l = list(dst)
        if self.rule == "tailored":
            inside = float(self.link[v, others].min()) if others else 0.0
            return float(self.link[v, dst_l].mean()) - inside if dst_l else -inside
        # KL: external (to dst) − internal (to the rest of src), on weight 1/β. Moving v from a
        # group it is weakly tied to into one it is strongly tied to lowers the cut (gain > 0)
        return float(self.w[v, dst_l].sum() - self.w[v, others].sum())


def _cycle_candidates(
    part: Partition, gains: _Gains, start: int, rng: np.random.Generator, max_len: int = 8
) -> list[Partition]:
    """Closed prefixes of one circular move sequence that starts by moving out of ``start``."""
    pp = len(part)
    groups = [set(g) for g in part]
    moves: list[tuple[int, int, int]] = []
    locked: set[int] = set()
    visited = {start}
    cur = start  # group that must give a vertex away next
    out: list[Partition] = []
    for _ in range(min(pp - 1, max_len)):
        best = None
        order = [q for q in rng.permutation(pp).tolist() if q not in visited]
        movers = [v for v in gains.candidates(groups[cur]) if v not in locked]
        table = [gains.gains(v, groups[cur], [groups[q] for q in order]) for v in movers]
        for i, q in enumerate(order):  # the first best in this order wins
            for v, row in zip(movers, table, strict=True):
                if best is None or row[i] > best[0]:
                    best = (row[i], v, q)
        if best is None:
            break
        _, v, q = best
        groups[cur].remove(v)
        groups[q].add(v)
        moves.append((v, cur, q))
        locked.add(v)
        visited.add(q)
        cur = q
        # close the cycle: the best unlocked vertex of ``cur`` goes back to ``start``
        close = None
        for u in gains.candidates(groups[cur]) or sorted(groups[cur]):
            if u in locked:
                continue
            g = gains.gain(u, groups[cur], groups[start])
            if close is None or g > close[0]:
                close = (g, u)
        if close is not None:
            out.append(_apply(part, moves + [(close[1], cur, start)]))
    return out


def _swap_candidates(
    part: Partition, gains: _Gains, rng: np.random.Generator, max_pairs: int = 32
) -> list[Partition]:
    """The paper's four swaps between the fastest pairs of two groups, for every pair of groups
    (or ``max_pairs`` random pairs of groups when there are more)."""
    cands = [gains.candidates(set(g))[:2] for g in part]
    out = []
    pairs = [(p, q) for p in range(len(part)) for q in range(p + 1, len(part))]
    if len(pairs) > max_pairs:
        pairs = [pairs[k] for k in rng.choice(len(pairs), max_pairs, replace=False)]
    for p, q in pairs:
        for a in cands[p]:
            for b in cands[q]:
                out.append(_apply(part, [(a, p, q), (b, q, p)]))
    return out


def _random_swaps(part: Partition, limit: int, rng: np.random.Generator) -> list[Partition]:
    """All single swaps between groups if there are at most ``limit``, else ``limit`` at random."""
    pp = len(part)
    pairs = [
        (p, q, a, b) for p in range(pp) for q in range(p + 1, pp) for a in part[p] for b in part[q]
    ]
    if len(pairs) > limit:
        pairs = [pairs[k] for k in rng.choice(len(pairs), limit, replace=False)]
    return [_apply(part, [(a, p, q), (b, q, p)]) for p, q, a, b in pairs]


def _block_labels(ev: PartitionEvaluator) -> list[list[int]]:
    """Host and region labels per device (a list: the block moves read them one at a time),
    each only if some block holds two or more devices."""
    out = []
    for labels in (ev.cluster.host_of, ev.cluster.region_of):
        _, lab, counts = np.unique(np.asarray(labels), return_inverse=True, return_counts=True)
        if counts.max() >= 2:
            out.append([int(x) for x in lab])
    return out


def _mirror(
    part: Partition, lab: list[int], p: int, q: int, rng: np.random.Generator
) -> Partition | None:
    """Block move: give group ``q`` the same block profile as group ``p``.

    With hosts as blocks, every device of ``p`` has a fast partner in ``q`` exactly when both
    groups hold as many devices of each host; then the coarse edge (p, q) runs inside hosts. For
    each block that ``q`` lacks, devices of it are swapped in from the other groups (never
    ``p``) against members of ``q`` from blocks it holds too many of. Returns None when nothing
    changes.
    """
    groups = [list(g) for g in part]
    want: dict[int, int] = {}
    for v in groups[p]:
        want[lab[v]] = want.get(lab[v], 0) + 1
    have: dict[int, int] = {}
    for v in groups[q]:
        have[lab[v]] = have.get(lab[v], 0) + 1
    excess = [v for v in groups[q] if have[lab[v]] > want.get(lab[v], 0)]
    # drop the excess members of the most over-represented blocks first (deterministic given rng)
    excess = [excess[k] for k in rng.permutation(len(excess))]
    surplus = {b: have[b] - want.get(b, 0) for b in have}
    out_q: list[int] = []
    for v in excess:
        if surplus[lab[v]] > 0:
            out_q.append(v)
            surplus[lab[v]] -= 1
    others = [r for r in rng.permutation(len(groups)).tolist() if r not in (p, q)]
    moved = False
    for b, n in want.items():
        need = n - have.get(b, 0)
        for r in others:
            if need <= 0 or not out_q:
                break
            for u in [u for u in groups[r] if lab[u] == b][:need]:
                if not out_q:
                    break
                v = out_q.pop()
                groups[r].remove(u)
                groups[q].remove(v)
                groups[r].append(v)
                groups[q].append(u)
                need -= 1
                moved = True
    return [tuple(sorted(g)) for g in groups] if moved else None


def _rebuild(
    part: Partition, lab: list[int], targets: Sequence[int], rng: np.random.Generator
) -> Partition | None:
    """Block move: re-split the ``k`` groups ``targets`` into same-block k-tuples.

    Devices of the ``k`` groups are cut into k-tuples within their block; the left-over ones
    are swapped out against devices from the other groups that complete a tuple (first the
    rest of a partial tuple, then ``k`` devices of one block). With ``dp`` tuples, group
    ``targets[i]`` takes member ``i`` of every tuple, so each coarse edge among the ``k`` groups
    has a perfect matching inside blocks (a pipeline boundary that runs inside hosts for every
    replica at once). Returns None when ``dp`` tuples cannot be formed this way.
    """
    k = len(targets)
    groups = [list(g) for g in part]
    dp = len(groups[targets[0]])
    by_block: dict[int, list[int]] = {}
    for t in targets:
        for v in groups[t]:
            by_block.setdefault(lab[v], []).append(v)
    tuples: list[list[int]] = []
    partial: list[list[int]] = []
    for members in by_block.values():
        full = len(members) - len(members) % k
        tuples += [members[i : i + k] for i in range(0, full, k)]
        if full < len(members):
            partial.append(members[full:])
    outside: dict[int, list[tuple[int, int]]] = {}  # block -> [(device, its group)]
    for r in rng.permutation(len(groups)).tolist():
        if r not in targets:
            for u in groups[r]:
                outside.setdefault(lab[u], []).append((u, r))
    partial = [partial[i] for i in rng.permutation(len(partial))]
    spare = [v for rest in partial for v in rest]  # devices that may leave the targets
    swaps: list[tuple[int, int, int]] = []  # (leaving device, arriving device, other group)
    for rest in partial:  # complete partial tuples from outside
        need = k - len(rest)
        cand = outside.get(lab[rest[0]], [])
        if len(tuples) >= dp or len(cand) < need or len(spare) - len(rest) < need:
            continue
        if any(v not in spare for v in rest):  # part of it already sent out
            continue
        for v in rest:
            spare.remove(v)
        got = [cand.pop() for _ in range(need)]
        swaps += [(spare.pop(), w, r) for w, r in got]
        tuples.append(rest + [w for w, _ in got])
    for b in rng.permutation(sorted(outside)).tolist():  # whole tuples from outside
        while len(tuples) < dp and len(spare) >= k and len(outside[b]) >= k:
            got = [outside[b].pop() for _ in range(k)]
            swaps += [(spare.pop(), w, r) for w, r in got]
            tuples.append([w for w, _ in got])
    if len(tuples) < dp:
        return None
    for out, w, r in swaps:
        groups[r].remove(w)
        groups[r].append(out)
    for i, t in enumerate(targets):
        groups[t] = [tup[i] for tup in tuples[:dp]]
    new = [tuple(sorted(g)) for g in groups]
    return None if new == part else new


def _block_candidates(
    part: Partition, labels: list[list[int]], rng: np.random.Generator, max_sets: int = 12
) -> list[Partition]:
    """Block moves per block labelling: :func:`_mirror` for up to ``max_sets`` ordered group
    pairs, and :func:`_rebuild` for up to ``max_sets`` group sets of each size k = 2..4."""
    pp = len(part)
    out = []
    for lab in labels:
        pairs = [(p, q) for p in range(pp) for q in range(pp) if p != q]
        for i in rng.permutation(len(pairs))[:max_sets]:
            got = _mirror(part, lab, *pairs[int(i)], rng)
            if got is not None:
                out.append(got)
        for k in range(2, min(4, pp) + 1):
            for _ in range(max_sets):
                got = _rebuild(part, lab, rng.choice(pp, k, replace=False).tolist(), rng)
                if got is not None:
                    out.append(got)
    return out


def local_search(
    ev: PartitionEvaluator,
    part: Partition,
    total: float,
    rng: np.random.Generator,
    *,
    rule: str = "tailored",
    max_steps: int = 50,
    swap_sample: int = 0,
    tie_break: bool = False,
    deadline: float | None = None,
    block_moves: bool = True,
) -> tuple[Partition, float]:
    """Improve ``part`` by circular move sequences until no start group improves TOTAL.

    Each step builds one sequence per start group (plus, for ``tailored``, the four-candidate
    swaps and the block moves of :func:`_block_candidates` over hosts and regions), costs every
    candidate with the true TOTAL in one batch, and applies the best one if it is lower. When
    that fails and ``swap_sample`` > 0, one more try costs up to ``swap_sample`` plain swaps
    (all of them on small instances) before giving up: the fast-pair candidates alone leave
    most devices unmovable. With ``tie_break``, a step that keeps TOTAL but lowers
    :meth:`PartitionEvaluator.spread` (or, failing that, its ``smooth_spread``) is also taken
    (lexicographic objective: TOTAL never rises, so the search still ends). Stops early once
    ``time.perf_counter()`` passes ``deadline``. Returns the improved partition and its TOTAL.
    """
    if rule not in LOCAL_SEARCHES:
        raise ValueError(f"local search rule {rule!r} unknown; known: {', '.join(LOCAL_SEARCHES)}")
    gains = _Gains(ev, rule)
    blocks = _block_labels(ev) if rule == "tailored" and block_moves else []
    pp = len(part)
    for _ in range(max_steps):
        if deadline is not None and time.perf_counter() >= deadline:
            break
        cands: list[Partition] = []
        for start in rng.permutation(pp)[:MAX_STARTS]:
            cands.extend(_cycle_candidates(part, gains, int(start), rng))
        if rule == "tailored":
            cands.extend(_swap_candidates(part, gains, rng))
            cands.extend(_block_candidates(part, blocks, rng))
        if not cands:
            break
        totals = ev.totals(cands, bound=total, deadline=deadline)
        k = int(np.argmin(totals))
        if totals[k] >= total - 1e-12 and swap_sample > 0:
            cands = _random_swaps(part, swap_sample, rng)
            totals = ev.totals(cands, bound=total, deadline=deadline)
            k = int(np.argmin(totals))
        if totals[k] < total - 1e-12:
            part, total = cands[k], float(totals[k])
            continue
        if not tie_break:
            break
        # plateau: among candidates with the same TOTAL take the one with the lowest spread
        ties = np.flatnonzero(totals <= total + 1e-12)
        if ties.size == 0:
            break
        tied = [cands[t] for t in ties]
        spreads = ev.spread(tied)
        j = int(np.argmin(spreads))
        if spreads[j] < float(ev.spread([part])[0]) - 1e-12:
            part = tied[j]
            continue
        # still flat: the smooth spread sees pairs of a coarse edge becoming fast one by one
        spreads = ev.smooth_spread(tied)
        j = int(np.argmin(spreads))
        if spreads[j] >= float(ev.smooth_spread([part])[0]) - 1e-12:
            break
        part = tied[j]
    return part, total
