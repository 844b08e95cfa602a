"""Paper Fig. 4: best TOTAL vs trials for tailored local search, Kernighan–Lin and random.

    python repro/ablation.py                       # cases 1-5, seeds 0-2, ~3-5 min on 2 cores
    python repro/ablation.py cases=4,5 seeds=0,1,2,3 trials=20 population=20 out_dir=DIR

Both GA variants start from a purely random population (no greedy seeds), so the curves show
what each local search finds by itself. The authors ran 4,900 trials with population 100 (about
300 s per case); the default here is ``trials=10, population=16`` so that the whole ablation fits
in a few minutes (each of our trials runs a full local search costed with the true TOTAL).
Random = best of ``random_layouts`` uniformly random rank maps (no matching, no TSP).

Writes ``ablation.csv`` (long: case, method, seed, trial, best_total_cost_s),
``ablation_summary.csv`` (per case: final TOTAL per method, ratios random/scheduled) into
``out_dir`` (default results/scheduler). The figure is drawn once, by the ablation study's report
(``python repro/run.py -m sweep=ablation`` reads ``ablation.csv`` through ``workflow.ablation_csv``
and writes ``results/ablation/fig4.png`` with :func:`repro.report.figures.fig4.plot_fig4`).
"""

from __future__ import annotations

import dataclasses
import logging
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the checkout importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pandas as pd

from repro.config import ConfigError, int_list, script_args
from repro.schedule import default_layout
from system.cases import get_case
from system.results import atomic_write_text
from system.scheduler import schedule
from system.workload import DTFM_REFERENCE

log = logging.getLogger(__name__)


@dataclass
class Args:
    """``key=value`` arguments (``python repro/ablation.py trials=20``)."""

    cases: str = "1,2,3,4,5"  # comma-separated paper cases
    seeds: str = "0,1,2"  # comma-separated seeds
    trials: int = 10  # GA trials per run
    population: int = 16  # GA population
    random_layouts: int = 5000  # random layouts per seed for the random baseline
    out_dir: str = "results/scheduler"

    def __post_init__(self) -> None:
        int_list("seeds", self.seeds)
        for k, low in (("trials", 1), ("population", 2), ("random_layouts", 1)):
            if getattr(self, k) < low:
                raise ConfigError(f"{k}={getattr(self, k)}: must be >= {low}")


DEFAULTS = dataclasses.asdict(Args())
METHODS = {"tailored": "genetic", "kl": "genetic_kl", "random": "random"}


def run(cfg: dict) -> tuple[pd.DataFrame, pd.DataFrame]:
    cases = [c for c in str(cfg["cases"]).split(",") if c]
    seeds = [int(s) for s in str(cfg["seeds"]).split(",") if s]
    rows = []
    for case in cases:
        cluster = get_case(case)
        pp, dp = default_layout(cluster.num_devices)  # 8 x 8 for the paper's 64 devices
        for seed in seeds:
            for label, method in METHODS.items():
                trials = int(cfg["random_layouts"] if method == "random" else cfg["trials"])
                r = schedule(
                    cluster,
                    DTFM_REFERENCE,
                    pp=pp,
                    dp=dp,
                    method=method,
                    seed=seed,
                    trials=trials,
                    population=int(cfg["population"]),
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
    summary["seeds"] = len(seeds)
    summary["ga_trials"] = int(cfg["trials"])
    summary["ga_population"] = int(cfg["population"])
    summary["random_layouts"] = int(cfg["random_layouts"])
    out = cfg["out_dir"]
    if out:
        atomic_write_text(f"{out}/ablation.csv", long.to_csv(index=False))
        atomic_write_text(f"{out}/ablation_summary.csv", summary.to_csv(index=False))
    return long, summary


def main(argv: Sequence[str] | None = None) -> int:
    from repro.console import console, setup_logging

    setup_logging()
    cfg = script_args(Args, argv)  # exits 2 with one line on a bad argument
    _, summary = run(cfg)
    console().print(summary.to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
