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
directly) does the same inside an emulated network of ``case`` (:mod:`system.emulation`) and adds
the simulator's prediction (``predicted_iter_time_s``) to each measured row; with
``emulate.baseline_placement=topology`` each point runs under its topology-aware rank map.
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
        system=system,
        model=str(cfg.model),
        layers=int(cfg.layers) if cfg.get("layers") is not None else None,
        tp=int(cfg.get("tp") or 1),
        pp=pp,
        dp=dp,
        zero=int(zero) if zero is not None and system == "deepspeed" else None,
        global_batch_size=int(cfg.batch) if cfg.get("batch") is not None else _DEFAULT_BATCH,
        micro_batch_size=int(cfg.get("micro_batch_size") or 1),
        iters=int(cfg.iters),
        seed=int(cfg.seed),
        lr=float(rt.get("lr") or BaselineSpec.lr),
        device=str(rt.get("device") or "cpu"),
        recompute=bool(cfg.get("baseline_recompute", False)),
    )


def _row(cfg: DictConfig, spec: BaselineSpec, result: dict, grid: bool, extra_key: dict) -> dict:
    key = {
        "study": str(cfg.study),
        "mode": str(cfg.mode),
        "system": spec.system,
        **extra_key,
        "model": spec.model,
        "num_layers": spec.gpt_config().num_layers,
        "num_devices": spec.world_size,
        "global_batch_size": spec.global_batch_size,
        "micro_batch_size": spec.micro_batch_size,
        "tp": spec.tp,
        "pp": spec.pp,
        "dp": spec.dp,
        "zero": spec.zero,
        "iters": spec.iters,
        "seed": spec.seed,
        "device": spec.device,
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


def _placed(points, place, placement: str):
    """Per point its rank map (``place(spec)``; None for points that will not run), and the
    points with those whose topology map equals launch order marked ``skipped``: that run is
    the launch-order grid's, the same ranks on the same devices."""
    maps, out = [], []
    for spec, reason in points:
        rm = place(spec) if reason is None else None
        unmoved = rm is not None and rm.devices == tuple(range(len(rm.devices)))
        if placement == "topology" and unmoved:
            reason = "skipped: the topology rank map is launch order (the launch-order row)"
        maps.append(rm)
        out.append((spec, reason))
    return out, maps


def _execute(
    cfg: DictConfig,
    base: BaselineSpec,
    cluster,
    run_kw: dict,
    extra_key: dict,
    predict=None,
    place=None,
    placement: str = "launch",
) -> dict:
    """One point or the grid on ``cluster``, rows written.

    ``predict(spec, rank_map)``: the simulator's time; ``place(spec)``: the point's
    :class:`baselines.placement.RankMap` under ``placement`` (None: launch order, unrecorded).
    """
    results_dir = Path(str(cfg.results_dir))
    timeout_s = float(cfg.get("baseline_timeout_s") or 600)
    grid = bool(cfg.get("grid", False))
    if grid:
        mbs = cfg.get("grid_micro_batch_sizes")
        points = grid_points(
            base.system,
            cluster,
            base.workload(),
            base=base,
            micro_batch_sizes=list(mbs) if mbs else None,
        )
        maps = None
        if place is not None:
            points, maps = _placed(points, place, placement)
        results = run_grid(points, run=run_point, timeout_s=timeout_s, rank_maps=maps, **run_kw)
    else:  # one point runs under its map even when that is launch order
        rm = place(base) if place is not None else None
        kw = run_kw if rm is None else {**run_kw, "rank_map": list(rm.devices)}
        res = run_point(base, timeout_s=timeout_s, **kw)
        if rm is not None:
            res = {
                **res,
                "placement": rm.placement,
                "rank_map": list(rm.devices),
                "placement_how": rm.how,
            }
        results = [(base, res)]
        if results[0][1]["status"] == "invalid":
            raise ValueError(results[0][1]["error"])
    rows = []
    for spec, res in results:
        ok = predict is not None and res["status"] == "ok"
        pred = predict(spec, res.get("rank_map")) if ok else None
        rows.append(_row(cfg, spec, {**res, "predicted_iter_time_s": pred}, grid, extra_key))
    write_rows(results_dir, rows)
    best = best_point(results)
    if best is None:
        raise RuntimeError(
            f"{base.label()}{' grid' if grid else ''}: no point ran "
            f"({_counts(results)}): {results[-1][1].get('error', '')[-800:]}"
        )
    spec, res = best
    log.info(
        "%s%s: %.3f s/iter, %.0f tokens/s, losses %s (%s)",
        spec.label(),
        " (best of the grid)" if grid else "",
        res["iter_time_s"],
        res["tokens_per_s"],
        [round(x, 4) for x in res["losses"]],
        _counts(results),
    )
    return {
        "status": "ok",
        "spec": spec.label(),
        "best_iter_time_s": res["iter_time_s"],
        "counts": _counts(results),
        **res,
    }


def _run_emulated(cfg: DictConfig, base: BaselineSpec) -> dict:
    """``mode=emulate``: the run (or grid) inside an emulated network of ``case``.

    Uses repro/modes/emulate.py's ``emulate.*`` keys and defaults (devices, bandwidth/delay scale,
    backend, the scaled model's hidden_size/seq_length/vocab_size, batch 4·dp), so rows sit beside
    ``system=ours`` rows of the same setting. Each row carries the scale factors and the
    simulator's prediction on the emulated (scaled) cluster with a CPU-calibrated hardware model.
    ``emulate.baseline_placement``: ``launch`` runs global rank r in device r's namespace;
    ``topology`` runs each point under its topology-aware rank map
    (:func:`baselines.grid.place_spec`, searched with that same simulator), skipping grid points
    whose map is launch order. Every row records ``placement``, ``rank_map`` and
    ``placement_how``, and its prediction uses that map.
    """
    from baselines.grid import emulation_kwargs, place_spec, predict_iter_time_s
    from baselines.worker import calibrated_cpu_hardware
    from repro.modes.emulate import DEFAULTS, pick_devices
    from system.cases import get_case
    from system.emulation.netns import Emulation
    from system.emulation.plan import make_plan
    from system.simulator.comm import GLOO

    user = OmegaConf.to_container(cfg.get("emulate") or OmegaConf.create({}), resolve=True)
    em = {**DEFAULTS, **{k: v for k, v in user.items() if v is not None}}
    full = get_case(str(cfg.case), str(cfg.get("case_variant") or "paper"))
    devices = (
        [int(d) for d in em["devices"]]
        if em["devices"]
        else pick_devices(full, int(em["max_devices"]))
    )
    cluster = full.subset(devices)
    base = dataclasses.replace(
        base,
        hidden_size=int(em["hidden_size"]),
        seq_length=int(em["seq_length"]),
        vocab_size=int(em["vocab_size"]),
        start="clock",  # ranks share the host's clock
        global_batch_size=int(cfg.batch)
        if cfg.get("batch") is not None  # emulate.py's default:
        else 4 * int(cfg.dp if cfg.get("dp") is not None else 2),
    )
    plan = make_plan(
        cluster, bandwidth_scale=float(em["bandwidth_scale"]), delay_scale=float(em["delay_scale"])
    )
    plan.check_capacity()
    scaled = plan.scaled_cluster()
    n = scaled.num_devices
    if not cfg.get("grid", False) and base.world_size != n:
        raise ValueError(
            f"mode=emulate: tp*pp*dp = {base.world_size} but the emulated cluster has "
            f"{n} devices (set emulation.devices or pp/dp/tp)"
        )
    placement = str(em["baseline_placement"])
    if placement not in ("launch", "topology"):
        raise ValueError(
            "mode=emulate: emulate.baseline_placement must be launch or topology, "
            f"got {placement!r}"
        )
    hw = calibrated_cpu_hardware(base)
    m = base.gpt_config()
    extra = {
        "case": str(cfg.case),
        "devices": devices,
        "hidden_size": m.hidden_size,
        "seq_length": m.seq_length,
        "vocab_size": m.vocab_size,
        "start": base.start,
        **plan.scale_record(),
        "placement": placement,
    }
    with Emulation(plan, backend=str(em["backend"])) as emu:
        extra["emu_backend"] = emu.backend
        return _execute(
            cfg,
            base,
            scaled,
            emulation_kwargs(emu),
            extra,
            predict=lambda s, rm: predict_iter_time_s(s, scaled, hw, GLOO, rank_map=rm),
            place=lambda s: place_spec(s, scaled, placement, hw, GLOO),
            placement=placement,
        )


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
