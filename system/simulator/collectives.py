"""Collectives on the project's link model: when each member of a group is done.

Every function times G concurrent groups (``groups[g]`` lists a group's devices in rank order,
``entry_s[g][k]`` when member k enters) whose flows share links and NICs under the cluster's
link-sharing model (:mod:`system.simulator.sharing`); each flow is a transfer of
:mod:`system.simulator.transfers`.

- ring (:func:`ring_collective_s`): 2·(n−1) synchronous steps of S/n bytes on every ring edge
  (n−1 for a reduce-scatter or an all-gather), a step as long as its slowest edge — on uniform
  links the textbook ``2·(n−1)/n · S/β + 2·(n−1)·α`` (Thakur et al., IJHPCA 2005); gloo's
  segmented ring event by event (:func:`ring_allreduce_end_s`, ``gloo/allreduce.cc``);
- sharded parameter server (the paper's DP, §3.2) as our runtime runs it
  (:mod:`system.runtime.data_parallel`): point-to-point and concurrent, each member entering when
  its own last backward ends (:func:`sharded_ps_p2p_s`). The scheduler's cost model
  (:mod:`system.cost.model`) keeps the paper's serialised charge ``Σ_{d'} 2·(α + 8·S/(n·β))``,
  an upper bound of this exchange for synchronised entry;
- double binary tree (:func:`tree_allreduce_end_s`): NCCL's two trees (NCCL 2.4+,
  ``src/graph/trees.cc`` ``ncclGetDtree``), each carrying half the message;
- two-level (:func:`two_level_allreduce_end_s`): reduce-scatter inside region blocks, an
  all-reduce of the shards across them, all-gather inside — megatron-core's partial distributed
  optimizer (``num_distributed_optimizer_instances``).

Which all-reduce runs: :func:`nccl_tuned_end_s` simulates NCCL's own pick per group (its tuner,
:mod:`system.simulator.nccl_tuner`, from NCCL's constants: nominal NIC speeds and per-hop
latencies, blind to WAN delays and link sharing); :func:`choose_allreduce` keeps the candidate
whose last member finishes first under the link model — what a user forces with ``NCCL_ALGO``
(or the framework's flag for ``two_level``) after measuring each.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from system.cluster import Cluster, fingerprint
from system.compiled import kernel
from system.simulator.nccl_tuner import choose, system_for_group
from system.simulator.sharing import alone_bps
from system.simulator.transfers import NCCL, Transport, flow_bandwidth_bps, flow_time_s

__all__ = [
    "ALGORITHMS",
    "TREE_CHUNK_BYTES",
    "ring_collective_s",
    "ring_collective_max_s",
    "ring_allreduce_s",
    "ring_allreduce_end_s",
    "sharded_ps_p2p_s",
    "btree_parents",
    "dtree_parents",
    "tree_allreduce_end_s",
    "two_level_block",
    "two_level_allreduce_end_s",
    "allreduce_end_s",
    "choose_allreduce",
    "nccl_allreduce_end_s",
    "nccl_tuned_end_s",
]

ALGORITHMS = ("ring", "tree", "two_level")
# Pipelining grain of the tree: NCCL's Simple protocol moves its 4 MiB buffer (NCCL_BUFFSIZE's
# default) in NCCL_STEPS = 8 slots of 512 KiB.
TREE_CHUNK_BYTES = 512 * 1024

# Per cluster fingerprint, the results that do not depend on when members enter: a ring
# collective's duration, NCCL's picks per group, a tree's per-hop times, each pair's rate alone.
# A grid search asks for
# the same groups and sizes again and again (every global batch of a setting, every rank map
# that keeps a group), and the clusters a sweep's jobs build apart share a fingerprint.
_KEPT: dict[str, dict] = {}
_KEPT_CLUSTERS = 16  # clusters kept at once
_KEPT_PER_CLUSTER = 1 << 16  # entries per cluster before its table starts again


def _kept(cluster: Cluster, key: tuple, make):
    """``make()``, computed once per ``cluster`` (by fingerprint) and ``key``; a pure function
    of both, so a kept value is the value."""
    fp = fingerprint(cluster)
    table = _KEPT.get(fp)
    if table is None:
        if len(_KEPT) >= _KEPT_CLUSTERS:
            _KEPT.clear()
        table = _KEPT[fp] = {}
    try:
        return table[key]
    except KeyError:
        if len(table) >= _KEPT_PER_CLUSTER:
            table.clear()
        value = table[key] = make()
        return value


def _array_key(*arrays: np.ndarray) -> tuple:
    """A hashable key of arrays' shapes, kinds and contents."""
    return tuple((a.shape, a.dtype.str, a.tobytes()) for a in arrays)


