"""Data parallel per stage across replicas (paper §3.5), on flat gradient buckets.

Parameters of a stage are packed into buckets (``bucket_mb`` MiB each); every parameter's
``.grad`` is a view into its bucket, so backward accumulates straight into the flat buffers and
:meth:`GradBuckets.zero` clears them before each iteration. Two exchanges, both AVERAGED over
the ``dp`` replicas:

* ``sharded_ps`` — colocated sharded parameter server: each bucket is cut into ``dp`` shards;
  replica k owns shard k. Every replica sends shard k of its gradient to replica k, which sums
  what it receives and divides by dp, then sends the reduced shard back to everyone. Each device
  sends and receives 2·(dp−1)/dp of the gradient, the paper's DP cost model. The transfers are
  point-to-point and concurrent (one connection per peer), and the receives of the first half
  are posted when the iteration starts (:meth:`GradBuckets.post_receives`), before the
  pipeline runs. Why not ``all_to_all`` + ``all_gather``: gloo sends a message only after the
  receiver's "ready" notice has arrived, and inside its collectives that notice is posted after
  the rank's own outgoing data on the same connection, so a replica that enters the exchange
  late holds its peers' data back by a whole transfer. With receives posted ahead, an early
  replica's shards travel while its peers still compute, and a transfer costs α + X/β once the
  data exists (``system.simulator.collectives.sharded_ps_p2p_s``).
* ``allreduce`` — one ``all_reduce`` per bucket, then divide by dp.

All buckets' transfers are posted before the first is waited on. :attr:`GradBuckets.bytes_sent`
counts the bytes this replica sends: the shards it passes to ``isend`` (``sharded_ps``), or a ring
all-reduce's 2·(dp−1)/dp of each bucket (``allreduce``: gloo runs the collective, so its bytes
are counted by that formula rather than observed).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from system.runtime.timeline import Timeline

__all__ = ["GradBuckets"]


class GradBuckets:
    """Flat fp32 gradient buckets for ``params``; shard-aligned for ``dp`` replicas.

    ``ranks`` (the stage's DP group, sorted global ranks) and ``rank`` (this process) are needed
    by the ``sharded_ps`` exchange: shard k belongs to ``ranks[k]``.
    """

    def __init__(
        self,
        params: list[nn.Parameter],
        *,
        dp: int,
        bucket_mb: float,
        device: torch.device,
        ranks: tuple[int, ...] | None = None,
        rank: int | None = None,
    ):
        if dp < 1:
            raise ValueError(f"GradBuckets: dp must be >= 1, got {dp}")
        if ranks is not None and (len(ranks) != dp or rank not in ranks):
            raise ValueError(f"GradBuckets: ranks {ranks} must hold dp={dp} ranks incl. {rank}")
        self.dp = dp
        self.ranks = tuple(sorted(ranks)) if ranks is not None else None
        self.me = self.ranks.index(rank) if self.ranks is not None else None
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
        # sharded_ps: row j of inbox[b] receives replica j's copy of my shard of bucket b
        self._inbox: list[torch.Tensor] = []
        self._posted: list[list] | None = None
        self.bytes_sent = 0  # payload bytes this replica sent in exchanges so far

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

    def _peers(self) -> list[tuple[int, int]]:
        """(shard index, global rank) of every other replica."""
        if self.ranks is None:
            raise RuntimeError("GradBuckets: sharded_ps needs ranks= and rank= at construction")
        return [(k, r) for k, r in enumerate(self.ranks) if k != self.me]

    def post_receives(self, group, mode: str) -> None:
        """Post the first-half receives of the ``sharded_ps`` exchange (no-op otherwise).

        Call it at the start of the iteration: the receives' ready notices reach the peers while
        the pipeline runs, so a peer that finishes its backward first sends its shards at once.
        """
        if self.dp == 1 or mode != "sharded_ps":
            return
        if self._posted is not None:
            raise RuntimeError("GradBuckets.post_receives: the previous exchange is not done")
        if not self._inbox:
            self._inbox = [b.new_empty((self.dp, b.numel() // self.dp)) for b in self.buffers]
        self._posted = [
            [dist.irecv(box[k], src=r, group=group, tag=2 * i) for k, r in self._peers()]
            for i, box in enumerate(self._inbox)
        ]

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
                    self.bytes_sent += 2 * (self.dp - 1) * b.numel() // self.dp * b.element_size()
            elif mode == "sharded_ps":
                self._sharded_ps(group)
            else:
                raise ValueError(f"GradBuckets.sync: unknown dp mode {mode!r}")

    def _sharded_ps(self, group) -> None:
        if self._posted is None:
            self.post_receives(group, "sharded_ps")
        peers = self._peers()
        shards = [b.view(self.dp, -1) for b in self.buffers]
        # 1) my copy of shard k to its owner k (the owners' receives were posted long ago)
        sends = [
            dist.isend(sh[k], dst=r, group=group, tag=2 * i)
            for i, sh in enumerate(shards)
            for k, r in peers
        ]
        # the outgoing shards are in the kernel once the sends complete: their memory may then
        # receive the owners' reduced shards (which cannot come before the owners got ours)
        self.bytes_sent += sum(sh[k].numel() * sh.element_size() for sh in shards for k, _ in peers)
        for w in sends:
            w.wait()
        gathers = [
            dist.irecv(sh[k], src=r, group=group, tag=2 * i + 1)
            for i, sh in enumerate(shards)
            for k, r in peers
        ]
        # 2) reduce my shard of each bucket as soon as its copies are in, send it back
        sends = []
        for i, (sh, box, works) in enumerate(zip(shards, self._inbox, self._posted, strict=True)):
            for w in works:
                w.wait()
            box[self.me].copy_(sh[self.me])
            torch.sum(box, dim=0, out=sh[self.me])
            sh[self.me].div_(self.dp)
            sends += [dist.isend(sh[self.me], dst=r, group=group, tag=2 * i + 1) for _, r in peers]
            self.bytes_sent += len(peers) * sh[self.me].numel() * sh.element_size()
        self._posted = None
        for w in gathers + sends:
            w.wait()
