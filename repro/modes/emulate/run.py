"""``mode=emulate``: training on emulated WAN links, beside the simulator's prediction (§4).

    python repro/run.py case=5 mode=emulate model=debug study=emulation
    python repro/run.py case=4 mode=emulate model=debug batch=16 random_layouts=2
    python repro/run.py case=5 mode=emulate system=megatron grid=true \\
        'devices=[0,8,24,40]' batch=8      # the baselines: repro/modes/train/baselines.py

Steps: take a subset of the case's devices (default: the first device of each region, at most
``max_devices``), scale bandwidths by ``bandwidth_scale`` (and delays by ``delay_scale``), build
the namespaces (:class:`system.emulation.netns.Emulation`), verify sampled links (stored with
every row), then run our runtime with the scheduled layout and ``random_layouts`` random layouts.
Each run's row holds the measured median iteration time and
:func:`system.simulator.simulate_ours` on the same scaled cluster and layout, fed with the
per-stage forward/backward/optimizer seconds measured in that run (so the comparison tests the
communication and pipeline model, not a CPU FLOP model), plus every scale factor.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import statistics
from pathlib import Path

import numpy as np

from repro.config.shared import fill_layout, runtime_spec
from repro.modes.emulate.config import EmulateConfig
from system.assignment import Assignment, random_assignment
from system.cases import case_label
from system.emulation import netns
from system.emulation.plan import make_plan
from system.emulation.verify import verify_links
from system.results import atomic_write_text, make_row, path_in, write_rows

log = logging.getLogger(__name__)

__all__ = ["measured_compute", "run"]

SCHEDULE_TRIALS, SCHEDULE_TIME_LIMIT_S = 300, 60.0  # scheduler.* left null


def measured_compute(metrics: dict, pp: int, warmup: int):
    """Per-stage compute measured by a runtime run, in the simulator's terms: medians (over the
    ranks of the stage and the iterations after the ``warmup`` ones) of the forward/backward
    micro-batch spans and the optimizer step."""
    from system.simulator import StageCompute

    stage_of = np.asarray(metrics["stage_of_rank"])
    pr = metrics["per_rank"]
    out = {}
    for key, field in (("fwd_s", "fwd_mb_s"), ("bwd_s", "bwd_mb_s"), ("opt_s", "optim_s")):
        arr = np.asarray(pr[field])  # [rank][iteration]
        arr = arr[:, warmup:] if arr.shape[1] > warmup else arr[:, -1:]
        out[key] = [float(np.median(arr[stage_of == s])) for s in range(pp)]
    return StageCompute(**out)


def _layouts(
    cfg: EmulateConfig, cluster, sizes, pp: int, dp: int
) -> list[tuple[str, int, Assignment]]:
    seed, out = cfg.seed, []
    for name in cfg.layouts:
        if name == "scheduled":
            from system.scheduler import schedule

            budget = {"trials": SCHEDULE_TRIALS, "time_limit_s": SCHEDULE_TIME_LIMIT_S}
            kwargs = cfg.scheduler.search_kwargs(**budget)
            res = schedule(cluster, sizes, pp=pp, dp=dp, seed=seed, **kwargs)
            out.append(("scheduled", seed, res.assignment))
        elif name == "random":
            out += [
                ("random", seed + k, random_assignment(pp, dp, seed + 1000 + k))
                for k in range(cfg.random_layouts)
            ]
        else:
            out.append(("identity", 0, Assignment(np.arange(pp * dp).reshape(pp, dp))))
    return out


def _delayer_lag(before: dict, after: dict) -> dict:
    """This run's mean release lateness of the userspace delayer (ms; NaN without one), from the
    difference of its cumulative counters, and the emulation's maximum so far."""
    n = after.get("delayed", 0) - before.get("delayed", 0)
    late = after.get("sum_late_s", 0.0) - before.get("sum_late_s", 0.0)
    return {
        "delayer_mean_late_ms": 1e3 * late / n if n > 0 else float("nan"),
        "delayer_max_late_ms": 1e3 * after.get("max_late_s", float("nan")),
    }