def _groups_and_entries(groups, entry_s, what: str) -> tuple[np.ndarray, np.ndarray]:
    """``groups`` as a (G, n) device array and ``entry_s`` as a float array of the same shape."""
    g = np.asarray(groups if isinstance(groups, np.ndarray) else [list(r) for r in groups], int)
    e = np.asarray(entry_s, dtype=float)
    if g.ndim != 2 or e.shape != g.shape:
        raise ValueError(f"{what}: groups {g.shape} and entry_s {e.shape} must be (G, n) alike")
    return g, e


def _groups_entries(groups, entry_s, nbytes) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`_groups_and_entries` of an all-reduce, and its message bytes, one per group."""
    g, e = _groups_and_entries(groups, entry_s, "all-reduce")
    size = np.empty(g.shape[0])
    size[:] = nbytes  # one per group
    if not (size >= 0).all() or not np.isfinite(size).all():
        raise ValueError(f"all-reduce: message bytes must be finite and >= 0, got {nbytes}")
    return g, e, size


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
    if not isinstance(rings, np.ndarray):
        sizes = {len(r) for r in rings}
        if len(sizes) > 1:
            raise ValueError(f"ring collective: rings must have one size, got {sorted(sizes)}")
    rings = np.asarray(rings, dtype=int)
    if rings.ndim != 2:
        raise ValueError(f"ring collective: rings must be a list of rings, got shape {rings.shape}")
    k, n = rings.shape
    if n == 1:
        return np.zeros(k)
    per_ring = np.empty(k)
    per_ring[:] = nbytes  # one per ring

    def make() -> np.ndarray:
        src, dst = rings.ravel(), np.roll(rings, -1, axis=1).ravel()  # member i sends to i + 1
        step = flow_time_s(cluster, src, dst, np.repeat(per_ring / n, n))
        out = steps_per_n[kind] * (n - 1) * step.reshape(k, n).max(axis=1)
        out.flags.writeable = False
        return out

    return _kept(cluster, ("ring", kind, *_array_key(rings, per_ring)), make).copy()


def ring_collective_max_s(
    cluster: Cluster, rings: np.ndarray, nbytes: Sequence[float], *, kind: str
) -> tuple[float, ...]:
    """For each size in ``nbytes``, the slowest of the concurrent ring collectives over
    ``rings`` of that many bytes per device (:func:`ring_collective_s`), kept per cluster: a
    grid asks each stage's bucket sizes again for every configuration of its shape."""
    rings = np.asarray(rings, dtype=int)
    sizes = tuple(float(b) for b in nbytes)

    def make() -> tuple[float, ...]:
        return tuple(float(ring_collective_s(cluster, rings, b, kind=kind).max()) for b in sizes)

    return _kept(cluster, ("ring_max", kind, *_array_key(rings), sizes), make)


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
    (:func:`~system.simulator.transfers.flow_bandwidth_bps`). On uniform links with equal entry
    e this is ``e + 2α + 2·8X/β`` when the receives were posted at least α before e, and
    ``e + 3α + 2·8X/β`` when posted at e (as inside one gloo all-to-all). Returns an array shaped
    like ``entry_s``.
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


def btree_parents(n: int) -> list[int]:
    """Parent of every rank in NCCL's binary tree over ranks 0..n−1 (``ncclGetBtree``): clear
    the lowest set bit b and set 2b, or only clear b when that leaves the range; rank 0 is the
    root (−1).

    >>> btree_parents(8)
    [-1, 2, 4, 2, 0, 6, 4, 6]
    """
    out = [-1]
    for rank in range(1, n):
        bit = rank & -rank
        up = (rank ^ bit) | (bit << 1)
        out.append(up if up < n else rank ^ bit)
    return out


