"""Transfer and collective times on a case's links (α-β model; ring all-reduce
2·(n−1)/n · S/β + 2·(n−1)·α, Thakur et al., IJHPCA 2005).

Every transfer of X bytes over link (a, b) takes ``α_ab + 8·X / β_eff`` seconds (paper §2), where
``β_eff`` is what the flow gets among the flows that run at the same time under the cluster's
link-sharing model (``pair``, ``nic``, ``region``, ``flow``, ``tc_class``; max-min fair;
:mod:`system.simulator.sharing`). Hosts with a NIC of their own (cases 1–2) share it under every
model.

Collectives here (the all-reduce algorithms NCCL and the frameworks choose between, tree and
two-level included, are in :mod:`system.simulator.allreduce`):

- ring all-reduce over n devices in the given order: 2·(n−1) synchronous steps, each moving S/n
  bytes on every ring edge at once, a step lasting as long as the slowest edge — on uniform links
  this is the textbook ``2·(n−1)/n · S/β + 2·(n−1)·α``; reduce-scatter and all-gather take n−1
  steps (half); gloo's segmented ring event by event (:func:`ring_allreduce_end_s`);
- sharded parameter server (the paper's DP, §3.2) as our runtime runs it
  (:mod:`system.runtime.data_parallel`): point-to-point and concurrent, one connection per
  peer, so a device's n−1 shards travel at once, sharing what the model shares.
  Each member enters when its own last backward ends; see :func:`sharded_ps_p2p_s` for the
  events. The scheduler's cost model (:mod:`system.cost.model`) keeps the paper's serialised
  charge ``Σ_{d'} 2·(α + 8·S/(n·β))`` — an upper bound of this exchange for synchronised entry.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from system.cluster import Cluster
from system.simulator.sharing import LINK_SHARING, shared_bandwidth_bps, with_link_sharing

__all__ = [
    "GLOO",
    "NCCL",
    "Transport",
    "NCCL_RENDEZVOUS",
    "flow_bandwidth_bps",
    "flow_time_s",
    "with_link_sharing",
    "LINK_SHARING",
    "TRANSPORTS",
    "ring_allreduce_end_s",
    "ring_allreduce_s",
    "ring_collective_s",
    "sharded_ps_p2p_s",
]


@dataclass(frozen=True, slots=True)
class Transport:
    """How a communication library moves point-to-point messages and ring all-reduces.

    - ``rendezvous``: a message leaves only after the receiver posted its receive and that
      notice crossed the link (gloo's unbound buffers); otherwise sends are eager (NCCL over
      sockets: receive buffers are pre-posted FIFO slots).
    - ``send_buffer_bytes``: a blocking send returns once all but this many bytes have left (the
      socket send buffer for gloo, NCCL's 4 MiB channel buffer).
    - ``ring_segment_bytes`` / ``ring_window``: gloo's ring all-reduce cuts the buffer into
      segments of at most 1 MiB (at least 2 per rank) and keeps 2 sends/receives in flight per
      rank, each behind the receiver's notice (``gloo/allreduce.cc``, ``kMaxSegmentSize``);
      ``None``: streamed textbook ring (NCCL), 2·(n−1) steps of α + 8·S/(n·β).
    """

    name: str
    rendezvous: bool
    send_buffer_bytes: float
    ring_segment_bytes: float | None = None
    ring_window: int = 2


NCCL = Transport("nccl", rendezvous=False, send_buffer_bytes=4 * 2**20)
# Sensitivity variant: NCCL with a send that waits for the receiver's posted receive (as gloo does)
NCCL_RENDEZVOUS = Transport("nccl_rendezvous", rendezvous=True, send_buffer_bytes=4 * 2**20)
GLOO = Transport("gloo", rendezvous=True, send_buffer_bytes=4 * 2**20, ring_segment_bytes=2**20)
# the baselines' transports a simulation may pick by name (the sensitivity knob)
TRANSPORTS = {t.name: t for t in (NCCL, NCCL_RENDEZVOUS)}


def flow_bandwidth_bps(cluster: Cluster, src: Sequence[int], dst: Sequence[int]) -> np.ndarray:
    """Bandwidth (bit/s) each of a set of concurrent flows ``src[i] -> dst[i]`` gets under the
    cluster's link-sharing model (:func:`system.simulator.sharing.shared_bandwidth_bps`)."""
    return shared_bandwidth_bps(cluster, src, dst)


def flow_time_s(cluster: Cluster, src: Sequence[int], dst: Sequence[int], nbytes) -> np.ndarray:
    """Seconds for each concurrent flow to move ``nbytes`` (a float, or one per flow); zero for
    a device to itself. On a cluster with size-dependent ``links`` each flow reaches the fraction
    of its bandwidth its size allows (:meth:`system.links.SizeDependentLinks.efficiency`)."""
    src, dst = np.asarray(src, dtype=int), np.asarray(dst, dtype=int)
    bw = flow_bandwidth_bps(cluster, src, dst)
    if cluster.links is not None:  # message-size-dependent links (system.links)
        host = np.asarray(cluster.host_of)
        bw = bw * cluster.links.efficiency(host[src], host[dst], nbytes)
    t = cluster.delay_s[src, dst] + 8.0 * np.asarray(nbytes, dtype=float) / bw
    return np.where(src == dst, 0.0, t)


def ring_collective_s(
    cluster: Cluster, rings: Sequence[Sequence[int]], nbytes, *, kind: str = "allreduce"
) -> np.ndarray:
    """Seconds for each of several concurrent ring collectives over ``nbytes`` per device (a
    float, or one value per ring).

    ``rings`` lists the devices of each ring in ring (rank) order; all rings run at the same time
    and share links/NICs. ``kind`` is ``allreduce`` (2·(n−1) steps) or ``reducescatter`` /
    ``allgather`` (n−1 steps).
    """
    steps_per_n = {"allreduce": 2, "reducescatter": 1, "allgather": 1}
    if kind not in steps_per_n:
        raise ValueError(f"ring collective: unknown kind {kind!r}; known: {', '.join(steps_per_n)}")
    rings = [list(r) for r in rings]
    sizes = {len(r) for r in rings}
    if len(sizes) != 1:
        raise ValueError(f"ring collective: rings must have one size, got {sorted(sizes)}")
    n = sizes.pop()
    if n == 1:
        return np.zeros(len(rings))
    src = np.array([r[i] for r in rings for i in range(n)])
    dst = np.array([r[(i + 1) % n] for r in rings for i in range(n)])
    per_ring = np.broadcast_to(np.asarray(nbytes, dtype=float), (len(rings),))
    step = flow_time_s(cluster, src, dst, np.repeat(per_ring / n, n))
    step = step.reshape(len(rings), n).max(axis=1)
    return steps_per_n[kind] * (n - 1) * step


def _groups_and_entries(groups, entry_s, what: str) -> tuple[np.ndarray, np.ndarray]:
    """``groups`` as a (G, n) device array and ``entry_s`` as a float array of the same shape."""
    g = np.asarray([list(r) for r in groups], dtype=int)
    e = np.asarray(entry_s, dtype=float)
    if g.ndim != 2 or e.shape != g.shape:
        raise ValueError(f"{what}: groups {g.shape} and entry_s {e.shape} must be (G, n) alike")
    return g, e


def sharded_ps_p2p_s(
    cluster: Cluster,
    groups: Sequence[Sequence[int]],
    nbytes: float,
    entry_s: np.ndarray,
    *,
    posted_s: float | np.ndarray = 0.0,
) -> np.ndarray:
    """When each member of several concurrent sharded-PS exchanges (paper §3.2) is done.

    ``groups[g]`` lists a stage's devices (one per replica), ``entry_s[g][k]`` when device
    ``groups[g][k]`` finishes its backward and enters the exchange, ``nbytes`` its gradient
    bytes (a float, or one per group); shard X = nbytes / n. Events, as the runtime and
    gloo/NCCL run them — a message leaves only once its receiver's receive is posted and that
    notice has crossed the link:

    - i's copy of shard j leaves i at ``s1[i,j] = max(e_i, p_j + α_ji)``, where ``p_j`` is when
      j posted its first-half receives (``posted_s``: a scalar, the runtime's iteration start,
      or one time per member like ``entry_s``), and arrives at ``a1[i,j] = s1[i,j] + α_ij +
      8X/β_ij``;
    - j holds its reduced shard at ``r_j = max(e_j, max_i a1[i,j])``;
    - j's reduced shard leaves for i at ``max(r_j, s1[j,i] + 8X/β_ji)`` (one connection per
      pair: it queues behind j's own first-half shard to i; i's receive for it, posted at e_i,
      has arrived since ``r_j >= a1[i,j]``) and arrives α_ji + 8X/β_ji later;
    - i is done when its reduced shard and all n−1 others are in.

    All (n−1)·n flows of all groups share links and NICs as concurrent flows
    (:func:`flow_bandwidth_bps`). On uniform links with equal entry e this is ``e + 2α + 2·8X/β``
    when the receives were posted at least α before e, and ``e + 3α + 2·8X/β`` when posted at e
    (as inside one gloo all-to-all). Returns an array shaped like ``entry_s``.
    """
    g, e = _groups_and_entries(groups, entry_s, "sharded PS")
    n = g.shape[1]
    if n == 1:
        return e.copy()
    src = np.repeat(g, n, axis=1).reshape(-1, n, n)  # [g, i, j] = device i
    dst = np.tile(g, (1, n)).reshape(-1, n, n)  # [g, i, j] = device j
    off = ~np.eye(n, dtype=bool)[None].repeat(g.shape[0], axis=0)
    x_s = np.zeros(src.shape)
    shard = np.broadcast_to(np.asarray(nbytes, dtype=float).reshape(-1, 1, 1), src.shape) / n
    x_s[off] = 8.0 * shard[off] / flow_bandwidth_bps(cluster, src[off], dst[off])
    a = np.where(off, cluster.delay_s[src, dst], 0.0)  # [g, i, j] = α_ij
    posted = np.broadcast_to(np.asarray(posted_s, dtype=float), e.shape)
    s1 = np.maximum(e[:, :, None], posted[:, None, :] + a.transpose(0, 2, 1))
    a1 = np.where(off, s1 + a + x_s, -np.inf)
    red = np.maximum(e, a1.max(axis=1))  # [g, j]
    s2 = np.maximum(red[:, :, None], s1 + x_s)  # [g, j, i]: j's reduced shard to i
    a2 = np.where(off, s2 + a + x_s, -np.inf)
    return np.maximum(red, a2.max(axis=1))


def ring_allreduce_s(
    cluster: Cluster, rings: Sequence[Sequence[int]], nbytes, transport: Transport = NCCL
) -> np.ndarray:
    """Seconds for each of several concurrent ring all-reduces of ``nbytes`` per device (a float
    or one per ring; gloo rings of different sizes are timed apart), all
    members entering at 0: NCCL's streamed ring (:func:`ring_collective_s`) or gloo's segmented
    one (:func:`ring_allreduce_end_s`)."""
    if transport.ring_segment_bytes is None:
        return ring_collective_s(cluster, rings, nbytes)
    g = np.asarray([list(r) for r in rings], dtype=int)
    per_ring = np.broadcast_to(np.asarray(nbytes, dtype=float), (g.shape[0],))
    out = np.empty(g.shape[0])
    for nb in np.unique(per_ring):  # gloo's segmentation depends on the size: one size at a time
        k = per_ring == nb
        out[k] = ring_allreduce_end_s(cluster, g[k], nb, np.zeros(g[k].shape), transport).max(1)
    return out


def ring_allreduce_end_s(
    cluster: Cluster,
    rings: Sequence[Sequence[int]],
    nbytes: float,
    entry_s: np.ndarray,
    transport: Transport = NCCL,
    *,
    element_bytes: int = 4,
) -> np.ndarray:
    """When each member of several concurrent ring all-reduces is done; ``entry_s`` (G, n) is
    when each enters (rings[g][q] is rank q of ring g).

    NCCL: every member is done ``ring_collective_s`` after the last one entered. gloo, event by
    event as ``gloo/allreduce.cc`` runs it: the buffer is cut into N = n·k segments (k = max(2,
    ⌈S/(n·1 MiB)⌉) per rank, each ⌈S/N⌉ rounded up to ``element_bytes``; trailing segments may
    be short or empty — a 1-element buffer has one), then a reduce-scatter loop and an
    all-gather loop of (n−1)·k iterations; rank q sends to q−1 and receives from q+1 (segment
    ((q+1)·k + i) mod N out and ((q+2)·k + i) mod N in during reduce-scatter, q·k + i and
    (q+1)·k + i during all-gather), skipping empty segments. In iteration i a rank first waits
    for its receive and send of iteration i − window, then posts receive i and issues send i;
    send i leaves when the link is free and the left neighbour's receive-i notice has arrived
    (α back), occupies the link 8·len/β and lands α later.
    """
    g, e = _groups_and_entries(rings, entry_s, "ring all-reduce")
    n = g.shape[1]
    if n == 1:
        return e.copy()
    if transport.ring_segment_bytes is None:
        t = ring_collective_s(cluster, g, nbytes)
        return np.broadcast_to((e.max(axis=1) + t)[:, None], g.shape).copy()
    k = max(2, int(np.ceil(nbytes / (n * transport.ring_segment_bytes))))
    segments = n * k
    seg = float(np.ceil(np.ceil(nbytes / segments) / element_bytes) * element_bytes)
    length = np.clip(nbytes - seg * np.arange(segments), 0.0, seg)  # bytes of segment j
    left = np.roll(g, 1, axis=1)  # [:, q] = device of rank q-1, the one q sends to
    bw = flow_bandwidth_bps(cluster, g.ravel(), left.ravel()).reshape(g.shape)
    alpha = cluster.delay_s[g, left]  # q -> q-1
    back = cluster.delay_s[left, g]  # q-1's notice to q
    buffer_s = 8.0 * transport.send_buffer_bytes / bw
    w = transport.ring_window
    sends = (n - 1) * k
    q = np.arange(n)
    t = e.copy()
    for first in (1, 0):  # reduce-scatter sends segment (q+1)·k + i, all-gather q·k + i
        link_free = np.full(g.shape, -np.inf)
        landed, sent = [], []  # per iteration
        for i in range(sends + w):
            if i >= w:
                done = np.maximum(landed[i - w], sent[i - w])
                t = np.maximum(t, done)
            if i < sends:
                nb = length[((q + first) * k + i) % segments]  # this rank's send
                on = np.broadcast_to(nb > 0, g.shape)
                busy = 8.0 * nb[None, :] / bw
                posted_left = np.roll(t, 1, axis=1)  # q-1 posts its receive i at its t
                start = np.maximum(np.maximum(t, link_free), posted_left + back)
                link_free = np.where(on, start + busy, link_free)
                sent.append(np.where(on, start + np.maximum(busy - buffer_s, 0.0), -np.inf))
                arrive = np.where(on, start + busy + alpha, -np.inf)
                landed.append(np.roll(arrive, -1, axis=1))  # q's send lands at q-1
    return t
