"""Paper Fig. 4: best TOTAL vs trials for tailored local search, Kernighan–Lin and random.

    python repro/run.py mode=scheduler_ablation results_dir=results/scheduler  # ~3-5 min
    python repro/run.py mode=scheduler_ablation cases=[4,5] seeds=[0,1,2,3] trials=20

Both GA variants start from a purely random population (no greedy seeds), so the curves show
what each local search finds by itself. The authors ran 4,900 trials with population 100 (about
300 s per case); the default here is ``trials=10, population=16`` so that the whole ablation fits
in a few minutes (each of our trials runs a full local search costed with the true TOTAL).
Random = best of ``random_layouts`` uniformly random rank maps (no matching, no TSP).

Writes ``ablation.csv`` (long: case, method, seed, trial, best_total_cost_s) and
``ablation_summary.csv`` (per case: final TOTAL per method, ratios random/scheduled) into
``results_dir``. The figure is drawn once, by the ablation study's report
(``python repro/run.py -m sweep=ablation`` reads ``ablation.csv`` through ``workflow.ablation_csv``
and writes ``results/ablation/fig4.png`` with :func:`repro.report.figures.fig4.plot_fig4`).
"""

from __future__ import annotations

import logging

import pandas as pd

from repro.config.shared import default_layout
from repro.studies.scheduler_ablation.config import SchedulerAblationConfig
from system.cases import get_case
from system.results import atomic_write_text, write_set
from system.scheduler import schedule
from system.workload import DTFM_REFERENCE

log = logging.getLogger(__name__)

__all__ = ["METHODS", "curves", "run"]

METHODS = {"tailored": "genetic", "kl": "genetic_kl", "random": "random"}


def curves(cfg: SchedulerAblationConfig) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(the long table of best-so-far curves, the per-case summary)."""
    rows = []
    for case in cfg.cases:
        cluster = get_case(case)
        pp, dp = default_layout(cluster.num_devices)  # 8 x 8 for the paper's 64 devices
        for seed in cfg.seeds:
            for label, method in METHODS.items():
                trials = cfg.random_layouts if method == "random" else cfg.trials
                r = schedule(
                    cluster,
                    DTFM_REFERENCE,
                    pp=pp,
                    dp=dp,
                    method=method,
                    seed=seed,
                    trials=trials,
                    population=cfg.population,
                    greedy_seeds=False,
                )
                log.info(
                    "case %s %s seed %d: TOTAL %.3f s (%d evaluations, %.1f s)",
                    case,
                    label,
                    seed,
                    r.cost.total_cost_s,
                    r.evaluations,
                    r.search_time_s,
                )
                for trial, best in r.history:
                    rows.append(
                        {
                            "case": case,
                            "method": label,
                            "seed": seed,
                            "trial": trial,
                            "best_total_cost_s": best,
                        }
                    )
    long = pd.DataFrame(rows)
    final = (
        long.sort_values("trial")
        .groupby(["case", "method", "seed"])
        .last()
        .reset_index()
        .pivot_table(index="case", columns="method", values="best_total_cost_s", aggfunc="mean")
    )
    summary = pd.DataFrame(
        {
            "case": final.index,
            "tailored_total_s": final["tailored"].values,
            "kl_total_s": final["kl"].values,
            "random_total_s": final["random"].values,
        }
    )
    summary["ratio_random_over_tailored"] = summary.random_total_s / summary.tailored_total_s
    summary["ratio_random_over_kl"] = summary.random_total_s / summary.kl_total_s
    summary["ratio_kl_over_tailored"] = summary.kl_total_s / summary.tailored_total_s
    summary["seeds"] = len(cfg.seeds)
    summary["ga_trials"] = cfg.trials
    summary["ga_population"] = cfg.population
    summary["random_layouts"] = cfg.random_layouts
    return long, summary


def run(cfg: SchedulerAblationConfig) -> dict:
    long, summary = curves(cfg)
    files = ("ablation.csv", "ablation_summary.csv")
    with write_set(cfg.results_dir, name="ablation", owns=files) as stage:
        atomic_write_text(stage / "ablation.csv", long.to_csv(index=False))
        atomic_write_text(stage / "ablation_summary.csv", summary.to_csv(index=False))
    print(summary.to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    return {"results_dir": cfg.results_dir, "cases": len(summary)}