def run(cfg: EmulateConfig) -> dict:
    from system.runtime.launch import launch
    from system.simulator import simulate_ours
    from system.workload import Workload, tasklet_sizes

    if cfg.system != "ours":  # the real baselines in the same emulated network
        from repro.modes.train.baselines import run_emulated

        return run_emulated(cfg)
    full = cfg.cluster()
    devices = cfg.picked_devices(full)
    cluster = full.subset(devices)
    n = cluster.num_devices
    pp, dp = fill_layout(n, cfg.pp, cfg.dp)
    if pp * dp != n:
        raise ValueError(
            f"mode=emulate: pp={pp} x dp={dp} must equal the {n} emulated devices {devices}"
        )
    batch = cfg.batch or 4 * dp
    warmup = cfg.warmup_iters
    seed, iters = cfg.seed, max(warmup + 1, cfg.iters)
    base = runtime_spec(cfg, pp=pp, dp=dp, global_batch_size=batch, iters=iters)
    model = base.gpt_config()
    # the CPU runtime sends fp32 activations and fp32 gradients
    wl = Workload(
        model=model,
        global_batch_size=batch,
        micro_batch_size=base.micro_batch_size,
        activation_bytes=4,
        gradient_bytes=4,
    )
    wl.check_layout(pp, dp)
    plan = make_plan(cluster, bandwidth_scale=cfg.bandwidth_scale, delay_scale=cfg.delay_scale)
    scaled = plan.scaled_cluster()
    sizes = tasklet_sizes(wl, pp, dp)
    layouts = _layouts(cfg, scaled, sizes, pp, dp)
    out_dir = Path(cfg.results_dir)
    rows, summary = [], []
    with netns.Emulation(plan, backend=str(cfg.backend)) as emu:
        report = verify_links(
            plan,
            pairs=cfg.verify_pairs,
            tolerance=cfg.verify_tolerance,
            on_fail=str(cfg.on_verify_fail),
            seed=seed,
        )
        report["backend"] = emu.backend
        vpath = path_in(
            out_dir,
            "verify",
            f"case{case_label(cfg.case)}-{n}dev-bw{plan.bandwidth_scale:g}-b{batch}.json",
        )
        atomic_write_text(vpath, json.dumps(report, indent=1))
        for _repeat, (layout, lseed, assign) in enumerate(layouts):
            # every rank times the iteration from one instant (one machine, one clock), what the
            # simulator predicts; the instant is far enough ahead for rank 0's notice to arrive
            margin = max(0.5, 4.0 * float(scaled.delay_s.max()))
            spec = dataclasses.replace(
                base, stages=assign.stages.tolist(), start="clock", start_margin_s=margin
            )
            key = {
                "study": cfg.study,
                "mode": "emulate",
                "case": cfg.case,
                "system": "ours" if layout == "scheduled" else f"ours_{layout}",
                "layout": layout,
                "layout_seed": lseed,
                "devices": devices,
                "num_devices": n,
                "num_layers": model.num_layers,
                "hidden_size": model.hidden_size,
                "seq_length": model.seq_length,
                "vocab_size": model.vocab_size,
                "global_batch_size": batch,
                "micro_batch_size": base.micro_batch_size,
                "tp": 1,
                "pp": pp,
                "dp": dp,
                "iters": iters,
                "warmup_iters": warmup,
                "seed": seed,
                "stages": assign.stages.tolist(),
                **plan.scale_record(),
            }
            before = emu.delayer_stats()
            try:
                m = launch(
                    spec,
                    rank_prefix=[emu.exec_prefix(i) for i in range(n)],
                    rank_env=[emu.rank_env(i) for i in range(n)],
                    master_addr=emu.master_addr,
                    timeout_s=cfg.timeout_s,
                )
            except RuntimeError as e:
                log.error("emulated run %s failed: %s", layout, e)
                rows.append(make_row(key, status="error", error=str(e)[:2000]))
                continue
            lag = _delayer_lag(before, emu.delayer_stats())
            compute = measured_compute(m, pp, warmup)
            sim = simulate_ours(scaled, assign, wl, compute=compute)
            meas = float(m["iter_time_median_s"])
            busy = float(
                np.max(wl.micro_batches(dp) * (np.array(compute.fwd_s) + np.array(compute.bwd_s)))
            )
            rows.append(
                make_row(
                    key,
                    iter_time_s=meas,
                    pflops=m["tflops"] / 1e3,
                    predicted_iter_time_s=sim.iter_time_s,
                    sim_error=sim.iter_time_s / meas - 1.0,
                    iter_times_s=m["iter_time_s"],
                    measured_dp_s=m["dp_s_median"],
                    measured_wait_s=m["wait_s_median"],
                    measured_compute_s=m["compute_s_median"],
                    sim_pipeline_s=sim.breakdown["pipeline_s"],
                    sim_dp_s=sim.breakdown["dp_sync_s"],
                    sim_dp_span_s=sim.breakdown["dp_span_max_s"],
                    compute_fwd_s=compute.fwd_s,
                    compute_bwd_s=compute.bwd_s,
                    compute_opt_s=compute.opt_s,
                    compute_share=busy / meas,
                    final_loss=m["losses"][-1],
                    verify_ok=report["ok"],
                    verify_max_rtt_err=report["max_abs_rtt_err"],
                    verify_max_bw_err=report["max_abs_bw_err"],
                    verify_max_tcp_err=report["max_abs_tcp_err"],
                    verify_file=str(vpath),
                    verify_pairs=report["pairs"],
                    emu_backend=emu.backend,
                    delayer_stats=emu.delayer_stats(),
                    **lag,
                    emu_tcp_congestion_control=emu.tcp_congestion_control,
                    scaled_bandwidth_gbps=scaled.bandwidth_gbps.tolist(),
                    scaled_delay_ms=scaled.delay_ms.tolist(),
                )
            )
            summary.append((layout, lseed, meas, sim.iter_time_s))
            log.info(
                "emulate case %s %s(%d): measured %.3f s, simulated %.3f s (%+.1f%%)",
                cfg.case,
                layout,
                lseed,
                meas,
                sim.iter_time_s,
                100 * (sim.iter_time_s / meas - 1),
            )
    path = write_rows(out_dir, rows)
    ok = [s for s in summary]
    mape = statistics.mean(abs(s[3] / s[2] - 1) for s in ok) if ok else float("nan")
    log.info("mode=emulate: %d runs, MAPE %.1f%% -> %s", len(ok), 100 * mape, path)
    return {"rows": len(rows), "mape": mape, "runs": summary, "csv": str(path), "verify": report}