def dtree_parents(n: int) -> tuple[list[int], list[int]]:
    """The two trees of NCCL's double binary tree (``ncclGetDtree``): the binary tree, and its
    mirror (rank r ↔ n−1−r) for even n or its copy shifted by one rank for odd n.

    >>> dtree_parents(4)
    ([-1, 2, 0, 2], [1, 3, 1, -1])
    """
    first = btree_parents(n)
    if n % 2 == 0:
        second = [-1 if first[n - 1 - r] < 0 else n - 1 - first[n - 1 - r] for r in range(n)]
    else:
        second = [-1 if first[(r - 1) % n] < 0 else (first[(r - 1) % n] + 1) % n for r in range(n)]
    return first, second


def _depth_order(parent: list[int]) -> list[int]:
    """Non-root ranks, deepest first."""
    depth = []
    for r in range(len(parent)):
        d, q = 0, r
        while parent[q] >= 0:
            q, d = parent[q], d + 1
        depth.append(d)
    return sorted((r for r in range(len(parent)) if parent[r] >= 0), key=lambda r: -depth[r])


class _Trees(NamedTuple):
    """The trees of an n-rank all-reduce as flat arrays: ``parents[t]`` of tree t, its non-root
    ranks deepest first (``orders[t]``), and the flows: ``child``/``par`` list every tree's
    edges, tree after tree, and ``cols[t][r]`` is rank r's edge (its column) in tree t."""

    parents: np.ndarray  # (T, n) int, root −1
    orders: np.ndarray  # (T, n − 1) int
    cols: np.ndarray  # (T, n) int, root −1
    child: np.ndarray  # (T·(n − 1),) int
    par: np.ndarray  # (T·(n − 1),) int


@functools.lru_cache(maxsize=256)
def _trees(n: int, one: bool) -> _Trees:
    """:class:`_Trees` of NCCL's double binary tree over n ranks (its first tree only when
    ``one``)."""
    parents = dtree_parents(n)[:1] if one else dtree_parents(n)
    child = [r for p in parents for r in range(n) if p[r] >= 0]
    par = [p[r] for p in parents for r in range(n) if p[r] >= 0]
    cols = np.full((len(parents), n), -1, dtype=np.int64)
    for t in range(len(parents)):
        for c in range(t * (n - 1), (t + 1) * (n - 1)):
            cols[t, child[c]] = c - t * (n - 1)
    out = _Trees(
        np.asarray(parents, dtype=np.int64),
        np.asarray([_depth_order(p) for p in parents], dtype=np.int64),
        cols,
        np.asarray(child, dtype=np.int64),
        np.asarray(par, dtype=np.int64),
    )
    for a in out:
        a.flags.writeable = False
    return out


def _alone_bps(cluster: Cluster, src: np.ndarray, dst: np.ndarray) -> np.ndarray:
    """Rate (bit/s) of each flow ``src → dst`` were it the only flow (its pair, capped by
    whatever else caps one flow under the sharing model), kept per cluster in a (D, D) table
    filled as pairs are asked for (NaN: not yet)."""
    table = _kept(cluster, ("alone",), lambda: np.full((cluster.num_devices,) * 2, np.nan))
    unknown = np.isnan(table[src, dst])
    if unknown.any():
        a, b = src[unknown], dst[unknown]
        table[a, b] = alone_bps(cluster, a, b)
    return table[src, dst]


