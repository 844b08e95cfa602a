"""A plan as JSON (``plan.json``) and back: what ``mode=plan`` writes and ``mode=simulate``
reads.

The record names the fleet (its file's content digest), the model, the batch and the
objective, and per plan: ``stages`` (``stages[s][r]`` = the fleet's device running stage ``s``
of replica ``r``), ``layers_per_stage``, ``config`` (tp, pp, dp, micro-batch, recomputation,
schedule, accumulation rounds, the layout's constructor, whether our runtime runs it),
``iteration_time_s``, ``cost_per_iteration_usd``, ``memory_per_device_bytes`` and
``devices_used``; beside it each heuristic's best iteration time, the lower bound and the gap,
the best plan our runtime can run, the compute source of every GPU type and the search's time.
:func:`simulate_record` simulates a record's plan again on its fleet.
"""

from __future__ import annotations

import math

import numpy as np

from system.cluster import Cluster
from system.planner.compute import ComputeModel
from system.planner.search import Candidate, Planner, PlanResult

__all__ = ["plan_record", "simulate_record", "candidate_fields", "PLAN_KEYS"]

PLAN_KEYS = ("stages", "layers_per_stage", "config")


def _num(x: float) -> float | None:
    return float(x) if math.isfinite(x) else None


def candidate_fields(c: Candidate) -> dict:
    """One plan's JSON fields."""
    used = sorted(int(d) for d in c.stages.ravel())
    mem = {
        str(int(c.stages[s, r])): float(c.stage_memory_bytes[s])
        for s in range(c.pp)
        for r in range(c.dp)
    }
    return {
        "iteration_time_s": _num(c.iter_time_s),
        "cost_per_iteration_usd": _num(c.cost_usd),
        "stages": c.stages.tolist(),
        "layers_per_stage": list(c.layers),
        "devices_used": used,
        "config": c.config(),
        "memory_per_device_bytes": dict(sorted(mem.items(), key=lambda kv: int(kv[0]))),
    }


def plan_record(result: PlanResult, *, meta: dict, compute: ComputeModel) -> dict:
    """The JSON record of a planning run (module docstring)."""
    best = result.best
    rec = {**meta}
    rec.update(candidate_fields(best))
    rec["heuristics"] = {
        k: (None if v is None else _num(v.iter_time_s)) for k, v in result.heuristics.items()
    }
    rec["heuristics_cost_per_iteration_usd"] = {
        k: (None if v is None else _num(v.cost_usd)) for k, v in result.heuristics.items()
    }
    rec["heuristic_plans"] = {
        k: (None if v is None else {**v.config(), "layers_per_stage": list(v.layers)})
        for k, v in result.heuristics.items()
    }
    rec["lower_bound_s"] = result.lower_bound_s
    rec["gap"] = best.iter_time_s / result.lower_bound_s - 1.0
    rec["runtime_plan"] = (
        None if result.best_runtime is None else candidate_fields(result.best_runtime)
    )
    rec["compute"] = compute.rows()
    rec["search_time_s"] = result.search_time_s
    rec["simulations"] = result.simulations
    rec["layouts_configured"] = result.layouts
    return rec


def simulate_record(
    cluster: Cluster, record: dict, compute: ComputeModel, *, batch: int
) -> Candidate:
    """The record's plan simulated again on ``cluster`` (ValueError naming what is wrong)."""
    missing = [k for k in PLAN_KEYS if k not in record]
    if missing:
        raise ValueError(f"plan: missing key(s) {missing}")
    cfg = record["config"]
    try:
        stages = np.asarray(record["stages"], dtype=np.int64)
        layers = tuple(int(x) for x in record["layers_per_stage"])
        mbs, rc, sch = int(cfg["micro_batch_size"]), str(cfg["recompute"]), str(cfg["schedule"])
        rounds = int(cfg["rounds"])
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"plan: bad stages, layers_per_stage or config ({e})") from None
    if stages.ndim != 2 or stages.size == 0:
        raise ValueError(f"plan: stages must be a (pp, dp) table, got shape {stages.shape}")
    flat = stages.ravel()
    if flat.min() < 0 or flat.max() >= cluster.num_devices or len(set(flat.tolist())) != flat.size:
        raise ValueError(
            f"plan: stages must hold distinct devices of the fleet's 0..{cluster.num_devices - 1}"
        )
    pp, dp = stages.shape
    if len(layers) != pp or sum(layers) != compute.model.num_layers or min(layers) < 1:
        raise ValueError(
            f"plan: layers_per_stage {list(layers)} must be {pp} counts summing to "
            f"{compute.model.num_layers}"
        )
    planner = Planner(cluster, compute.model, batch, compute, local_search=False)
    return planner.evaluate(str(cfg.get("layout", "plan")), stages, layers, mbs, rc, sch, rounds)
