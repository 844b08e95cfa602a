"""Data parallel per stage across replicas (paper §3.5), on flat gradient buckets.

Parameters of a stage are packed into buckets (``bucket_mb`` MiB each); every parameter's
``.grad`` is a view into its bucket, so backward accumulates straight into the flat buffers and
:meth:`GradBuckets.zero` clears them before each iteration (the authors' runtime kept a stale
buffer after iteration 1). Two exchanges, both AVERAGED over the ``dp`` replicas:

* ``sharded_ps`` — colocated sharded parameter server: each bucket is cut into ``dp`` shards;
  ``all_to_all`` sends shard k to replica k, which sums what it receives (its shard of every
  replica's gradient) and divides by dp; ``all_gather`` returns the reduced shards to everyone.
  Each device sends and receives 2·(dp−1)/dp of the gradient, the paper's DP cost model.
* ``allreduce`` — one ``all_reduce`` per bucket, then divide by dp.

All buckets' collectives are posted asynchronously before the first is waited on.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from system.runtime.timeline import Timeline

__all__ = ["GradBuckets"]


class GradBuckets:
    """Flat fp32 gradient buckets for ``params``; shard-aligned for ``dp`` replicas."""

    def __init__(
        self, params: list[nn.Parameter], *, dp: int, bucket_mb: float, device: torch.device
    ):
        if dp < 1:
            raise ValueError(f"GradBuckets: dp must be >= 1, got {dp}")
        self.dp = dp
        self.params = [p for p in params if p.requires_grad]
        limit = max(1, int(bucket_mb * 2**20 / 4))
        groups: list[list[nn.Parameter]] = [[]]
        size = 0
        for p in self.params:
            if groups[-1] and size + p.numel() > limit:
                groups.append([])
                size = 0
            groups[-1].append(p)
            size += p.numel()
        self.buffers: list[torch.Tensor] = []
        for group in groups:
            n = sum(p.numel() for p in group)
            n_pad = -(-n // dp) * dp  # round up to a multiple of dp
            flat = torch.zeros(n_pad, dtype=torch.float32, device=device)
            off = 0
            for p in group:
                p.grad = flat[off : off + p.numel()].view_as(p)
                off += p.numel()
            self.buffers.append(flat)

    @property
    def numel(self) -> int:
        return sum(b.numel() for b in self.buffers)

    def zero(self) -> None:
        for b in self.buffers:
            b.zero_()

    def check_views(self) -> None:
        """Raise if something replaced a ``.grad`` (e.g. ``zero_grad(set_to_none=True)``)."""
        for p in self.params:
            if p.grad is None or p.grad.data_ptr() == 0:
                raise RuntimeError("GradBuckets: a parameter's .grad is no longer a bucket view")

    def scale_(self, factor: float) -> None:
        for b in self.buffers:
            b.mul_(factor)

    def all_finite(self) -> bool:
        return all(bool(torch.isfinite(b).all()) for b in self.buffers)

    def sync(self, group, mode: str, timeline: Timeline) -> None:
        """Average the buckets over the ``dp`` replicas of ``group`` (no-op when dp == 1)."""
        if self.dp == 1:
            return
        with timeline.span("dp", mode):
            if mode == "allreduce":
                works = [dist.all_reduce(b, group=group, async_op=True) for b in self.buffers]
                for w in works:
                    w.wait()
                for b in self.buffers:
                    b.div_(self.dp)
            elif mode == "sharded_ps":
                recv = [torch.empty_like(b) for b in self.buffers]
                works = [
                    dist.all_to_all_single(r, b, group=group, async_op=True)
                    for r, b in zip(recv, self.buffers, strict=True)
                ]
                shards = []
                for w, r in zip(works, recv, strict=True):
                    w.wait()
                    # (dp, shard): row j is replica j's copy of my shard; sum, then average
                    shards.append(r.view(self.dp, -1).sum(0).div_(self.dp))
                works = [
                    dist.all_gather_single(b, s, group=group, async_op=True)
                    for b, s in zip(self.buffers, shards, strict=True)
                ]
                for w in works:
                    w.wait()
            else:
                raise ValueError(f"GradBuckets.sync: unknown dp mode {mode!r}")
