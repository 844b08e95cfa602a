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
j·c))``, in one compiled loop over stages, replicas and micro-batches. With free links and equal
stages it gives GPipe's (m + p − 1)·(t_f + t_b) exactly (tested).

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
def _gpipe(start, f, b, link_f, lat_f, open_f, link_b, lat_b, notice_b, m):
    """(fwd_end, bwd_end) of :func:`gpipe_timeline`, each (p, r): every stage's compute chain
    and every link's send chain (:func:`_chain`'s recurrence, inlined), forward then backward."""
    p, r = f.shape
    fwd_end = np.empty((p, r))
    bwd_end = np.empty((p, r))
    arrival = np.empty((m, r))
    done = np.empty((m, r))
    for s in range(p):  # forward phase
        for j in range(r):
            free = start[s, j]
            c = f[s, j]
            run = 0.0
            for i in range(m):
                v = (start[0, j] if s == 0 else arrival[i, j]) - i * c
                run = v if i == 0 else (run if (run >= v or run != run) else v)
                top = run if (run >= free or run != run) else free
                done[i, j] = (i + 1.0) * c + top
            fwd_end[s, j] = done[m - 1, j]
            if s < p - 1:
                free = open_f[s, j]
                c = link_f[s, j] - lat_f[s, j]
                run = 0.0
                for i in range(m):
                    v = done[i, j] - i * c
                    run = v if i == 0 else (run if (run >= v or run != run) else v)
                    top = run if (run >= free or run != run) else free
                    arrival[i, j] = (i + 1.0) * c + top + lat_f[s, j]
    for s in range(p - 1, -1, -1):  # backward phase, from the last stage down
        for j in range(r):
            free = fwd_end[s, j]
            c = b[s, j]
            run = 0.0
            for i in range(m):
                v = (fwd_end[p - 1, j] if s == p - 1 else arrival[i, j]) - i * c
                run = v if i == 0 else (run if (run >= v or run != run) else v)
                top = run if (run >= free or run != run) else free
                done[i, j] = (i + 1.0) * c + top
            bwd_end[s, j] = done[m - 1, j]
            if s > 0:
                free = fwd_end[s - 1, j] + notice_b[s - 1, j]
                c = link_b[s - 1, j] - lat_b[s - 1, j]
                run = 0.0
                for i in range(m):
                    v = done[i, j] - i * c
                    run = v if i == 0 else (run if (run >= v or run != run) else v)
                    top = run if (run >= free or run != run) else free
                    arrival[i, j] = (i + 1.0) * c + top + lat_b[s - 1, j]
    return fwd_end, bwd_end


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
    fwd_end, bwd_end = _gpipe(
        np.ascontiguousarray(start),
        np.ascontiguousarray(f),
        np.ascontiguousarray(b),
        *(
            np.ascontiguousarray(a, dtype=float).reshape(max(p - 1, 0), r)
            for a in (link_fwd_s, lat_f, open_f, link_bwd_s, lat_b, notice_b)
        ),
        int(micro_batches),
    )
    return GPipeTimes(fwd_end_s=fwd_end, bwd_end_s=bwd_end)
