"""Ideal GPipe iteration time from per-stage compute and per-link transfer times (paper §3.5).

A thin view of the simulator's GPipe model (:func:`system.simulator.gpipe_timeline.gpipe_timeline`)
in the terms the runtime benchmark measures: one replica, one message time per link.

The runtime's schedule as a flow shop: stage s computes the forward of micro-batch i when it has
finished i−1 and i's activations have arrived; link s→s+1 carries one message at a time, each
taking ``link_s[s]`` seconds, overlapped with compute (sends and receives are posted ahead). The
backward runs in reverse micro-batch order once a stage has done all its forwards, gradients
flowing back over the same links. Each stage then spends ``tail_s[s]`` (data-parallel exchange +
optimizer step); the iteration ends when the slowest stage does. No other overheads: what the
measured time is compared with.

With equal stages (f forward, b backward, link l, M micro-batches, pp stages) and l <= f, b this
is the textbook GPipe time (M + pp − 1)·(f + b) + 2·(pp − 1)·l:

    >>> round(gpipe_ideal_s([1.0, 1.0], [2.0, 2.0], [0.5], micro_batches=4), 6)
    16.0
    >>> (4 + 2 - 1) * (1 + 2) + 2 * (2 - 1) * 0.5
    16.0

When a link is slower than compute, it sets the pace instead (communication-bound, paper §1):

    >>> round(gpipe_ideal_s([1.0, 1.0], [1.0, 1.0], [3.0], micro_batches=4), 6)
    28.0
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from system.simulator.gpipe_timeline import gpipe_timeline

__all__ = ["gpipe_ideal_s"]


def gpipe_ideal_s(
    fwd_s: Sequence[float],
    bwd_s: Sequence[float],
    link_s: Sequence[float],
    micro_batches: int,
    tail_s: Sequence[float] | None = None,
) -> float:
    """Ideal iteration time (s) of the GPipe schedule.

    Args:
        fwd_s, bwd_s: per stage, forward / backward compute of one micro-batch (s), len pp.
        link_s: per link s→s+1, time of one activation (= gradient) message (s), len pp−1.
        micro_batches: micro-batches per replica, M >= 1.
        tail_s: per stage, time after its last backward (gradient exchange + step); default 0.
    """
    pp = len(fwd_s)
    if pp < 1 or len(bwd_s) != pp or len(link_s) != pp - 1:
        raise ValueError(
            f"gpipe_ideal_s: need pp >= 1 forward/backward times and pp-1 link "
            f"times, got {len(fwd_s)}, {len(bwd_s)}, {len(link_s)}"
        )
    tail = np.zeros(pp) if tail_s is None else np.asarray(tail_s, float)
    if tail.shape != (pp,):
        raise ValueError(f"gpipe_ideal_s: tail_s has {tail.size} entries, pp={pp}")
    link = np.asarray(link_s, float).reshape(pp - 1, 1)
    times = gpipe_timeline(
        np.asarray(fwd_s, float), np.asarray(bwd_s, float), link, link, micro_batches
    )
    return float(np.max(times.bwd_end_s[:, 0] + tail))
