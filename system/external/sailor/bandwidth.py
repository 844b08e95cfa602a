"""Importer of Sailor's bandwidth fits, and the cluster they describe.

Two files (units: the fit gives GB/s; ``x = log2(message_bytes / 1e6)``):

- ``multizone_bandwidths_het.json``: ``[zone_s][gpu_s][count_s][zone_r][gpu_r][count_r] =
  [[a, b, c], peak_bytes_per_s]`` — NCCL send/recv between two nodes, ``count`` GPUs of each node
  sending at once (one pair per GPU), bandwidth = all pairs' bytes over the time;
- ``intra_node_bandwidths.json``: ``[gpu][count] = [[a, b, c], peak_bytes_per_s]`` — the same
  inside one node with ``count`` GPUs.

:func:`load_bandwidth_fits` and :func:`load_intra_node_fits` return :class:`BandwidthFits` /
a dict of :class:`~system.links.BandwidthCurve` (each curve's ``flows`` = the count, so one GPU's
flow gets 1/count of the fitted total). :func:`cluster_from_nodes` builds a
:class:`~system.cluster.Cluster` of whole nodes from them: one device per GPU, one host per node,
each inter-node device pair's per-flow peak in ``bandwidth_gbps`` and the curves in ``links``.

Every fit must be positive over the sizes it is used at: from its floor (the smallest measured
size, a power of two from 64 KiB, where it is positive; smaller messages take the floor's time)
to the largest measured size, 1 GiB. Sailor's fits are quadratics that dip below zero at the
small end, which the floor handles; one that is zero or negative above its floor would give a
link of no bandwidth, so the file is refused. A peak over :data:`MAX_PEAK_BYTES_PER_S` would
make a link free and is refused too. Both files must be non-empty.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from system.cluster import Cluster, LinkSharing, fingerprint_from_recipe
from system.external.sailor.errors import SailorFormatError, number, positive_int, read_json
from system.external.sailor.gpus import project_gpu
from system.links import BandwidthCurve, KindPairCurves, SizeDependentLinks

__all__ = [
    "BandwidthFits",
    "NodeSpec",
    "load_bandwidth_fits",
    "load_intra_node_fits",
    "cluster_from_nodes",
    "MULTIZONE",
    "multizone_cluster",
    "MAX_PEAK_BYTES_PER_S",
]

# No link of any node is faster: 10 TB/s is ten times an NVLink 4 GPU's 900 GB/s.
MAX_PEAK_BYTES_PER_S = 1e13


@dataclass(frozen=True, slots=True)
class NodeSpec:
    """One node: its zone, Sailor GPU type and how many of its GPUs the run uses."""

    zone: str
    gpu: str
    gpus: int


@dataclass(frozen=True, slots=True)
class BandwidthFits:
    """Inter-node fits by ``(zone_s, gpu_s, count_s, zone_r, gpu_r, count_r)`` (Sailor names)."""

    source: str
    curves: dict[tuple[str, str, int, str, str, int], BandwidthCurve] = field(repr=False)

    def curve(self, src: NodeSpec, dst: NodeSpec) -> BandwidthCurve:
        """The fit from ``src``'s node to ``dst``'s; SailorFormatError naming the missing key."""
        key = (src.zone, src.gpu, src.gpus, dst.zone, dst.gpu, dst.gpus)
        if key not in self.curves:
            raise SailorFormatError(
                self.source,
                "[{}][{}][{}][{}][{}][{}]".format(*key),
                "no bandwidth fit for this pair of nodes",
            )
        return self.curves[key]


def _curve(entry, file, where: str, flows: int) -> BandwidthCurve:
    if not (isinstance(entry, list) and len(entry) == 2 and isinstance(entry[0], list)):
        raise SailorFormatError(file, where, "expected [[a, b, c], peak_bytes_per_s]")
    if len(entry[0]) != 3:
        raise SailorFormatError(file, where, f"expected 3 coefficients, got {len(entry[0])}")
    a, b, c = (number(v, file, f"{where}[0][{i}]", minimum=None) for i, v in enumerate(entry[0]))
    peak = number(entry[1], file, f"{where}[1]", minimum=1e-300)
    if peak > MAX_PEAK_BYTES_PER_S:
        raise SailorFormatError(
            file, f"{where}[1]", f"peak {peak:.3g} bytes/s is over {MAX_PEAK_BYTES_PER_S:g}"
        )
    try:
        curve = BandwidthCurve(a, b, c, peak_bps=8.0 * peak, flows=flows)
    except ValueError as e:
        raise SailorFormatError(file, where, str(e)) from None
    lowest_gbs, at = _lowest_gbs(curve)
    if lowest_gbs <= 0:
        raise SailorFormatError(
            file,
            where + "[0]",
            f"fit {lowest_gbs:.3g} GB/s at {at:.3g} bytes, inside the sizes it is used for "
            f"({curve.floor_bytes:.0f}..{curve.max_bytes:.0f}); a link needs bandwidth > 0",
        )
    return curve


def _lowest_gbs(curve: BandwidthCurve) -> tuple[float, float]:
    """The fit's least value (GB/s) between its floor and its largest size, and where (bytes):
    at an end, or at the vertex of a parabola that opens upwards."""
    lo, hi = math.log2(curve.floor_bytes / 1e6), math.log2(curve.max_bytes / 1e6)
    xs = [lo, hi]
    if curve.a > 0 and lo < -curve.b / (2 * curve.a) < hi:
        xs.append(-curve.b / (2 * curve.a))
    x = min(xs, key=lambda v: curve.a * v * v + curve.b * v + curve.c)
    return curve.a * x * x + curve.b * x + curve.c, 1e6 * 2.0**x


def _mapping(d, file, where: str) -> dict:
    if not isinstance(d, dict) or not d:
        raise SailorFormatError(file, where, "expected a non-empty JSON object")
    return d


def load_bandwidth_fits(path) -> BandwidthFits:
    """All inter-node fits of ``multizone_bandwidths_het.json`` (every entry checked)."""
    data = _mapping(read_json(path), path, "(top level)")
    curves = {}
    for zs, by_gs in data.items():
        for gs, by_cs in _mapping(by_gs, path, f"[{zs}]").items():
            project_gpu(gs, path, f"[{zs}][{gs}]")
            for cs, by_zr in _mapping(by_cs, path, f"[{zs}][{gs}]").items():
                n_s = positive_int(_int_key(cs, path, f"[{zs}][{gs}][{cs}]"), path, f"[{cs}]")
                for zr, by_gr in _mapping(by_zr, path, f"[{zs}][{gs}][{cs}]").items():
                    for gr, by_cr in _mapping(by_gr, path, f"[{zs}][{gs}][{cs}][{zr}]").items():
                        where = f"[{zs}][{gs}][{cs}][{zr}][{gr}]"
                        project_gpu(gr, path, where)
                        for cr, entry in _mapping(by_cr, path, where).items():
                            n_r = _int_key(cr, path, f"{where}[{cr}]")
                            flows = min(n_s, n_r)
                            key = (zs, gs, n_s, zr, gr, n_r)
                            curves[key] = _curve(entry, path, f"{where}[{cr}]", flows)
    return BandwidthFits(source=str(path), curves=curves)


def _int_key(key: str, file, where: str) -> int:
    try:
        value = int(key)
    except ValueError:
        raise SailorFormatError(file, where, f"expected a GPU count, got {key!r}") from None
    return positive_int(value, file, where)


def load_intra_node_fits(path) -> dict[tuple[str, int], BandwidthCurve]:
    """Intra-node fits of ``intra_node_bandwidths.json`` by (Sailor GPU name, count)."""
    data = _mapping(read_json(path), path, "(top level)")
    out = {}
    for gpu, by_count in data.items():
        project_gpu(gpu, path, f"[{gpu}]")
        for count, entry in _mapping(by_count, path, f"[{gpu}]").items():
            n = _int_key(count, path, f"[{gpu}][{count}]")
            out[(gpu, n)] = _curve(entry, path, f"[{gpu}][{count}]", n)
    return out


def _per_flow_gbps(curve: BandwidthCurve) -> float:
    return curve.peak_bps / curve.flows / 1e9


def node_pair_peak_gbps(fits: BandwidthFits, a: NodeSpec, b: NodeSpec) -> float:
    """Gbit/s between a GPU of node ``a`` and one of another node ``b`` in
    :func:`cluster_from_nodes`'s cluster: the smaller of the two directions' per-flow peaks."""
    return min(_per_flow_gbps(fits.curve(a, b)), _per_flow_gbps(fits.curve(b, a)))


def cluster_from_nodes(
    nodes: Sequence[NodeSpec],
    fits: BandwidthFits,
    intra: dict[tuple[str, int], BandwidthCurve] | None = None,
    *,
    name: str = "sailor",
) -> Cluster:
    """A cluster of whole nodes: node k's GPUs are devices ``offset_k .. offset_k + gpus − 1``
    on host k, typed by :func:`~system.external.sailor.gpus.project_gpu`, region = zone.

    Inter-node device pairs get the pair's fitted per-flow peak (peak / flows); intra-node pairs
    the intra-node fit's, or 1e4 Gbit/s (effectively free) for a node without one (a single GPU,
    or a type Sailor did not profile inside a node). ``delay_ms`` is 0: latency is in the fits.
    """
    if not nodes:
        raise ValueError("cluster_from_nodes: needs at least one node")
    # each node as a (zone, Sailor GPU, GPUs) tuple, its GPU type checked once per name (the
    # first node of a bad name is the one named)
    specs = [(n.zone, n.gpu, n.gpus) for n in nodes]
    project: dict[str, str] = {}
    for k, n in enumerate(nodes):
        if n.gpu not in project:
            project[n.gpu] = project_gpu(n.gpu, fits.source, f"node {k} gpu")
    recipe = [(z, project[g], c) for z, g, c in specs]
    host_of = [k for k, n in enumerate(nodes) for _ in range(n.gpus)]
    gpu_of = [g for _, g, c in recipe for _ in range(c)]
    region_of = [z for z, _, c in specs for _ in range(c)]
    d = len(host_of)
    # node kinds (zone, GPU, GPUs) in order of first appearance; a curve per ordered pair of
    # kinds that two distinct nodes form
    index: dict[tuple, int] = {}
    kinds: list[NodeSpec] = []
    for spec, n in zip(specs, nodes, strict=True):
        if spec not in index:
            index[spec] = len(kinds)
            kinds.append(n)
    kind = np.array([index[k] for k in specs])
    count = np.bincount(kind, minlength=len(kinds))
    curves: dict[tuple[int, int], BandwidthCurve] = {}
    for ka in range(len(kinds)):
        for kb in range(len(kinds)):
            if ka != kb or count[ka] > 1:
                curves[(ka, kb)] = fits.curve(kinds[ka], kinds[kb])
    per_flow = np.zeros((len(kinds), len(kinds)))
    for (ka, kb), c in curves.items():
        per_flow[ka, kb] = _per_flow_gbps(c)
    peak = per_flow[np.ix_(kind, kind)]
    own = [(intra or {}).get((g, c)) for _, g, c in specs]  # each node's intra-node fit
    within = {i: c for i, c in enumerate(own) if c is not None}
    diagonal = np.arange(len(nodes))
    peak[diagonal, diagonal] = [c.peak_bps / c.flows / 1e9 if c is not None else 1e4 for c in own]
    peak = np.minimum(peak, peak.T)  # the Cluster keeps one symmetric peak per pair
    # a node's devices are consecutive: each device's row and column are its node's; handed
    # over read-only, with the diagonal the cluster gives a device to itself (not copied)
    gpus = [n.gpus for n in nodes]
    bw = np.repeat(np.repeat(peak, gpus, axis=0), gpus, axis=1)
    np.fill_diagonal(bw, np.inf)
    delay = np.zeros((d, d))
    for m in (bw, delay):
        m.setflags(write=False)
    links = SizeDependentLinks(between=KindPairCurves(tuple(kind.tolist()), curves), within=within)
    cluster = Cluster(
        name=name,
        region_of=tuple(region_of),
        host_of=tuple(host_of),
        delay_ms=delay,
        bandwidth_gbps=bw,
        gpu_of=tuple(gpu_of),
        links=links,
        link_sharing=LinkSharing("pair"),  # flows share a pair's curve, nothing else (links.py)
        meta={"source": "sailor", "nodes": specs},
    )
    # nodes, GPU types and links decide everything above (a node pair's peak is read off its
    # kinds' curve or its node's intra-node curve, in ``links``): no need to hash the matrices
    fingerprint_from_recipe(cluster, json.dumps(["cluster_from_nodes", recipe]))
    return cluster


MULTIZONE = (  # (zone, nodes): 16 nodes of 4 V100-16 in Sailor's five zones
    ("us-central1-a", 4),
    ("us-central1-b", 3),
    ("us-central1-c", 3),
    ("us-central1-f", 3),
    ("us-west1-b", 3),
)


def multizone_cluster(sailor_dir: str) -> Cluster:
    """16 nodes of 4 V100-16 in five zones, links from Sailor's fitted bandwidths."""
    fits = load_bandwidth_fits(f"{sailor_dir}/multizone_bandwidths_het.json")
    intra = load_intra_node_fits(f"{sailor_dir}/intra_node_bandwidths.json")
    nodes = [NodeSpec(zone, "V100-16", 4) for zone, n in MULTIZONE for _ in range(n)]
    return cluster_from_nodes(nodes, fits, intra, name="sailor-multizone")
