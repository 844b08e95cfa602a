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
from pathlib import Path

import numpy as np

from system.cluster import Cluster
from system.planner.compute import ComputeModel
from system.planner.search import Candidate, Planner, PlanResult

__all__ = [
    "plan_record",
    "simulate_record",
    "candidate_fields",
    "read_plan",
    "check_plan",
    "PLAN_KEYS",
]

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
    rec["heuristics_cut"] = list(result.heuristics_cut)
    rec["lower_bound_s"] = result.lower_bound_s
    rec["gap"] = best.iter_time_s / result.lower_bound_s - 1.0
    rec["runtime_plan"] = (
        None if result.best_runtime is None else candidate_fields(result.best_runtime)
    )
    rec["compute"] = compute.rows()
    rec["search_time_s"] = result.search_time_s
    rec["simulations"] = result.simulations
    rec["skipped_as_too_slow"] = result.skipped
    rec["budget_device_sims"] = result.budget_device_sims
    rec["spent_device_sims"] = result.spent_device_sims
    rec["time_cut"] = result.time_cut
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


def read_plan(path: str | Path) -> dict:
    """A plan.json as a dict (ValueError naming the file when it is not one)."""
    from system.cases import parse_document

    p = Path(path)
    if not p.is_file():
        raise ValueError(f"plan file {p} does not exist")
    data = parse_document(p.read_bytes(), f"plan file {p}", json_only=True)
    if not isinstance(data, dict):
        raise ValueError(f"plan file {p}: expected a JSON object (mode=plan's plan.json)")
    return data


def check_plan(rec: dict, case: str, model: str, layers: int | None, batch: int | None) -> None:
    """``rec`` is a plan of fleet ``case`` for this model (and layers and batch, when given):
    a ValueError naming the first disagreement."""
    from system.cases import case_digest

    missing = [k for k in ("model", "layers", "batch", *PLAN_KEYS) if k not in rec]
    if missing:
        raise ValueError(f"missing key(s) {missing}")
    for key, given in (("model", model), ("layers", layers), ("batch", batch)):
        if given is not None and str(given) != str(rec[key]):
            raise ValueError(f"{key}={given} but the plan's is {rec[key]}")
    digest = rec.get("case_sha256")
    if digest is not None and case_digest(case) not in (None, digest):
        raise ValueError(f"made for another version of {case}")
