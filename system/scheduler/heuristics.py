"""The layouts a user would try before a search: the baselines of the scheduler's worth.

Each returns an :class:`~system.assignment.Assignment` (``stages[s][r]`` = device of stage s in
replica r) for a (pp, dp) shape, or None where it does not apply:

- ``one_pipeline_per_region``: every pipeline inside one region, its stages in host order, so
  pipeline messages stay on fast links and each stage's DP group spans the regions. Applies when
  every region's device count is a multiple of pp (cases 4 and 5 at pp = 8);
- ``greedy_region_fill``: replicas one at a time, each taking its pp devices from the region
  with the most free devices (ties: the region listed first), spilling into the next such
  region when one runs out — the same idea where regions are uneven (pre-empted spot fleets);
- ``launch_order``: devices as listed, stage s on devices s·dp … s·dp + dp − 1 (what our
  runtime runs with no schedule, and the baselines' launch order);
- ``random``: a uniformly random rank map (a seeded :class:`numpy.random.Generator`).

Within a region, devices go in (host, device) order so that a pipeline's consecutive stages
share a host where they can.
"""

from __future__ import annotations

import numpy as np

from system.assignment import Assignment, identity_assignment, random_assignment
from system.cluster import Cluster

__all__ = ["HEURISTICS", "greedy_region_chains", "heuristic_assignment"]

HEURISTICS = ("one_pipeline_per_region", "greedy_region_fill", "launch_order", "random")


def _region_devices(cluster: Cluster) -> list[list[int]]:
    """Devices of each region (regions in first-listed order), sorted by (host, device)."""
    host = cluster.host_ids
    region = np.asarray(cluster.region_of)
    out = []
    for r in cluster.regions:
        dev = np.flatnonzero(region == r)
        out.append([int(d) for d in dev[np.lexsort((dev, host[dev]))]])
    return out


def _from_chains(chains: list[list[int]]) -> Assignment:
    """Replica r runs stage s on ``chains[r][s]``."""
    return Assignment(np.asarray(chains, dtype=np.int64).T.copy())


def greedy_region_chains(regions: list[list[int]], pp: int, dp: int) -> list[list[int]]:
    """``greedy_region_fill``'s replicas (module docstring): ``dp`` chains of ``pp`` devices, each
    taken from the region (a list of its free devices, in order) with the most free devices,
    ties to the region listed first. The regions must hold at least pp·dp devices."""
    free = [list(devs) for devs in regions]
    if sum(map(len, free)) < pp * dp:
        raise ValueError(
            f"greedy region fill: {pp} x {dp} needs more devices than the regions hold"
        )
    chains = []
    for _ in range(dp):
        chain: list[int] = []
        while len(chain) < pp:
            k = max(range(len(free)), key=lambda i: (len(free[i]), -i))
            take = free[k][: pp - len(chain)]
            free[k] = free[k][len(take) :]
            chain += take
        chains.append(chain)
    return chains


def heuristic_assignment(
    cluster: Cluster,
    pp: int,
    dp: int,
    name: str,
    rng: np.random.Generator | int = 0,
) -> Assignment | None:
    """The layout of heuristic ``name`` (module docstring); None where it does not apply."""
    if pp < 1 or dp < 1 or pp * dp != cluster.num_devices:
        raise ValueError(f"heuristic layout: pp={pp} x dp={dp} != {cluster.num_devices} devices")
    if name == "launch_order":
        return identity_assignment(pp, dp)
    if name == "random":
        return random_assignment(pp, dp, np.random.default_rng(rng))
    regions = _region_devices(cluster)
    if name == "one_pipeline_per_region":
        if any(len(devs) % pp for devs in regions):
            return None
        return _from_chains([devs[i : i + pp] for devs in regions for i in range(0, len(devs), pp)])
    if name == "greedy_region_fill":
        return _from_chains(greedy_region_chains(regions, pp, dp))
    raise ValueError(f"unknown heuristic {name!r}; known: {', '.join(HEURISTICS)}")
