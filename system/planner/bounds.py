"""Lower bounds on the iteration time of any plan the planner can make.

Per sequence, a forward and backward pass through every layer and the output layer costs at
least ``w = 3 ×`` its forward FLOPs (no recomputation; Narayanan et al., SC'21). For a shape
(``pp`` stages, ``dp`` replicas, micro-batches of ``b`` sequences, ``m = B / (dp·b)`` of them
per replica) on any ``pp·dp`` devices of the fleet, each at its best sustained rate:

- compute: the replicas' summed rate is at most ``S``, the summed rate of the fleet's
  ``pp·dp`` fastest devices, so the slowest replica's rate ``R`` is at most ``S / dp``, and it
  computes ``m·b·w`` FLOPs: ``T >= m·b·w·dp / S``;
- pipeline fill and drain: a replica's stages take ``t_s`` per micro-batch; its last
  micro-batch cannot finish before ``(m − 1)·max_s t_s + Σ_s t_s`` (GPipe and 1F1B alike), with
  ``max_s t_s >= b·w / R`` and ``Σ_s t_s >= b·w / r_max`` (``r_max`` the fastest device's
  rate): ``T >= (m − 1)·b·w·dp / S + b·w / r_max``.

The bound is the least over every shape and micro-batch size the planner searches of the larger
of the two, leaving out the shapes whose stages cannot fit on the fleet's largest GPU even with
one micro-batch in flight and full recomputation (some stage holds ``⌈L / pp⌉`` layers).
Communication (the pipeline's messages, the data-parallel exchange) and the optimizer step
are left out, so the bound holds for every placement, link-sharing model and schedule; the
gap it leaves is what those cost, and what no shape can avoid.
"""

from __future__ import annotations

import numpy as np

from system.simulator.hardware import layer_forward_flops, logits_forward_flops

__all__ = ["iteration_lower_bound_s"]


def iteration_lower_bound_s(planner) -> float:
    """The bound (module docstring) of ``planner``'s problem, seconds."""
    model = planner.model
    w = 3.0 * (model.num_layers * layer_forward_flops(model, 1) + logits_forward_flops(model, 1))
    rates = np.sort(np.asarray(planner.best_rate, dtype=float))[::-1]
    top = np.cumsum(rates)  # top[n-1]: the n fastest devices' summed rate
    r_max = float(rates[0])
    best = np.inf
    most = float(np.max(planner.usable))
    for pp, dp in planner.shapes(len(rates)):
        layers = -(-model.num_layers // pp)
        if planner.stage_memory(pp // 2 if pp > 2 else 0, pp, layers, 1, 1, "full") > most:
            continue  # a middle stage (the first when pp <= 2) cannot hold its layers
        s = float(top[pp * dp - 1])
        for b in planner.micro_batch_sizes:
            if planner.batch % (dp * b):
                continue
            m = planner.batch // (dp * b)
            compute = m * b * w * dp / s
            fill = (m - 1) * b * w * dp / s + b * w / r_max
            best = min(best, max(compute, fill))
    return float(best)
