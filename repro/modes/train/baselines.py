"""Real Megatron and DeepSpeed runs, one row per configuration (``mode=train`` and
``mode=emulate`` with ``system=megatron|deepspeed``).

    python repro/run.py mode=train system=megatron model=debug pp=2 dp=2 iters=3 results_dir=DIR
    python repro/run.py mode=train system=deepspeed zero=3 dp=4 results_dir=DIR
    python repro/run.py mode=train system=deepspeed zero=1 pp=2 dp=2 results_dir=DIR
    python repro/run.py mode=train system=megatron grid=true grid_devices=4 results_dir=DIR
    python repro/run.py mode=emulate system=deepspeed case=5 grid=true \\
        'devices=[0,8,24,40]' batch=8 iters=4 results_dir=DIR

A single run uses ``tp``/``pp``/``dp``/``zero`` (DeepSpeed: ``zero`` defaults to 3 without a
pipeline and 1 with one); ``grid=true`` runs the baseline's grid search (the same space the
simulator searches, :mod:`baselines.space`), writing a row for every point, infeasible ones
included (status ``invalid``/``oom``), and logs the best point. Under ``mode=emulate`` the run
or grid happens inside an emulated network of ``case`` (:mod:`system.emulation`), once per
protocol of ``baseline_placements``, and each measured row carries the simulator's prediction
(``predicted_iter_time_s``) under the rank map it ran with.
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

from baselines.grid import BaselineSpec, best_point, grid_points, local_cluster, run_grid, run_point
from baselines.placement import Placement
from repro.modes.emulate.config import EmulateConfig
from repro.modes.train.config import RuntimeOptions, TrainConfig
from system.results import make_row, write_rows

log = logging.getLogger(__name__)

__all__ = ["run_local", "run_emulated"]

LocalRun = TrainConfig | EmulateConfig


def _base_spec(cfg: LocalRun, runtime: RuntimeOptions) -> BaselineSpec:
    system, pp, dp = str(cfg.system), cfg.pp or 1, cfg.dp or 1
    zero = cfg.zero
    if system == "deepspeed" and zero is None:
        zero = 3 if pp == 1 else 1
    return BaselineSpec(
        system=system,
        model=str(cfg.model),
        layers=cfg.layers,
        tp=cfg.tp,
        pp=pp,
        dp=dp,
        zero=zero if system == "deepspeed" else None,
        global_batch_size=cfg.batch or BaselineSpec.global_batch_size,
        micro_batch_size=cfg.micro_batch_size,
        iters=cfg.iters,
        seed=cfg.seed,
        lr=runtime.lr,
        device=str(runtime.device),
        recompute=cfg.baseline_recompute,
    )


def _row(cfg: LocalRun, spec: BaselineSpec, result: dict, grid: bool, extra_key: dict) -> dict:
    key = {
        "study": cfg.study,
        "mode": cfg.mode,
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
    # the frameworks' features the run used (schedule, overlap flags, collective): in the key
    # where they differ from the plain run's, so the plain runs keep their keys
    plain = {
        "virtual_stages": 1,
        "distributed_optimizer": False,
        "overlap_grad_reduce": False,
        "overlap_param_gather": False,
        "overlap_comm": None,
        "dp_collective": "ring",
    }
    features = {k: getattr(spec, k) for k in plain}
    if spec.device != "cuda" and spec.dp_collective == "auto":
        features["dp_collective"] = "ring"  # what ran: gloo's all-reduce is its ring
    key.update({k: v for k, v in features.items() if v != plain[k]})
    values = {k: v for k, v in result.items() if k not in key}
    values.update({k: v for k, v in features.items() if k not in key})
    interleaved = spec.virtual_stages > 1
    values["schedule"] = "interleaved-1f1b" if interleaved else ("1f1b" if spec.pp > 1 else "none")
    values.setdefault("iter_time_s", None)
    values.setdefault("pflops", None)
    values.setdefault("dp_collective_request", spec.dp_collective)  # NCCL_ALGO only if forced
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
        if placement == Placement.topology and unmoved:
            reason = "skipped: the topology rank map is launch order (the launch-order row)"
        maps.append(rm)
        out.append((spec, reason))
    return out, maps


def _execute(
    cfg: LocalRun,
    base: BaselineSpec,
    cluster,
    run_kw: dict,
    extra_key: dict,
    predict=None,
    place=None,
    placement: Placement = Placement.launch,
) -> dict:
    """One point or the grid on ``cluster``, rows written.

    ``predict(spec, rank_map)``: the simulator's time; ``place(spec)``: the point's
    :class:`baselines.placement.RankMap` under ``placement`` (None: launch order, unrecorded).
    """
    results_dir = Path(cfg.results_dir)
    timeout_s, grid = cfg.timeout_s, cfg.grid
    if grid:
        points = grid_points(
            base.system,
            cluster,
            base.workload(),
            base=base,
            micro_batch_sizes=cfg.grid_micro_batch_sizes,
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


def run_emulated(cfg: EmulateConfig) -> dict:
    """The run (or grid) inside an emulated network of ``case``, once per protocol of
    ``baseline_placements``.

    The emulated network, devices, scaled model and default batch (4·dp) are those of
    ``system=ours`` in the same setting, so the rows sit beside ours'. Each row carries the
    scale factors and the simulator's prediction on the emulated (scaled) cluster with a
    CPU-calibrated hardware model. ``launch`` runs global rank r in device r's namespace;
    ``topology`` runs each point under its topology-aware rank map
    (:func:`baselines.grid.place_spec`, searched with that same simulator), skipping grid points
    whose map is launch order. Every row records ``placement``, ``rank_map`` and
    ``placement_how``, and its prediction uses that map.
    """
    from baselines.grid import emulation_kwargs, place_spec, predict_iter_time_s
    from baselines.worker import calibrated_cpu_hardware
    from system.emulation.netns import Emulation
    from system.emulation.plan import make_plan
    from system.simulator.transfers import GLOO

    full = cfg.cluster()
    devices = cfg.picked_devices(full)
    cluster = full.subset(devices)
    base = _base_spec(cfg, RuntimeOptions())
    base = dataclasses.replace(
        base,
        hidden_size=cfg.hidden_size,
        seq_length=cfg.seq_length,
        vocab_size=cfg.vocab_size,
        start="clock",  # ranks share the host's clock
        global_batch_size=cfg.batch or 4 * (cfg.dp or 2),
    )
    plan = make_plan(cluster, bandwidth_scale=cfg.bandwidth_scale, delay_scale=cfg.delay_scale)
    plan.check_capacity()
    scaled = plan.scaled_cluster()
    n = scaled.num_devices
    if not cfg.grid and base.world_size != n:
        raise ValueError(
            f"mode=emulate: tp*pp*dp = {base.world_size} but the emulated cluster has "
            f"{n} devices (set devices or pp/dp/tp)"
        )
    hw = calibrated_cpu_hardware(base)
    m = base.gpt_config()
    out = {}
    with Emulation(plan, backend=str(cfg.backend)) as emu:
        for placement in cfg.baseline_placements:
            extra = {
                "case": cfg.case,
                "devices": devices,
                "hidden_size": m.hidden_size,
                "seq_length": m.seq_length,
                "vocab_size": m.vocab_size,
                "start": base.start,
                **plan.scale_record(),
                "placement": str(placement),
                "emu_backend": emu.backend,
            }
            out[str(placement)] = _execute(
                cfg,
                base,
                scaled,
                emulation_kwargs(emu),
                extra,
                predict=lambda s, rm: predict_iter_time_s(s, scaled, hw, GLOO, rank_map=rm),
                place=lambda s, p=placement: place_spec(s, scaled, p, hw, GLOO),
                placement=placement,
            )
    return next(iter(out.values())) if len(out) == 1 else {"placements": out}


def run_local(cfg: TrainConfig) -> dict:
    """One baseline configuration on local processes, or its grid with ``grid=true``."""
    base = _base_spec(cfg, cfg.runtime)
    n = cfg.grid_devices or base.world_size
    return _execute(cfg, base, local_cluster(n), {}, {"case": "local"})