def tree_allreduce_end_s(
    cluster: Cluster, groups: Sequence[Sequence[int]], nbytes, entry_s
) -> np.ndarray:
    """When each member of G concurrent double-binary-tree all-reduces is done; ``nbytes`` a
    float or one per group. Returns (G, n).

    NCCL's double binary tree (NCCL 2.4+, ``src/graph/trees.cc`` ``ncclGetDtree``: the binary
    tree of ``ncclGetBtree`` and its mirror for an even rank count, or a copy shifted by one rank
    for an odd one; a message of one chunk runs on one channel, so on the first tree only, as
    NCCL lowers the channel count for small sizes). Each tree carries half of the message,
    reduced up to its root and broadcast back down, pipelined in chunks of
    :data:`TREE_CHUNK_BYTES`. A member is done at the later of two times. The pipeline: the first
    chunk climbs and descends the tree hop by hop (α + 8·chunk/r per hop, each member joining
    when it entered), the rest streams behind it at the tree's slowest edge rate, r each edge's
    rate alone on its links (early on, before the other tree's and the way down's chunks arrive,
    an edge has its links to itself). The busiest link: all edges of both trees, up and down, of
    every group are concurrent flows sharing links as the sharing model says (under ``pair`` a
    parent receives from its two children at two links' rates, under ``nic`` it shares its one
    NIC), and no member is done before every flow has moved its half at that shared rate and
    landed (8·half/r_shared + α after the last member entered): a link the trees share carries
    both halves whatever the order of their chunks.
    """
    g, e, size = _groups_entries(groups, entry_s, nbytes)
    n = g.shape[1]
    if n == 1:
        return e.copy()
    # one chunk: one channel, so one tree carries it all
    trees = _trees(n, bool(size.max() <= TREE_CHUNK_BYTES))
    passes, drain = _kept(
        cluster, ("tree", *_array_key(g, size)), lambda: _tree_hops(cluster, g, size, trees)
    )
    out = np.full(g.shape, -np.inf)
    for t, (up, down, stream) in enumerate(passes):
        done = _tree_pass(e, trees.parents[t], trees.orders[t], trees.cols[t], up, down)
        out = np.maximum(out, done + stream[:, None])
    return np.maximum(out, (e.max(axis=1) + drain)[:, None])


def _tree_hops(
    cluster: Cluster, g: np.ndarray, size: np.ndarray, trees: _Trees
) -> tuple[list[tuple[np.ndarray, np.ndarray, np.ndarray]], np.ndarray]:
    """What :func:`tree_allreduce_end_s` times without the entry times: per tree, the first
    chunk's hop up and down each edge (G, n − 1) and the rest's streaming time (G,); and the
    busiest link's drain (G,)."""
    child, par = trees.child, trees.par
    src = np.concatenate([g[:, child], g[:, par]], axis=1)  # up, then down, per group
    dst = np.concatenate([g[:, par], g[:, child]], axis=1)
    shared = flow_bandwidth_bps(cluster, src.ravel(), dst.ravel()).reshape(src.shape)
    rate = _alone_bps(cluster, src, dst)
    alpha = cluster.delay_s[src, dst]
    half = size / len(trees.parents)
    chunk = np.minimum(half, TREE_CHUNK_BYTES)
    hop = alpha + 8.0 * chunk[:, None] / rate  # (G, 2·edges): first chunk per hop
    edges = g.shape[1] - 1
    passes = []
    for t in range(len(trees.parents)):
        cols = np.arange(t * edges, (t + 1) * edges)  # this tree's edges among the up flows
        up, down = hop[:, cols], hop[:, cols + child.size]
        slowest = np.minimum(rate[:, cols], rate[:, cols + child.size]).min(axis=1)
        stream = 8.0 * (half - chunk) / slowest
        passes.append(tuple(_read_only(x) for x in (up, down, stream)))
    drain = (8.0 * half[:, None] / shared + alpha).max(axis=1)  # the busiest link's bytes
    return passes, _read_only(drain)


def _read_only(a: np.ndarray) -> np.ndarray:
    """``a`` (a fresh array), no longer writable: a kept value is shared."""
    a = np.ascontiguousarray(a)
    a.flags.writeable = False
    return a


@kernel
def _tree_pass(e, parent, order, col, up, down):
    """One tree's first chunk, (G, n) arrival times: up the tree leaves first (a parent holds
    it once every child's has arrived, and it entered itself), then down from the root, each
    hop taking ``up``/``down`` of the child's edge ``col[r]``. The maxima are numpy's (NaN
    wins, then the first argument on a tie)."""
    groups = e.shape[0]
    reduced = e.copy()
    for i in range(order.size):  # leaves first
        r = order[i]
        p = parent[r]
        k = col[r]
        for j in range(groups):
            a = reduced[j, p]
            b = reduced[j, r] + up[j, k]
            reduced[j, p] = a if (a >= b or a != a) else b
    done = reduced.copy()  # the root's value is final; the others are set on the way down
    for i in range(order.size - 1, -1, -1):  # root first
        r = order[i]
        k = col[r]
        for j in range(groups):
            done[j, r] = done[j, parent[r]] + down[j, k]
    return done


