"""Where a baseline's ranks run: launch order (the paper's protocol) or a topology-aware rank map.

Megatron and DeepSpeed number their ranks ``rank = t + TP·(d + DP·s)`` (tensor innermost, then
data, then pipeline) and a launcher puts rank r on the r-th device it was given. The paper's
baselines used the devices in the order listed (``launch``: rank r on device r). A careful user
lists them in a better order (``topology``): tensor- and pipeline-parallel groups inside a host or
region where they fit, regions visited in a good order. That is a *rank map*, launch rank ->
device, the ``rank_map`` of :func:`system.simulator.baseline_training.simulate_1f1b_ring`.

The topology search, per configuration (tp, pp, dp):

1. Regions are ordered up to four ways: as listed; by the cheapest open path over the region
   graph (:func:`system.cost.tsp.open_tsp_path`, exact Held–Karp) weighted by the pipeline's
   message time (α + 8·activation/β) and by the data-parallel ring's (α + 8·(stage gradient /
   DP)/β); and, for at most :data:`MAX_RING_REGIONS` regions, the closed ring whose slowest edge
   is fastest (ties: smallest sum), since a ring all-reduce step lasts as long as its slowest
   edge (:func:`system.simulator.collectives.ring_collective_s`). Devices keep their host order
   inside a region, so a TP group that fits a host stays on it.
2. The devices, region by region in that order, fill the (pp, dp, tp) rank grid ``stage-major``
   (each stage's DP group contiguous: a stage sits in a region when dp·tp fits one) and
   ``replica-major`` (each pipeline contiguous: it sits in a region when pp·tp fits one).
3. The distinct candidates (at most 8) are ranked by a communication cost in the style of
   :mod:`system.cost.model`: per micro-batch, activations forward and gradients back over the
   slowest stage boundary, the fill/drain over all boundaries, and the slowest DP gradient
   synchronisation of a stage by the collective the row will run
   (:func:`system.simulator.baseline_training.dp_sync_end_s`). Launch order and the
   ``SIMULATE_TOP`` best others are simulated in full and the fastest kept, so ``topology`` is
   never slower than ``launch`` for a configuration.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable
from dataclasses import dataclass, replace
from enum import StrEnum

import numpy as np

from baselines.space import (
    RECOMPUTE_MODES,
    BaselineConfig,
    GridResult,
    config_memory_bytes,
    pick_best,
)
from system.cluster import Cluster, fingerprint, link_time_s
from system.cost.tsp import open_tsp_path
from system.simulator.baseline_training import dp_sync_end_s
from system.simulator.collectives import ring_collective_s
from system.simulator.hardware import V100, Hardware
from system.simulator.result import SimResult
from system.simulator.transfers import NCCL, Transport
from system.workload import Workload, stage_gradient_params

__all__ = [
    "Placement",
    "check_placement",
    "RankMap",
    "launch_map",
    "candidate_maps",
    "search_placement",
    "place_and_simulate",
    "grid_search",
    "proxy_cost_s",
]


class Placement(StrEnum):
    """Where a baseline's launch ranks run (module docstring)."""

    launch = "launch"  # rank r on device r: the paper's protocol
    topology = "topology"  # each configuration under its best topology-aware rank map


def check_placement(placement: str) -> Placement:
    """``placement`` as a :class:`Placement`, or one ValueError naming the choices."""
    try:
        return Placement(placement)
    except ValueError:
        raise ValueError(
            f"baseline placement must be one of {', '.join(Placement)}, got {placement!r}"
        ) from None


MAX_RING_REGIONS = 9  # exhaustive bottleneck ring: (R − 1)! orders, 40,320 at 9
SIMULATE_TOP = 2  # topology candidates simulated in full per configuration (besides launch)


@dataclass(frozen=True, slots=True)
class RankMap:
    """Device of each launch rank, and how the map was built."""

    placement: str  # launch | topology
    devices: tuple[int, ...]  # devices[r] = device of launch rank r
    how: str  # "launch order" or "<layout>: region > region > ..."


def launch_map(cluster: Cluster) -> RankMap:
    """Rank r on device r: the order the devices were listed in (the paper's protocol)."""
    return RankMap(Placement.launch, tuple(range(cluster.num_devices)), "launch order")


def _region_blocks(cluster: Cluster) -> tuple[list[str], list[np.ndarray]]:
    """Regions in first-listed order and their devices, sorted by (host, device)."""
    names = list(dict.fromkeys(cluster.region_of))
    host = cluster.host_ids
    region = np.asarray(cluster.region_of)
    blocks = []
    for r in names:
        dev = np.flatnonzero(region == r)
        blocks.append(dev[np.lexsort((dev, host[dev]))])
    return names, blocks


