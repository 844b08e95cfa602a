"""Speed-up attribution: a ladder of simulations from Megatron as launched to ours.

    python repro/run.py mode=attribution results_dir=results/attribution     # cases 4, 5; L40
    python repro/run.py mode=attribution cases=[5] layers=[24] batches=[1024] results_dir=DIR

Each rung changes one design choice and is simulated in full (no rung is derived from another);
the speed-up of a rung is the previous rung's iteration time over its own, so the rungs multiply
up to Megatron-as-launched / ours exactly:

0. ``megatron_launch``: Megatron's grid best with ranks in launch order (the paper's protocol);
1. ``topology``: Megatron's grid best with topology-aware rank maps (:mod:`baselines.placement`);
2. ``no_extra_syncs``: that configuration and rank map without the tied-embedding and
   gradient-norm all-reduces (ours' runtime has an untied head and no norm clipping);
3. ``sharded_ps``: the DP ring all-reduce replaced by the paper's sharded parameter server
   (§3.2), each member entering when its own pass ends;
4. ``gpipe``: 1F1B replaced by GPipe with the same blocking p2p calls;
5. ``overlap``: GPipe with receive, compute and send on separate streams, messages streamed —
   our runtime's timeline (:func:`system.simulator.simulate_ours` on the same layout,
   micro-batch size and recomputation, all micro-batches in one pass);
6. ``ours_shape``: our runtime's own choices — pp and dp as ``mode=simulate`` sets them
   (:func:`repro.config.default_layout`, 8 × 8 on 64 devices), micro-batch 1, full
   recomputation, the accumulation rounds memory forces — on the best of the baselines'
   topology-aware rank maps for that shape (:func:`baselines.placement.candidate_maps`, each
   simulated);
7. ``ours``: our system as ``mode=simulate`` runs it: the same, on the scheduler's layout (same
   budget).

Rungs 4–5 ignore the activation memory of keeping every micro-batch in flight (GPipe needs
accumulation rounds for that; rung 6 has them), so they show what the schedule and overlap buy
on links, not whether the layout fits.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd

from baselines.megatron.perf import grid_search_megatron
from baselines.placement import Placement, candidate_maps
from baselines.space import BaselineConfig
from repro.config import AttributionConfig, default_layout
from system.assignment import Assignment
from system.cases import get_case
from system.simulator import simulate_1f1b_ring, simulate_ours, stage_compute
from system.simulator.collective import device_grid
from system.workload import Workload, get_model, tasklet_sizes

log = logging.getLogger(__name__)

__all__ = ["STEPS", "ladder", "ladder_table", "plot_attribution", "run"]

STEPS = (
    ("megatron_launch", "Megatron, launch order"),
    ("topology", "+ topology-aware placement"),
    ("no_extra_syncs", "- tied-embedding + grad-norm all-reduces"),
    ("sharded_ps", "DP ring -> sharded PS"),
    ("gpipe", "1F1B -> GPipe (blocking)"),
    ("overlap", "+ overlap (separate streams)"),
    ("ours_shape", "ours' pp/dp, mbs 1, full rc, rounds"),
    ("ours", "scheduler's layout = ours"),
)


def ladder(case: str, layers: int, batch: int, *, seed: int = 0) -> list[dict]:
    """The rungs of one setting: one dict per rung (module docstring)."""
    from repro.modes.simulate import SIM_BUDGET
    from system.scheduler import schedule

    cluster = get_case(case)
    workload = Workload(model=get_model("gpt3_xl", layers), global_batch_size=batch)
    cache: dict = {}
    launch = grid_search_megatron(cluster, workload, placement=Placement.launch, cache=cache).best
    topo = grid_search_megatron(cluster, workload, placement=Placement.topology, cache=cache).best
    c = topo.config
    if c["tp"] != 1:
        raise ValueError(
            f"case {case}: Megatron's best uses tp={c['tp']}; the ladder's GPipe rungs need tp=1"
        )
    pp, dp, rc = c["pp"], c["dp"], c["recompute"]
    rank_map = topo.breakdown["rank_map"]
    w = replace(workload, micro_batch_size=c["micro_batch_size"])
    common = dict(tp=1, pp=pp, dp=dp, rank_map=rank_map, recompute=rc)
    plain = simulate_1f1b_ring(cluster, w, **common)  # untied, no grad-norm all-reduce
    ps = simulate_1f1b_ring(cluster, w, **common, dp_protocol="sharded_ps")
    gpipe = simulate_1f1b_ring(cluster, w, **common, dp_protocol="sharded_ps", schedule="gpipe")
    stages = device_grid(1, pp, dp, rank_map)[:, :, 0]
    compute = stage_compute(w.model, pp, w.micro_batch_size, recompute=rc)
    overlap = simulate_ours(cluster, Assignment(stages), w, compute=compute, rounds=1)
    opp, odp = default_layout(cluster.num_devices)
    sched = schedule(
        cluster,
        tasklet_sizes(workload, opp, odp),
        pp=opp,
        dp=odp,
        method="genetic",
        seed=seed,
        greedy_seeds=True,
        **SIM_BUDGET,
    )
    ours = simulate_ours(cluster, sched.assignment, workload)
    shape = BaselineConfig(
        system="megatron", tp=1, pp=opp, dp=odp, micro_batch_size=workload.micro_batch_size
    )
    heuristic = min(
        (
            simulate_ours(
                cluster, Assignment(device_grid(1, opp, odp, rm.devices)[:, :, 0]), workload
            )
            for rm in candidate_maps(cluster, workload, shape)
        ),
        key=lambda r: r.iter_time_s,
    )
    results = [launch, topo, plain, ps, gpipe, overlap, heuristic, ours]
    base = {"case": case, "num_layers": layers, "global_batch_size": batch}
    out, prev = [], None
    for (step, label), res in zip(STEPS, results, strict=True):
        t = float(res.iter_time_s)
        out.append(
            {
                **base,
                "rung": len(out),
                "step": step,
                "label": label,
                "iter_time_s": t,
                "speedup_step": (prev / t) if prev else 1.0,
                "speedup_cumulative": float(results[0].iter_time_s) / t,
                "config": res.label(),
                "pipeline_s": float(res.breakdown.get("pipeline_s", np.nan)),
                "dp_sync_s": float(res.breakdown.get("dp_sync_s", np.nan)),
            }
        )
        prev = t
    total = float(np.prod([r["speedup_step"] for r in out]))
    assert abs(total - out[-1]["speedup_cumulative"]) < 1e-9 * total
    return out


def ladder_table(cases, layers, batches, seed: int = 0) -> pd.DataFrame:
    rows = [
        r for c in cases for L in layers for b in batches for r in ladder(str(c), L, b, seed=seed)
    ]
    return pd.DataFrame(rows)


def plot_attribution(table: pd.DataFrame, path: str | Path) -> Path:
    """Per setting, each rung's iteration time (bars, log scale) and its step speed-up."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from repro.report.figures import save_figure

    keys = ["case", "num_layers", "global_batch_size"]
    groups = list(table.groupby(keys, sort=True))
    fig, axes = plt.subplots(
        1, len(groups), figsize=(3.6 * len(groups), 4.2), squeeze=False, sharey=True
    )
    for ax, ((case, layers, batch), g) in zip(axes[0], groups, strict=True):
        g = g.sort_values("rung")
        x = np.arange(len(g))
        ax.bar(x, g.iter_time_s, color=["#888"] + ["#4a7"] * (len(g) - 2) + ["#36c"])
        for xi, (t, f) in enumerate(zip(g.iter_time_s, g.speedup_step, strict=True)):
            if xi:
                ax.text(xi, t, f"{f:.2f}x", ha="center", va="bottom", fontsize=7)
        ax.set_yscale("log")
        ax.set_xticks(x, g.label, rotation=70, ha="right", fontsize=7)
        total = float(g.speedup_cumulative.iloc[-1])
        ax.set_title(f"case {case}, L{layers}, B{batch}: {total:.2f}x", fontsize=9)
    axes[0][0].set_ylabel("simulated iteration time (s)")
    fig.tight_layout()
    return save_figure(fig, path)


