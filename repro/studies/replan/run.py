"""``mode=replan``: replay a spot pre-emption trace, re-planning warm vs from scratch.

    python repro/run.py mode=replan case=5 events=8 results_dir=results/scheduler

A seeded trace starts with every device of the case and, every ``interval_s`` seconds,
pre-empts ``step_devices`` random present devices or brings back as many absent ones
(never below half the case, never above all of it). The layout keeps dp = 8 replicas and
changes pp (48 devices: 6 stages), so ``num_layers`` must divide by every pp the trace reaches
(gpt3_xl's 24 layers do for 64 / 48 / 32 devices).

After each event two plans are made for the devices present: ``warm`` (:func:`replan`, from
the previous plan, ``time_limit_s``) and ``scratch`` (:func:`schedule`, default budget).
For each: TOTAL, simulated iteration time (:func:`simulate_ours`), the devices that must fetch
layers they do not hold (``moved_tasklets``; layers, not stage ids, are compared since stage s
covers other layers once pp changes), the bytes, and the time to fetch them from the fastest
device that held each layer (a layer nobody present held is counted as lost). Throughput
over time = tokens per iteration / iteration time, zero while planning and moving state.
Writes ``replan.csv`` and ``replan.png`` into ``results_dir``.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pandas as pd

from repro.studies.replan.config import ReplanConfig
from system.cluster import Cluster
from system.results import atomic_write_text, write_set
from system.scheduler import schedule
from system.scheduler.replan import moved_tasklets, replan
from system.scheduler.replan import spot_trace as trace
from system.simulator import simulate_ours
from system.simulator.sharing import with_link_sharing
from system.workload import Workload, get_model, tasklet_sizes

log = logging.getLogger(__name__)

__all__ = ["trace", "replay", "run"]


def _layers(stage: int, pp: int, num_layers: int) -> set[int]:
    return set(range(stage * num_layers // pp, (stage + 1) * num_layers // pp))


def _state_moves(
    cluster: Cluster,
    present: list[int],
    held: dict[int, set[int]],
    need: dict[int, set[int]],
    layer_bytes: float,
) -> tuple[int, float, float, int]:
    """(devices that fetch, bytes fetched, seconds until all hold their layers, lost layers).

    Layers, not stage ids, are compared: when pp changes, stage s covers other layers. A device
    fetches each missing layer from the present device with the fastest link that held it
    (one after another; devices in parallel); a layer nobody present held is lost (it would
    come from a checkpoint). Device ids are those of the full ``cluster``.
    """
    link = cluster.link_time_s(layer_bytes)
    devices, nbytes, worst, lost = 0, 0.0, 0.0, set()
    for d in present:
        missing = need[d] - held.get(d, set())
        if not missing:
            continue
        devices += 1
        nbytes += len(missing) * layer_bytes
        t = 0.0
        for layer in missing:
            holders = [h for h in present if layer in held.get(h, set())]
            if holders:
                t += float(link[holders, d].min())
            else:
                lost.add(layer)
        worst = max(worst, t)
    return devices, nbytes, worst, len(lost)


def replay(
    cluster: Cluster,
    work: Workload,
    *,
    events: int,
    step: int,
    interval_s: float,
    time_limit_s: float,
    dp: int,
    seed: int,
) -> pd.DataFrame:
    rows = []
    states = {"warm": {}, "scratch": {}}  # plan -> {device: (stage, pp)}
    held = {"warm": {}, "scratch": {}}  # plan -> {device: layers it holds}
    num_layers = work.model.num_layers
    layer_bytes = work.model.params_per_layer * work.gradient_bytes  # fp16 weights
    for k, present in enumerate(trace(cluster.num_devices, events, step, seed)):
        sub = cluster.subset(present)
        pp = len(present) // dp
        sizes = tasklet_sizes(work, pp, dp)
        for plan, prev in states.items():
            # the new stage that holds the middle layer of each device's old stage (stage ids
            # mean other layers once pp changes); -1 for devices that just joined
            prev_stage = np.array(
                [int((prev[d][0] + 0.5) * pp / prev[d][1]) if d in prev else -1 for d in present]
            )
            if plan == "warm" and k > 0:
                r = replan(
                    sub,
                    sizes,
                    pp=pp,
                    dp=dp,
                    prev_stage=prev_stage,
                    seed=seed,
                    time_limit_s=time_limit_s,
                )
                a, cost, t_plan = r.assignment, r.cost, r.search_time_s
            else:
                s = schedule(sub, sizes, pp=pp, dp=dp, seed=seed, bound=False)
                a, cost, t_plan = s.assignment, s.cost, s.search_time_s
                flipped = type(a)(a.stages[::-1])
                if moved_tasklets(flipped, prev_stage) < moved_tasklets(a, prev_stage):
                    a = flipped
            need = {d: _layers(int(a.stage_of[i]), pp, num_layers) for i, d in enumerate(present)}
            moved, moved_bytes, move_s, lost = _state_moves(
                cluster, present, held[plan], need, layer_bytes
            )
            held[plan] = need
            sim = simulate_ours(sub, a, work)
            if sim.status != "ok":  # the config checks every layout of the trace up front
                raise ValueError(f"event {k}: {len(present)} devices, pp={pp}: {sim.status}")
            rows.append(
                {
                    "event": k,
                    "time_s": k * interval_s,
                    "plan": plan,
                    "num_devices": len(present),
                    "pp": pp,
                    "dp": dp,
                    "total_cost_s": cost.total_cost_s,
                    "iter_time_s": sim.iter_time_s,
                    "tokens_per_s": work.tokens_per_iteration / sim.iter_time_s,
                    "moved_tasklets": moved if k > 0 else 0,
                    "moved_param_bytes": moved_bytes if k > 0 else 0.0,
                    "plan_time_s": t_plan,
                    "move_time_s": move_s if k > 0 else 0.0,
                    "lost_layers": lost if k > 0 else 0,
                }
            )
            states[plan] = {d: (int(a.stage_of[i]), pp) for i, d in enumerate(present)}
        log.info(
            "event %d: %d devices; warm TOTAL %.2f (%d moved), scratch %.2f (%d moved)",
            k,
            len(present),
            rows[-2]["total_cost_s"],
            rows[-2]["moved_tasklets"],
            rows[-1]["total_cost_s"],
            rows[-1]["moved_tasklets"],
        )
    return pd.DataFrame(rows)


def _figure(df: pd.DataFrame, path: Path, interval_s: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from repro.report.figures import save_figure

    fig, ax = plt.subplots(figsize=(7, 3.2))
    for plan, style in (("warm", "-"), ("scratch", "--")):
        d = df[df.plan == plan].sort_values("event")
        t, y = [], []
        for _, r in d.iterrows():
            down = r.plan_time_s + r.move_time_s  # no training while planning and moving
            t += [r.time_s, r.time_s + down, r.time_s + down]
            y += [0.0, 0.0, r.tokens_per_s]
        t.append(d.time_s.max() + interval_s)
        y.append(y[-1])
        ax.step(np.array(t) / 3600.0, np.array(y) / 1e3, style, where="post", label=plan)
    ax.set_xlabel("time (h)")
    ax.set_ylabel("throughput (k tokens/s)")
    ax.legend()
    fig.tight_layout()
    save_figure(fig, path, dpi=120)


def run(cfg: ReplanConfig) -> dict:
    """Replay the trace per ``cfg``; returns the warm and scratch plans' means."""
    work = Workload(
        model=get_model(cfg.model, cfg.layers),
        global_batch_size=cfg.global_batch(),
        micro_batch_size=cfg.micro_batch_size,
    )
    df = replay(
        # every pair its own pipe (link sharing ``pair``): the model this study was made under
        with_link_sharing(cfg.cluster(), "pair"),
        work,
        events=cfg.events,
        step=cfg.step_devices,
        interval_s=cfg.interval_s,
        time_limit_s=cfg.time_limit_s,
        dp=cfg.dp,
        seed=cfg.seed,
    )
    out = Path(cfg.results_dir)
    with write_set(out, name="replan", owns=("replan.csv", "replan.png")) as stage:
        atomic_write_text(stage / "replan.csv", df.to_csv(index=False))
        _figure(df, stage / "replan.png", cfg.interval_s)
    summary = {}
    for plan in ("warm", "scratch"):
        d = df[(df.plan == plan) & (df.event > 0)]
        summary[plan] = {
            "mean_total_cost_s": float(d.total_cost_s.mean()),
            "mean_iter_time_s": float(d.iter_time_s.mean()),
            "moved_tasklets": int(d.moved_tasklets.sum()),
            "mean_plan_time_s": float(d.plan_time_s.mean()),
        }
    log.info("replan summary: %s", summary)
    return summary