def _region_weights(cluster: Cluster, blocks: list[np.ndarray], nbytes: float) -> np.ndarray:
    """(R, R) mean link time α + 8·nbytes/β between the devices of two regions."""
    t = cluster.link_time_s(nbytes)
    k = len(blocks)
    w = np.zeros((k, k))
    for a in range(k):
        for b in range(k):
            if a != b:
                w[a, b] = float(t[np.ix_(blocks[a], blocks[b])].mean())
    return w


def _region_orders(
    cluster: Cluster, workload: Workload, config: BaselineConfig, blocks: list[np.ndarray]
) -> list[list[int]]:
    k = len(blocks)
    orders = [list(range(k))]
    if k < 3:
        return orders
    model = workload.model
    act = config.micro_batch_size * model.seq_length * model.hidden_size
    act *= workload.activation_bytes / config.tp
    grad = max(stage_gradient_params(model, config.pp)) * workload.gradient_bytes / config.tp
    w_ring = _region_weights(cluster, blocks, grad / config.dp)
    found = [open_tsp_path(_region_weights(cluster, blocks, act))[1], open_tsp_path(w_ring)[1]]
    if k <= MAX_RING_REGIONS:
        found.append(_bottleneck_ring(w_ring))
    for order in found:
        if list(order) not in orders:
            orders.append(list(order))
    return orders


def _bottleneck_ring(w: np.ndarray) -> list[int]:
    """The closed tour over all nodes whose largest edge weight is smallest (then the smallest
    sum), by enumerating the (R − 1)! tours that start at node 0."""
    tours = _tours(w.shape[0])
    edges = w[tours, np.roll(tours, -1, axis=1)]
    worst, total = edges.max(axis=1), edges.sum(axis=1)
    best = np.lexsort((total, np.round(worst, 12)))[0]
    return [int(x) for x in tours[best]]


@functools.lru_cache(maxsize=MAX_RING_REGIONS + 1)
def _tours(k: int) -> np.ndarray:
    """The (k − 1)! closed tours over nodes 0..k−1 that start at node 0, in lexicographic
    order, one per row (read-only)."""
    perms = np.array(list(itertools.permutations(range(1, k))), dtype=int)
    tours = np.concatenate([np.zeros((len(perms), 1), dtype=int), perms], axis=1)
    tours.flags.writeable = False
    return tours


def _tp_inside_hosts(cluster: Cluster, grid: np.ndarray) -> bool:
    host = cluster.host_ids[grid]
    return bool(np.all(host == host[..., :1]))


# Candidate maps already made, by the cluster's fingerprint and what else they depend on
# (:func:`candidate_maps`): a grid search asks again for every recomputation and ZeRO variant of
# one shape, and the settings of one case (other global batches) ask for the same shapes.
_CANDIDATES: dict[tuple, tuple[RankMap, ...]] = {}
MAX_CANDIDATES = 4096


def candidate_maps(cluster: Cluster, workload: Workload, config: BaselineConfig) -> list[RankMap]:
    """Launch order first, then the distinct topology-aware maps (module docstring), each a
    valid layout (TP groups inside a host). They depend on the shape, the micro-batch and the
    model's sizes only; each is made once per cluster content (:data:`_CANDIDATES`)."""
    key = _candidates_key(cluster, workload, config)
    hit = _CANDIDATES.get(key)
    if hit is None:
        if len(_CANDIDATES) >= MAX_CANDIDATES:
            _CANDIDATES.clear()
        hit = _CANDIDATES[key] = tuple(_candidate_maps(cluster, workload, config))
    return list(hit)


def _candidates_key(cluster: Cluster, workload: Workload, config: BaselineConfig) -> tuple:
    """What :func:`candidate_maps` depends on (its memo's key)."""
    return (
        fingerprint(cluster),
        workload.model,
        workload.activation_bytes,
        workload.gradient_bytes,
        config.tp,
        config.pp,
        config.dp,
        config.micro_batch_size,
    )


def _candidate_maps(cluster: Cluster, workload: Workload, config: BaselineConfig) -> list[RankMap]:
    """:func:`candidate_maps` without the memo."""
    tp, pp, dp = config.tp, config.pp, config.dp
    if tp * pp * dp != cluster.num_devices:
        raise ValueError(f"placement: tp={tp} x pp={pp} x dp={dp} != {cluster.num_devices} devices")
    names, blocks = _region_blocks(cluster)
    out = [launch_map(cluster)]
    seen = {out[0].devices}
    for order in _region_orders(cluster, workload, config, blocks):
        seq = np.concatenate([blocks[i] for i in order])
        path = " > ".join(names[i] for i in order)
        layouts = {
            "stage-major": seq.reshape(pp, dp, tp),
            "replica-major": seq.reshape(dp, pp, tp).transpose(1, 0, 2),
        }
        for layout, grid in layouts.items():
            devices = tuple(int(x) for x in grid.ravel())  # launch rank order is grid's C order
            if devices in seen or not _tp_inside_hosts(cluster, grid):
                continue
            seen.add(devices)
            out.append(RankMap(Placement.topology, devices, f"{layout}: {path}"))
    return out


