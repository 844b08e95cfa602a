"""Bottleneck perfect matching between two DP groups (paper §3.3, PIPELINEP-COST step 1).

Given the (n, n) matrix of link times between the devices of two groups, the coarse edge weight
is min over perfect matchings of the largest matched entry. Two exact routines:

- :func:`bottleneck_matching`: binary search over the sorted distinct entries, testing each
  threshold for a perfect matching with Hopcroft–Karp (``scipy.sparse.csgraph``); returns the
  value *and* a matching that attains it. Any n.
- :func:`bottleneck_values`: values only, for a batch of small matrices at once (n <= 12), by a
  min-max dynamic program over column subsets, vectorized with numpy. This is the scheduler's
  inner loop; tests check that both agree.

Example:
    >>> m = np.array([[1.0, 9.0], [2.0, 3.0]])
    >>> value, perm = bottleneck_matching(m)
    >>> value, perm.tolist()
    (3.0, [0, 1])
    >>> float(bottleneck_values(m[None])[0])
    3.0
"""

from __future__ import annotations

import logging
from functools import cache

import numpy as np
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import maximum_bipartite_matching

log = logging.getLogger(__name__)

__all__ = ["bottleneck_matching", "bottleneck_values", "MAX_DP_BATCH_N"]

MAX_DP_BATCH_N = 12  # largest n for the subset DP (2^n · n work per matrix)


def _check_square(m: np.ndarray, name: str) -> np.ndarray:
    m = np.asarray(m, dtype=float)
    if m.ndim != 2 or m.shape[0] != m.shape[1] or m.shape[0] == 0:
        raise ValueError(f"{name}: need a non-empty square matrix, got shape {m.shape}")
    if not np.all(np.isfinite(m)):
        raise ValueError(f"{name}: entries must be finite")
    return m


def _perfect_matching(allowed: np.ndarray) -> np.ndarray | None:
    """Hopcroft–Karp on a boolean (n, n) matrix: column per row, or None if not perfect."""
    n = allowed.shape[0]
    _, cols = np.nonzero(allowed)  # row-major: each row's columns in order, as csr wants them
    indptr = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(allowed.sum(axis=1), out=indptr[1:])
    graph = csr_matrix((np.ones(cols.size, dtype=bool), cols.astype(np.int32), indptr), (n, n))
    match = maximum_bipartite_matching(graph, perm_type="column")
    return None if np.any(match < 0) else match


def bottleneck_matching(cost: np.ndarray) -> tuple[float, np.ndarray]:
    """Exact bottleneck perfect matching of a square cost matrix.

    Returns ``(value, perm)`` where row ``i`` is matched to column ``perm[i]`` and
    ``max_i cost[i, perm[i]] == value`` is the minimum possible.

    Raises:
        ValueError: if ``cost`` is not a finite non-empty square matrix.
    """
    m = _check_square(cost, "bottleneck_matching")
    # Every row and every column must be matched: the value is at least the largest row minimum
    # and the largest column minimum. Often this bound is the answer; try it first.
    lower = max(m.min(axis=1).max(), m.min(axis=0).max())
    values = np.unique(m)
    values = values[values >= lower]
    first = _perfect_matching(m <= values[0])
    if first is not None:
        return float(values[0]), first.astype(np.int64)
    lo, hi = 1, len(values) - 1
    best = None  # the matching at values[hi] once one was found; the largest value always has one
    while lo < hi:  # invariant: values[lo-1] fails, values[hi] succeeds
        mid = (lo + hi) // 2
        got = _perfect_matching(m <= values[mid])
        if got is None:
            lo = mid + 1
        else:
            hi, best = mid, got
    if best is None:
        best = _perfect_matching(m <= values[hi])
        assert best is not None
    return float(values[hi]), best.astype(np.int64)


@cache
def _subset_tables(n: int) -> list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]:
    """Per popcount level L: valid transitions mask <- mask - c for c in mask, flattened.

    Returns per level ``(tgt, src, col, starts)``: target masks (sorted, distinct), predecessor
    masks and the column of each transition, and the first transition of each target (for
    ``np.minimum.reduceat``).
    """
    masks = np.arange(1 << n, dtype=np.int64)
    bits = (masks[:, None] >> np.arange(n)[None, :]) & 1 == 1
    pop = bits.sum(axis=1)
    levels = []
    for level in range(1, n + 1):
        s_idx, col = np.nonzero(bits[pop == level])
        mask = masks[pop == level][s_idx]
        tgt, starts = np.unique(mask, return_index=True)
        levels.append((tgt, mask ^ (1 << col), col, starts))
    return levels


def _lower_bounds(c: np.ndarray) -> np.ndarray:
    """Every row and column is matched: value >= max(largest row min, largest column min)."""
    return np.maximum(c.min(axis=2).max(axis=1), c.min(axis=1).max(axis=1))


def _reaches(allowed: np.ndarray) -> np.ndarray:
    """Whether each boolean (n, n) matrix of a batch has a perfect matching (subset DP)."""
    k, n, _ = allowed.shape
    r = np.zeros((k, 1 << n), dtype=np.uint8)
    r[:, 0] = 1
    a = allowed.astype(np.uint8)
    for level, (tgt, src, col, starts) in enumerate(_subset_tables(n)):
        r[:, tgt] = np.maximum.reduceat(r[:, src] & a[:, level, col], starts, axis=1)
    return r[:, -1] == 1


def bottleneck_values(costs: np.ndarray) -> np.ndarray:
    """Bottleneck matching values of a batch ``(K, n, n)`` of matrices, n <= 12.

    Most matrices attain the lower bound max(row minima, column minima): test that threshold with
    a boolean subset DP first. The rest run the min-max DP g[mask] = min over c in mask of
    max(g[mask - c], cost[|mask| - 1, c]) (rows 0..|mask|-1 matched onto the columns in mask).
    """
    c = np.asarray(costs, dtype=float)
    if c.ndim != 3 or c.shape[1] != c.shape[2] or c.shape[1] == 0:
        raise ValueError(f"bottleneck_values: need a (K, n, n) batch, got shape {c.shape}")
    k, n, _ = c.shape
    if n > MAX_DP_BATCH_N:
        return np.array([bottleneck_matching(x)[0] for x in c])
    if k == 0:
        return np.zeros(0)
    out = _lower_bounds(c)
    rest = np.flatnonzero(~_reaches(c <= out[:, None, None]))
    if rest.size:
        cr = c[rest]
        g = np.empty((rest.size, 1 << n))
        g[:, 0] = -np.inf
        for level, (tgt, src, col, starts) in enumerate(_subset_tables(n)):
            cand = np.maximum(g[:, src], cr[:, level, col])
            g[:, tgt] = np.minimum.reduceat(cand, starts, axis=1)
        out[rest] = g[:, -1]
    return out
