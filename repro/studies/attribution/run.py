"""Speed-up attribution: a ladder of simulations from Megatron as launched to ours at its best.

    python repro/run.py mode=attribution results_dir=results/attribution     # cases 4, 5; L40
    python repro/run.py mode=attribution cases=[5] layers=[24] batches=[1024] results_dir=DIR

Each rung changes one thing and is simulated in full under the ``link_sharing`` given; every rung
fits in device memory; a rung's speed-up is the previous rung's iteration time over its own, so
the rungs multiply to Megatron-as-launched / ours exactly. Where memory forces a choice (GPipe
keeps a whole pass's micro-batches: as many accumulation passes as 16 GB need), ``constraint``
says so.

0. ``megatron_launch``: Megatron's grid best C0, ranks in launch order (the paper's protocol;
   its DP collective in the ``dp_collective`` column);
1. ``topology``: C0 on its best topology-aware rank map (:mod:`baselines.placement`);
2. ``retune``: Megatron's grid best C1 for topology-aware maps (the grid re-picks for them);
3. ``untie``: no tied-embedding all-reduce (an untied head, as ours; its gradients join the last
   stage's DP payload);
4. ``no_grad_norm``: no gradient-norm all-reduce (ours clips nothing);
5. ``sharded_ps``: the paper's sharded parameter server (§3.2) for the DP all-reduce, each member
   entering when its own pass ends;
6. ``gpipe``: GPipe for 1F1B, same blocking p2p, in the fewest accumulation passes that fit;
7. ``overlap``: receive, compute and send on separate streams, messages streamed — our runtime's
   timeline (:func:`system.simulator.simulate_ours`), same layout, passes, micro-batch, recompute;
8. ``flag``: + ours' fp16 finite-flag all-reduce over all ranks (its loss scaling);
9. ``full_recompute``: full activation recomputation (ours' runtime default), passes re-derived;
10. ``micro_batch``: the paper's micro-batch size, passes re-derived;
11. ``ours_shape``: the paper's pp × dp (:func:`repro.config.shared.default_layout`) on the best
    of the baselines' topology-aware rank maps for that shape;
12. ``ours``: the scheduler's layout — our system as the paper ran it (``mode=simulate``'s);
13. ``ours_best``: ours' configuration search (:func:`system.config_search.search_ours`).
"""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd

from baselines.megatron.perf import grid_search_megatron, ring_kwargs
from baselines.placement import Placement, candidate_maps, search_placement
from baselines.space import BaselineConfig
from repro.config.shared import default_layout
from repro.studies.attribution.config import AttributionConfig
from system.assignment import Assignment
from system.cases import get_case
from system.config_search import search_ours
from system.simulator import V100, SimResult, simulate_1f1b_ring, simulate_ours
from system.simulator.baseline_training import device_grid
from system.simulator.ours import accumulation_rounds
from system.simulator.sharing import DEFAULT_LINK_SHARING, link_sharing_of, with_link_sharing
from system.workload import Workload, get_model

log = logging.getLogger(__name__)

__all__ = ["STEPS", "ladder", "ladder_table", "plot_attribution", "run"]

STEPS = (
    ("megatron_launch", "Megatron, launch order"),
    ("topology", "+ topology-aware rank map"),
    ("retune", "+ grid re-picked for it"),
    ("untie", "- tied-embedding all-reduce"),
    ("no_grad_norm", "- grad-norm all-reduce"),
    ("sharded_ps", "DP all-reduce -> sharded PS"),
    ("gpipe", "1F1B -> GPipe (blocking)"),
    ("overlap", "+ overlapped streams"),
    ("flag", "+ fp16 finite-flag all-reduce"),
    ("full_recompute", "full recomputation"),
    ("micro_batch", "paper's micro-batch"),
    ("ours_shape", "paper's pp x dp (heuristic layout)"),
    ("ours", "scheduler's layout = ours"),
    ("ours_best", "ours' configuration search"),
)


def _passes(w: Workload, pp: int, dp: int, rc: str) -> tuple[int, str]:
    """Fewest GPipe accumulation passes that fit, and the constraint in words."""
    m = w.micro_batches(dp)
    r = accumulation_rounds(w, pp, dp, V100, recompute=rc)
    if r == 0:
        raise ValueError(f"not one micro-batch of {w.micro_batch_size} fits with pp={pp}, {rc}")
    if r == 1:
        return 1, f"all {m} micro-batches of a pass fit"
    return r, f"16 GB holds {m // r} of {m} micro-batches in flight: {r} passes"


