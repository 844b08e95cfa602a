"""The scheduler's worth: its layout against the layouts a user would try first.

    python repro/run.py mode=scheduler_worth sailor_dir=DIR results_dir=results/scheduler

``DIR`` holds Sailor's published bandwidth fits (eth-easl/sailor, MIT License:
``multizone_bandwidths_het.json``, ``intra_node_bandwidths.json``); without it the multi-zone
setting is left out. The table is written to ``worth.{csv,md}``.

Per setting, ours runs in the paper's configuration (pp × dp as listed, micro-batch 1, full
recomputation, GPipe, fp16 loss scaling; :func:`system.simulator.simulate_ours`) on ``search``,
the paper's hybrid GA with local search (:func:`system.scheduler.schedule`; on the mixed
fleet also the ``iteration_time`` objective, which sees GPU types: ``search_iteration_time``),
and on the heuristics of :mod:`system.scheduler.heuristics`: one pipeline per region (where
regions hold whole pipelines), greedy region fill, launch order, and a random rank map (the
median of ``random_layouts`` seeded draws).

Settings (:func:`settings`): paper cases 1–5 (L40, batch 1024, pp = dp = 8); spot variants (case
5 and case 4 with 16 of 64 devices pre-empted, case 5 with 32, three seeded draws each); the
mixed fleet (:func:`system.cases.mixed`: every stage at its slowest GPU, layers split by stage
speed for every layout alike); 16 four-V100 nodes in five Google Cloud zones from Sailor's
bandwidth fits (:func:`system.external.sailor.bandwidth.cluster_from_nodes`).

Each layout is simulated under the link-sharing models listed (the first is the table's). The
table gives each layout's time, ``ratio`` = best heuristic / search (> 1: the search wins), each
phase's share of the difference, and how many regions a pipeline and a DP group span on average.
``planner`` (:mod:`system.planner`, same link model and GPU efficiency): the plan of ``mode=plan``
for the setting's model, depth and batch beside the best heuristic given the same configuration
search (``heuristics_searched``; ``heuristics_searched_cut`` names those stopped at their share of
the time limit), and ``planner_ratio`` = the table's best heuristic / the planner's plan.
"""

from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pandas as pd

from repro.studies.scheduler_worth.config import SchedulerWorthConfig
from system.assignment import Assignment
from system.cases import get_case
from system.cluster import Cluster
from system.external.sailor.bandwidth import multizone_cluster
from system.results import atomic_write_text, write_set
from system.scheduler import schedule
from system.scheduler.heuristics import heuristic_assignment
from system.simulator import SimResult, simulate_ours
from system.simulator.sharing import with_link_sharing
from system.workload import Workload, get_model, tasklet_sizes

log = logging.getLogger(__name__)

HEURISTIC_LAYOUTS = ("one_pipeline_per_region", "greedy_region_fill", "launch_order", "random")


@dataclass(frozen=True)
class Setting:
    """One row of the study: a cluster, the model depth and batch, the shape."""

    name: str
    kind: str  # paper | spot | mixed | multizone
    cluster: Cluster
    layers: int
    batch: int
    pp: int
    dp: int


def _spot(case: str, gone: int, seed: int) -> Cluster:
    """Case ``case`` after ``gone`` of its devices were pre-empted (seeded, uniform)."""
    c = get_case(case)
    rng = np.random.default_rng([seed, gone, int(case)])
    keep = sorted(rng.choice(c.num_devices, c.num_devices - gone, replace=False).tolist())
    return c.subset(keep, name=f"case{case}-spot{len(keep)}-s{seed}")


def settings(sailor_dir: str | None, spot_seeds: tuple[int, ...] = (0, 1, 2)) -> Iterator[Setting]:
    """The study's settings (module docstring), in table order."""
    for case in ("1", "2", "3", "4", "5"):
        yield Setting(f"case {case}", "paper", get_case(case), 40, 1024, 8, 8)
    for case, gone, layers, pp in (("5", 16, 24, 6), ("5", 32, 40, 4), ("4", 16, 24, 6)):
        for seed in spot_seeds:
            c = _spot(case, gone, seed)
            yield Setting(f"case {case} -{gone} (seed {seed})", "spot", c, layers, 1024, pp, 8)
    yield Setting("mixed fleet", "mixed", get_case("mixed"), 40, 1024, 8, 8)
    if sailor_dir is not None:
        yield Setting(
            "multi-zone (Sailor fits)", "multizone", multizone_cluster(sailor_dir), 40, 1024, 8, 8
        )


