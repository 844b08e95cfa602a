"""GPipe timeline with overlapped receive/compute/send (ours, paper §3.5), in closed form.

GPipe (all forwards, then all backwards), event-driven, exact for its model. For micro-batch i on
stage s with forward time f_s and a transfer time l_s from stage s to s+1::

    # forward: compute starts when the input arrived and the previous micro-batch is done
    F[s][i] = max(F[s][i-1], A[s][i]) + f_s           A[0][i] = start[0]
    # send stream: one transfer at a time per link, starts when the activation exists; with a
    # propagation delay d_s inside l_s the link is busy l_s − d_s and the message lands d_s later
    T[s][i] = max(T[s][i-1], F[s][i]) + (l_s − d_s)      A[s+1][i] = T[s][i] + d_s

Receive, compute and send run on separate streams, so a stage's steady-state slot per micro-batch
is max(recv, compute, send) — the paper's overlap. The backward pass is the mirror image, starting
on the last stage when its last forward is done. Each recurrence ``X[i] = max(X[i-1], Y[i]) + c``
is solved in closed form with a running maximum, ``X[i] = (i+1)·c + max(X[-1], cummax_j(Y[j] −
j·c))``, one compiled loop per phase over its chains (compute and link, stage by stage),
replicas and micro-batches. With free links and equal stages it gives GPipe's
(m + p − 1)·(t_f + t_b) exactly (tested).

Pipelines with blocking point-to-point calls (1F1B, blocking GPipe) are replayed op by op from
an op-order program instead: :mod:`system.simulator.replay`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from system.compiled import kernel

__all__ = ["GPipeTimes", "gpipe_timeline"]


@dataclass(frozen=True, slots=True)
class GPipeTimes:
    """End times (s) per (stage, replica) of one GPipe pass."""

    fwd_end_s: np.ndarray  # (p, r) end of the last forward
    bwd_end_s: np.ndarray  # (p, r) end of the last backward


@kernel
def _chains(first, cost, free, arrive, m):
    """(C, r) last values of C chained recurrences over m micro-batches and r replicas: chain c
    is X[i] = max(X[i-1], A[i]) + cost[c], X[-1] = free[c], in the module's closed form, its
    arrivals A the previous chain's values (the first chain's: ``first``), each plus
    ``arrive[c]`` where ``arrive`` is not NaN (a link's propagation delay, added on arrival).
    The maxima are numpy's (NaN wins, then the first argument)."""
    chains, r = cost.shape
    ends = np.empty((chains, r))
    x = np.empty(m)
    for j in range(r):
        for i in range(m):
            x[i] = first[j]
        for k in range(chains):
            c, top_free, delay = cost[k, j], free[k, j], arrive[k, j]
            run = 0.0
            for i in range(m):
                v = x[i] - i * c
                run = v if i == 0 else (run if (run >= v or run != run) else v)
                top = run if (run >= top_free or run != run) else top_free
                x[i] = (i + 1.0) * c + top
                if delay == delay:
                    x[i] = x[i] + delay
            ends[k, j] = x[m - 1]
    return ends


def _phase(first, compute, compute_free, link, link_free, delay, m) -> np.ndarray:
    """(p, r) ends of one phase's compute chains: stage by stage in the order given, each
    followed by the link to the next (``link``, ``link_free``, ``delay``: (p − 1, r))."""
    p, r = compute.shape
    cost, free, arrive = (np.full((2 * p - 1, r), np.nan) for _ in range(3))
    cost[0::2], free[0::2] = compute, compute_free
    cost[1::2], free[1::2], arrive[1::2] = link - delay, link_free, delay
    return np.ascontiguousarray(
        _chains(np.ascontiguousarray(first), cost, free, arrive, int(m))[0::2]
    )


def gpipe_timeline(
    fwd_s: np.ndarray,
    bwd_s: np.ndarray,
    link_fwd_s: np.ndarray,
    link_bwd_s: np.ndarray,
    micro_batches: int,
    start_s: np.ndarray | None = None,
    notice_fwd_s: np.ndarray | None = None,
    notice_bwd_s: np.ndarray | None = None,
    latency_fwd_s: np.ndarray | None = None,
    latency_bwd_s: np.ndarray | None = None,
) -> GPipeTimes:
    """One GPipe pass of ``micro_batches`` over p stages and r replicas.

    Args:
        fwd_s, bwd_s: (p,) or (p, r) compute seconds per micro-batch (backward incl. recompute).
        link_fwd_s: (p-1, r) seconds to send one activation from stage s to s+1 in each replica.
        link_bwd_s: (p-1, r) seconds to send one activation gradient from stage s+1 to s.
        micro_batches: m >= 1.
        start_s: (p, r) when each device is free to start (default 0): chains passes for
            gradient accumulation.
        notice_fwd_s, notice_bwd_s: (p-1, r) receive-ready rendezvous (gloo, NCCL): a message
            leaves only after its receiver posted the receive and that notice crossed the link.
            Stage s+1 posts its forward receives when its pass starts, so link s carries
            nothing before ``start_s[s+1] + notice_fwd_s[s]`` (one-way delay s+1 → s); stage s
            posts its backward receives when its forwards end, so gradients cross link s no
            earlier than ``fwd_end[s] + notice_bwd_s[s]`` (delay s → s+1). Default: no wait.
        latency_fwd_s, latency_bwd_s: (p-1, r) the part of each link time that is propagation
            delay: a stream (TCP) sends the next message after the previous one's bytes are on
            the wire, not after they arrived, so a link is busy ``link − latency`` per message
            and each message arrives ``latency`` after it left. Default 0: a link carries one
            whole message at a time.
    """
    if micro_batches < 1:
        raise ValueError(f"gpipe: micro_batches must be >= 1, got {micro_batches}")
    link_fwd_s, link_bwd_s = np.asarray(link_fwd_s, float), np.asarray(link_bwd_s, float)
    p = np.asarray(fwd_s).shape[0]
    if link_fwd_s.ndim == 2:
        r = link_fwd_s.shape[1]
    else:
        r = np.asarray(start_s).shape[1] if start_s is not None else 1
    f = np.broadcast_to(np.asarray(fwd_s, float).reshape(p, -1), (p, r))
    b = np.broadcast_to(np.asarray(bwd_s, float).reshape(p, -1), (p, r))
    if p > 1 and (link_fwd_s.shape != (p - 1, r) or link_bwd_s.shape != (p - 1, r)):
        raise ValueError(
            f"gpipe: link times must have shape ({p - 1}, {r}), got "
            f"{link_fwd_s.shape} and {link_bwd_s.shape}"
        )
    start = np.zeros((p, r)) if start_s is None else np.asarray(start_s, float)
    never = np.full((max(p - 1, 0), r), -np.inf)
    open_f = never if notice_fwd_s is None else start[1:] + np.asarray(notice_fwd_s, float)
    notice_b = never if notice_bwd_s is None else np.asarray(notice_bwd_s, float)
    lat_f = (
        np.zeros((max(p - 1, 0), r)) if latency_fwd_s is None else np.asarray(latency_fwd_s, float)
    )
    lat_b = (
        np.zeros((max(p - 1, 0), r)) if latency_bwd_s is None else np.asarray(latency_bwd_s, float)
    )
    if np.any(lat_f > link_fwd_s + 1e-12) or np.any(lat_b > link_bwd_s + 1e-12):
        raise ValueError("gpipe: a link's latency exceeds its message time")
    m = int(micro_batches)
    link_f, lat_f, open_f, link_b, lat_b, notice_b = (
        np.asarray(a, float).reshape(max(p - 1, 0), r)
        for a in (link_fwd_s, lat_f, open_f, link_bwd_s, lat_b, notice_b)
    )
    fwd_end = _phase(start[0], f, start, link_f, open_f, lat_f, m)
    # backward: from the last stage down, each link's receive-ready notice after the forwards
    free_b = fwd_end[:-1] + notice_b
    back = _phase(
        fwd_end[p - 1], b[::-1], fwd_end[::-1], link_b[::-1], free_b[::-1], lat_b[::-1], m
    )
    bwd_end = back[::-1].copy()
    return GPipeTimes(fwd_end_s=fwd_end, bwd_end_s=bwd_end)
