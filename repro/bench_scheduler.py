"""Scheduler benchmark: quality and time on cases 4–5, and scaling to 256 / 1,024 devices.

    python repro/bench_scheduler.py                    # writes results/scheduler/bench.{csv,md}
    python repro/bench_scheduler.py time_limit_s=5 big_time_limit_s=30 out_dir=DIR

Rows (authors' constants DTFM_REFERENCE, seed 0):

- ``genetic``: our GA (greedy seeds in the initial population), stopped at ``time_limit_s``;
- ``genetic_noseed``: the same GA from a purely random population;
- ``random_best_of_N``: best of N uniformly random rank maps (no matching, no TSP);
- ``authors_best``: the best TOTAL the authors' GA reached (PAPER.md §3: 4,900 trials, 283 s).

Scaling: case 5's eight regions replicated to 32 and 128 devices each (256 / 1,024 devices,
dp = 8 replicas of pp = 32 / 128 stages, TSP heuristic beyond 16 stages), GA with a small
population stopped at ``big_time_limit_s``; we report the TOTAL reached and the time taken.
Wall times depend on machine load; CPU seconds are reported beside them.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the checkout importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np
import pandas as pd

from system.cases import get_case
from system.cluster import Cluster
from system.results import atomic_write_text
from system.scheduler import schedule
from system.workload import DTFM_REFERENCE

log = logging.getLogger(__name__)

AUTHORS_BEST_S = {"4": 34.80, "5": 49.22}  # PAPER.md §3 / issue 2
DEFAULTS = {"time_limit_s": "5", "big_time_limit_s": "30", "random_layouts": "5000",
            "big_random_layouts": "200", "seed": "0", "out_dir": "results/scheduler"}


def replicated_case5(per_region: int) -> Cluster:
    """Case 5's 8 regions with ``per_region`` devices each (same region-pair links)."""
    c5 = get_case("5")
    k = c5.num_devices // len(c5.regions)  # 8 devices per region in case 5
    rep = np.arange(len(c5.regions)) * k  # one representative device per region
    delay = c5.delay_ms[np.ix_(rep, rep)].copy()
    bw = c5.bandwidth_gbps[np.ix_(rep, rep)].copy()
    np.fill_diagonal(delay, c5.delay_ms[0, 1])  # intra-region link
    np.fill_diagonal(bw, c5.bandwidth_gbps[0, 1])
    reg = np.repeat(np.arange(len(c5.regions)), per_region)
    return Cluster(name=f"case5x{per_region}", region_of=tuple(c5.regions[r] for r in reg),
                   host_of=tuple(range(len(reg))), delay_ms=delay[np.ix_(reg, reg)],
                   bandwidth_gbps=bw[np.ix_(reg, reg)],
                   description=f"case 5 regions x {per_region} devices")


def _row(label: str, cluster: Cluster, method: str, res, **extra) -> dict:
    return {"cluster": cluster.name, "num_devices": cluster.num_devices, "pp": res.assignment.pp,
            "dp": res.assignment.dp, "row": label, "method": method,
            "total_cost_s": res.cost.total_cost_s, "dp_cost_s": res.cost.dp_cost_s,
            "pp_cost_s": res.cost.pp_cost_s, "search_time_s": res.search_time_s,
            "search_cpu_s": (res.stats or {}).get("search_cpu_s"), "trials": res.trials,
            "evaluations": res.evaluations, "best_from": (res.stats or {}).get("best_from", ""),
            **extra}


