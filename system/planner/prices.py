"""Public on-demand prices per GPU, for the planner's dollar cost.

US dollars per GPU-hour: an instance's on-demand Linux price in us-east-1 divided by its GPUs,
from AWS's public price list (https://aws.amazon.com/ec2/pricing/on-demand/, the instance pages
https://aws.amazon.com/ec2/instance-types/p3/, /p4/, /g4/, /g6/):

- V100: p3.16xlarge, 8 × V100 16 GB, $24.48 per hour;
- A100: p4d.24xlarge, 8 × A100 40 GB, $32.7726 per hour;
- T4: g4dn.12xlarge, 4 × T4, $3.912 per hour;
- L4: g6.48xlarge, 8 × L4, $13.3504 per hour;
- GH200: Lambda's on-demand GH200 (96 GB), $1.49 per GPU-hour
  (https://lambda.ai/service/gpu-cloud, pricing; AWS sells no GH200 instance).

The consumer cards (RTX 3090, RTX 2080, TITAN RTX) have no public on-demand list price; a plan
that uses one has no dollar cost (NaN), and ``objective=cost`` leaves them idle. A plan pays for
the GPUs it uses only (the idle ones are not rented).
"""

from __future__ import annotations

import math

__all__ = ["USD_PER_GPU_HOUR", "usd_per_hour"]

USD_PER_GPU_HOUR: dict[str, float] = {
    "V100": 24.48 / 8,
    "A100": 32.7726 / 8,
    "T4": 3.912 / 4,
    "L4": 13.3504 / 8,
    "GH200": 1.49,
}


def usd_per_hour(gpu: str) -> float:
    """Dollars per hour of one GPU of type ``gpu`` (NaN where no public price is listed)."""
    return USD_PER_GPU_HOUR.get(gpu, math.nan)
