"""``mode=train system=megatron|deepspeed``: real baseline training, one row per configuration.

    python repro/run.py mode=train system=megatron model=debug pp=2 dp=2 iters=3 results_dir=DIR
    python repro/run.py mode=train system=deepspeed zero=3 dp=4 results_dir=DIR
    python repro/run.py mode=train system=deepspeed zero=1 pp=2 dp=2 results_dir=DIR
    python repro/run.py mode=train system=megatron grid=true grid_devices=4 results_dir=DIR

A single run uses ``tp``/``pp``/``dp``/``zero`` (DeepSpeed: ``zero`` defaults to 3 without a
pipeline and 1 with one); ``grid=true`` runs the baseline's grid search over ``grid_devices``
local ranks (the same space the simulator searches, :mod:`baselines.space`), writing a row for
every point, infeasible ones included (status ``invalid``/``oom``), and logs the best point.
"""

from __future__ import annotations

import logging
from pathlib import Path

from omegaconf import DictConfig

from baselines.grid import BaselineSpec, best_point, grid_points, local_cluster, run_grid, run_point
from system.results import make_row, write_rows

log = logging.getLogger(__name__)

_DEFAULT_BATCH = 8  # sequences per iteration when batch=null (as system/runtime's RunSpec)


def _base_spec(cfg: DictConfig, system: str) -> BaselineSpec:
    pp = int(cfg.pp) if cfg.get("pp") is not None else 1
    dp = int(cfg.dp) if cfg.get("dp") is not None else 1
    rt = cfg.get("runtime") or {}  # shared with system=ours (runtime.lr, runtime.device)
    zero = cfg.get("zero")
    if system == "deepspeed" and zero is None:
        zero = 3 if pp == 1 else 1
    return BaselineSpec(
        system=system, model=str(cfg.model),
        layers=int(cfg.layers) if cfg.get("layers") is not None else None,
        tp=int(cfg.get("tp") or 1), pp=pp, dp=dp,
        zero=int(zero) if zero is not None and system == "deepspeed" else None,
        global_batch_size=int(cfg.batch) if cfg.get("batch") is not None else _DEFAULT_BATCH,
        micro_batch_size=int(cfg.get("micro_batch_size") or 1), iters=int(cfg.iters),
        seed=int(cfg.seed), lr=float(rt.get("lr") or BaselineSpec.lr),
        device=str(rt.get("device") or "cpu"),
        recompute=bool(cfg.get("baseline_recompute", False)),
    )


def _row(cfg: DictConfig, spec: BaselineSpec, result: dict, grid: bool) -> dict:
    key = {
        "study": str(cfg.study), "mode": str(cfg.mode), "system": spec.system,
        "case": "local", "model": spec.model, "num_layers": spec.gpt_config().num_layers,
        "num_devices": spec.world_size, "global_batch_size": spec.global_batch_size,
        "micro_batch_size": spec.micro_batch_size, "tp": spec.tp, "pp": spec.pp, "dp": spec.dp,
        "zero": spec.zero, "iters": spec.iters, "seed": spec.seed, "device": spec.device,
        "grid": grid,
    }
    values = {k: v for k, v in result.items() if k not in key}
    values.setdefault("iter_time_s", None)
    values.setdefault("pflops", None)
    return make_row(key, variant=_variant(spec), **values)


def _variant(spec: BaselineSpec) -> str:
    if spec.system == "megatron":
        return "megatron"
    return f"zero{spec.zero}" if spec.pp == 1 else f"pp+zero{spec.zero}"


def run(cfg: DictConfig) -> dict:
    """Run one baseline configuration, or its grid with ``grid=true``; returns a summary."""
    system = str(cfg.system)
    if system not in ("megatron", "deepspeed"):
        raise ValueError(f"train_baseline: system must be megatron or deepspeed, got {system!r}")
    results_dir = Path(str(cfg.results_dir))
    timeout_s = float(cfg.get("baseline_timeout_s") or 600)
    base = _base_spec(cfg, system)
    if not cfg.get("grid", False):
        result = run_point(base, timeout_s=timeout_s)
        if result["status"] == "invalid":
            raise ValueError(result["error"])
        write_rows(results_dir, [_row(cfg, base, result, grid=False)])
        if result["status"] != "ok":
            raise RuntimeError(f"{base.label()}: {result['status']}: {result.get('error', '')[-800:]}")
        log.info("%s: %.3f s/iter, %.0f tokens/s, losses %s", base.label(), result["iter_time_s"],
                 result["tokens_per_s"], [round(x, 4) for x in result["losses"]])
        return {"status": "ok", "spec": base.label(), **result}

    n = int(cfg.get("grid_devices") or base.world_size)
    mbs = cfg.get("grid_micro_batch_sizes")
    points = grid_points(system, local_cluster(n), base.workload(), base=base,
                         micro_batch_sizes=list(mbs) if mbs else None)
    results = run_grid(points, timeout_s=timeout_s)
    write_rows(results_dir, [_row(cfg, s, r, grid=True) for s, r in results])
    best = best_point(results)
    counts: dict[str, int] = {}
    for _, r in results:
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    if best is None:
        raise RuntimeError(f"{system} grid on {n} devices: no point ran ({counts})")
    log.info("%s grid on %d devices: best %s at %.3f s/iter (%s)", system, n, best[0].label(),
             best[1]["iter_time_s"], counts)
    return {"status": "ok", "best": best[0].label(), "best_iter_time_s": best[1]["iter_time_s"],
            "counts": counts}
