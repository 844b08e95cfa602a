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
- sharded parameter server (the paper's DP, §3.2): each device sends one S/n shard to every peer
  and gets the reduced shard back, sends serialised: ``Σ_{d'} 2·(α + 8·S/(n·β_eff))``; a group
  takes as long as its slowest device.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from system.cluster import Cluster

__all__ = ["flow_bandwidth_bps", "flow_time_s", "ring_collective_s", "sharded_ps_s"]


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


def sharded_ps_s(cluster: Cluster, groups: Sequence[Sequence[int]], nbytes: float) -> np.ndarray:
    """Seconds for each of several concurrent sharded-parameter-server exchanges (paper §3.2).

    Each device sends its peers' shards one after another, so at any moment every device with a
    cross-host peer holds one flow through its host's NIC.
    """
    groups = [list(g) for g in groups]
    out = np.zeros(len(groups))
    if not groups or len(groups[0]) == 1:
        return out
    n = len(groups[0])
    sharing = {}
    if cluster.host_nic_gbps is not None:
        host = np.asarray(cluster.host_of)
        busy = [d for g in groups for d in g if np.any(host[g] != host[d])]
        counts = (
            np.bincount(host[busy], minlength=cluster.num_hosts)
            if busy
            else np.zeros(cluster.num_hosts, dtype=int)
        )
        sharing = {"host_flows_out": counts, "host_flows_in": counts}
    for k, g in enumerate(groups):
        src = np.repeat(g, n)
        dst = np.tile(g, n)
        t = flow_time_s(cluster, src, dst, nbytes / n, **sharing)
        out[k] = 2.0 * t.reshape(n, n).sum(axis=1).max()
    return out