def _spans(cluster: Cluster, a: Assignment) -> tuple[float, float]:
    """Mean number of regions a pipeline spans, and a DP group."""
    region = np.asarray(cluster.region_of)
    pipe = statistics.fmean(len(set(region[a.pipeline(r)])) for r in range(a.dp))
    group = statistics.fmean(len(set(region[a.group(s)])) for s in range(a.pp))
    return pipe, group


def _simulate(s: Setting, a: Assignment, w: Workload, sharing: str) -> SimResult:
    cluster = with_link_sharing(s.cluster, sharing)
    compute = None
    if s.kind == "mixed":  # each stage at its slowest GPU, layers split by stage speed
        from system.cost.iteration import IterationTimeEvaluator
        from system.scheduler.api import layers_in_stage_order
        from system.simulator.hardware import stage_compute_for

        sizes = tasklet_sizes(w, s.pp, s.dp)
        ev = IterationTimeEvaluator(s.cluster, sizes, pp=s.pp, dp=s.dp, workload=w)
        part = [tuple(sorted(a.group(k))) for k in range(s.pp)]
        compute = stage_compute_for(s.cluster, a, w, layers_in_stage_order(ev, part, a))
    return simulate_ours(cluster, a, w, compute=compute, loss_scaling=True)


def compare(
    s: Setting,
    *,
    budget: dict,
    seed: int,
    sharing: tuple[str, ...],
    random_layouts: int,
    planner_time_limit_s: float | None = None,
) -> dict:
    """One row of the table (module docstring)."""
    w = Workload(model=get_model("gpt3_xl", s.layers), global_batch_size=s.batch)
    t0 = time.perf_counter()
    found = schedule(
        s.cluster, tasklet_sizes(w, s.pp, s.dp), pp=s.pp, dp=s.dp, seed=seed, bound=False, **budget
    )
    search_s = time.perf_counter() - t0
    layouts: dict[str, Assignment | list[Assignment]] = {"search": found.assignment}
    if s.kind == "mixed":  # the project's objective that sees GPU types, beside the paper's
        layouts["search_iteration_time"] = schedule(
            s.cluster,
            tasklet_sizes(w, s.pp, s.dp),
            pp=s.pp,
            dp=s.dp,
            seed=seed,
            objective="iteration_time",
            workload=w,
            **budget,
        ).assignment
    for name in HEURISTIC_LAYOUTS:
        if name == "random":
            layouts[name] = [
                heuristic_assignment(s.cluster, s.pp, s.dp, "random", rng=[seed, k])
                for k in range(random_layouts)
            ]
        else:
            got = heuristic_assignment(s.cluster, s.pp, s.dp, name)
            if got is not None:
                layouts[name] = got
    row = {
        "setting": s.name,
        "kind": s.kind,
        "devices": s.cluster.num_devices,
        "regions": len(s.cluster.regions),
        "layers": s.layers,
        "global_batch_size": s.batch,
        "pp": s.pp,
        "dp": s.dp,
        "search_wall_s": search_s,
        "search_trials": found.trials,
    }
    if planner_time_limit_s:
        from system.planner.compute import compute_model
        from system.planner.search import plan

        cl = with_link_sharing(s.cluster, sharing[0])
        t0 = time.perf_counter()
        got = plan(
            cl,
            w.model,
            s.batch,
            compute_model(w.model, set(cl.gpus)),
            time_limit_s=planner_time_limit_s,
            seed=seed,
        )
        b = got.best
        row["planner_s"] = b.iter_time_s
        row["planner_plan"] = (
            f"pp{b.pp}/dp{b.dp} mbs{b.micro_batch_size} {b.schedule} rc-{b.recompute} "
            f"[{b.layout}] {len(b.stages.ravel())} dev"
        )
        searched = [h for h in got.heuristics.values() if h is not None]
        row["heuristics_searched_s"] = min(h.iter_time_s for h in searched)
        row["heuristics_searched_cut"] = " ".join(got.heuristics_cut)  # stopped at their share
        row["planner_wall_s"] = time.perf_counter() - t0
    for m in sharing:
        sims: dict[str, SimResult] = {}
        for name, a in layouts.items():
            if isinstance(a, list):  # random: the median draw
                runs = sorted((_simulate(s, x, w, m) for x in a), key=lambda r: r.iter_time_s)
                sims[name] = runs[len(runs) // 2]
            else:
                sims[name] = _simulate(s, a, w, m)
        best = min((k for k in HEURISTIC_LAYOUTS if k in sims), key=lambda k: sims[k].iter_time_s)
        suffix = "" if m == sharing[0] else f"_{m}"
        row[f"best_heuristic{suffix}"] = best
        row[f"ratio{suffix}"] = sims[best].iter_time_s / sims["search"].iter_time_s
        if m != sharing[0]:
            continue
        for name in ("search", "search_iteration_time", *HEURISTIC_LAYOUTS):
            row[f"{name}_s"] = sims[name].iter_time_s if name in sims else float("nan")
        if "planner_s" in row:
            row["planner_ratio"] = sims[best].iter_time_s / row["planner_s"]
        for name, tag in (("search", "search"), (best, "best")):
            r = sims[name]
            row[f"{tag}_pipeline_s"] = r.breakdown["pipeline_s"]
            row[f"{tag}_dp_s"] = r.breakdown["dp_sync_s"]
            a = layouts[name] if not isinstance(layouts[name], list) else None
            pipe, group = _spans(s.cluster, a) if a is not None else (np.nan, np.nan)
            row[f"{tag}_pipeline_regions"] = pipe
            row[f"{tag}_dp_group_regions"] = group
    return row


def why(row: pd.Series) -> str:
    """The difference in each phase (best heuristic minus search) and the layouts' region spans
    (search vs best heuristic)."""
    d_pipe = row.best_pipeline_s - row.search_pipeline_s
    d_dp = row.best_dp_s - row.search_dp_s
    verdict = "search wins" if row.ratio > 1.005 else "tie" if row.ratio > 0.995 else "search loses"
    return (
        f"{verdict}; {row.best_heuristic} - search: pipeline {d_pipe:+.1f} s, DP {d_dp:+.1f} s; "
        f"regions per pipeline {row.search_pipeline_regions:.1f} vs "
        f"{row.best_pipeline_regions:.1f}, per DP group {row.search_dp_group_regions:.1f} vs "
        f"{row.best_dp_group_regions:.1f}"
    )


def _markdown(table: pd.DataFrame, sharing: tuple[str, ...]) -> str:
    from repro.report.tables import markdown_table

    cols = ["setting", "devices", "pp", "dp", "layers", "search_s", "search_iteration_time_s"]
    cols += [f"{h}_s" for h in HEURISTIC_LAYOUTS]
    cols += ["best_heuristic", "ratio"] + [f"ratio_{m}" for m in sharing[1:]]
    if "planner_s" in table:
        cols += ["heuristics_searched_s", "planner_s", "planner_plan", "planner_ratio"]
    cols += ["why"]
    heads = {
        "search_s": "search s",
        "search_iteration_time_s": "search (iteration-time objective) s",
        "one_pipeline_per_region_s": "one pipeline per region s",
        "greedy_region_fill_s": "greedy region fill s",
        "launch_order_s": "launch order s",
        "random_s": "random s (median)",
        "ratio": f"best heuristic / search ({sharing[0]})",
        **{f"ratio_{m}": f"... ({m})" for m in sharing[1:]},
        "heuristics_searched_s": "best heuristic, configuration searched s",
        "planner_s": "planner s",
        "planner_plan": "planner's plan",
        "planner_ratio": f"best heuristic / planner ({sharing[0]})",
    }
    return markdown_table(table.reindex(columns=cols), floatfmt=".2f", headers=heads)


def run(cfg: SchedulerWorthConfig) -> dict:
    budget = {
        "trials": cfg.trials,
        "patience_trials": cfg.patience_trials,
        "time_limit_s": cfg.time_limit_s,
    }
    sharing = tuple(str(m) for m in cfg.link_sharing)
    rows = []
    # every setting's cluster is built (and its input files read) before the first one runs
    for s in list(settings(cfg.sailor_dir, tuple(cfg.spot_seeds))):
        row = compare(
            s,
            budget=budget,
            seed=cfg.seed,
            sharing=sharing,
            random_layouts=cfg.random_layouts,
            planner_time_limit_s=cfg.planner_time_limit_s,
        )
        rows.append(row)
        log.info(
            "%s: search %.2f s, %s %.2f s",
            s.name,
            row["search_s"],
            row["best_heuristic"],
            row[f"{row['best_heuristic']}_s"],
        )
    table = pd.DataFrame(rows)
    table["why"] = [why(r) for _, r in table.iterrows()]
    out = cfg.results_dir
    text = _markdown(table, sharing)
    with write_set(out, name="worth", owns=("worth.csv", "worth.md")) as stage:
        atomic_write_text(stage / "worth.csv", table.to_csv(index=False, float_format="%.6g"))
        atomic_write_text(stage / "worth.md", text + "\n")
    print(text)
    return {"settings": len(table), "results_dir": str(out)}
