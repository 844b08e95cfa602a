"""Scheduler benchmark: plateaus, certified gaps, quality on cases 4–5, scaling to 1,024 devices.

    python repro/run.py mode=bench_scheduler results_dir=results/scheduler   # bench.{csv,md}
    python repro/run.py mode=bench_scheduler sections=[plateau,gaps] seeds=[0,1,2] results_dir=DIR

Sections (authors' constants DTFM_REFERENCE; the default convergence budget unless a time limit
is named):

- ``plateau``: case 2 as the authors' code builds it (``dtfm_code``) and spot variants of it
  (:data:`SPOT_VARIANTS`), each seed, ``before`` = the search without block moves and without
  structure-aligned seeds (``use_structure=False``), ``after`` = the default search; with the
  lower bound and certified gap.
- ``gaps``: cases 1–5 (paper variant) and case 2 (dtfm_code) at 64 devices: bound, result, gap.
- ``quality``: cases 4–5: GA with and without greedy seeds, best of N random rank maps, and the
  authors' best (4,900 GA trials).
- ``scaling``: case 5's eight regions replicated to ``per_regions`` devices each (default 32 and
  128: 256 / 1,024 devices; 512: 4,096), dp = 8, GA (population 10) stopped at
  ``big_time_limit_s`` vs its greedy start and the combinatorial bound.

Wall times depend on machine load; CPU seconds are reported beside them.
"""

from __future__ import annotations

import logging
import time

import numpy as np
import pandas as pd

from repro.checks.bench.config import BenchSchedulerConfig
from system.cases import get_case, spot_cluster
from system.cluster import Cluster
from system.results import atomic_write_text
from system.scheduler import schedule
from system.workload import DTFM_REFERENCE

log = logging.getLogger(__name__)

# TOTAL of the best layouts the authors' released scheduler finds with their constants (4,900
# trials, population 100), measured by running their code on cases 4 and 5
AUTHORS_BEST_S = {"4": 34.80, "5": 49.22}


# Spot variants of case 2 (dtfm_code units: 1.25 Gbit/s between hosts, 100 inside): host sizes
# and link speeds change, 64 devices each, pp = dp = 8.
SPOT_VARIANTS = {
    "case2_dtfm_code": None,  # get_case("2", "dtfm_code"): 8 x 4 GPUs + 32 x 1
    "spot_16x2": dict(host_sizes=(2,) * 16 + (1,) * 32, across_gbps=1.25, inside_gbps=100.0),
    "spot_4x8": dict(host_sizes=(8,) * 4 + (1,) * 32, across_gbps=1.25, inside_gbps=100.0),
    "spot_12x4": dict(host_sizes=(4,) * 12 + (1,) * 16, across_gbps=1.25, inside_gbps=100.0),
    "spot_mixed": dict(
        host_sizes=(8,) * 2 + (4,) * 4 + (2,) * 8 + (1,) * 16, across_gbps=1.25, inside_gbps=100.0
    ),
    "spot_8x4_10g": dict(host_sizes=(4,) * 8 + (1,) * 32, across_gbps=10.0, inside_gbps=100.0),
    "spot_8x4_slow_5ms": dict(
        host_sizes=(4,) * 8 + (1,) * 32, across_gbps=0.5, inside_gbps=100.0, across_delay_ms=5.0
    ),
}


def spot_variant(name: str) -> Cluster:
    spec = SPOT_VARIANTS[name]
    return get_case("2", "dtfm_code") if spec is None else spot_cluster(name, **spec)


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
    return Cluster(
        name=f"case5x{per_region}",
        region_of=tuple(c5.regions[r] for r in reg),
        host_of=tuple(range(len(reg))),
        delay_ms=delay[np.ix_(reg, reg)],
        bandwidth_gbps=bw[np.ix_(reg, reg)],
        description=f"case 5 regions x {per_region} devices",
    )


def _row(label: str, cluster: Cluster, method: str, res, **extra) -> dict:
    return {
        "cluster": cluster.name,
        "num_devices": cluster.num_devices,
        "pp": res.assignment.pp,
        "dp": res.assignment.dp,
        "row": label,
        "method": method,
        "total_cost_s": res.cost.total_cost_s,
        "dp_cost_s": res.cost.dp_cost_s,
        "pp_cost_s": res.cost.pp_cost_s,
        "search_time_s": res.search_time_s,
        "search_cpu_s": (res.stats or {}).get("search_cpu_s"),
        "trials": res.trials,
        "evaluations": res.evaluations,
        "best_from": (res.stats or {}).get("best_from", ""),
        "stopped_by": (res.stats or {}).get("stopped_by", ""),
        "initial_best_s": (res.stats or {}).get("initial_best_s"),
        "bound_total_s": res.bound.total_bound_s if res.bound else None,
        "bound_method": res.bound.method if res.bound else "",
        "gap_pct": res.gap_pct,
        "time_to_best_s": _time_to_best(res),
        **extra,
    }


