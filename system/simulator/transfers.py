"""Point-to-point transfer times on a case's links (α-β model), and the transports that move them.

Every transfer of X bytes over link (a, b) takes ``α_ab + 8·X / β_eff`` seconds (paper §2), where
``β_eff`` is what the flow gets among the flows that run at the same time under the cluster's
link-sharing model (``pair``, ``nic``, ``region``, ``flow``, ``tc_class``; max-min fair;
:mod:`system.simulator.sharing`). Hosts with a NIC of their own (cases 1–2) share it under every
model. A :class:`Transport` says how a communication library (NCCL, gloo) posts and buffers its
messages. The collectives built from these flows are in :mod:`system.simulator.collectives`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from system.cluster import Cluster
from system.simulator.sharing import shared_bandwidth_bps

__all__ = [
    "GLOO",
    "NCCL",
    "Transport",
    "NCCL_RENDEZVOUS",
    "TRANSPORTS",
    "flow_bandwidth_bps",
    "flow_time_s",
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
        host = cluster.host_ids
        bw = bw * cluster.links.efficiency(host[src], host[dst], nbytes)
    t = cluster.delay_s[src, dst] + 8.0 * np.asarray(nbytes, dtype=float) / bw
    return np.where(src == dst, 0.0, t)
