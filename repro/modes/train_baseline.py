"""``mode=train system=megatron|deepspeed``: real baseline training, one row per configuration.

    python repro/run.py mode=train system=megatron model=debug pp=2 dp=2 iters=3 results_dir=DIR
    python repro/run.py mode=train system=deepspeed zero=3 dp=4 results_dir=DIR
    python repro/run.py mode=train system=deepspeed zero=1 pp=2 dp=2 results_dir=DIR
    python repro/run.py mode=train system=megatron grid=true grid_devices=4 results_dir=DIR
    python repro/run.py mode=emulate system=deepspeed model=debug case=5 grid=true \\
        'emulate.devices=[0,8,24,40]' batch=8 iters=4 results_dir=DIR

A single run uses ``tp``/``pp``/``dp``/``zero`` (DeepSpeed: ``zero`` defaults to 3 without a
pipeline and 1 with one); ``grid=true`` runs the baseline's grid search over ``grid_devices``
local ranks (the same space the simulator searches, :mod:`baselines.space`), writing a row for
every point, infeasible ones included (status ``invalid``/``oom``), and logs the best point.
``mode=emulate`` (dispatched here by repro/modes/emulate.py for these systems, or called
directly) does the same inside an emulated network of ``case`` (:mod:`system.emulation`) and adds the
simulator's prediction (``predicted_iter_time_s``) to each measured row.
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

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


def _row(cfg: DictConfig, spec: BaselineSpec, result: dict, grid: bool, extra_key: dict) -> dict:
    key = {
        "study": str(cfg.study), "mode": str(cfg.mode), "system": spec.system, **extra_key,
        "model": spec.model, "num_layers": spec.gpt_config().num_layers,
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


def _counts(results) -> dict[str, int]:
    counts: dict[str, int] = {}
    for _, r in results:
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    return counts


def _execute(cfg: DictConfig, base: BaselineSpec, cluster, run_kw: dict, extra_key: dict,
             predict=None) -> dict:
    """One point or the grid on ``cluster``, rows written; ``predict(spec)``: simulator's time."""
    results_dir = Path(str(cfg.results_dir))
    timeout_s = float(cfg.get("baseline_timeout_s") or 600)
    grid = bool(cfg.get("grid", False))
    if grid:
        mbs = cfg.get("grid_micro_batch_sizes")
        points = grid_points(base.system, cluster, base.workload(), base=base,
                             micro_batch_sizes=list(mbs) if mbs else None)
        results = run_grid(points, timeout_s=timeout_s, **run_kw)
    else:
        results = [(base, run_point(base, timeout_s=timeout_s, **run_kw))]
        if results[0][1]["status"] == "invalid":
            raise ValueError(results[0][1]["error"])
    rows = []
    for spec, res in results:
        pred = predict(spec) if predict is not None and res["status"] == "ok" else None
        rows.append(_row(cfg, spec, {**res, "predicted_iter_time_s": pred}, grid, extra_key))
    write_rows(results_dir, rows)
    best = best_point(results)
    if best is None:
        raise RuntimeError(f"{base.label()}{' grid' if grid else ''}: no point ran "
                           f"({_counts(results)}): {results[-1][1].get('error', '')[-800:]}")
    spec, res = best
    log.info("%s%s: %.3f s/iter, %.0f tokens/s, losses %s (%s)", spec.label(),
             " (best of the grid)" if grid else "", res["iter_time_s"], res["tokens_per_s"],
             [round(x, 4) for x in res["losses"]], _counts(results))
    return {"status": "ok", "spec": spec.label(), "best_iter_time_s": res["iter_time_s"],
            "counts": _counts(results), **res}


def _run_emulated(cfg: DictConfig, base: BaselineSpec) -> dict:
    """``mode=emulate``: the run (or grid) inside an emulated network of ``case``.

    Uses repro/modes/emulate.py's ``emulate.*`` keys and defaults (devices, bandwidth/delay scale,
    backend, the scaled model's hidden_size/seq_length/vocab_size, batch 4·dp), so rows sit beside
    ``system=ours`` rows of the same setting. Each row carries the scale factors and the
    simulator's prediction on the emulated (scaled) cluster with a CPU-calibrated hardware model.
    """
    from baselines.grid import emulation_kwargs, predict_iter_time_s
    from baselines.worker import calibrated_cpu_hardware
    from repro.modes.emulate import DEFAULTS, pick_devices
    from system.cases import get_case
    from system.emulation.netns import Emulation
    from system.emulation.plan import make_plan
    from system.simulator.comm import GLOO

    user = OmegaConf.to_container(cfg.get("emulate") or OmegaConf.create({}), resolve=True)
    em = {**DEFAULTS, **{k: v for k, v in user.items() if v is not None}}
    full = get_case(str(cfg.case), str(cfg.get("case_variant") or "paper"))
    devices = [int(d) for d in em["devices"]] if em["devices"] else pick_devices(
        full, int(em["max_devices"]))
    cluster = full.subset(devices)
    base = dataclasses.replace(
        base, hidden_size=int(em["hidden_size"]), seq_length=int(em["seq_length"]),
        vocab_size=int(em["vocab_size"]), start="clock",  # ranks share the host's clock
        global_batch_size=int(cfg.batch) if cfg.get("batch") is not None  # emulate.py's default:
        else 4 * int(cfg.dp if cfg.get("dp") is not None else 2))
    plan = make_plan(cluster, bandwidth_scale=float(em["bandwidth_scale"]),
                     delay_scale=float(em["delay_scale"]))
    plan.check_capacity()
    scaled = plan.scaled_cluster()
    n = scaled.num_devices
    if not cfg.get("grid", False) and base.world_size != n:
        raise ValueError(f"mode=emulate: tp*pp*dp = {base.world_size} but the emulated cluster has "
                         f"{n} devices (set emulation.devices or pp/dp/tp)")
    hw = calibrated_cpu_hardware(base)
    m = base.gpt_config()
    extra = {"case": str(cfg.case), "devices": devices, "hidden_size": m.hidden_size,
             "seq_length": m.seq_length, "vocab_size": m.vocab_size, "start": base.start,
             **plan.scale_record()}
    with Emulation(plan, backend=str(em["backend"])) as emu:
        extra["emu_backend"] = emu.backend
        return _execute(cfg, base, scaled, emulation_kwargs(emu), extra,
                        predict=lambda s: predict_iter_time_s(s, scaled, hw, GLOO))


def run(cfg: DictConfig) -> dict:
    """Run one baseline configuration, or its grid with ``grid=true``; returns a summary."""
    system = str(cfg.system)
    if system not in ("megatron", "deepspeed"):
        raise ValueError(f"train_baseline: system must be megatron or deepspeed, got {system!r}")
    base = _base_spec(cfg, system)
    if str(cfg.mode) == "emulate":
        return _run_emulated(cfg, base)
    n = int(cfg.get("grid_devices") or base.world_size)
    return _execute(cfg, base, local_cluster(n), {}, {"case": "local"})
