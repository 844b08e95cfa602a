"""``mode=emulate``: our runtime on emulated WAN links, beside the simulator's prediction (§4).

    python repro/run.py case=5 mode=emulate model=debug study=emulation
    python repro/run.py case=4 mode=emulate model=debug batch=16 emulate.random_layouts=2
    python repro/run.py case=5 mode=emulate system=megatron model=debug grid=true \
        'emulate.devices=[0,8,24,40]' batch=8      # the baselines: repro/modes/train_baseline.py

Steps: take a subset of the case's devices (default: the first device of each region, at most
``emulate.max_devices``), scale bandwidths by ``emulate.bandwidth_scale`` (and delays by
``emulate.delay_scale``), build the namespaces (:class:`system.emulation.netns.Emulation`),
verify sampled links (stored with every row), then run the runtime with the scheduled layout and
``emulate.random_layouts`` random layouts. Each run's row holds the measured median iteration
time and :func:`system.simulator.simulate_ours` on the same scaled cluster and layout, fed with
the per-stage forward/backward/optimizer seconds measured in that run (so the comparison tests
the communication and pipeline model, not a CPU FLOP model), plus every scale factor.
"""

from __future__ import annotations

import json
import logging
import statistics
from pathlib import Path

import numpy as np
from omegaconf import DictConfig

from repro.modes import mode_options
from repro.runtime_metrics import measured_compute
from system.assignment import Assignment, random_assignment
from system.cases import get_case
from system.emulation import netns
from system.emulation.plan import make_plan
from system.emulation.verify import verify_links
from system.results import atomic_write_text, make_row, write_rows

log = logging.getLogger(__name__)

DEFAULTS = {
    "devices": None,
    "max_devices": 8,
    "bandwidth_scale": 0.1,
    "delay_scale": 1.0,
    "layouts": ["scheduled", "random"],
    "random_layouts": 2,
    "verify_pairs": 6,
    "verify_tolerance": 0.10,
    "on_verify_fail": "raise",
    "backend": "auto",
    "hidden_size": 256,
    "seq_length": 64,
    "vocab_size": 128,
    "timeout_s": 600,
    "schedule_trials": 300,
    "warmup_iters": 2,
    "baseline_placement": "launch",
}


def pick_devices(cluster, max_devices: int) -> list[int]:
    """First device of each region (region order), at most ``max_devices``."""
    first = {}
    for d, r in enumerate(cluster.region_of):
        first.setdefault(r, d)
    return list(first.values())[:max_devices]


def _layouts(
    o: dict, cluster, sizes, pp: int, dp: int, seed: int
) -> list[tuple[str, int, Assignment]]:
    out = []
    for name in o["layouts"]:
        if name == "scheduled":
            from system.scheduler import schedule

            res = schedule(
                cluster,
                sizes,
                pp=pp,
                dp=dp,
                method="genetic",
                seed=seed,
                trials=int(o["schedule_trials"]),
                time_limit_s=60,
            )
            out.append(("scheduled", seed, res.assignment))
        elif name == "random":
            out += [
                ("random", seed + k, random_assignment(pp, dp, seed + 1000 + k))
                for k in range(int(o["random_layouts"]))
            ]
        elif name == "identity":
            out.append(("identity", 0, Assignment(np.arange(pp * dp).reshape(pp, dp))))
        else:
            raise ValueError(f"mode=emulate: unknown layout {name!r} (scheduled, random, identity)")
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


def run(cfg: DictConfig) -> dict:
    from system.runtime.launch import launch
    from system.runtime.spec import RunSpec
    from system.simulator import simulate_ours
    from system.workload import Workload, tasklet_sizes

    system = str(cfg.get("system", "all"))
    if system in ("megatron", "deepspeed"):  # the real baselines in the same emulated network
        from repro.modes.train_baseline import run as run_baseline

        return run_baseline(cfg)
    if system not in ("all", "ours", "ours_random"):
        raise ValueError(
            f"mode=emulate: system must be ours, megatron or deepspeed, got {system!r}"
        )
    o = mode_options(cfg, "emulate", DEFAULTS, keep_none=("devices",))
    full = get_case(str(cfg.case), str(cfg.get("case_variant", "paper")))
    devices = list(o["devices"]) if o["devices"] else pick_devices(full, int(o["max_devices"]))
    cluster = full.subset(devices)
    n = cluster.num_devices
    dp = int(cfg.dp) if cfg.get("dp") is not None else 2
    pp = int(cfg.pp) if cfg.get("pp") is not None else n // dp
    if pp * dp != n:
        raise ValueError(
            f"mode=emulate: pp={pp} x dp={dp} must equal the {n} emulated devices {devices}"
        )
    batch = int(cfg.batch) if cfg.get("batch") is not None else 4 * dp
    warmup = int(o["warmup_iters"])
    if warmup < 0:
        raise ValueError(f"mode=emulate: emulate.warmup_iters must be >= 0, got {warmup}")
    seed, iters = int(cfg.seed), max(warmup + 1, int(cfg.iters))
    base = RunSpec(
        model=str(cfg.model),
        layers=None if cfg.get("layers") is None else int(cfg.layers),
        hidden_size=int(o["hidden_size"]),
        seq_length=int(o["seq_length"]),
        vocab_size=int(o["vocab_size"]),
        pp=pp,
        dp=dp,
        global_batch_size=batch,
        micro_batch_size=int(cfg.micro_batch_size),
        iters=iters,
        seed=seed,
        warmup_iters=warmup,
    )
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
    plan = make_plan(
        cluster, bandwidth_scale=float(o["bandwidth_scale"]), delay_scale=float(o["delay_scale"])
    )
    scaled = plan.scaled_cluster()
    sizes = tasklet_sizes(wl, pp, dp)
    layouts = _layouts(o, scaled, sizes, pp, dp, seed)
    out_dir = Path(str(cfg.results_dir))
    rows, summary = [], []
    with netns.Emulation(plan, backend=str(o["backend"])) as emu:
        report = verify_links(
            plan,
            pairs=int(o["verify_pairs"]),
            tolerance=float(o["verify_tolerance"]),
            on_fail=str(o["on_verify_fail"]),
            seed=seed,
        )
        report["backend"] = emu.backend
        vpath = (
            out_dir / "verify" / f"case{cfg.case}-{n}dev-bw{plan.bandwidth_scale:g}-b{batch}.json"
        )
        atomic_write_text(vpath, json.dumps(report, indent=1))
        for _repeat, (layout, lseed, assign) in enumerate(layouts):
            # every rank times the iteration from one instant (one machine, one clock), what the
            # simulator predicts; the instant is far enough ahead for rank 0's notice to arrive
            margin = max(0.5, 4.0 * float(scaled.delay_s.max()))
            spec = RunSpec(
                **{
                    **base.to_dict(),
                    "stages": assign.stages.tolist(),
                    "start": "clock",
                    "start_margin_s": margin,
                }
            )
            key = {
                "study": str(cfg.study),
                "mode": "emulate",
                "case": str(cfg.case),
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
                    timeout_s=float(o["timeout_s"]),
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