def two_level_block(cluster: Cluster, groups: Sequence[Sequence[int]]) -> int:
    """The block size k of a two-level all-reduce over ``groups``, or 0 where the rank map does
    not allow one: every group must split into n/k ≥ 2 runs of k ≥ 2 consecutive ranks, each run
    inside one region, with one k for all groups.

    >>> from system.cases import get_case
    >>> two_level_block(get_case("debug"), [[0, 1, 2, 3]])   # 2 devices per region
    2
    >>> two_level_block(get_case("debug"), [[0, 2, 4, 6]])   # one per region
    0
    """
    region = np.asarray(cluster.region_of)
    ks = set()
    for grp in groups:
        r = region[np.asarray(list(grp), dtype=int)]
        n = r.size
        k = int(np.argmax(r != r[0])) if np.any(r != r[0]) else n
        if k < 2 or n % k or n // k < 2:
            return 0
        blocks = r.reshape(n // k, k)
        if np.any(blocks != blocks[:, :1]):
            return 0
        ks.add(k)
    return ks.pop() if len(ks) == 1 else 0


def two_level_allreduce_end_s(
    cluster: Cluster, groups: Sequence[Sequence[int]], nbytes, entry_s, k: int
) -> tuple[np.ndarray, str]:
    """(G, n) end times of a two-level all-reduce with blocks of ``k``, and the inner algorithm
    that crossed the blocks (``ring`` or ``tree``).

    Reduce-scatter inside blocks of k consecutive ranks that share a region, an all-reduce of the
    1/k shards across the blocks (k concurrent groups, ring or tree, whichever ends first),
    all-gather inside the blocks — megatron-core's partial distributed optimizer
    (``num_distributed_optimizer_instances``: reduce-scatter over the intra-instance group,
    all-reduce over the inter-instance group, parameter all-gather over the intra-instance
    group). Every member is done when the last of its group is.
    """
    g, e, size = _groups_entries(groups, entry_s, nbytes)
    n = g.shape[1]
    if k < 2 or n % k or n // k < 2:
        raise ValueError(f"two-level all-reduce: block size {k} does not split groups of {n}")
    blocks = g.reshape(g.shape[0], n // k, k)
    inner = blocks.reshape(-1, k)
    inner_bytes = np.repeat(size, n // k)
    rs = ring_collective_s(cluster, inner, inner_bytes, kind="reducescatter").reshape(-1, n // k)
    ag = ring_collective_s(cluster, inner, inner_bytes, kind="allgather").reshape(-1, n // k)
    across = blocks.transpose(0, 2, 1).reshape(-1, n // k)  # (G·k, n/k): same position per block
    zero = np.zeros(across.shape)
    mid, how = choose_allreduce(cluster, across, np.repeat(size / k, k), zero, ("ring", "tree"))
    mid = mid.max(axis=1).reshape(-1, k).max(axis=1)  # per group
    total = rs.max(axis=1) + mid + ag.max(axis=1)
    return np.broadcast_to((e.max(axis=1) + total)[:, None], g.shape).copy(), how


def allreduce_end_s(
    cluster: Cluster, groups: Sequence[Sequence[int]], nbytes, entry_s, algorithm: str
) -> tuple[np.ndarray, str]:
    """(G, n) end times of ``algorithm`` (one of :data:`ALGORITHMS`) and its full name
    (``two_level/ring`` or ``two_level/tree`` for the two-level one). ValueError when the rank
    map does not allow a two-level all-reduce."""
    g, e, size = _groups_entries(groups, entry_s, nbytes)
    if algorithm == "ring":
        t = ring_collective_s(cluster, g, size) if g.shape[1] > 1 else np.zeros(g.shape[0])
        return np.broadcast_to((e.max(axis=1) + t)[:, None], g.shape).copy(), "ring"
    if algorithm == "tree":
        return tree_allreduce_end_s(cluster, g, size, e), "tree"
    if algorithm == "two_level":
        k = two_level_block(cluster, g)
        if not k:
            raise ValueError("two-level all-reduce: the groups do not split into region blocks")
        end, how = two_level_allreduce_end_s(cluster, g, size, e, k)
        return end, f"two_level/{how}"
    raise ValueError(f"all-reduce algorithm must be one of {ALGORITHMS}, got {algorithm!r}")


def choose_allreduce(
    cluster: Cluster,
    groups: Sequence[Sequence[int]],
    nbytes,
    entry_s,
    candidates: Sequence[str] = ALGORITHMS,
) -> tuple[np.ndarray, str]:
    """The candidate whose last member finishes first under the link model: its (G, n) end
    times and name, one algorithm for all groups of the call. Not NCCL's choice, but what a user
    forces with ``NCCL_ALGO`` (or the framework's flag for ``two_level``) after measuring each.
    ``two_level`` is skipped where the rank map does not allow it; a tree of two ranks is the
    ring (ties go to the earlier candidate)."""
    g = np.asarray([list(r) for r in groups], dtype=int)
    best: tuple[np.ndarray, str] | None = None
    for algo in candidates:
        if algo == "two_level" and not two_level_block(cluster, g):
            continue
        if algo == "tree" and g.shape[1] < 3:
            continue
        end, name = allreduce_end_s(cluster, g, nbytes, entry_s, algo)
        if best is None or end.max() < best[0].max() - 1e-12:
            best = (end, name)
    if best is None:
        raise ValueError(f"all-reduce: none of {tuple(candidates)} applies to these groups")
    return best


def nccl_allreduce_end_s(
    cluster: Cluster, groups: Sequence[Sequence[int]], nbytes, entry_s
) -> tuple[np.ndarray, list[str]]:
    """The fastest of ring and tree per group (not NCCL's choice: :func:`nccl_tuned_end_s` is):
    each of G concurrent groups (a communicator each) takes ring or tree, whichever ends first
    for it (:func:`choose_allreduce` on that group, with the others' flows sharing the links as
    under the tree's choice); (G, n) end times and the algorithm of each group."""
    g, e, size = _groups_entries(groups, entry_s, nbytes)
    ring, _ = allreduce_end_s(cluster, g, size, e, "ring")
    if g.shape[1] < 3:
        return ring, ["ring"] * g.shape[0]
    tree, _ = allreduce_end_s(cluster, g, size, e, "tree")
    use_tree = tree.max(axis=1) < ring.max(axis=1) - 1e-12
    return np.where(use_tree[:, None], tree, ring), ["tree" if u else "ring" for u in use_tree]


def nccl_tuned_end_s(
    cluster: Cluster,
    groups: Sequence[Sequence[int]],
    nbytes,
    entry_s,
    coll: str = "allreduce",
) -> tuple[np.ndarray, list[str], list[str]]:
    """NCCL's own pick per group, simulated: (G, n) end times, the algorithm each group ran and
    NCCL's ``algorithm/protocol`` for it. Each group is its own communicator: NCCL's tuner
    (:func:`system.simulator.nccl_tuner.choose`, ``src/graph/tuning.cc``) picks from its own
    constants, and the pick is simulated here under the link model; groups that pick the ring
    and groups that pick the tree are simulated apart (each set's flows share links among
    themselves only). An all-reduce runs the ring or the tree NCCL picks; a reduce-scatter or
    all-gather (``coll``) has no tree, and the PAT NCCL may pick for one GPU per node is not
    modelled: those run the ring, their pick still recorded."""
    g, e, size = _groups_entries(groups, entry_s, nbytes)

    def make() -> tuple[list[str], np.ndarray]:
        picks = [
            choose(system_for_group(cluster, grp), coll, b)
            for grp, b in zip(g.tolist(), size.tolist(), strict=True)
        ]
        use_tree = np.array([c.algorithm == "tree" for c in picks], dtype=bool)
        use_tree.flags.writeable = False
        return [f"{c.algorithm}/{c.protocol}" for c in picks], use_tree

    tuned, use_tree = _kept(cluster, ("nccl", coll, *_array_key(g, size)), make)
    tuned = list(tuned)
    if coll != "allreduce":
        return e, ["ring"] * len(tuned), tuned  # the caller times the ring collectives
    ran = ["tree" if u else "ring" for u in use_tree.tolist()]
    end = np.empty(g.shape)
    for algo, rows in (("ring", ~use_tree), ("tree", use_tree)):
        if rows.any():
            end[rows] = allreduce_end_s(cluster, g[rows], size[rows], e[rows], algo)[0]
    return end, ran, tuned