def _row(step: str, label: str, res: SimResult, constraint: str) -> dict:
    if res.status != "ok":
        raise ValueError(f"attribution rung {step} does not fit in memory: {res.label()}")
    return {
        "step": step,
        "label": label,
        "iter_time_s": float(res.iter_time_s),
        "config": res.label(),
        "pipeline_s": float(res.breakdown.get("pipeline_s", np.nan)),
        "dp_sync_s": float(res.breakdown.get("dp_sync_s", np.nan)),
        "memory_gib": res.memory_bytes / 2**30,
        "rounds": int(res.breakdown.get("rounds", res.config.get("rounds", 1))),
        "dp_collective": res.breakdown.get("dp_collective", ""),
        "constraint": constraint,
    }


def ladder(
    case: str, layers: int, batch: int, *, seed: int = 0, link_sharing: str = DEFAULT_LINK_SHARING
) -> list[dict]:
    """The rungs of one setting: one dict per rung (module docstring)."""
    from repro.modes.simulate.run import SIM_BUDGET, scheduled_layout

    plain = get_case(case)
    cluster = with_link_sharing(plain, link_sharing)
    workload = Workload(model=get_model("gpt3_xl", layers), global_batch_size=batch)
    cache: dict = {}
    launch = grid_search_megatron(cluster, workload, placement=Placement.launch, cache=cache).best
    topo = grid_search_megatron(cluster, workload, placement=Placement.topology, cache=cache).best
    for res in (launch, topo):
        if res.config["tp"] != 1:
            raise ValueError(
                f"case {case}: Megatron's best uses tp={res.config['tp']}; the ladder's GPipe "
                "rungs need tp=1"
            )

    def megatron(res: SimResult, rank_map, **kw) -> SimResult:
        c = res.config
        w = replace(workload, micro_batch_size=c["micro_batch_size"])
        # the configuration's own features (virtual stages, distributed optimizer, overlap)
        args = {**ring_kwargs(c), "recompute": c["recompute"], "tied_embedding": True, **kw}
        out = simulate_1f1b_ring(
            cluster, w, tp=1, pp=c["pp"], dp=c["dp"], rank_map=rank_map, **args
        )
        used = {  # the features this rung ran with, as Megatron's configuration names them
            "zero": 0,
            "virtual_stages": out.breakdown["virtual_stages"],
            "distributed_optimizer": args.get("zero") == 1,
            "overlap_grad_reduce": bool(args.get("overlap_grad_reduce")),
            "overlap_param_gather": bool(args.get("overlap_param_gather")),
        }
        return replace(out, config={**out.config, **used})

    c0 = BaselineConfig(
        system="megatron", **{k: launch.config[k] for k in _CONFIG_KEYS if k in launch.config}
    )
    moved, _ = search_placement(cluster, workload, c0, lambda rm: megatron(launch, rm.devices))
    rank_map = topo.breakdown["rank_map"]
    c = topo.config
    w = replace(workload, micro_batch_size=c["micro_batch_size"])
    pp, dp, rc = c["pp"], c["dp"], c["recompute"]
    untied = megatron(topo, rank_map, tied_embedding=False)
    no_norm = megatron(topo, rank_map, tied_embedding=False, grad_norm=False)
    no_overlap = {"overlap_grad_reduce": False, "overlap_param_gather": False}  # ring DP only
    ps = megatron(
        topo,
        rank_map,
        tied_embedding=False,
        grad_norm=False,
        dp_protocol="sharded_ps",
        **no_overlap,
    )
    passes, why = _passes(w, pp, dp, rc)
    gp = megatron(
        topo,
        rank_map,
        tied_embedding=False,
        grad_norm=False,
        dp_protocol="sharded_ps",
        schedule="gpipe",
        rounds=passes,
        **no_overlap,
    )
    stages = Assignment(device_grid(1, pp, dp, rank_map)[:, :, 0])

    def ours_on(a: Assignment, wl: Workload, rc_: str, flag: bool) -> tuple[SimResult, str]:
        r, text = _passes(wl, a.pp, a.dp, rc_)
        return simulate_ours(cluster, a, wl, rounds=r, recompute=rc_, loss_scaling=flag), text

    overlap, _ = ours_on(stages, w, rc, False)
    flag, _ = ours_on(stages, w, rc, True)
    full, why_full = ours_on(stages, w, "full", True)
    w1 = replace(w, micro_batch_size=workload.micro_batch_size)
    mbs1, why_mbs = ours_on(stages, w1, "full", True)
    opp, odp = default_layout(cluster.num_devices)
    shape = BaselineConfig(
        system="megatron", tp=1, pp=opp, dp=odp, micro_batch_size=workload.micro_batch_size
    )
    heuristic = min(
        (
            ours_on(Assignment(device_grid(1, opp, odp, rm.devices)[:, :, 0]), w1, "full", True)
            for rm in candidate_maps(plain, workload, shape)
        ),
        key=lambda pair: pair[0].iter_time_s,
    )
    layout = scheduled_layout(case, plain, workload, opp, odp, seed)
    ours, why_ours = ours_on(layout, workload, "full", True)
    best = search_ours(cluster, workload, seed=seed, budget=SIM_BUDGET).best
    rungs = [
        (launch, "the grid's best in launch order"),
        (moved, "same configuration"),
        (topo, "the grid's best for topology-aware maps"),
        (untied, "same memory (the model counts the head's weights either way)"),
        (no_norm, ""),
        (ps, ""),
        (gp, why),
        (overlap, why),
        (flag, why),
        (full, why_full),
        (mbs1, why_mbs),
        (heuristic[0], f"{heuristic[1]}; the best of the baselines' topology-aware maps"),
        (ours, why_ours),
        (best, f"searched: {best.label()}, {best.config.get('layout', '')}"),
    ]
    base = {"case": case, "num_layers": layers, "global_batch_size": batch}
    base["link_sharing"] = link_sharing_of(cluster)  # what the simulator read
    out, prev = [], None
    for k, ((step, label), (res, constraint)) in enumerate(zip(STEPS, rungs, strict=True)):
        row = {**base, "rung": k, **_row(step, label, res, constraint)}
        t = row["iter_time_s"]
        row["speedup_step"] = (prev / t) if prev else 1.0
        row["speedup_cumulative"] = float(launch.iter_time_s) / t
        out.append(row)
        prev = t
    total = float(np.prod([r["speedup_step"] for r in out]))
    assert abs(total - out[-1]["speedup_cumulative"]) < 1e-9 * total
    return out


