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
    if str(cfg.framework) == "sailor":
        return plan_sailor_case(cfg)
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
        budget_device_sims=cfg.budget_device_sims,
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


def sailor_model_name(model, inputs) -> str:
    """The Sailor training config whose shape (hidden size, blocks, sequence) is ``model``'s."""
    for name, sh in sorted(inputs.shapes.items()):
        if (sh.hidden_size, sh.num_layers, sh.seq_length) == (
            model.hidden_size,
            model.num_layers,
            model.seq_length,
        ):
            return name
    raise ValueError(
        f"model {model.name}: no Sailor training config of its shape (have "
        f"{', '.join(sorted(inputs.shapes))})"
    )


def plan_sailor_case(cfg: PlanConfig) -> dict:
    """``framework=sailor``: plan for Sailor's framework (system/planner/sailor_target.py)."""
    import baselines.deepspeed.schedule  # noqa: F401  (DeepSpeed's op order for the replay)
    from system.external.sailor.predict import load_inputs
    from system.planner.sailor_target import plan_sailor, warm_up
    from system.workload import get_model

    t0 = time.perf_counter()
    cluster = cfg.cluster()
    model = get_model(str(cfg.model), cfg.layers)
    inputs = load_inputs(cfg.profiles)
    name = sailor_model_name(model, inputs)
    warm_up(cluster, name, inputs)  # the model's modules and kernels: loading, not search
    load_s = time.perf_counter() - t0
    result = plan_sailor(
        cluster,
        name,
        cfg.batch,
        inputs,
        objective=str(cfg.objective),
        max_iter_time_s=cfg.max_iter_time_s,
        time_limit_s=max(1.0, cfg.time_limit_s - load_s),
    )
    best = result.best
    if best is None:
        raise ValueError(
            f"case {cfg.case}: no plan fits Sailor's framework (model {name}, batch {cfg.batch}, "
            f"objective {cfg.objective})"
        )
    pred = best.prediction
    return {
        "framework": "sailor",
        "case": cfg.case,
        "case_sha256": case_digest(cfg.case),
        "cluster": cluster.name,
        "num_devices": cluster.num_devices,
        "model": model.name,
        "sailor_model": name,
        "layers": model.num_layers,
        "batch": cfg.batch,
        "objective": str(cfg.objective),
        "max_iter_time_s": cfg.max_iter_time_s,
        "profiles": cfg.profiles,
        "iteration_time_s": float(best.iter_time_s),
        "cost_per_iteration_usd": float(best.cost_usd),
        "layout": best.layout,
        "config": best.config(),
        "layers_per_stage": [len(st.layers) for st in best.plan.stages],
        "gpus_used": sum(r.tp for st in best.plan.stages for r in st.replicas),
        "peak_memory_bytes": float(pred.peak_memory_bytes),
        "breakdown_s": {
            "pipeline": pred.pipeline_s,
            "tied": pred.tied_s,
            "data_parallel": pred.dp_s,
            "optimizer": pred.optimizer_s,
        },
        "plan_config": best.plan_config(),
        "heuristics": {
            k: (float(c.iter_time_s) if c is not None else None)
            for k, c in result.heuristics.items()
        },
        "search_time_s": result.search_time_s,
        "simulations": result.simulations,
        "estimates": result.estimates,
        "floored": result.floored,
        "load_time_s": load_s,
    }


def run(cfg: PlanConfig) -> dict:
    rec = plan_case(cfg)
    out = cfg.out or str(path_in(cfg.results_dir, f"plan-{case_label(cfg.case)}.json"))
    atomic_write_text(out, json.dumps(rec, indent=1) + "\n")
    if rec.get("framework") == "sailor":
        print(
            f"plan (Sailor's framework): {rec['iteration_time_s']:.3f} s per iteration on "
            f"{rec['gpus_used']} of {rec['num_devices']} GPUs ({rec['config']}, layers "
            f"{rec['layers_per_stage']}); searched {rec['search_time_s']:.1f} s -> {out}"
        )
        return {"out": out, "iteration_time_s": rec["iteration_time_s"]}
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
        f"searched {rec['search_time_s']:.1f} s"
        + (
            " (stopped by time_limit_s before its budget: this plan depends on the machine)"
            if rec.get("time_cut")
            else ""
        )
        + f" -> {out}"
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
    parts = ", ".join(
        f"{k} {got.breakdown[k]:.3f} s"
        for k in ("pipeline_s", "dp_sync_s", "flag_allreduce_s")
        if isinstance(got.breakdown.get(k), float)
    )
    print(
        f"plan {cfg.plan}: simulated {got.iter_time_s:.3f} s per iteration "
        f"(recorded {rec.get('iteration_time_s')}), {got.config()}, layers {list(got.layers)}"
        + (f"; {parts} (dp_sync_s: past the pipeline, the flag all-reduce in it)" if parts else "")
    )
    return {"iteration_time_s": got.iter_time_s, "recorded": rec.get("iteration_time_s")}
