"""Transfer and collective times on a case's links, with link and NIC sharing (MODELING.md).

Every transfer of X bytes over link (a, b) takes ``α_ab + 8·X / β_eff`` seconds (paper §2), where
``β_eff`` is the link bandwidth shared fairly among the flows that run at the same time:

- flows on the same ordered device pair split that link's bandwidth;
- flows that leave (or enter) a host through its NIC (``Cluster.host_nic_gbps``, cases 1–2) split
  the NIC: each gets at most NIC / (number of concurrent cross-host flows out of / into the host).
  NICs are full duplex, so outgoing and incoming flows are counted separately.

Collectives:

- ring all-reduce over n devices in the given order: 2·(n−1) synchronous steps, each moving S/n
  bytes on every ring edge at once, a step lasting as long as the slowest edge — on uniform links
  this is the textbook ``2·(n−1)/n · S/β + 2·(n−1)·α``; reduce-scatter and all-gather take n−1
  steps (half);
- sharded parameter server (the paper's DP, §3.2) as our runtime runs it
  (:mod:`system.runtime.data_parallel`): point-to-point and concurrent, one connection per
  peer, so a device's n−1 shards travel at once (sharing only its host NIC, where it has one).
  Each member enters when its own last backward ends; see :func:`sharded_ps_p2p_s` for the
  events. The scheduler's cost model (:mod:`system.cost.model`) keeps the paper's serialised
  charge ``Σ_{d'} 2·(α + 8·S/(n·β))`` — an upper bound of this exchange for synchronised entry.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from system.cluster import Cluster

__all__ = ["flow_bandwidth_bps", "flow_time_s", "ring_collective_s", "sharded_ps_p2p_s"]


def flow_bandwidth_bps(
    cluster: Cluster,
    src: Sequence[int],
    dst: Sequence[int],
    host_flows_out: np.ndarray | None = None,
    host_flows_in: np.ndarray | None = None,
) -> np.ndarray:
    """Bandwidth (bit/s) each of a set of concurrent flows ``src[i] -> dst[i]`` gets.

    ``host_flows_out/in`` (per host) override how many concurrent cross-host flows share each NIC
    (default: counted from the given flows).
    """
    src, dst = np.asarray(src, dtype=int), np.asarray(dst, dtype=int)
    if src.shape != dst.shape:
        raise ValueError(f"flows: src {src.shape} and dst {dst.shape} differ in shape")
    if src.size == 0:
        return np.zeros(0)
    d = cluster.num_devices
    bw = cluster.bandwidth_bps[src, dst].astype(float)
    pair = src * d + dst
    same_pair = np.bincount(pair, minlength=d * d)[pair]
    bw = bw / same_pair
    if cluster.host_nic_gbps is None:
        return bw
    host = np.asarray(cluster.host_of)
    hs, hd = host[src], host[dst]
    cross = hs != hd
    h = cluster.num_hosts
    n_out = np.bincount(hs[cross], minlength=h) if host_flows_out is None else host_flows_out
    n_in = np.bincount(hd[cross], minlength=h) if host_flows_in is None else host_flows_in
    nic = np.asarray(cluster.host_nic_gbps) * 1e9
    share = np.minimum(nic[hs] / np.maximum(n_out[hs], 1), nic[hd] / np.maximum(n_in[hd], 1))
    return np.where(cross, np.minimum(bw, share), bw)


def flow_time_s(
    cluster: Cluster, src: Sequence[int], dst: Sequence[int], nbytes: float, **sharing
) -> np.ndarray:
    """Seconds for each concurrent flow to move ``nbytes``; zero for a device to itself."""
    src, dst = np.asarray(src, dtype=int), np.asarray(dst, dtype=int)
    bw = flow_bandwidth_bps(cluster, src, dst, **sharing)
    t = cluster.delay_s[src, dst] + 8.0 * float(nbytes) / bw
    return np.where(src == dst, 0.0, t)


def ring_collective_s(
    cluster: Cluster, rings: Sequence[Sequence[int]], nbytes: float, *, kind: str = "allreduce"
) -> np.ndarray:
    """Seconds for each of several concurrent ring collectives over ``nbytes`` per device.

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
    step = flow_time_s(cluster, src, dst, nbytes / n).reshape(len(rings), n).max(axis=1)
    return steps_per_n[kind] * (n - 1) * step


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
    bytes; shard X = nbytes / n. Events, as the runtime and gloo/NCCL run them — a message
    leaves only once its receiver's receive is posted and that notice has crossed the link:

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
    g = np.asarray(groups, dtype=int)
    e = np.asarray(entry_s, dtype=float)
    if g.ndim != 2 or e.shape != g.shape:
        raise ValueError(f"sharded PS: groups {g.shape} and entry_s {e.shape} must be (G, n) alike")
    n = g.shape[1]
    if n == 1:
        return e.copy()
    src = np.repeat(g, n, axis=1).reshape(-1, n, n)  # [g, i, j] = device i
    dst = np.tile(g, (1, n)).reshape(-1, n, n)  # [g, i, j] = device j
    off = ~np.eye(n, dtype=bool)[None].repeat(g.shape[0], axis=0)
    x_s = np.zeros(src.shape)
    x_s[off] = 8.0 * (nbytes / n) / flow_bandwidth_bps(cluster, src[off], dst[off])
    a = np.where(off, cluster.delay_s[src, dst], 0.0)  # [g, i, j] = α_ij
    posted = np.broadcast_to(np.asarray(posted_s, dtype=float), e.shape)
    s1 = np.maximum(e[:, :, None], posted[:, None, :] + a.transpose(0, 2, 1))
    a1 = np.where(off, s1 + a + x_s, -np.inf)
    red = np.maximum(e, a1.max(axis=1))  # [g, j]
    s2 = np.maximum(red[:, :, None], s1 + x_s)  # [g, j, i]: j's reduced shard to i
    a2 = np.where(off, s2 + a + x_s, -np.inf)
    return np.maximum(red, a2.max(axis=1))
