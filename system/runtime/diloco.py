"""DiLoCo's outer loop for one stage of one replica (Douillard et al., "DiLoCo: Distributed
Low-Communication Training of Language Models", 2023).

Each replica (a pipeline of stages, or one device) takes ``H`` inner optimizer steps on its own
data with no data-parallel exchange. Then, per stage, the replicas average their
pseudo-gradient Δ = θ_outer − θ_local over the stage's data-parallel group, an outer SGD
(Nesterov momentum by default) steps θ_outer with Δ as its gradient, and every replica resets
its parameters to the new θ_outer. The inner optimizer keeps its state across outer steps, as
in the paper. The exchange is any :mod:`system.runtime.exchange` exchange over the stage's
gradient buckets, which hold Δ during the outer step: fp32, or int8 (INTELLECT-1, Jaghouar et
al., 2024, quantizes the outer all-reduce to int8).

With H = 1, an outer SGD of learning rate 1 without momentum and an inner SGD, one outer step is
exactly a data-parallel SGD step: θ − mean_r(θ − (θ − η·g_r)) = θ − η·mean_r(g_r) (tested).
"""

from __future__ import annotations

import torch
from torch import nn

from system.compression import LocalSGD

__all__ = ["DiLoCo"]


class DiLoCo:
    """Outer state of one stage: θ_outer and the outer optimizer (momentum buffers)."""

    def __init__(self, params: list[nn.Parameter], options: LocalSGD) -> None:
        if not options.active:
            raise ValueError("DiLoCo: local.method is 'none'")
        self.options = options
        self.params = [p for p in params if p.requires_grad]
        self.outer_params = [p.detach().clone() for p in self.params]
        self.outer = torch.optim.SGD(
            self.outer_params,
            lr=options.outer_lr,
            momentum=options.outer_momentum,
            nesterov=options.nesterov,
        )

    def is_outer_step(self, step: int) -> bool:
        """Whether inner step ``step`` (0-based) ends with an outer step."""
        return (step + 1) % self.options.inner_steps == 0

    @torch.no_grad()
    def outer_step(self, average) -> None:
        """Write Δ into the parameters' ``.grad`` (the exchange's buckets), call ``average()``
        to average them over the replicas, step θ_outer and copy it into the parameters."""
        for p, q in zip(self.params, self.outer_params, strict=True):
            p.grad.copy_(q - p)
        average()
        for p, q in zip(self.params, self.outer_params, strict=True):
            q.grad = p.grad
        self.outer.step()
        for p, q in zip(self.params, self.outer_params, strict=True):
            p.copy_(q)
            q.grad = None
