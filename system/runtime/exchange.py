"""The data-parallel exchange a rank runs: plain, or compressed with error feedback.

Every exchange averages a stage's flat buckets (:class:`~system.runtime.data_parallel.
GradBuckets`) over the stage's ``dp`` replicas, counts the bytes it sends (``bytes_sent``), and
has two calls: :meth:`post_receives` at the start of an iteration (so peers can send while this
rank still computes; a gloo or NCCL send leaves only once its receiver has posted) and
:meth:`sync` after the backward pass.

* :class:`PlainExchange` — the paper's sharded parameter server (or one all-reduce per bucket)
  as :class:`GradBuckets` runs it.
* :class:`CompressedShardedPS` — the same sharded exchange, every message encoded by a
  :class:`~system.runtime.codec.Codec` (CocktailSGD-style, Wang et al., ICML 2023): replica i
  sends owner k the compressed shard k of (gradient + its residual for that shard); the owner
  averages its own shard with the decoded copies, compresses (average + its own residual) once
  and sends that to every replica; everyone, the owner included, takes the decoded average, so
  the replicas stay identical. With error feedback each residual keeps what its compression
  dropped (Karimireddy et al., ICML 2019); without it the dropped part is lost.
* :class:`CompressedRing` — the baseline a collective library offers for sparse messages: every
  replica compresses its whole bucket (+ residual) and the payloads travel once around a ring
  (all-gather, dp − 1 steps); every replica decodes all dp payloads and averages them in replica
  order. (A ring all-reduce cannot sum sparse messages in place: their supports differ.)

For the random sparsifier all replicas draw the same indices for a message (the key names step,
bucket and shard, not the sender), so averages of sparse messages stay sparse.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from system.compression import Compression
from system.runtime.codec import Codec, Quantizer, Sparsifier, mix_key
from system.runtime.data_parallel import GradBuckets
from system.runtime.timeline import Timeline

__all__ = ["PlainExchange", "CompressedShardedPS", "CompressedRing", "make_exchange"]


class PlainExchange:
    """:class:`GradBuckets`' own exchange (``sharded_ps`` or ``allreduce``)."""

    def __init__(self, buckets: GradBuckets, group, mode: str) -> None:
        self.buckets, self.group, self.mode = buckets, group, mode

    @property
    def bytes_sent(self) -> int:
        return self.buckets.bytes_sent

    def post_receives(self) -> None:
        self.buckets.post_receives(self.group, self.mode)

    def sync(self, step: int, timeline: Timeline) -> None:
        self.buckets.sync(self.group, self.mode, timeline)


class _Compressed:
    """Shared state of the compressed exchanges: buckets, codec, residuals, posted receives."""

    def __init__(
        self,
        buckets: GradBuckets,
        group,
        codec: Codec,
        *,
        error_feedback: bool,
        seed: int,
    ) -> None:
        if buckets.ranks is None:
            raise ValueError("compressed exchange: GradBuckets needs ranks= and rank=")
        self.buckets, self.group, self.codec = buckets, group, codec
        self.dp, self.ranks, self.me = buckets.dp, buckets.ranks, buckets.me
        self.error_feedback, self.seed = error_feedback, int(seed)
        self.bytes_sent = 0
        self._posted: dict | None = None

    def _send(self, payload: torch.Tensor, dst: int, tag: int):
        self.bytes_sent += payload.numel()  # uint8
        return dist.isend(payload, dst=dst, group=self.group, tag=tag)

    def _recv(self, numel: int, src: int, tag: int):
        buf = torch.empty(self.codec.nbytes(numel), dtype=torch.uint8)
        buf = buf.to(self.buckets.buffers[0].device)
        return buf, dist.irecv(buf, src=src, group=self.group, tag=tag)

    def _compress(self, x: torch.Tensor, residual: torch.Tensor | None, key: int):
        """(payload, decoded) of ``x`` + residual; the residual keeps what was dropped."""
        if residual is not None:
            x = x + residual
        payload, decoded = self.codec.roundtrip(x, key)
        if residual is not None:
            residual.copy_(x - decoded)
        return payload, decoded


