"""Lower bounds on the iteration time of any plan the planner can make.

``compute``: every sequence of the global batch passes forward and backward (no recomputation:
3 × the forward FLOPs, Narayanan et al., SC'21) through every layer and the output layer; no
plan finishes its iteration before the fleet's summed best sustained rate (each device at its
best micro-batch) has done that work. Communication, bubbles, stage granularity and the optimizer
step are left out, so the bound is valid for every device subset, shape and schedule.
"""

from __future__ import annotations

from system.simulator.hardware import layer_forward_flops, logits_forward_flops

__all__ = ["iteration_lower_bound_s"]


def iteration_lower_bound_s(planner) -> float:
    """The compute bound (module docstring) of ``planner``'s problem, seconds."""
    model = planner.model
    per_seq = 3.0 * (
        model.num_layers * layer_forward_flops(model, 1) + logits_forward_flops(model, 1)
    )
    return planner.batch * per_seq / float(planner.best_rate.sum())