def run(cfg: dict) -> pd.DataFrame:
    seed = int(cfg["seed"])
    limit, big_limit = float(cfg["time_limit_s"]), float(cfg["big_time_limit_s"])
    rows = []
    for case in ("4", "5"):
        c = get_case(case)
        kw = dict(pp=8, dp=8, seed=seed)
        g = schedule(c, DTFM_REFERENCE, time_limit_s=limit, **kw)
        rows.append(_row("genetic", c, "genetic", g, case=case))
        g0 = schedule(c, DTFM_REFERENCE, time_limit_s=limit, greedy_seeds=False, **kw)
        rows.append(_row("genetic_noseed", c, "genetic", g0, case=case))
        n = int(cfg["random_layouts"])
        r = schedule(c, DTFM_REFERENCE, method="random", trials=n, **kw)
        rows.append(_row(f"random_best_of_{n}", c, "random", r, case=case))
        rows.append({"cluster": c.name, "num_devices": 64, "pp": 8, "dp": 8, "case": case,
                     "row": "authors_best", "method": "authors_ga_4900_trials",
                     "total_cost_s": AUTHORS_BEST_S[case], "search_time_s": 283.0 if case == "5"
                     else None})
    for per_region, pp in ((8, 8), (32, 32), (128, 128)):
        c = get_case("5") if per_region == 8 else replicated_case5(per_region)
        dp = c.num_devices // pp
        lim = limit if per_region == 8 else big_limit
        g = schedule(c, DTFM_REFERENCE, pp=pp, dp=dp, seed=seed, time_limit_s=lim,
                     population=100 if per_region == 8 else 10)
        rows.append(_row("scaling_genetic", c, "genetic", g, case="5" if per_region == 8 else
                         f"5x{per_region}", time_limit_s=lim))
        n = int(cfg["big_random_layouts"])
        r = schedule(c, DTFM_REFERENCE, pp=pp, dp=dp, method="random", trials=n, seed=seed)
        rows.append(_row(f"scaling_random_best_of_{n}", c, "random", r,
                         case="5" if per_region == 8 else f"5x{per_region}"))
    df = pd.DataFrame(rows)
    out = cfg["out_dir"]
    if out:
        atomic_write_text(f"{out}/bench.csv", df.to_csv(index=False))
        atomic_write_text(f"{out}/bench.md", _markdown(df, cfg))
    return df


def _markdown(df: pd.DataFrame, cfg: dict) -> str:
    cols = ["case", "num_devices", "pp", "dp", "row", "total_cost_s", "search_time_s",
            "search_cpu_s", "trials", "evaluations", "best_from"]
    lines = ["# Scheduler benchmark (`python repro/bench_scheduler.py`)", "",
             f"Settings: {cfg}. Sizes: DTFM_REFERENCE (c_dp = 0.65e9 B, c_pp = 0.47116e9 B).",
             "Wall times depend on machine load (shared 2-core machine); CPU seconds beside them.",
             "", "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for _, r in df.iterrows():
        vals = []
        for c in cols:
            v = r.get(c)
            vals.append("" if v is None or (isinstance(v, float) and np.isnan(v)) else
                        f"{v:.3f}" if isinstance(v, float) else str(v))
        lines.append("| " + " | ".join(vals) + " |")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    from rich.table import Table

    from repro.console import console, setup_logging

    setup_logging()
    cfg = dict(DEFAULTS)
    for arg in sys.argv[1:] if argv is None else argv:
        key, _, value = arg.partition("=")
        if key not in DEFAULTS or not value:
            log.error("argument %r: expected key=value with key in %s", arg, ", ".join(DEFAULTS))
            return 2
        cfg[key] = value
    df = run(cfg)
    table = Table(title="scheduler benchmark (TOTAL = DP + 2 PP, seconds per iteration)")
    for c in ("case", "devices", "pp x dp", "row", "TOTAL s", "wall s", "cpu s", "trials",
              "best from"):
        table.add_column(c)
    for _, r in df.iterrows():
        def fmt(v, f="{:.3f}"):
            return "" if v is None or (isinstance(v, float) and np.isnan(v)) else f.format(v)
        table.add_row(str(r["case"]), str(r["num_devices"]), f"{r['pp']}x{r['dp']}", r["row"],
                      fmt(r["total_cost_s"]), fmt(r.get("search_time_s"), "{:.2f}"),
                      fmt(r.get("search_cpu_s"), "{:.2f}"), fmt(r.get("trials"), "{:.0f}"),
                      str(r.get("best_from") or ""))
    console().print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
