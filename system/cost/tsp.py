"""Open-loop TSP on the coarsened group graph (paper §3.3, PIPELINEP-COST step 2).

The pipeline visits every DP group once, starting anywhere: the cheapest Hamiltonian path.

- :func:`open_tsp_values`: exact Held–Karp for a batch ``(K, m, m)`` of weight matrices, m <= 16,
  compiled (numba): 2^m · m² steps per matrix, no temporaries.
- :func:`open_tsp_path`: one matrix, returns ``(cost, order)``; exact Held–Karp for m <= 16, else
  nearest-neighbour paths from 8 spread-out starts, each improved by vectorized 2-opt (a
  heuristic: the cost is an upper bound, and it is the true cost of the returned order).

Example:
    >>> w = np.array([[0, 1, 9], [1, 0, 2], [9, 2, 0]], dtype=float)
    >>> cost, order = open_tsp_path(w)
    >>> cost, order
    (3.0, [0, 1, 2])
"""

from __future__ import annotations

import logging

import numpy as np

from system.compiled import kernel

log = logging.getLogger(__name__)

__all__ = ["open_tsp_values", "open_tsp_path", "path_cost", "MAX_EXACT_TSP"]

MAX_EXACT_TSP = 16  # largest group count solved exactly


@kernel
def _open_values(w: np.ndarray, out: np.ndarray, dp: np.ndarray) -> None:
    """``out[k]`` = the cheapest open path of ``w[k]`` by Held–Karp; ``dp`` (2^m, m) is the
    table, left holding the last matrix's: dp[S, j] = cheapest path over the set S ending at j
    (any start) = min over i in S - j of dp[S - j, i] + w[i, j]. Sets in increasing order, so
    S - j is done before S. Only additions and minima: the values do not depend on the order
    the candidates are visited in."""
    m = w.shape[1]
    n = 1 << m
    for k in range(w.shape[0]):
        dp[:, :] = np.inf
        for j in range(m):
            dp[1 << j, j] = 0.0
        for s in range(3, n):
            if s & (s - 1) == 0:
                continue  # one member: set above
            for j in range(m):
                if not (s >> j) & 1:
                    continue
                prev = s ^ (1 << j)
                best = np.inf
                for i in range(m):
                    if (prev >> i) & 1:
                        c = dp[prev, i] + w[k, i, j]
                        if c < best:
                            best = c
                dp[s, j] = best
        best = np.inf
        for j in range(m):
            if dp[n - 1, j] < best:
                best = dp[n - 1, j]
        out[k] = best


def _check_weights(w: np.ndarray, name: str) -> np.ndarray:
    w = np.asarray(w, dtype=float)
    if w.ndim < 2 or w.shape[-1] != w.shape[-2] or w.shape[-1] == 0:
        raise ValueError(f"{name}: need square weight matrices, got shape {w.shape}")
    if not np.all(np.isfinite(w)):
        raise ValueError(f"{name}: weights must be finite")
    return w


def open_tsp_values(weights: np.ndarray) -> np.ndarray:
    """Exact cheapest Hamiltonian-path cost of each matrix in a ``(K, m, m)`` batch, m <= 16."""
    w = _check_weights(weights, "open_tsp_values")
    if w.ndim != 3:
        raise ValueError(f"open_tsp_values: need a (K, m, m) batch, got shape {w.shape}")
    k, m, _ = w.shape
    if m > MAX_EXACT_TSP:
        raise ValueError(f"open_tsp_values: exact only up to {MAX_EXACT_TSP} groups, got {m}")
    if m == 1 or k == 0:
        return np.zeros(k)
    out = np.empty(k)
    _open_values(np.ascontiguousarray(w), out, np.empty((1 << m, m)))
    return out


def path_cost(weights: np.ndarray, order: list[int]) -> float:
    w = np.asarray(weights, dtype=float)
    return float(sum(w[a, b] for a, b in zip(order[:-1], order[1:], strict=True)))


def _exact_path(w: np.ndarray) -> list[int]:
    m = w.shape[0]
    dp = np.empty((1 << m, m))
    _open_values(np.ascontiguousarray(w[None]), np.empty(1), dp)
    mask = (1 << m) - 1
    j = int(np.argmin(dp[mask]))
    order = [j]
    while mask != (1 << j):
        prev = mask ^ (1 << j)
        i = int(np.argmin(dp[prev] + w[:, j]))
        order.append(i)
        mask, j = prev, i
    return order[::-1]


def _nearest_neighbour(w: np.ndarray, start: int) -> np.ndarray:
    m = w.shape[0]
    order = [start]
    free = np.ones(m, dtype=bool)
    free[start] = False
    for _ in range(m - 1):
        row = np.where(free, w[order[-1]], np.inf)
        nxt = int(np.argmin(row))
        order.append(nxt)
        free[nxt] = False
    return np.array(order)


def _two_opt(w: np.ndarray, order: np.ndarray, max_moves: int = 10_000) -> np.ndarray:
    """Best-improvement 2-opt on an open path, each round vectorized over all (i, j).

    A dummy node joined to everything at weight 0 closes the path, so reversing q[i..j] changes
    edges (q[i-1], q[i]) and (q[j], q[j+1]) into (q[i-1], q[j]) and (q[i], q[j+1]).
    """
    m = w.shape[0]
    wp = np.zeros((m + 1, m + 1))
    wp[:m, :m] = w
    q = np.concatenate([[m], order, [m]])
    upper = np.triu(np.ones((m, m), dtype=bool), k=1)
    for _ in range(max_moves):
        c = wp[q[:-1], q[1:]]  # (m+1,) edge k joins q[k], q[k+1]
        x = wp[np.ix_(q[0:m], q[1 : m + 1])]  # x[i-1, j-1] = w(q[i-1], q[j])
        y = wp[np.ix_(q[1 : m + 1], q[2 : m + 2])]  # y[i-1, j-1] = w(q[i], q[j+1])
        delta = x + y - c[0:m, None] - c[None, 1 : m + 1]
        delta[~upper] = 0.0
        k = int(np.argmin(delta))
        i, j = divmod(k, m)
        if delta[i, j] >= -1e-12:
            break
        q[i + 1 : j + 2] = q[i + 1 : j + 2][::-1].copy()
    return q[1:-1]


def _heuristic_path(w: np.ndarray, starts: int = 8) -> list[int]:
    """Nearest neighbour from ``starts`` spread-out groups, each improved by 2-opt; the best."""
    m = w.shape[0]
    best, best_cost = None, np.inf
    for s in np.unique(np.linspace(0, m - 1, max(1, min(starts, m))).astype(int)):
        order = _two_opt(w, _nearest_neighbour(w, int(s)))
        cost = float(w[order[:-1], order[1:]].sum())
        if cost < best_cost:
            best, best_cost = order, cost
    return [int(x) for x in best]


def open_tsp_path(weights: np.ndarray, starts: int = 8) -> tuple[float, list[int]]:
    """Cheapest Hamiltonian path (any start): ``(cost, order)``; exact up to 16 groups."""
    w = _check_weights(weights, "open_tsp_path")
    if w.ndim != 2:
        raise ValueError(f"open_tsp_path: need one (m, m) matrix, got shape {w.shape}")
    m = w.shape[0]
    if m == 1:
        return 0.0, [0]
    if m <= MAX_EXACT_TSP:
        order = _exact_path(w)
        order = order if order[0] < order[-1] else order[::-1]  # one direction, deterministic
        return path_cost(w, order), order
    order = _heuristic_path(w, starts)
    return path_cost(w, order), order
