"""Bottleneck perfect matching between two DP groups (paper §3.3, PIPELINEP-COST step 1).

Given the (n, n) matrix of link times between the devices of two groups, the coarse edge weight
is min over perfect matchings of the largest matched entry. Two exact routines:

- :func:`bottleneck_matching`: binary search over the sorted distinct entries, testing each
  threshold for a perfect matching with Hopcroft–Karp (``scipy.sparse.csgraph``); returns the
  value *and* a matching that attains it. Any n.
- :func:`bottleneck_values`: values only, for a batch of matrices at once, by the same threshold
  search with augmenting paths, compiled with numba. This is the scheduler's inner loop; tests
  check that both agree.

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

import numpy as np

from system.compiled import kernel

log = logging.getLogger(__name__)

__all__ = ["bottleneck_matching", "bottleneck_values"]


def _check_square(m: np.ndarray, name: str) -> np.ndarray:
    m = np.asarray(m, dtype=float)
    if m.ndim != 2 or m.shape[0] != m.shape[1] or m.shape[0] == 0:
        raise ValueError(f"{name}: need a non-empty square matrix, got shape {m.shape}")
    if not np.all(np.isfinite(m)):
        raise ValueError(f"{name}: entries must be finite")
    return m


def _perfect_matching(allowed: np.ndarray) -> np.ndarray | None:
    """Hopcroft–Karp on a boolean (n, n) matrix: column per row, or None if not perfect."""
    # scipy is imported at the first matching, not with the module: the command line's start
    # (every configuration check and error message) does not wait for it
    from scipy.sparse import csr_matrix
    from scipy.sparse.csgraph import maximum_bipartite_matching

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


@kernel
def _values(c: np.ndarray, out: np.ndarray) -> None:
    """``out[k]`` = the bottleneck matching value of ``c[k]`` (see :func:`bottleneck_values`).

    The thresholds tried: first the lower bound max(largest row minimum, largest column
    minimum) (every row and column is matched), then a binary search over the sorted distinct
    entries above it. A threshold admits a perfect matching of {(i, j): c[i, j] <= it} when
    augmenting paths, found breadth-first from each row in turn, match every row (O(n³))."""
    n = c.shape[1]
    row_of = np.empty(n, dtype=np.int64)  # row matched to each column
    col_of = np.empty(n, dtype=np.int64)  # column matched to each row
    parent = np.empty(n, dtype=np.int64)  # the row a column was reached from
    queue = np.empty(n, dtype=np.int64)
    for k in range(c.shape[0]):
        lower = -np.inf
        for i in range(n):
            row_min = np.inf
            col_min = np.inf
            for j in range(n):
                row_min = min(row_min, c[k, i, j])
                col_min = min(col_min, c[k, j, i])
            lower = max(lower, row_min, col_min)
        values = np.empty(0)
        lo, hi = -1, -1  # -1: the lower bound is being tried; then values[lo - 1] fails
        threshold = lower
        while True:
            row_of[:] = -1
            col_of[:] = -1
            perfect = True
            for start in range(n):
                parent[:] = -1
                queue[0] = start
                head, tail, free = 0, 1, -1
                while head < tail and free < 0:
                    i = queue[head]
                    head += 1
                    for j in range(n):
                        if parent[j] < 0 and c[k, i, j] <= threshold:
                            parent[j] = i
                            if row_of[j] < 0:
                                free = j
                                break
                            queue[tail] = row_of[j]
                            tail += 1
                if free < 0:
                    perfect = False  # this row cannot be matched
                    break
                j = free
                while j >= 0:  # flip the path back to the start row
                    i = parent[j]
                    nxt = col_of[i]
                    row_of[j] = i
                    col_of[i] = j
                    j = nxt
            if lo < 0:
                if perfect:
                    out[k] = lower
                    break
                values = np.unique(c[k])
                lo = np.searchsorted(values, lower, side="right")
                hi = values.size - 1  # the largest entry admits every matching
            elif perfect:
                hi = (lo + hi) // 2
            else:
                lo = (lo + hi) // 2 + 1
            if lo >= hi:
                out[k] = values[hi]
                break
            threshold = values[(lo + hi) // 2]


def bottleneck_values(costs: np.ndarray) -> np.ndarray:
    """Bottleneck matching values of a batch ``(K, n, n)`` of matrices.

    Most matrices attain the lower bound max(row minima, column minima): that threshold is tested
    first; the rest binary-search the sorted distinct entries above it. Each threshold is tested
    by augmenting paths, compiled (numba). Only comparisons: the values are exact, the same as
    :func:`bottleneck_matching`'s.
    """
    c = np.asarray(costs, dtype=float)
    if c.ndim != 3 or c.shape[1] != c.shape[2] or c.shape[1] == 0:
        raise ValueError(f"bottleneck_values: need a (K, n, n) batch, got shape {c.shape}")
    if np.isnan(c).any():
        raise ValueError("bottleneck_values: entries must not be NaN")
    out = np.empty(c.shape[0])
    _values(np.ascontiguousarray(c), out)
    return out
