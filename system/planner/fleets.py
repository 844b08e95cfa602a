"""Synthetic fleets of mixed GPU types for the planner at scale, written as topology files.

A fleet of ``num_gpus`` GPUs spread over case 5's eight AWS regions (the paper's §4.1, links
from ``system/data/aws_region_pairs_case5.csv``; inside a region the paper's 5 ms / 2 Gbit/s),
as public cloud machines: p4d.24xlarge (8 A100), p3.16xlarge (8 V100), g6.48xlarge (8 L4) and
g4dn.12xlarge (4 T4), a quarter of the GPUs of each type; machine by machine, each region in
turn takes the next machine of the type listed for it (:data:`REGION_TYPES`). Inside a machine
1,200 Gbit/s (V100 NVLink, NVIDIA V100 datasheet).

    python -m system.planner.fleets 4096 > system/data/fleets/mixed-4096.json

JSON rather than YAML: a 4,096-device file parses in a fraction of a second as JSON, in tens of
seconds with the pure-Python YAML loader.
"""

from __future__ import annotations

import csv
import json
import sys
from importlib import resources

__all__ = ["REGION_TYPES", "MACHINES", "fleet"]

MACHINES = {"A100": 8, "V100": 8, "L4": 8, "T4": 4}  # GPUs per machine
REGION_TYPES = {  # the two machine types each region offers, in turn
    "Oregon": ("A100", "V100"),
    "Virginia": ("A100", "T4"),
    "Ohio": ("V100", "L4"),
    "Tokyo": ("L4", "T4"),
    "Seoul": ("A100", "L4"),
    "London": ("V100", "T4"),
    "Frankfurt": ("A100", "L4"),
    "Ireland": ("V100", "T4"),
}


def fleet(num_gpus: int) -> dict:
    """The topology document of a ``num_gpus``-GPU fleet (module docstring); ``num_gpus`` a
    multiple of 64."""
    if num_gpus < 64 or num_gpus % 64:
        raise ValueError(f"num_gpus={num_gpus}: a multiple of 64")
    left = {g: num_gpus // 4 for g in MACHINES}
    pairs, done = [], set()
    text = resources.files("system.data").joinpath("aws_region_pairs_case5.csv").read_text()
    for row in csv.DictReader(text.splitlines()):
        a, b = row["region_a"], row["region_b"]
        key = frozenset((a, b))
        if a in REGION_TYPES and b in REGION_TYPES and key not in done:
            done.add(key)
            pairs.append(
                {
                    "region_a": a,
                    "region_b": b,
                    "delay_ms": float(row["delay_ms"]),
                    "bandwidth_gbps": float(row["bandwidth_gbps"]),
                }
            )
    devices = []
    host, turn = 0, 0
    regions = list(REGION_TYPES)
    while any(left.values()):
        region = regions[turn % len(regions)]
        kinds = [g for g in REGION_TYPES[region] if left[g]]
        turn += 1
        if not kinds:
            continue
        gpu = kinds[(turn // len(regions)) % len(kinds)]
        n = min(MACHINES[gpu], left[gpu])
        left[gpu] -= n
        devices += [{"region": region, "gpu": gpu, "host": f"m{host}"}] * n
        host += 1
    return {
        "name": f"mixed-{num_gpus}",
        "intra_delay_ms": 5.0,
        "intra_bandwidth_gbps": 2.0,
        "intra_host_bandwidth_gbps": 1200.0,
        "pairs": pairs,
        "devices": devices,
    }


if __name__ == "__main__":
    sys.stdout.write(json.dumps(fleet(int(sys.argv[1]))) + "\n")
