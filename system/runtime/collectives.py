"""All-reduce algorithms of NCCL and the frameworks, over torch.distributed point-to-point.

Three sum all-reduces of a 1-D tensor over a group of global ranks (``ranks`` in group order),
in place, built from ``isend``/``irecv`` only (gloo on CPU), as
:mod:`system.simulator.collectives` models them:

- ``ring``: reduce-scatter then all-gather around ``ranks[0] → ranks[1] → …``, n − 1 steps each;
  in reduce-scatter step s the member at position q sends segment (q − s) mod n to q + 1 and adds
  segment (q − s − 1) mod n from q − 1 into its own, so it ends holding segment (q + 1) mod n
  summed; the all-gather passes the sums on (Patarasuk and Yuan, JPDC 2009; NCCL's ring);
- ``tree``: NCCL's double binary tree (``src/graph/trees.cc``, ``ncclGetDtree``; parent arrays
  from :func:`system.simulator.collectives.dtree_parents`, one source for both). Each tree carries
  half of the tensor (the first tree all of it when it is one chunk, as NCCL runs a small message
  on one channel) in chunks of :data:`~system.simulator.collectives.TREE_CHUNK_BYTES`: a member adds
  its children's chunk c into its own and sends the sum up as soon as it has them; the root's sum
  travels back down. Chunks pipeline;
- ``two_level``: blocks of ``block`` consecutive members (a region's devices): ring reduce-scatter
  inside each block, an all-reduce (``inner``: ring or tree) of each summed segment across blocks
  among members at the same position, ring all-gather inside each block (megatron-core's partial
  distributed optimizer).

:meth:`AllReduce.post` posts every receive, into buffers of its own, before the collective
starts: NCCL's receivers own pre-registered FIFO slots, so its sends never wait for a posted
receive, while gloo sends only once the receiver's notice of a posted receive arrives, which
pre-posting hides. :meth:`AllReduce.run` does the sends and reductions. The tree runs one thread
per tree and direction (gloo's ``Work`` reports completion only through ``wait``), so one tree's
chunk never waits behind the other's. Each phase gets a block of :data:`TAG_STRIDE` message tags
from ``tag``; concurrent collectives over the same ranks need distinct ``tag``\\ s.
"""

from __future__ import annotations

import math
import queue
import threading
from collections.abc import Sequence

import torch
import torch.distributed as dist

from system.simulator.collectives import TREE_CHUNK_BYTES, dtree_parents

__all__ = ["ALGORITHMS", "AllReduce", "TAG_STRIDE", "allreduce"]

ALGORITHMS = ("ring", "tree", "two_level")
TAG_STRIDE = 1 << 20  # tags per phase (chunks of one tree, steps of one ring)
_MAX_TAG = (1 << 31) - 1  # gloo's tags are 32-bit


def _check_group(x: torch.Tensor, ranks: Sequence[int], me: int, tag: int) -> list[int]:
    ranks = [int(r) for r in ranks]
    if x.dim() != 1 or not x.is_contiguous():
        raise ValueError(f"all-reduce: a contiguous 1-D tensor, got shape {tuple(x.shape)}")
    if len(set(ranks)) != len(ranks) or me not in ranks:
        raise ValueError(f"all-reduce: rank {me} must be in distinct ranks {ranks}")
    if not 0 <= tag or tag + 8 * TAG_STRIDE > _MAX_TAG:
        raise ValueError(f"all-reduce: tag {tag} out of 0..{_MAX_TAG - 8 * TAG_STRIDE}")
    return ranks


class AllReduce:
    """One all-reduce of ``x`` over ``ranks`` on this rank: :meth:`post` its receives, then
    :meth:`run` it (module docstring). Subclasses fill ``_post`` and ``_run``."""

    def __init__(self, x: torch.Tensor, ranks: Sequence[int], tag: int = 0) -> None:
        self.me = dist.get_rank()
        self.ranks = _check_group(x, ranks, self.me, tag)
        self.x, self.tag = x, tag
        self.pos = self.ranks.index(self.me)
        self._posted = False

    def post(self) -> AllReduce:
        if not self._posted:
            self._post()
            self._posted = True
        return self

    def run(self) -> torch.Tensor:
        self.post()
        if len(self.ranks) > 1:
            self._run()
        return self.x

    def _post(self) -> None:
        raise NotImplementedError

    def _run(self) -> None:
        raise NotImplementedError