def proxy_cost_s(
    cluster: Cluster,
    workload: Workload,
    config: BaselineConfig,
    devices: tuple[int, ...],
    *,
    dp_collective: str = "auto",
    transport: Transport = NCCL,
) -> float:
    """The ranking cost of step 3 of the module docstring (seconds; not an iteration time),
    with the DP collective the row runs (``dp_collective``, ``transport``)."""
    tp, pp, dp = config.tp, config.pp, config.dp
    grid = np.asarray(devices).reshape(pp, dp, tp)
    model = workload.model
    total = 0.0
    if pp > 1:
        act = config.micro_batch_size * model.seq_length * model.hidden_size
        nbytes = act * workload.activation_bytes / tp
        up, down = grid[:-1], grid[1:]  # each boundary's pairs, devices apart
        fwd = link_time_s(cluster.delay_s[up, down], cluster.bandwidth_bps[up, down], nbytes)
        bwd = link_time_s(cluster.delay_s[down, up], cluster.bandwidth_bps[down, up], nbytes)
        fwd, bwd = fwd.max(axis=(1, 2)), bwd.max(axis=(1, 2))  # slowest replica per boundary
        m = workload.global_batch_size // (dp * config.micro_batch_size)
        total += m * float((fwd + bwd).max()) + float((fwd + bwd).sum())
    if dp > 1:
        grads = np.asarray(stage_gradient_params(model, pp)) * workload.gradient_bytes / tp
        rings = grid.transpose(0, 2, 1).reshape(-1, dp)
        sizes = np.repeat(grads, tp)
        if config.zero == 3:  # ZeRO-3's gathers and scatters are rings
            total += float(ring_collective_s(cluster, rings, sizes).max())
        else:
            end, _, _ = dp_sync_end_s(
                cluster,
                rings,
                sizes,
                np.zeros(rings.shape),
                transport,
                zero=1 if config.zero == 1 else 0,
                dp_collective=dp_collective,
            )
            total += float(end.max())
    return total


# Rankings already made (:func:`_ranked`), by what :func:`proxy_cost_s` reads: a grid asks
# again for every recomputation, chunking and optimizer variant of one shape and micro-batch.
_RANKINGS: dict[tuple, tuple[RankMap, ...]] = {}


def _ranked(
    cluster: Cluster,
    workload: Workload,
    config: BaselineConfig,
    cands: list[RankMap],
    dp_collective: str,
    transport: Transport,
) -> tuple[RankMap, ...]:
    """The topology-aware maps of ``cands`` (launch order, first, left out) by increasing
    :func:`proxy_cost_s`, ties in their order. The cost reads the candidates' inputs (the
    :func:`candidate_maps` key), the global batch, ``config.zero``, the DP collective and the
    transport, so a ranking is kept by those (:data:`_RANKINGS`)."""
    key = (
        _candidates_key(cluster, workload, config),
        workload.global_batch_size,
        config.zero,
        dp_collective,
        transport,
    )
    hit = _RANKINGS.get(key)
    if hit is None:

        def cost(c: RankMap) -> float:
            return proxy_cost_s(
                cluster,
                workload,
                config,
                c.devices,
                dp_collective=dp_collective,
                transport=transport,
            )

        if len(_RANKINGS) >= MAX_CANDIDATES:
            _RANKINGS.clear()
        hit = _RANKINGS[key] = tuple(sorted(cands[1:], key=cost))
    return hit


def search_placement(
    cluster: Cluster,
    workload: Workload,
    config: BaselineConfig,
    simulate: Callable[[RankMap], SimResult],
    top: int = SIMULATE_TOP,
    *,
    dp_collective: str = "auto",
    transport: Transport = NCCL,
) -> tuple[SimResult, RankMap]:
    """The fastest under ``simulate`` (a configuration's simulator with the rank map bound) of
    launch order and the ``top`` candidates of :func:`candidate_maps` with the lowest
    :func:`proxy_cost_s` (under the row's ``dp_collective`` and ``transport``), with the map
    that gave it; ties keep launch order."""
    cands = candidate_maps(cluster, workload, config)
    ranked = _ranked(cluster, workload, config, cands, dp_collective, transport)
    best: tuple[SimResult, RankMap] | None = None
    for cand in [cands[0], *ranked[:top]]:
        res = simulate(cand)
        if best is None or res.iter_time_s < best[0].iter_time_s - 1e-9:
            best = (res, cand)
    assert best is not None
    res, cand = best
    if cand.placement == Placement.launch:  # the search kept launch order: record it as its pick
        cand = RankMap(Placement.topology, cand.devices, "launch order (best of the search)")
    return res, cand