class CompressedShardedPS(_Compressed):
    """The sharded parameter server with compressed messages (module docstring)."""

    def __init__(self, buckets: GradBuckets, group, codec: Codec, *, error_feedback, seed) -> None:
        super().__init__(buckets, group, codec, error_feedback=error_feedback, seed=seed)
        views = [b.view(self.dp, -1) for b in buckets.buffers]
        self.worker_res = [torch.zeros_like(v) for v in views] if error_feedback else None
        self.server_res = [torch.zeros_like(v[0]) for v in views] if error_feedback else None

    def _peers(self) -> list[tuple[int, int]]:
        return [(k, r) for k, r in enumerate(self.ranks) if k != self.me]

    def post_receives(self) -> None:
        if self.dp == 1 or self._posted is not None:
            return
        shard = [b.numel() // self.dp for b in self.buckets.buffers]
        peers = self._peers()
        self._posted = {  # per bucket: copies of my shard from every peer, reduced shards back
            "in": [[(j, *self._recv(n, r, 2 * i)) for j, r in peers] for i, n in enumerate(shard)],
            "back": [
                [(k, *self._recv(n, r, 2 * i + 1)) for k, r in peers] for i, n in enumerate(shard)
            ],
        }

    def sync(self, step: int, timeline: Timeline) -> None:
        if self.dp == 1:
            return
        with timeline.span("dp", "compressed_ps"):
            self.post_receives()
            posted, self._posted = self._posted, None
            shards = [b.view(self.dp, -1) for b in self.buckets.buffers]
            sends = []
            for i, sh in enumerate(shards):  # 1) shard k, compressed, to its owner k
                for k, r in self._peers():
                    res = self.worker_res[i][k] if self.worker_res else None
                    payload, _ = self._compress(sh[k], res, mix_key(self.seed, step, i, k, 0))
                    sends.append(self._send(payload, r, 2 * i))
            for i, sh in enumerate(shards):  # 2) reduce my shard, compress once, send back
                acc = sh[self.me].clone()
                n = acc.numel()
                for _, buf, work in posted["in"][i]:
                    work.wait()
                    acc += self.codec.decode(buf, n, mix_key(self.seed, step, i, self.me, 0))
                acc /= self.dp
                res = self.server_res[i] if self.server_res else None
                payload, mine = self._compress(acc, res, mix_key(self.seed, step, i, self.me, 1))
                sh[self.me].copy_(mine)
                sends += [self._send(payload, r, 2 * i + 1) for _, r in self._peers()]
            for i, sh in enumerate(shards):  # 3) everyone's reduced shards
                n = sh.shape[1]
                for k, buf, work in posted["back"][i]:
                    work.wait()
                    sh[k].copy_(self.codec.decode(buf, n, mix_key(self.seed, step, i, k, 1)))
            for w in sends:
                w.wait()


class CompressedRing(_Compressed):
    """All-gather of whole compressed buckets around a ring (module docstring)."""

    def __init__(self, buckets: GradBuckets, group, codec: Codec, *, error_feedback, seed) -> None:
        super().__init__(buckets, group, codec, error_feedback=error_feedback, seed=seed)
        self.res = [torch.zeros_like(b) for b in buckets.buffers] if error_feedback else None
        self.next = self.ranks[(self.me + 1) % self.dp]
        self.prev = self.ranks[(self.me - 1) % self.dp]

    def post_receives(self) -> None:
        if self.dp == 1 or self._posted is not None:
            return
        self._posted = {
            (i, s): self._recv(b.numel(), self.prev, i * self.dp + s)
            for i, b in enumerate(self.buckets.buffers)
            for s in range(self.dp - 1)
        }

    def sync(self, step: int, timeline: Timeline) -> None:
        if self.dp == 1:
            return
        with timeline.span("dp", "compressed_ring"):
            self.post_receives()
            posted, self._posted = self._posted, None
            for i, b in enumerate(self.buckets.buffers):
                key = mix_key(self.seed, step, i, 0, 2)
                res = self.res[i] if self.res else None
                payloads = [None] * self.dp
                payloads[self.me], _ = self._compress(b, res, key)
                sends = []
                for s in range(self.dp - 1):  # pass on what arrived in the previous step
                    out = payloads[(self.me - s) % self.dp]
                    sends.append(self._send(out, self.next, i * self.dp + s))
                    buf, work = posted[(i, s)]
                    work.wait()
                    payloads[(self.me - s - 1) % self.dp] = buf
                total = torch.zeros_like(b)
                for p in payloads:  # replica order: the same sum on every replica
                    total += self.codec.decode(p, b.numel(), key)
                b.copy_(total / self.dp)
                for w in sends:
                    w.wait()


def make_exchange(options: Compression, buckets: GradBuckets, group, *, mode: str, seed: int):
    """The exchange a run's options call for: DiLoCo's outer exchange (plain fp32, or int8
    through the compressed sharded PS without error feedback), a compressed per-step exchange
    (``mode`` sharded_ps or ring), or the plain one."""
    if options.local.active:
        if options.local.outer_bits == 32:
            return PlainExchange(buckets, group, mode)
        q = Quantizer(options.local.outer_bits)
        return CompressedShardedPS(buckets, group, q, error_feedback=False, seed=seed)
    if options.dp.active:
        dp = options.dp
        codec = Sparsifier(dp.method, dp.ratio, dp.bits)
        kind = CompressedRing if mode == "ring" else CompressedShardedPS
        return kind(buckets, group, codec, error_feedback=dp.error_feedback, seed=seed)
    return PlainExchange(buckets, group, mode)
