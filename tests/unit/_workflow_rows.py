"""Synthetic study rows in the simulate schema for the workflow tests (report, claims, variance)."""

from __future__ import annotations

import numpy as np

from system.results import make_row

BASE_TIME_S = {"megatron": 40.0, "deepspeed": 36.0, "ours": 10.0, "ours_random": 20.0}


def synthetic_rows(
    *,
    cases=("1", "5"),
    layers=(24, 40),
    batches=(1024, 4096),
    repeats=3,
    speedup=4.0,
    noise=0.01,
    seed=0,
) -> list[dict]:
    """Rows where ours is ``speedup``× faster than megatron in every setting; megatron has a grid.

    The gap to the baselines shrinks with batch and layers; repeats jitter by ``noise``.
    """
    rng = np.random.default_rng(seed)
    rows = []
    for case in cases:
        for l in layers:
            for b in batches:
                shrink = 1.0 / (1 + 0.1 * np.log2(b / 1024) + 0.1 * (l - 24) / 8)
                ours_t = 10.0 * l / 24 * b / 1024
                times = {
                    "ours": ours_t,
                    "ours_random": 2.0 * ours_t,
                    "megatron": ours_t * (1 + (speedup - 1) * shrink),
                    "deepspeed": ours_t * (1 + (speedup * 0.9 - 1) * shrink),
                }
                for system, t in times.items():
                    configs = [(1, 8, 8), (2, 4, 8)] if system == "megatron" else [(1, 8, 8)]
                    for tp, pp, dp in configs:
                        slow = (
                            1.0
                            if (tp, pp, dp) == ((2, 4, 8) if case == "1" else (1, 8, 8))
                            else 1.3
                        )
                        for r in range(repeats):
                            it = t * slow * (1 + noise * rng.standard_normal())
                            key = {
                                "mode": "simulate",
                                "case": case,
                                "system": system,
                                "num_layers": l,
                                "global_batch_size": b,
                                "tp": tp,
                                "pp": pp,
                                "dp": dp,
                                "micro_batch_size": 1,
                                "repeat": r,
                            }
                            rows.append(
                                make_row(
                                    key,
                                    iter_time_s=it,
                                    pflops=1e3 * l * b / it / 1e6,
                                    study="synthetic",
                                )
                            )
    return rows


# A two-job smoke multirun on the debug case (ours only, no ablation), for the sweep tests:
# `python repro/run.py -m *TWO_DEBUG_JOBS results_dir=...`.
TWO_DEBUG_JOBS = (
    "sweep=smoke",
    "case=debug",
    "model=debug",
    "batch=16,32",
    "system=ours",
    "workflow.ablation_csv=null",
)
