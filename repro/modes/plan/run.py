"""``mode=plan``: plan ours on a fleet and write the plan as JSON (system/planner).

    python repro/run.py mode=plan case=FLEET.yaml model=gpt3_xl layers=40 batch=1024 out=plan.json
    python repro/run.py mode=plan case=FLEET.yaml objective=cost max_iter_time_s=60 out=plan.json

The plan (devices used, stages, layer split, micro-batch, recomputation, schedule, its simulated
iteration time and dollars per iteration, each heuristic's best, the lower bound and gap, the
best plan our runtime runs) goes to ``out`` (default ``results_dir/plan-<case>.json``);
``python repro/run.py mode=simulate case=FLEET.yaml plan=plan.json`` simulates it again.
"""

from __future__ import annotations

import json
import logging
import time

from repro.modes.plan.config import PlanConfig
from system.cases import case_digest, case_label
from system.results import atomic_write_text, path_in

log = logging.getLogger(__name__)

__all__ = ["run", "plan_case"]


def plan_case(cfg: PlanConfig) -> dict:
    """Plan per ``cfg``; returns the JSON-ready record."""
    from system.planner.compute import compute_model
    from system.planner.record import plan_record
    from system.planner.search import plan
    from system.simulator.sharing import with_link_sharing
    from system.workload import get_model

    t0 = time.perf_counter()
    cluster = with_link_sharing(cfg.cluster(), str(cfg.link_sharing))
    model = get_model(str(cfg.model), cfg.layers)
    compute = compute_model(model, set(cluster.gpus), cfg.profiles)
    load_s = time.perf_counter() - t0
    result = plan(
        cluster,
        model,
        cfg.batch,
        compute,
        objective=str(cfg.objective),
        max_iter_time_s=cfg.max_iter_time_s,
        time_limit_s=max(1.0, cfg.time_limit_s - load_s),
        seed=cfg.seed,
        runnable_only=cfg.runnable_only,
        local_search=cfg.local_search,
    )
    if result.best is None or result.best.iter_time_s == float("inf"):
        raise ValueError(
            f"case {cfg.case}: no plan fits (model {model.name}, {model.num_layers} layers, "
            f"batch {cfg.batch}, objective {cfg.objective}"
            + (f", max_iter_time_s {cfg.max_iter_time_s})" if cfg.max_iter_time_s else ")")
        )
    meta = {
        "case": cfg.case,
        "case_sha256": case_digest(cfg.case),
        "cluster": cluster.name,
        "num_devices": cluster.num_devices,
        "model": model.name,
        "layers": model.num_layers,
        "batch": cfg.batch,
        "objective": str(cfg.objective),
        "max_iter_time_s": cfg.max_iter_time_s,
        "link_sharing": str(cfg.link_sharing),
        "seed": cfg.seed,
        "profiles": cfg.profiles,
    }
    rec = plan_record(result, meta=meta, compute=compute)
    rec["load_time_s"] = load_s
    return rec


def run(cfg: PlanConfig) -> dict:
    rec = plan_case(cfg)
    out = cfg.out or str(path_in(cfg.results_dir, f"plan-{case_label(cfg.case)}.json"))
    atomic_write_text(out, json.dumps(rec, indent=1) + "\n")
    heur = ", ".join(
        f"{k} {v:.2f} s" if v is not None else f"{k} -" for k, v in rec["heuristics"].items()
    )
    print(
        f"plan: {rec['iteration_time_s']:.3f} s per iteration"
        + (
            f", ${rec['cost_per_iteration_usd']:.4f}"
            if rec["cost_per_iteration_usd"] is not None
            else ""
        )
        + f" on {len(rec['devices_used'])} of {rec['num_devices']} devices "
        f"({rec['config']}, layers {rec['layers_per_stage']}); heuristics: {heur}; "
        f"lower bound {rec['lower_bound_s']:.3f} s (gap {100 * rec['gap']:.1f}%); "
        f"searched {rec['search_time_s']:.1f} s -> {out}"
    )
    log.info("plan written to %s", out)
    return {"out": out, "iteration_time_s": rec["iteration_time_s"]}


def simulate_plan(cfg) -> dict:
    """The plan of ``cfg.plan`` simulated again on the fleet ``cfg.case`` (no result rows)."""
    from system.planner.compute import compute_model
    from system.planner.record import read_plan, simulate_record
    from system.simulator.sharing import with_link_sharing
    from system.workload import get_model

    rec = read_plan(cfg.plan)
    case = cfg.cases()[0]
    from repro.config.shared import load_case

    cluster = with_link_sharing(
        load_case(case, cfg.case_variant, cfg.limits.max_devices), str(cfg.link_sharing)
    )
    model = get_model(str(rec["model"]), int(rec["layers"]))
    profiles = rec.get("profiles")
    compute = compute_model(model, set(cluster.gpus), profiles)
    got = simulate_record(cluster, rec, compute, batch=int(rec["batch"]))
    print(
        f"plan {cfg.plan}: simulated {got.iter_time_s:.3f} s per iteration "
        f"(recorded {rec.get('iteration_time_s')}), {got.config()}, layers {list(got.layers)}"
    )
    return {"iteration_time_s": got.iter_time_s, "recorded": rec.get("iteration_time_s")}