class _Ring(AllReduce):
    """Reduce-scatter (``steps`` includes ``rs``) and all-gather (``ag``) around the ring."""

    def __init__(self, x, ranks, tag=0, phases=("rs", "ag")) -> None:
        super().__init__(x, ranks, tag)
        self.phases = phases
        self.segs = list(torch.tensor_split(x, len(self.ranks)))

    def seg_after_reduce_scatter(self) -> torch.Tensor:
        """The segment this member holds summed once the reduce-scatter is done."""
        return self.segs[(self.pos + 1) % len(self.ranks)]

    def _post(self) -> None:
        n, q = len(self.ranks), self.pos
        left = self.ranks[(q - 1) % n]
        self.recvs = {}
        for k, phase in enumerate(("rs", "ag")):
            if phase not in self.phases:
                continue
            for s in range(n - 1):
                j = (q - s - 1) % n if phase == "rs" else (q - s) % n
                buf = torch.empty_like(self.segs[j])
                work = dist.irecv(buf, src=left, tag=self.tag + k * TAG_STRIDE + s)
                self.recvs[phase, s] = (j, buf, work)

    def _run(self) -> None:
        n, q = len(self.ranks), self.pos
        right = self.ranks[(q + 1) % n]
        sends = []
        for k, phase in enumerate(("rs", "ag")):
            if phase not in self.phases:
                continue
            for s in range(n - 1):
                out = (q - s) % n if phase == "rs" else (q + 1 - s) % n
                tag = self.tag + k * TAG_STRIDE + s
                sends.append(dist.isend(self.segs[out], dst=right, tag=tag))
                j, buf, work = self.recvs[phase, s]
                work.wait()
                if phase == "rs":
                    self.segs[j].add_(buf)
                else:
                    self.segs[j].copy_(buf)
        for w in sends:
            w.wait()


