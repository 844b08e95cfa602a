"""``mode=quality_links``: the time-per-iteration factor on emulated links, and a check that
time to target is the product of the two factors.

    python repro/run.py mode=quality_links results_dir=results/quality

1. **Timing**: for each case, the first device of each of ``pp·dp`` regions in network
   namespaces with the case's delays and ``bandwidth_scale`` × its bandwidths
   (:mod:`system.emulation`), the scheduler's layout for those links, and every method's
   setting (chosen from the ``mode=quality_curves`` tuning rows, as that mode chooses) run for
   ``timing_iters`` iterations back to back: the median seconds per iteration after
   ``timing_warmup``.
2. **End-to-end check**: ``check_methods`` on ``check_case``, each a full run of
   ``check_iters`` iterations (its own warm-up and cosine schedule). The same spec trained in
   one process gives the loss curve (the runtime's losses equal it, a test); the target is its
   windowed training loss at 75% of the run; predicted time to target = iterations to target ×
   the run's own median seconds per iteration, measured = the emulated run's clock when its
   windowed loss first reaches the target.
"""

from __future__ import annotations

import dataclasses
import logging
import statistics
import time

import numpy as np

log = logging.getLogger(__name__)

__all__ = ["run", "first_reached"]

WINDOW = 16  # training losses averaged over this many iterations (the check's curve)


def first_reached(losses, target: float, window: int = WINDOW) -> int | None:
    """The first iteration (1-based count done) whose trailing ``window`` mean is ≤ target."""
    x = np.asarray(losses, dtype=float)
    for i in range(window, x.size + 1):
        if x[i - window : i].mean() <= target:
            return i
    return None


def _layout(cfg, scaled) -> list[list[int]]:
    from system.scheduler import schedule
    from system.workload import tasklet_sizes

    wl = dataclasses.replace(
        cfg.base_spec(lr=1e-3).workload(), activation_bytes=4, gradient_bytes=4
    )
    return schedule(
        scaled,
        tasklet_sizes(wl, cfg.pp, cfg.dp),
        pp=cfg.pp,
        dp=cfg.dp,
        method="genetic",
        seed=0,
        trials=300,
        time_limit_s=60,
    ).assignment.stages.tolist()


def _devices(cfg, case: str) -> list[int]:
    from system.cases import get_case

    first: dict = {}
    for d, region in enumerate(get_case(case).region_of):
        first.setdefault(region, d)
    return list(first.values())[: cfg.pp * cfg.dp]


def run(cfg) -> dict:
    from baselines.grid import emulation_kwargs
    from repro.studies.quality_curves.methods import hparams_text
    from repro.studies.quality_curves.run import chosen_from_store
    from system.cases import get_case
    from system.emulation.netns import Emulation
    from system.emulation.plan import make_plan
    from system.results import has_row, make_row, write_rows
    from system.runtime.inprocess import train_in_process
    from system.runtime.launch import launch

    chosen = chosen_from_store(cfg)
    done, t_job = [], time.monotonic()
    for case in dict.fromkeys([*map(str, cfg.cases), str(cfg.check_case)]):
        devices = _devices(cfg, case)
        plan = make_plan(
            get_case(case).subset(devices),
            bandwidth_scale=cfg.bandwidth_scale,
            delay_scale=cfg.delay_scale,
        )
        scaled = plan.scaled_cluster()
        margin = max(0.5, 4.0 * float(scaled.delay_s.max()))
        layout = _layout(cfg, scaled)
        jobs = []
        if case in map(str, cfg.cases):
            jobs += [("timing", m, cfg.timing_iters) for m in chosen]
        if case == str(cfg.check_case):
            jobs += [
                ("check", str(m), cfg.check_iters) for m in cfg.check_methods if str(m) in chosen
            ]
        with Emulation(plan) as emu:
            kw = emulation_kwargs(emu)
            for kind, method, iters in jobs:
                opts = chosen[method]
                spec = dataclasses.replace(
                    cfg.base_spec(seed=cfg.seed, **opts),
                    iters=iters,
                    lr_warmup_iters=min(cfg.warmup_iters, iters // 8),
                    stages=layout,
                    start="free",
                    start_margin_s=margin,
                    warmup_iters=cfg.timing_warmup,
                )
                key = {
                    "study": cfg.study,
                    "mode": "quality_links",
                    "phase": kind,
                    "system": method,
                    "case": case,
                    "seed": cfg.seed,
                    "hparams": hparams_text(opts),
                    "iters": iters,
                    "emu_bandwidth_scale": cfg.bandwidth_scale,
                    "emu_delay_scale": cfg.delay_scale,
                    "devices": devices,
                    "stages": layout,
                }
                probe = make_row(key)
                if has_row(cfg.results_dir, probe["run_id"]):
                    continue
                t0 = time.monotonic()
                m = launch(
                    spec,
                    rank_prefix=kw["rank_prefix"],
                    rank_env=kw["rank_env"],
                    master_addr=kw["master_addr"],
                    timeout_s=cfg.timeout_s,
                )
                per_iter = list(np.diff([0.0, *m["elapsed_s"]]))
                values = dict(
                    iter_time_s=float(statistics.median(per_iter[cfg.timing_warmup :])),
                    elapsed_s=m["elapsed_s"],
                    losses=m["losses"],
                    wall_s=time.monotonic() - t0,
                    **plan.scale_record(),
                )
                if kind == "check":
                    here = train_in_process(spec, eval_every=iters, eval_sequences=8)
                    values.update(_product_check(here.train_loss, values))
                write_rows(cfg.results_dir, [make_row(key, **values)])
                done.append(probe["run_id"])
                log.info(
                    "quality_links %s %s case %s: %.3f s/iter",
                    kind,
                    method,
                    case,
                    values["iter_time_s"],
                )
    return {"run_ids": done, "job_s": time.monotonic() - t_job}


def _product_check(curve: list[float], values: dict) -> dict:
    """Predicted (iterations × s/iter) and measured time to the curve's 75% target."""
    x = np.asarray(curve, dtype=float)
    at = int(0.75 * x.size)
    target = float(x[at - WINDOW : at].mean())
    n = first_reached(curve, target)
    measured_at = first_reached(values["losses"], target)
    predicted = None if n is None else n * values["iter_time_s"]
    measured = None if measured_at is None else float(values["elapsed_s"][measured_at - 1])
    return dict(
        check_target_loss=target,
        check_iters_to_target=n,
        check_predicted_s=predicted,
        check_measured_s=measured,
    )