def _markdown(table: pd.DataFrame) -> str:
    """One line per setting: each rung's time and its step speed-up, then the total speed-up."""
    from repro.report.tables import markdown_table

    keys = ["case", "num_layers", "global_batch_size"]
    lines = []
    for (case, layers, batch), g in table.groupby(keys, sort=True):
        g = g.sort_values("rung")
        line = {"case": case, "L": layers, "batch": batch}
        line[STEPS[0][1]] = f"{g.iter_time_s.iloc[0]:.1f} s"
        for (_, label), t, f in zip(STEPS[1:], g.iter_time_s[1:], g.speedup_step[1:], strict=True):
            line[label] = f"{t:.1f} s ({f:.2f}x)"
        line["total"] = f"{g.speedup_cumulative.iloc[-1]:.2f}x"
        lines.append(line)
    return markdown_table(pd.DataFrame(lines))


def run(cfg: AttributionConfig) -> dict:
    from system.results import atomic_write_text

    out = Path(cfg.results_dir)
    table = ladder_table(cfg.cases, cfg.layers, cfg.batches, cfg.seed)
    atomic_write_text(out / "ladder.csv", table.to_csv(index=False))
    atomic_write_text(out / "ladder.md", _markdown(table) + "\n")
    plot_attribution(table, out / "attribution.png")
    print(_markdown(table))
    return {"rungs": len(table), "results_dir": str(out)}