def place_and_simulate(
    cluster: Cluster,
    workload: Workload,
    config: BaselineConfig,
    placement: str,
    simulate: Callable[[RankMap], SimResult],
    memory_bytes: float,
    usable_bytes: float,
    cache: dict | None = None,
    *,
    dp_collective: str = "auto",
    transport: Transport = NCCL,
) -> SimResult:
    """``simulate`` ``config`` under ``placement`` (``launch`` or ``topology``) and record it.

    The result's ``config`` gains ``placement``; its ``breakdown`` the ``rank_map`` (device of
    each launch rank) and ``placement_how``. A configuration over memory (``memory_bytes`` >
    ``usable_bytes``) is not simulated: an ``oom`` result records it. ``cache`` (a dict shared
    between calls) keeps each (configuration, rank map)'s simulation, so the launch-order map
    is simulated once for both protocols. ``dp_collective`` and ``transport``: the row's, for
    the rank-map search's ranking (:func:`search_placement`).
    """
    placement = check_placement(placement)
    if memory_bytes > usable_bytes:
        return SimResult(
            system=config.system,
            iter_time_s=float("nan"),
            compute_time_s=float("nan"),
            model_flops=workload.model_flops(recompute=True),
            memory_bytes=memory_bytes,
            config={**config.to_dict(), "placement": placement},
            breakdown={
                "rank_map": list(range(cluster.num_devices)),
                "placement_how": "not simulated (over memory)",
                "variant": config.variant,
            },
            status="oom",
        )
    memo = {} if cache is None else cache

    def cached(rm: RankMap) -> SimResult:
        key = (config, rm.devices, dp_collective)
        if key not in memo:
            memo[key] = simulate(rm)
        r = memo[key]
        return replace(r, config=dict(r.config), breakdown=dict(r.breakdown))

    if placement == Placement.launch:
        rm = launch_map(cluster)
        res = cached(rm)
    else:
        res, rm = search_placement(
            cluster, workload, config, cached, dp_collective=dp_collective, transport=transport
        )
    res.config["placement"] = placement
    res.breakdown["rank_map"] = list(rm.devices)
    res.breakdown["placement_how"] = rm.how
    return res


def grid_search(
    system: str,
    space: Callable[[Cluster, Workload, tuple[str, ...]], list[BaselineConfig]],
    simulate: Callable[..., SimResult],
    cluster: Cluster,
    workload: Workload,
    hardware: Hardware = V100,
    *,
    placement: str = Placement.launch,
    recompute: tuple[str, ...] = RECOMPUTE_MODES,
    transport: Transport = NCCL,
    cache: dict | None = None,
    layout: str = "layout",
    dp_collective: str = "auto",
) -> GridResult:
    """A baseline's grid search, as the paper ran it (appendix 10.2): every configuration of
    ``space(cluster, workload, recompute)`` placed under ``placement`` (``launch`` or
    ``topology``) and simulated (:func:`place_and_simulate`); the best is the fastest one that
    fits in ``hardware``'s memory.

    ``simulate(cluster, workload, config, hardware, transport, rank_map=...)`` is the framework's
    one-iteration model. ``cache``: a dict shared by calls on the same cluster, workload,
    hardware and transport (both protocols) so that launch-order simulations are reused.
    ``layout`` names what the grid varies, for the error raised when the space is empty.
    ``dp_collective``: the DP collective every configuration runs
    (:data:`system.simulator.baseline_training.DP_REQUESTS`; default ``auto``, NCCL's pick), passed
    to ``simulate`` and to the rank-map search's ranking.
    """
    configs = space(cluster, workload, recompute)
    if not configs:
        raise ValueError(
            f"{system}: no valid {layout} for {workload.model.num_layers} layers, batch "
            f"{workload.global_batch_size} on {cluster.num_devices} devices"
        )

    def one(c: BaselineConfig) -> SimResult:
        def sim(rm: RankMap) -> SimResult:
            return simulate(
                cluster,
                workload,
                c,
                hardware,
                transport,
                rank_map=rm.devices,
                dp_collective=dp_collective,
            )

        mem = config_memory_bytes(c, workload)
        return place_and_simulate(
            cluster,
            workload,
            c,
            placement,
            sim,
            mem,
            hardware.usable_memory_bytes,
            cache,
            dp_collective=dp_collective,
            transport=transport,
        )

    results = [one(c) for c in configs]
    assert all(np.isfinite(r.iter_time_s) for r in results if r.status == "ok")
    return pick_best(results, f"{system} on {cluster.name}")