_CONFIG_KEYS = (
    "tp",
    "pp",
    "dp",
    "micro_batch_size",
    "recompute",
    "virtual_stages",
    "distributed_optimizer",
    "overlap_grad_reduce",
    "overlap_param_gather",
)


def ladder_table(
    cases, layers, batches, seed: int = 0, link_sharing: str = DEFAULT_LINK_SHARING
) -> pd.DataFrame:
    rows = [
        r
        for c in cases
        for L in layers
        for b in batches
        for r in ladder(str(c), L, b, seed=seed, link_sharing=link_sharing)
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
    """One line per setting: each rung's time and its step speed-up, then the total speed-up;
    then per setting every rung's configuration, passes, memory and constraint."""
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
    text = markdown_table(pd.DataFrame(lines))
    cols = ["rung", "label", "config", "dp_collective", "rounds", "memory_gib", "constraint"]
    for (case, layers, batch), g in table.groupby(keys, sort=True):
        sharing = ", ".join(sorted(set(g.get("link_sharing", pd.Series(["?"])))))
        text += f"\n\n### case {case}, L{layers}, B{batch} (link sharing {sharing})\n\n"
        text += markdown_table(g.sort_values("rung")[cols], floatfmt=".1f")
    return text


def run(cfg: AttributionConfig) -> dict:
    from system.results import atomic_write_text, write_set

    out = Path(cfg.results_dir)
    table = ladder_table(cfg.cases, cfg.layers, cfg.batches, cfg.seed, str(cfg.link_sharing))
    files = ("ladder.csv", "ladder.md", "attribution.png")
    with write_set(out, name="attribution", owns=files) as stage:
        atomic_write_text(stage / "ladder.csv", table.to_csv(index=False))
        atomic_write_text(stage / "ladder.md", _markdown(table) + "\n")
        plot_attribution(table, stage / "attribution.png")
    print(_markdown(table))
    return {"rungs": len(table), "results_dir": str(out)}