def _time_to_best(res) -> float | None:
    """Seconds until the final best first appeared (trials are spread evenly over the run)."""
    if not res.history or res.trials == 0:
        return 0.0
    best = res.history[-1][1]
    first = next(t for t, v in res.history if v <= best + 1e-12)
    return res.search_time_s * first / max(1, res.trials)


def _plateau(cfg: BenchSchedulerConfig) -> list[dict]:
    rows = []
    for name in SPOT_VARIANTS:
        c = spot_variant(name)
        for seed in cfg.seeds:
            for label, structure in (("before", False), ("after", True)):
                res = schedule(c, DTFM_REFERENCE, pp=8, dp=8, seed=seed, use_structure=structure)
                rows.append(_row(label, c, "genetic", res, section="plateau", case=name, seed=seed))
                log.info(
                    "plateau %s seed %d %s: TOTAL %.3f (bound %.3f)",
                    name,
                    seed,
                    label,
                    res.cost.total_cost_s,
                    res.bound.total_bound_s,
                )
    return rows


def _gaps(cfg: BenchSchedulerConfig) -> list[dict]:
    rows = []
    for case, variant in (
        ("1", "paper"),
        ("2", "paper"),
        ("2", "dtfm_code"),
        ("3", "paper"),
        ("4", "paper"),
        ("5", "paper"),
    ):
        c = get_case(case, variant)
        res = schedule(c, DTFM_REFERENCE, pp=8, dp=8, seed=cfg.seed)
        rows.append(
            _row(
                "genetic",
                c,
                "genetic",
                res,
                section="gaps",
                case=case if variant == "paper" else f"{case}_{variant}",
            )
        )
    return rows


def _quality(cfg: BenchSchedulerConfig) -> list[dict]:
    rows = []
    seed = cfg.seed
    for case in ("4", "5"):
        c = get_case(case)
        kw = dict(pp=8, dp=8, seed=seed)
        g0 = schedule(c, DTFM_REFERENCE, greedy_seeds=False, **kw)
        rows.append(_row("genetic_noseed", c, "genetic", g0, section="quality", case=case))
        n = cfg.random_layouts
        r = schedule(c, DTFM_REFERENCE, method="random", trials=n, **kw)
        rows.append(_row(f"random_best_of_{n}", c, "random", r, section="quality", case=case))
        rows.append(
            {
                "section": "quality",
                "cluster": c.name,
                "num_devices": 64,
                "pp": 8,
                "dp": 8,
                "case": case,
                "row": "authors_best",
                "method": "authors_ga_4900_trials",
                "total_cost_s": AUTHORS_BEST_S[case],
                "search_time_s": 283.0 if case == "5" else None,
            }
        )
    return rows


def _scaling(cfg: BenchSchedulerConfig) -> list[dict]:
    rows = []
    seed, limit = cfg.seed, cfg.big_time_limit_s
    for per_region in cfg.per_regions:
        c = replicated_case5(per_region)
        pp, dp = c.num_devices // 8, 8
        g = schedule(c, DTFM_REFERENCE, pp=pp, dp=dp, seed=seed, time_limit_s=limit, population=10)
        rows.append(
            _row(
                "scaling_genetic",
                c,
                "genetic",
                g,
                section="scaling",
                case=f"5x{per_region}",
                time_limit_s=limit,
            )
        )
        n = cfg.big_random_layouts
        r = schedule(c, DTFM_REFERENCE, pp=pp, dp=dp, method="random", trials=n, seed=seed)
        rows.append(
            _row(
                f"scaling_random_best_of_{n}",
                c,
                "random",
                r,
                section="scaling",
                case=f"5x{per_region}",
            )
        )
    return rows