class _Tree(AllReduce):
    """NCCL's double binary tree, chunked and pipelined (module docstring)."""

    def __init__(self, x, ranks, tag=0) -> None:
        super().__init__(x, ranks, tag)
        n, size = len(self.ranks), x.numel()
        chunk = max(1, TREE_CHUNK_BYTES // x.element_size())
        if n < 2:
            self.trees = []
            return
        parents = dtree_parents(n)
        if size * x.element_size() <= TREE_CHUNK_BYTES:  # one chunk: one channel, one tree
            parents, halves = parents[:1], [x]
        else:
            halves = list(torch.tensor_split(x, 2))
        if math.ceil(max(h.numel() for h in halves) / chunk) > TAG_STRIDE:
            raise ValueError(f"tree all-reduce: {size} elements is too many chunks")
        pairs = zip(parents, halves, strict=True)
        self.trees = [(parent, list(torch.split(half, chunk))) for parent, half in pairs]

    def _tags(self, t: int) -> tuple[int, int]:
        return self.tag + (2 * t) * TAG_STRIDE, self.tag + (2 * t + 1) * TAG_STRIDE

    def _post(self) -> None:
        self.up, self.down = [], []
        for t, (parent, chunks) in enumerate(self.trees):
            up_tag, down_tag = self._tags(t)
            kids = [r for r in range(len(parent)) if parent[r] == self.pos]
            self.up.append(
                [
                    [
                        (buf := torch.empty_like(c), dist.irecv(buf, self.ranks[k], tag=up_tag + i))
                        for k in kids
                    ]
                    for i, c in enumerate(chunks)
                ]
            )
            if parent[self.pos] >= 0:
                src = self.ranks[parent[self.pos]]
                self.down.append(
                    [
                        (buf := torch.empty_like(c), dist.irecv(buf, src, tag=down_tag + i))
                        for i, c in enumerate(chunks)
                    ]
                )
            else:
                self.down.append(None)

    def _run(self) -> None:
        errors: list[BaseException] = []

        def guarded(fn, *args):
            try:
                fn(*args)
            except BaseException as e:  # re-raised by the caller after join
                errors.append(e)

        threads = []
        for t in range(len(self.trees)):
            summed: queue.SimpleQueue = queue.SimpleQueue()  # the root's reduced chunks
            for fn in (self._up, self._down):
                threads.append(threading.Thread(target=guarded, args=(fn, t, summed)))
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        if errors:
            raise errors[0]

    def _up(self, t: int, summed: queue.SimpleQueue) -> None:
        parent, chunks = self.trees[t]
        up_tag, _ = self._tags(t)
        dst = parent[self.pos]
        sends = []
        for i, c in enumerate(chunks):
            for buf, work in self.up[t][i]:
                work.wait()
                c.add_(buf)
            if dst >= 0:
                sends.append(dist.isend(c, self.ranks[dst], tag=up_tag + i))
            else:
                summed.put(i)
        for w in sends:
            w.wait()

    def _down(self, t: int, summed: queue.SimpleQueue) -> None:
        parent, chunks = self.trees[t]
        _, down_tag = self._tags(t)
        kids = [self.ranks[r] for r in range(len(parent)) if parent[r] == self.pos]
        sends = []
        for i, c in enumerate(chunks):
            if self.down[t] is None:  # the root: chunk i is summed once the up thread says so
                assert summed.get(timeout=3600) == i
            else:
                buf, work = self.down[t][i]
                work.wait()
                c.copy_(buf)  # the up thread sent chunk i before the root could sum it
            sends += [dist.isend(c, k, tag=down_tag + i) for k in kids]
        for w in sends:
            w.wait()


class _TwoLevel(AllReduce):
    """Ring reduce-scatter in blocks, ``inner`` all-reduce across, ring all-gather in blocks."""

    def __init__(self, x, ranks, tag=0, block: int = 2, inner: str = "ring") -> None:
        super().__init__(x, ranks, tag)
        n = len(self.ranks)
        if block < 2 or n % block or n // block < 2:
            raise ValueError(f"two-level all-reduce: block {block} does not split {n} ranks")
        if inner not in ("ring", "tree"):
            raise ValueError(f"two-level all-reduce: inner must be ring or tree, got {inner!r}")
        b, i = divmod(self.pos, block)
        mine = self.ranks[b * block : (b + 1) * block]
        across = self.ranks[i::block]
        self.rs = _Ring(x, mine, tag, phases=("rs",))
        seg = self.rs.seg_after_reduce_scatter()
        kind = _Ring if inner == "ring" else _Tree
        self.across = kind(seg, across, tag + 2 * TAG_STRIDE)
        self.ag = _Ring(x, mine, tag + 6 * TAG_STRIDE, phases=("ag",))

    def _post(self) -> None:
        for op in (self.rs, self.across, self.ag):
            op.post()

    def _run(self) -> None:
        for op in (self.rs, self.across, self.ag):
            op.run()


def allreduce(
    x: torch.Tensor,
    algorithm: str,
    ranks: Sequence[int] | None = None,
    *,
    tag: int = 0,
    block: int = 2,
    inner: str = "ring",
) -> AllReduce:
    """An all-reduce of ``x`` over ``ranks`` (default: every rank) by ``algorithm``, not yet
    posted: call ``.post()`` early and ``.run()`` to do it (``block``/``inner``: two-level)."""
    ranks = list(range(dist.get_world_size())) if ranks is None else list(ranks)
    if algorithm == "ring":
        return _Ring(x, ranks, tag)
    if algorithm == "tree":
        return _Tree(x, ranks, tag)
    if algorithm == "two_level":
        return _TwoLevel(x, ranks, tag, block=block, inner=inner)
    raise ValueError(f"all-reduce algorithm must be one of {ALGORITHMS}, got {algorithm!r}")
