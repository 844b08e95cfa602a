"""Open-loop TSP on the coarsened group graph (paper §3.3, PIPELINEP-COST step 2).

The pipeline visits every DP group once, starting anywhere: the cheapest Hamiltonian path.

- :func:`open_tsp_values`: exact Held–Karp for a batch ``(K, m, m)`` of weight matrices, m <= 16,
  vectorized over the batch and over all subsets of one size.
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
from functools import cache

import numpy as np

log = logging.getLogger(__name__)

__all__ = ["open_tsp_values", "open_tsp_path", "path_cost", "MAX_EXACT_TSP"]

MAX_EXACT_TSP = 16  # largest group count solved exactly


@cache
def _levels(m: int) -> list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]:
    """Held–Karp transitions per subset size L >= 2, flattened to valid (S, j) <- (S - j, i).

    For each level: ``tgt`` (distinct state ids S·m + j, sorted), ``src`` (state ids
    (S - j)·m + i), ``wid`` (weight ids i·m + j) and ``starts`` (first transition of each target,
    for ``np.minimum.reduceat``). Only i, j in S with i != j appear: 4-5x fewer than a dense gather.
    """
    masks = np.arange(1 << m, dtype=np.int64)
    bits = (masks[:, None] >> np.arange(m)[None, :]) & 1 == 1  # (2^m, m) membership
    pop = bits.sum(axis=1)
    eye = np.eye(m, dtype=bool)
    out = []
    for level in range(2, m + 1):
        ms = masks[pop == level]
        b = bits[pop == level]
        # valid (S, j, i): j in S, i in S, i != j; C-order keeps each target (S, j) contiguous
        ok = b[:, :, None] & b[:, None, :] & ~eye[None, :, :]
        s_idx, j, i = np.nonzero(ok)
        mask = ms[s_idx]
        tgt_all = mask * m + j
        src = (mask ^ (1 << j)) * m + i
        wid = i * m + j
        tgt, starts = np.unique(tgt_all, return_index=True)
        out.append((tgt, src, wid, starts))
    return out


def _held_karp(w: np.ndarray) -> np.ndarray:
    """dp table (K, 2^m · m): cheapest path over set S ending at j (any start), id S·m + j."""
    k, m, _ = w.shape
    dp = np.full((k, (1 << m) * m), np.inf)
    singles = np.arange(m)
    dp[:, (1 << singles) * m + singles] = 0.0
    wf = w.reshape(k, m * m)
    for tgt, src, wid, starts in _levels(m):
        cand = dp[:, src] + wf[:, wid]
        dp[:, tgt] = np.minimum.reduceat(cand, starts, axis=1)
    return dp


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
    chunk = max(1, int(4e6 // ((1 << m) * m * m)))  # bound the (K, transitions) temporary
    out = np.empty(k)
    full = ((1 << m) - 1) * m
    for s in range(0, k, chunk):
        out[s : s + chunk] = _held_karp(w[s : s + chunk])[:, full : full + m].min(axis=1)
    return out


def path_cost(weights: np.ndarray, order: list[int]) -> float:
    w = np.asarray(weights, dtype=float)
    return float(sum(w[a, b] for a, b in zip(order[:-1], order[1:], strict=True)))


def _exact_path(w: np.ndarray) -> list[int]:
    m = w.shape[0]
    dp = _held_karp(w[None])[0].reshape(1 << m, m)
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
