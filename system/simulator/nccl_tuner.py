"""NCCL's own choice of collective algorithm and protocol, computed as NCCL computes it.

NCCL picks, for every call, the (algorithm, protocol) pair its cost model predicts to be the
fastest: ``time = latency + bytes / bandwidth`` per pair, the lowest wins (NVIDIA/nccl
``src/enqueue.cc`` ``topoGetAlgoInfo``). This module re-implements that model from the constants
of NCCL 2.27.7 (tag ``v2.27.7-1``, commit 593de54e), ``src/graph/tuning.cc``
(``ncclTopoTuneModel``, ``ncclTopoGetAlgoTime``) and, for the per-channel bandwidth and the
channel count it starts from, ``src/graph/search.cc`` (``ncclTopoCompute``) and
``src/graph/topo.h``. The predicted times are NCCL's, not this project's link model: NCCL knows
a NIC's nominal speed and fixed per-hop latencies, nothing of WAN delays or of how flows share
links (:mod:`system.simulator.collectives` simulates the pick under the link model).

Steps, each NCCL's: the ring and tree graphs NCCL would search (channels, ``bwIntra``,
``bwInter``; :func:`search_graphs`, in closed form for the node shapes this project models: p
identical GPUs per node linked all-to-all by NVLink or by PCIe, ``nics_per_node`` NICs of
``net_gbps`` each); per collective, algorithm and protocol a latency and a bandwidth
(:func:`tune_model`); the predicted time of one call (:func:`algo_time_us`); the fastest pair
(:func:`choose`). :func:`system_for_group` describes a group of a :class:`~system.cluster.Cluster`
as NCCL sees it.

Not modelled: CollNet and NVLS (they need SHARP switches or NVSwitch multicast), PCIe switches
between GPUs, AMD/ARM/POWER CPUs, NCCL_ALGO / NCCL_PROTO overrides (forcing is the caller's),
tuner plugins, aggregated calls (one operation per launch).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import NamedTuple

import numpy as np

__all__ = [
    "NCCL_VERSION",
    "ALGOS",
    "PROTOS",
    "COLLECTIVES",
    "GPU_ARCH",
    "NcclSystem",
    "Graph",
    "TunerModel",
    "TunerChoice",
    "search_graphs",
    "tune_model",
    "algo_time_us",
    "choose",
    "tune_allreduce",
    "system_for_group",
]

NCCL_VERSION = "2.27.7-1"
ALGOS = ("tree", "ring", "pat")  # the ones NCCL offers without CollNet/NVLS hardware
PROTOS = ("LL", "LL128", "Simple")
COLLECTIVES = ("allreduce", "reducescatter", "allgather")

# Compute capability of this project's GPU types (system.gpus.GPU_TYPES).
GPU_ARCH = {
    "V100": 70,
    "T4": 75,
    "RTX2080": 75,
    "TitanRTX": 75,
    "A100": 80,
    "RTX3090": 86,
    "L4": 89,
    "GH200": 90,
}
# Per-GPU NVLink links of the SXM parts (NVIDIA datasheets: V100 6, A100 12, H100/GH200 18);
# the others have no NVLink here.
NVLINKS_PER_GPU = {"V100": 6, "A100": 12, "GH200": 18}
# NVLink bandwidth per link and direction, GB/s (topo.h SM*_NVLINK_BW).
_NVLINK_BW = {70: 20.0, 75: 20.0, 80: 20.0, 86: 12.0, 89: 12.0, 90: 20.6, 100: 40.1}
# PCIe x16 bandwidth per GPU, GB/s, as NCCL derives it from the link (width · GT/s code / 80:
# Gen3 12, Gen4 24, Gen5 48); the default generation per arch.
_PCI_BW = {70: 12.0, 75: 12.0, 80: 24.0, 86: 24.0, 89: 24.0, 90: 48.0, 100: 48.0}

# ---- tuning.cc constants (µs and GB/s), indexed [algo][proto] with algo tree, ring ----------
_BASE_LAT = {"tree": (6.8, 14.0, 8.4), "ring": (6.6, 14.0, 8.4)}
_HW_LAT = {  # [link][algo][proto]
    "nvlink": {"tree": (0.6, 1.25, 4.0), "ring": (0.6, 1.9, 3.4)},
    "pci": {"tree": (1.0, 1.9, 4.0), "ring": (1.0, 2.5, 5.7)},
    "net": {"tree": (5.0, 8.5, 14.0), "ring": (2.7, 4.0, 14.0)},
}
# [compcap index: Volta, Ampere, Hopper, Blackwell][node index: 1, 2, ≥3 nodes]
_LL_MAX_BW = ((39.0, 39.0, 20.4), (87.7, 22.5, 19.0), (141.0, 45.0, 35.0), (282.0, 90.0, 70.0))
_RING_LL128_BW = ((20.0,) * 3, (20.0,) * 3, (36.7,) * 3, (73.4,) * 3)
_TREE_LL128_BW = ((20.0,) * 3, (20.0,) * 3, (36.7, 36.7, 29.0), (73.4, 73.4, 58.0))
_TREE_BW = ((26.5, 18.5, 10.0), (24.0, 23.6, 17.8), (38.7, 41.4, 36.0), (77.4, 82.8, 72.0))
# treeCorrectionFactor[proto][log2(bytes/64)], 64 B .. 256 MiB
_TREE_CORRECTION = (
    (1., 1., 1., 1., .9, .8, .7, .7, .7, .7, .6, .5, .4, .4, .5, .6, .7, .8, .9, 1., 1., 1., 1.),
    (1., 1., 1., 1., 1., .9, .8, .8, .8, .7, .6, .6, .6, .6, .6, .6, .8, .9, .9, .9, .9, 1., 1.),
    (.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5, .5, .5, .5, .6, .7, .8, .7, .7, .8, .9, .9),
)  # fmt: skip
# search.cc speed tables, GB/s per channel
_SPEEDS_INTRA = {
    0: (40.0, 30.0, 20.0, 18.0, 15.0, 12.0, 10.0, 9.0, 7.0, 6.0, 5.0, 4.0, 3.0),
    90: (60.0, 50.0, 40.0, 30.0, 24.0, 20.0, 15.0, 12.0, 11.0, 6.0, 3.0),
    100: (90.0, 80.0, 70.0, 60.0, 50.0, 40.0, 30.0, 24.0, 20.0, 19.0, 18.0),
}
_SPEEDS_INTER = {
    0: (48.0, 30.0, 28.0, 24.0, 20.0, 18.0, 15.0, 12.0, 10.0, 9.0, 7.0, 6.0, 5.0, 4.0, 3.0, 2.4,
        1.2, 0.24, 0.12),
    90: (48.0, 45.0, 42.0, 40.0, 30.0, 24.0, 22.0, 20.0, 17.5, 15.0, 12.0, 6.0, 3.0, 2.4, 1.2,
         0.24, 0.12),
    100: (96.0, 48.0, 45.1, 42.0, 40.0, 30.0, 24.0, 22.0, 20.0, 17.5, 15.0, 12.0, 6.0, 3.0, 2.4,
          1.2, 0.24, 0.12),
}  # fmt: skip
_MAXCHANNELS = 64  # device.h MAXCHANNELS; the ring search asks for at most half
# Path types (topo.h), in NCCL's order: a lower value is a closer path.
PATH_TYPES = ("LOC", "NVL", "NVB", "C2C", "PIX", "PXB", "P2C", "PXN", "PHB", "SYS", "NET")


def _path(name: str) -> int:
    if name not in PATH_TYPES:
        raise ValueError(f"NCCL path type must be one of {PATH_TYPES}, got {name!r}")
    return PATH_TYPES.index(name)


@dataclass(frozen=True, slots=True)
class NcclSystem:
    """What NCCL's topology detection sees for one communicator.

    ``n_ranks`` GPUs on ``n_nodes`` nodes (``n_ranks/n_nodes`` each), compute capability ``arch``
    (70 V100, 80 A100, 90 H100/GH200; :data:`GPU_ARCH`), GPUs of a node linked by ``intra``
    (``nvlink``: every pair over NVLink, ``nvlinks`` links per GPU; ``pci``: PCIe of
    ``pci_gbs`` GB/s per GPU), ``nics_per_node`` NICs of ``net_gbps`` Gbit/s each (NCCL reads the
    NIC's nominal speed: Mbit/s / 8000 = GB/s), reached from a GPU over a path of type
    ``gpu_nic_path`` (``PIX``/``PXB``: a PCIe switch shared with the GPU, as in DGX/HGX servers;
    ``PHB``: through the CPU's host bridge, as on single-GPU cloud instances, the default;
    ``SYS``: across CPU sockets). ``uniform_arch``: every rank's GPU of one arch (LL128 needs it).
    """

    n_ranks: int
    n_nodes: int
    arch: int = 70
    intra: str = "nvlink"
    net_gbps: float = 100.0
    nics_per_node: int = 1
    nvlinks: int = 6
    pci_gbs: float | None = None
    gpu_nic_path: str = "PHB"
    uniform_arch: bool = True

    def __post_init__(self) -> None:
        if self.n_ranks < 1 or self.n_nodes < 1 or self.n_nodes > self.n_ranks:
            raise ValueError(
                f"NCCL system: need 1 <= n_nodes <= n_ranks, got {self.n_nodes} nodes for "
                f"{self.n_ranks} ranks"
            )
        if self.arch < 60:
            raise ValueError(
                f"NCCL system: arch must be a compute capability >= 60, got {self.arch}"
            )
        if self.intra not in ("nvlink", "pci"):
            raise ValueError(f"NCCL system: intra must be nvlink or pci, got {self.intra!r}")
        if not (self.net_gbps > 0 and math.isfinite(self.net_gbps)):
            raise ValueError(f"NCCL system: net_gbps must be > 0, got {self.net_gbps}")
        if self.nics_per_node < 1 or (self.intra == "nvlink" and self.nvlinks < 1):
            raise ValueError("NCCL system: nics_per_node and nvlinks must be >= 1")
        if self.pci_gbs is not None and not self.pci_gbs > 0:
            raise ValueError(f"NCCL system: pci_gbs must be > 0, got {self.pci_gbs}")
        _path(self.gpu_nic_path)

    @property
    def gpus_per_node(self) -> int:
        return self.n_ranks // self.n_nodes

    @property
    def pci_bw(self) -> float:
        return self.pci_gbs if self.pci_gbs is not None else _PCI_BW[_arch_key(self.arch, _PCI_BW)]

    @property
    def nvlink_bw(self) -> float:
        """Per-GPU NVLink bandwidth, GB/s per direction (0 without NVLink)."""
        if self.intra != "nvlink" or self.gpus_per_node == 1:  # no NVLink peer in the node
            return 0.0
        return self.nvlinks * _NVLINK_BW[_arch_key(self.arch, _NVLINK_BW)]


def _arch_key(arch: int, table: dict) -> int:
    """The table's entry for ``arch``: its own, or the nearest arch below it."""
    return max(k for k in table if k <= arch) if arch >= min(table) else min(table)


class Graph(NamedTuple):
    """A searched graph (``struct ncclTopoGraph``'s fields the tuner reads)."""

    pattern: str  # ring, balanced_tree, tree
    n_channels: int
    bw_intra: float  # GB/s per channel
    bw_inter: float
    type_intra: int  # index in PATH_TYPES
    type_inter: int


def _speeds(arch: int, inter: bool) -> tuple[float, ...]:
    table = _SPEEDS_INTER if inter else _SPEEDS_INTRA
    return table[100 if arch >= 100 else 90 if arch >= 90 else 0]


def _fit(sys: NcclSystem, inter: bool, s_inter: float, s_intra: float) -> int:
    """How many channels the node's links hold at these per-channel speeds."""
    g = sys.gpus_per_node
    fits = []
    if inter:  # each channel enters and leaves the node through a NIC, over the GPU's PCIe
        per_nic = int(sys.net_gbps / 8.0 / s_inter + 1e-9) if s_inter <= sys.pci_bw else 0
        fits.append(sys.nics_per_node * per_nic)
    if g > 1:  # GPU to GPU: each GPU's link once per direction per channel
        total = sys.nvlink_bw if sys.intra == "nvlink" else sys.pci_bw
        fits.append(int(total / s_intra + 1e-9))
    return min(fits) if fits else _MAXCHANNELS


def _search(sys: NcclSystem, pattern: str, min_ch: int, max_ch: int) -> tuple[int, float, float]:
    """``ncclTopoCompute``'s bandwidth search, in closed form: channels, bwIntra, bwInter.

    NCCL's own steps: the first speed of NCCL's speed table (per arch, intra-node or inter-node)
    not above the fastest path (GPU→NIC on several nodes, GPU→GPU on one); as many channels as
    the links hold at that speed (a channel uses a NIC at its speed, and each GPU's NVLink or
    PCIe link once per direction), lower speeds tried while they stay above 49% of the best
    found and kept when they give more total bandwidth; channels doubled at half the speed when
    the speed is ≥ 25 GB/s (not from sm90 with more than 4 channels below 50 GB/s); then the
    speed raised while the channels still fit."""
    inter = sys.n_nodes > 1
    g = sys.gpus_per_node
    speeds = _speeds(sys.arch, inter)
    if inter:
        max_bw = min(sys.net_gbps / 8.0, sys.pci_bw)
    elif g > 1:
        max_bw = sys.nvlink_bw if sys.intra == "nvlink" else sys.pci_bw
    else:
        max_bw = 5000.0  # LOC_BW: one GPU, no network
    total_bw = max(sys.pci_bw, sys.nvlink_bw)
    if g > 1 and pattern != "ring":
        total_bw *= g / (g - 1)

    def fit(s_inter: float, s_intra: float) -> int:
        return min(_fit(sys, inter, s_inter, s_intra), max_ch)

    i = 0
    while i < len(speeds) - 1 and (speeds[i] > max_bw or speeds[i] * min_ch > total_bw):
        i += 1
    best = (0, 0.0)  # (channels, speed)
    while True:  # pass 1: the first speed that fits, then lower ones above 49% of the best
        n = fit(speeds[i], speeds[i])
        if n >= min_ch and n * speeds[i] > best[0] * best[1]:
            best = (n, speeds[i])
        if best[0] and (best[0] == max_ch or best[0] * best[1] >= total_bw):
            break
        if i < len(speeds) - 1 and (best[0] == 0 or speeds[i + 1] / best[1] > 0.49):
            i += 1
            continue
        break
    n, s = best
    if n == 0:  # NCCL falls back to one channel at 0.1 GB/s
        return 1, 0.1, 0.1
    # ncclTopoDupChannels
    if s >= 25.0 and not (sys.arch > 80 and s < 50.0 and n > 4) and pattern == "ring":
        dup = min(2 * n, max_ch)
        s /= -(-dup // n)
        n = dup
    bw_intra = bw_inter = s
    # pass 2: raise the speed while the channels still fit
    j = speeds.index(s) if s in speeds else next(k for k, v in enumerate(speeds) if v < s)
    if pattern == "ring":
        while j > 0 and fit(speeds[j - 1], speeds[j - 1]) >= n:
            j -= 1
            bw_intra = bw_inter = speeds[j]
    else:  # trees: bwIntra alone, up to twice bwInter
        while j > 0 and bw_intra < 2 * bw_inter and fit(bw_inter, speeds[j - 1]) >= n:
            j -= 1
            bw_intra = speeds[j]
    return n, bw_intra, bw_inter


@functools.lru_cache(maxsize=1024)
def search_graphs(sys: NcclSystem) -> dict[str, Graph]:
    """The ring and tree graphs NCCL would search on ``sys`` (:func:`_search`). The tree keeps
    the ring's channel count, and raises its ``bwIntra`` alone up to twice ``bwInter`` — the
    two-node case where NCCL's tree predicts up to twice the ring's network bandwidth
    (``tuning.cc``)."""
    g = sys.gpus_per_node
    if g > 1:
        type_intra = _path("NVL") if sys.intra == "nvlink" else _path("PHB")
    else:
        type_intra = _path("LOC")
    type_inter = _path(sys.gpu_nic_path) if sys.n_nodes > 1 else _path("PIX")
    n, bi, be = _search(sys, "ring", 1, _MAXCHANNELS // 2)
    ring = Graph("ring", n, bi, be, type_intra, type_inter)
    tree_pattern = "balanced_tree" if g > 1 else "tree"
    tn, ti, te = _search(sys, tree_pattern, n, n)
    if tn < n:  # the tree must match the ring's channels; both take the fewer
        n = tn
        ring = ring._replace(n_channels=n)
    tree = Graph(tree_pattern, n, ti, te, type_intra, type_inter)
    return {"ring": ring, "tree": tree}


class TunerModel(NamedTuple):
    """``comm->latencies`` (µs) and ``comm->bandwidths`` (GB/s, 0: disabled) per collective,
    algorithm and protocol, and the communicator's channel count."""

    system: NcclSystem
    latency_us: dict[tuple[str, str, str], float]
    bandwidth_gbs: dict[tuple[str, str, str], float]
    comm_channels: int
    graphs: dict[str, Graph]


@functools.lru_cache(maxsize=1024)
def tune_model(sys: NcclSystem) -> TunerModel:
    """``ncclTopoTuneModel`` for all-reduce, reduce-scatter and all-gather.

    Per (algorithm, protocol), for n ranks on N nodes (p = n/N GPUs each):

    - bus bandwidth ``nChannels · bw`` (GB/s) of the searched graph: ``bwIntra`` on one or two
      nodes, ``bwInter`` on more; Ring/LL ``min(llMaxBw, ½·busBw)``; Ring/LL128
      ``min(0.92·busBw, nChannels·perChMaxRingLL128Bw)``; Tree all-reduce ``min(0.92·busBw,
      nChannels·perChMaxTreeBw)``, then Tree/LL ``min(busBw/3.8, llMaxBw)``, Tree/LL128
      ``min(busBw·(7/9 on one node, 120/128 otherwise), nChannels·perChMaxTreeLL128Bw)``, and
      ×0.85 when the tree graph is a plain (not balanced) tree; PAT ×0.75;
    - algorithm bandwidth: the ring's bus bandwidth × n/nsteps (all-reduce: nsteps = 2(n−1)),
      the tree's × ½ (PAT for reduce-scatter/all-gather keeps its bus bandwidth);
    - latency (µs): a base per algorithm × protocol, plus per hop a hardware latency by link
      (NVLink, PCI, NET): the ring ``(nsteps − interSteps)·intra + interSteps·inter`` with
      interSteps = 2(N−1) for an all-reduce, N−1 for reduce-scatter/all-gather; the tree
      ``2·((p−1)·intra + ⌊log2 N⌋·inter)``; with one GPU per node every hop is a network hop at
      the tree's network latency; the ring's per-step latency is at least the network post
      overhead (1 µs on Intel CPUs, ×3 for Simple);
    - LL128 on by default only when the graph's GPU–NIC path is at most PXB (PXN from sm90), the
      intra-node path at most NVB (NVLink, possibly through a GPU), and all GPUs one arch
      (sm70+).
    """
    graphs = search_graphs(sys)
    n, nodes = sys.n_ranks, sys.n_nodes
    ppn = n / nodes
    cc = 3 if sys.arch >= 100 else 2 if sys.arch >= 90 else 1 if sys.arch >= 80 else 0
    node_idx = nodes - 1 if nodes <= 2 else 2
    ll_max = _LL_MAX_BW[cc if nodes == 1 else 0][node_idx]  # multi-node: Intel CPU row
    tree_max = _TREE_BW[cc][node_idx]
    ring_ll128_max = _RING_LL128_BW[cc][node_idx]
    tree_ll128_max = _TREE_LL128_BW[cc][node_idx]
    lat: dict[tuple[str, str, str], float] = {}
    bws: dict[tuple[str, str, str], float] = {}
    for coll in COLLECTIVES:
        nsteps = 2 * (n - 1) if coll == "allreduce" else n - 1
        for algo in ALGOS:
            if algo == "pat" and coll == "allreduce":
                continue
            if algo == "tree" and coll != "allreduce":
                continue
            gr = graphs["ring" if algo == "ring" else "tree"]  # PAT reads the tree's graph
            intra_hw = "nvlink" if gr.type_intra == _path("NVL") else "pci"
            for pi, proto in enumerate(PROTOS):
                if algo == "pat" and (proto != "Simple" or nodes != n):
                    continue  # PAT: Simple only, one GPU per node
                bw = gr.bw_intra if nodes <= 2 else gr.bw_inter
                bus = gr.n_channels * bw
                if algo == "ring" and proto == "LL":
                    bus = min(ll_max, bus * 0.5)
                if algo == "ring" and proto == "LL128":
                    bus = min(bus * 0.92, gr.n_channels * ring_ll128_max)
                if algo == "tree":
                    bus = min(bus * 0.92, gr.n_channels * tree_max)
                    if proto == "LL":
                        bus = min(bus / 3.8, ll_max)
                    if proto == "LL128":
                        f = 7.0 / 9.0 if nodes == 1 else 120.0 / 128.0
                        bus = min(bus * f, gr.n_channels * tree_ll128_max)
                    if gr.pattern == "tree":
                        bus *= 0.85
                if algo == "pat":
                    bus *= 0.75
                if algo == "ring":
                    bus *= n / nsteps
                elif algo == "tree":
                    bus *= 0.5
                base = 8.0 if algo == "pat" else _BASE_LAT[algo][pi]
                hw_algo = "ring" if algo == "pat" else algo
                intra_lat = _HW_LAT[intra_hw][hw_algo][pi]
                inter_lat = _HW_LAT["net"]["tree" if ppn == 1 else hw_algo][pi]  # latencyInter 0
                if algo == "ring":
                    overhead = (3.0 if proto == "Simple" else 1.0) if nodes > 1 else 0.0
                    intra_lat = max(intra_lat, overhead)
                    inter_steps = (
                        0 if nodes == 1 else (2 if coll == "allreduce" else 1) * (nodes - 1)
                    )
                    t = base + (nsteps - inter_steps) * intra_lat + inter_steps * inter_lat
                elif algo == "tree":
                    t = base + 2 * ((n // nodes - 1) * intra_lat + _log2i(nodes) * inter_lat)
                else:  # PAT
                    t = 8.0 + _log2i(nodes) * (inter_lat / 3.5) + n * 2.8
                # LL128 only where NCCL enables it by default
                if proto == "LL128" and not _ll128_enabled(sys, gr):
                    bus = 0.0
                lat[coll, algo, proto] = t
                bws[coll, algo, proto] = bus
    comm_channels = min(_MAXCHANNELS, 2 * graphs["ring"].n_channels)
    return TunerModel(sys, lat, bws, comm_channels, graphs)


def _ll128_enabled(sys: NcclSystem, gr: Graph) -> bool:
    ok = gr.type_inter <= (_path("PXN") if sys.arch >= 90 else _path("PXB"))
    return ok and gr.type_intra <= _path("NVB") and sys.uniform_arch and sys.arch >= 70


def _log2i(x: int) -> int:
    """NCCL's log2i: ⌊log2 x⌋, −1 for 0."""
    return int(x).bit_length() - 1


def algo_time_us(model: TunerModel, coll: str, algo: str, proto: str, nbytes: float) -> float:
    """``ncclTopoGetAlgoTime`` for one operation: predicted µs, or −1 where disabled. The
    tree's bandwidth × a correction factor per power-of-two size (64 B … 256 MiB), the
    multi-node Ring/Simple all-reduce's latency ×1.9 (before sm80) or ×1.4 once a chunk per rank
    and channel reaches 64 B, and ``time = latency + bytes/(1000·bw)`` µs."""
    bw = model.bandwidth_gbs.get((coll, algo, proto), 0.0)
    lat = model.latency_us.get((coll, algo, proto), 0.0)
    if bw == 0:
        return -1.0
    size = int(nbytes)
    log_size = _log2i(size >> 6)
    if algo == "tree" and coll == "allreduce" and 0 <= log_size < 23:
        bw *= _TREE_CORRECTION[PROTOS.index(proto)][log_size]
    sys = model.system
    if (
        algo == "ring"
        and proto == "Simple"
        and sys.n_nodes > 1
        and coll == "allreduce"
        and size // (model.comm_channels * sys.n_ranks) >= 64
    ):
        lat *= 1.9 if sys.arch < 80 else 1.4  # the ring's plateau
    return lat + size / (1000.0 * bw)


class TunerChoice(NamedTuple):
    """NCCL's pick for one call and every candidate's predicted time (µs, −1: disabled)."""

    algorithm: str
    protocol: str
    time_us: float
    times_us: Mapping[tuple[str, str], float]


def choose(sys: NcclSystem, coll: str, nbytes: float) -> TunerChoice:
    """NCCL's (algorithm, protocol) for one ``coll`` of ``nbytes`` bytes on ``sys``: the lowest
    predicted time, ties to the first in NCCL's order (tree before ring, LL before LL128 before
    Simple). One rank alone runs the ring with nothing to move."""
    if coll not in COLLECTIVES:
        raise ValueError(f"collective must be one of {COLLECTIVES}, got {coll!r}")
    if not (nbytes >= 0 and math.isfinite(nbytes)):
        raise ValueError(f"message bytes must be finite and >= 0, got {nbytes}")
    return _choose(sys, coll, float(nbytes))


@functools.lru_cache(maxsize=1 << 16)  # a grid search asks the same few sizes many times
def _choose(sys: NcclSystem, coll: str, nbytes: float) -> TunerChoice:
    """:func:`choose` on checked arguments; a pure function of them, kept for the process."""
    if sys.n_ranks == 1:
        return TunerChoice("ring", "Simple", 0.0, MappingProxyType({("ring", "Simple"): 0.0}))
    model = tune_model(sys)
    times = {}
    for algo in ALGOS:
        for proto in PROTOS:
            if (coll, algo, proto) in model.latency_us:
                times[algo, proto] = algo_time_us(model, coll, algo, proto, nbytes)
    best = min(
        ((t, k) for k, t in times.items() if t >= 0), key=lambda tk: tk[0], default=None
    )  # min keeps the first of equal times
    if best is None:
        raise ValueError(f"NCCL: no algorithm/protocol available for {coll} on {sys}")
    (algo, proto) = best[1]
    return TunerChoice(algo, proto, best[0], MappingProxyType(times))  # shared: read-only


def tune_allreduce(sys: NcclSystem, nbytes: float) -> TunerChoice:
    """:func:`choose` for an all-reduce."""
    return choose(sys, "allreduce", nbytes)


def _host_egress_gbps(cluster) -> dict[int, float]:
    """Per host, the fastest link from one of its devices to a device of another host (0.0 for
    a host alone in the cluster)."""
    host = cluster.host_ids
    other = host[:, None] != host[None, :]
    fastest = np.where(other, cluster.bandwidth_gbps, 0.0).max(axis=1)  # per device
    out: dict[int, float] = {}
    for d, h in enumerate(cluster.host_of):
        out[h] = max(out.get(h, 0.0), float(fastest[d]))
    return out


def system_for_group(cluster, group, *, gpu_nic_path: str = "PHB") -> NcclSystem:
    """The :class:`NcclSystem` NCCL would detect for a communicator over ``group`` (devices of
    ``cluster``): its ranks, its hosts as nodes, the slowest arch among its GPUs, NVLink inside a
    host where every GPU of the group has NVLink (:data:`NVLINKS_PER_GPU`) and the host's links
    run faster than PCIe, else PCIe; each host's NIC at ``cluster.host_nic_gbps`` or, where the
    cluster names none, at the fastest link that leaves the host (a NIC is at least that fast;
    NCCL reads the NIC's nominal speed, not the path's), the slowest host's for all (NCCL takes
    the minimum over ranks). Computed once per cluster, group and path."""
    devs = tuple(map(int, group))
    if not devs or len(set(devs)) != len(devs):
        raise ValueError(f"NCCL communicator: group must list distinct devices, got {group}")
    known = cluster.memo("nccl_systems", dict)
    key = (devs, gpu_nic_path)
    if key not in known:
        known[key] = _detect_system(cluster, devs, gpu_nic_path)
    return known[key]


def _detect_system(cluster, devs: tuple[int, ...], gpu_nic_path: str) -> NcclSystem:
    hosts = [cluster.host_of[d] for d in devs]
    types = [cluster.gpus[d] for d in devs]
    unknown = sorted(set(types) - set(GPU_ARCH))
    if unknown:
        raise ValueError(f"NCCL communicator: no compute capability known for GPU {unknown[0]!r}")
    arch = min(GPU_ARCH[t] for t in types)
    n, nodes = len(devs), len(set(hosts))
    host_of = list(cluster.host_of)
    bw = cluster.bandwidth_gbps
    intra, nvlinks = "pci", 1
    if nodes < n and all(t in NVLINKS_PER_GPU for t in types):
        pairs = [
            bw[a, b] for i, a in enumerate(devs) for b in devs[i + 1 :] if host_of[a] == host_of[b]
        ]
        if min(pairs) / 8.0 > _PCI_BW[_arch_key(arch, _PCI_BW)]:
            intra, nvlinks = "nvlink", min(NVLINKS_PER_GPU[t] for t in types)
    if cluster.host_nic_gbps is not None:
        nets = [cluster.host_nic_gbps[h] for h in set(hosts)]
    else:
        egress = cluster.memo("nccl_host_egress_gbps", lambda: _host_egress_gbps(cluster))
        nets = [egress[h] for h in set(hosts) if egress[h] > 0]
    net = min(nets) if nets else 100.0
    return NcclSystem(
        n,
        nodes,
        arch=arch,
        intra=intra,
        net_gbps=net,
        nvlinks=nvlinks,
        gpu_nic_path=gpu_nic_path,
        uniform_arch=len({GPU_ARCH[t] for t in types}) == 1,
    )