def _scale(cfg: BenchSchedulerConfig) -> list[dict]:
    """Hierarchical search (region clusters, then incremental swap / 2-opt moves) from the greedy
    start at scale; cost-vs-time curves go to ``scale_curves.{csv,png}`` in ``results_dir``."""
    import os

    from system.cost.partition import PartitionEvaluator
    from system.scheduler.bounds import gap_pct, lower_bound
    from system.scheduler.genetic import greedy_seeds
    from system.scheduler.hierarchical import hierarchical_search

    rows, curves = [], []
    seed, limit = cfg.seed, cfg.scale_time_limit_s
    instances = []
    for per_region in cfg.scale_per_regions:
        instances.append((f"5x{per_region}", replicated_case5(per_region)))
    for per_region in cfg.scale_per_regions:
        # case 2's shape scaled up: half the devices in 4-GPU hosts, half single GPUs, one region
        n = 8 * per_region
        spot = spot_cluster(
            f"spot{n}",
            host_sizes=(4,) * (n // 8) + (1,) * (n // 2),
            across_gbps=1.25,
            inside_gbps=100.0,
        )
        instances.append((f"spot{n}", spot))
    for name, c in instances:
        pp, dp = c.num_devices // 8, 8
        load_1min = os.getloadavg()[0]
        t0, cpu0 = time.perf_counter(), time.process_time()
        ev = PartitionEvaluator(c, DTFM_REFERENCE, pp=pp, dp=dp)
        start = greedy_seeds(ev)["greedy_pipeline"]  # groups in chain (stage) order
        greedy_s = time.perf_counter() - t0
        state, st = hierarchical_search(
            ev,
            start,
            np.arange(pp),
            np.random.default_rng(seed),
            time_limit_s=limit,
            max_moves=10**9,
        )
        wall_s, cpu_s = time.perf_counter() - t0, time.process_time() - cpu0
        bound = lower_bound(c, DTFM_REFERENCE, pp=pp, dp=dp).total_bound_s
        improved = st.best_total_s < st.start_total_s - 1e-9
        rows.append(
            {
                "section": "scale",
                "case": name,
                "cluster": c.name,
                "num_devices": c.num_devices,
                "pp": pp,
                "dp": dp,
                "row": "hierarchical",
                "method": "hierarchical",
                "initial_best_s": st.start_total_s,
                "total_cost_s": st.best_total_s,
                "bound_total_s": bound,
                "gap_pct": gap_pct(st.best_total_s, bound),
                "start_gap_pct": gap_pct(st.start_total_s, bound),
                "improvement_pct": 100.0 * (st.start_total_s - st.best_total_s) / st.start_total_s,
                "time_to_best_s": greedy_s + st.time_to_best_s if improved else greedy_s,
                "greedy_time_s": greedy_s,
                "search_time_s": wall_s,
                "search_cpu_s": cpu_s,
                "trials": st.moves_tried,
                "moves_applied": st.moves_applied,
                "stopped_by": st.stopped_by,
                "best_from": "hierarchical" if improved else "greedy",
                "time_limit_s": limit,
                "load_avg_1min": load_1min,
            }
        )
        curves += [
            {
                "case": name,
                "num_devices": c.num_devices,
                "time_s": greedy_s + t,
                "best_total_s": v,
                "bound_total_s": bound,
            }
            for t, v in st.curve
        ]
        log.info(
            "scale %d devices: greedy %.3f -> %.3f s (bound %.3f) in %.1f s",
            c.num_devices,
            st.start_total_s,
            st.best_total_s,
            bound,
            wall_s,
        )
    out = cfg.results_dir
    if curves:
        df = pd.DataFrame(curves)
        atomic_write_text(f"{out}/scale_curves.csv", df.to_csv(index=False))
        _plot_curves(df, f"{out}/scale_curves.png")
    return rows


def _plot_curves(df: pd.DataFrame, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = list(dict.fromkeys(df["case"]))
    fig, axes = plt.subplots(1, len(keys), figsize=(4.5 * len(keys), 3.6), squeeze=False)
    for ax, key in zip(axes[0], keys, strict=True):
        d = df[df["case"] == key]
        n = d["num_devices"].iloc[0]
        ax.step(d["time_s"], d["best_total_s"], where="post", label="best TOTAL")
        ax.axhline(d["best_total_s"].iloc[0], ls=":", c="grey", label="greedy start")
        ax.axhline(d["bound_total_s"].iloc[0], ls="--", c="k", label="lower bound")
        ax.set(
            title=f"{key}: {n} devices",
            xlabel="wall time s (incl. greedy start)",
            ylabel="TOTAL s per iteration",
        )
        ax.legend(fontsize=7)
    fig.tight_layout()
    from repro.report.figures import save_figure

    save_figure(fig, path, dpi=120)


SECTIONS = {
    "plateau": _plateau,
    "gaps": _gaps,
    "quality": _quality,
    "scaling": _scaling,
    "scale": _scale,
}


def bench_table(cfg: BenchSchedulerConfig) -> pd.DataFrame:
    """Every row of the configured sections."""
    return pd.DataFrame([row for name in cfg.sections for row in SECTIONS[name](cfg)])


def _markdown(df: pd.DataFrame, cfg: BenchSchedulerConfig) -> str:
    from repro.report.tables import markdown_table

    cols = [
        "section",
        "case",
        "seed",
        "num_devices",
        "pp",
        "dp",
        "row",
        "total_cost_s",
        "bound_total_s",
        "gap_pct",
        "initial_best_s",
        "search_time_s",
        "time_to_best_s",
        "search_cpu_s",
        "trials",
        "stopped_by",
        "best_from",
        "load_avg_1min",
    ]
    lines = [
        "# Scheduler benchmark (`python repro/run.py mode=bench_scheduler`)",
        "",
        f"Settings: sections {[str(s) for s in cfg.sections]}, seeds {cfg.seeds}, seed "
        f"{cfg.seed}, per_regions {cfg.per_regions}, big_time_limit_s {cfg.big_time_limit_s}, "
        f"random_layouts {cfg.random_layouts}, big_random_layouts {cfg.big_random_layouts}, "
        f"scale_per_regions {cfg.scale_per_regions}, scale_time_limit_s "
        f"{cfg.scale_time_limit_s}. Sizes: DTFM_REFERENCE (c_dp = 0.65e9 B, c_pp = 0.4712492e9 B).",
        "Wall times depend on machine load (shared 2-core machine); CPU seconds beside them.",
        "",
        markdown_table(df.reindex(columns=cols), floatfmt=".3f"),
    ]
    return "\n".join(lines) + "\n"


def run(cfg: BenchSchedulerConfig) -> dict:
    from rich.console import Console
    from rich.table import Table

    df = bench_table(cfg)
    atomic_write_text(f"{cfg.results_dir}/bench.csv", df.to_csv(index=False))
    atomic_write_text(f"{cfg.results_dir}/bench.md", _markdown(df, cfg))
    table = Table(title="scheduler benchmark (TOTAL = DP + 2 PP, seconds per iteration)")
    for c in (
        "section",
        "case",
        "seed",
        "devices",
        "pp x dp",
        "row",
        "TOTAL s",
        "bound s",
        "gap %",
        "wall s",
        "cpu s",
        "trials",
        "stopped by",
    ):
        table.add_column(c)

    def fmt(v, f="{:.3f}"):
        return "" if v is None or (isinstance(v, float) and np.isnan(v)) else f.format(v)

    for _, r in df.iterrows():
        table.add_row(
            str(r["section"]),
            str(r["case"]),
            fmt(r.get("seed"), "{:.0f}"),
            str(r["num_devices"]),
            f"{r['pp']}x{r['dp']}",
            r["row"],
            fmt(r["total_cost_s"]),
            fmt(r.get("bound_total_s")),
            fmt(r.get("gap_pct"), "{:.1f}"),
            fmt(r.get("search_time_s"), "{:.2f}"),
            fmt(r.get("search_cpu_s"), "{:.2f}"),
            fmt(r.get("trials"), "{:.0f}"),
            str(r.get("stopped_by") or ""),
        )
    Console().print(table)
    scale = df[df["section"] == "scale"] if "section" in df else df.iloc[:0]
    if len(scale):
        t2 = Table(title="section scale: hierarchical search vs its greedy start (TOTAL s)")
        for c in (
            "case",
            "devices",
            "greedy start",
            "final",
            "bound",
            "gap % start",
            "gap % final",
            "improved %",
            "time to best s",
            "wall s",
            "cpu s",
            "moves",
            "load 1 min",
        ):
            t2.add_column(c)
        for _, r in scale.iterrows():
            t2.add_row(
                str(r["case"]),
                str(r["num_devices"]),
                fmt(r["initial_best_s"]),
                fmt(r["total_cost_s"]),
                fmt(r["bound_total_s"]),
                fmt(r["start_gap_pct"], "{:.2f}"),
                fmt(r["gap_pct"], "{:.2f}"),
                fmt(r["improvement_pct"], "{:.3f}"),
                fmt(r["time_to_best_s"], "{:.2f}"),
                fmt(r["search_time_s"], "{:.1f}"),
                fmt(r["search_cpu_s"], "{:.1f}"),
                fmt(r["trials"], "{:.0f}"),
                fmt(r["load_avg_1min"], "{:.2f}"),
            )
        Console().print(t2)
    return {"rows": len(df), "results_dir": cfg.results_dir}
