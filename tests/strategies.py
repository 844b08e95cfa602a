"""Random inputs shared by the property tests: heterogeneous clusters and hypothesis strategies.

A cluster is drawn from a seed (``random_cluster``), so hypothesis shrinks a failing case to a
small seed and device count, and a test that builds the same cluster outside hypothesis gets the
same links.
"""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from system.cluster import Cluster

__all__ = ["random_cluster", "seeds"]

# seeds for random_cluster, random partitions and the scheduler's own RNG
seeds = st.integers(0, 10_000)


def random_cluster(n: int, seed: int) -> Cluster:
    """``n`` devices, one per host and region, heterogeneous symmetric links: 0.2–2 Gbit/s, 1–150
    ms (the spread of the paper's §4.1 cases)."""
    rng = np.random.default_rng(seed)
    bw = rng.uniform(0.2, 2.0, (n, n))
    delay = rng.uniform(1.0, 150.0, (n, n))
    return Cluster(
        name=f"rand{n}-{seed}",
        region_of=tuple(f"r{i}" for i in range(n)),
        host_of=tuple(range(n)),
        delay_ms=(delay + delay.T) / 2,
        bandwidth_gbps=(bw + bw.T) / 2,
    )
