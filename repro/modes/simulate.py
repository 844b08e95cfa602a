"""``mode=simulate``: the paper's Fig. 3 experiment in the performance simulator (§4, no GPU).

    python repro/run.py case=5 layers=40                 # 3 batch sizes, all systems
    python repro/run.py case=5 layers=40 batch=2048      # one setting
    python repro/run.py case=all results_dir=DIR         # the full grid: 5 cases x 3 x 3

For every (case, layers, batch): schedule our layout (cached per case and tasklet sizes), simulate
ours, ours with random layouts (max(3, repeats) seeded rank maps), Megatron's and DeepSpeed's
whole configuration grids; print a table; write one row per (system, layout/config, batch,
repeat) with :func:`system.results.make_row`, then ``fig3.png``, ``summary.csv`` and
``claims.md`` into ``results_dir``. Everything is computed before anything is written, so bad
input (unknown case, layers not divisible into stages, nothing fits in memory) raises one
ValueError and leaves no half-written output. No torch import.
"""

from __future__ import annotations

import logging
import math
import time
from pathlib import Path

import numpy as np
import pandas as pd
from omegaconf import DictConfig, ListConfig

from baselines.deepspeed.perf import grid_search_deepspeed
from baselines.megatron.perf import grid_search_megatron
from system.cases import get_case
from system.cluster import Cluster
from system.results import atomic_write_text, has_row, make_row, read_rows, write_rows
from system.scheduler.assignment import random_assignment
from system.simulator import V100, SimResult, simulate_ours
from system.simulator.summary import merge_summary, summary_frame, with_speedups
from system.workload import Workload, get_model, tasklet_sizes

log = logging.getLogger(__name__)

SYSTEMS = ("ours", "ours_random", "megatron", "deepspeed")
# What a simulated "repeat" is (column ``repeat_kind``): the simulator is deterministic, so a
# repeat of a fixed layout or configuration is an identical copy (run-to-run noise is measured
# only in mode=emulate/train); ours_random's repeats are different random layouts.
REPEAT_COPY = "deterministic copy"
PAPER_LAYERS, PAPER_BATCHES = (24, 32, 40), (1024, 2048, 4096)
SCHEDULER_METHODS = {
    "genetic": "genetic",
    "kl": "genetic_kl",
    "genetic_kl": "genetic_kl",
    "random": "random",
}
SIM_BUDGET = {"trials": 4, "population": 4, "time_limit_s": 1.0}  # keeps the full grid < 2 min
MIN_RANDOM_LAYOUTS = 3  # the paper's three random layouts per setting (appendix 10.1)


def _as_list(value, default) -> list:
    if value is None:
        return list(default)
    if isinstance(value, (list, tuple, ListConfig)):
        return list(value)
    if isinstance(value, str) and value.lower() == "all":
        return list(default)
    return [value]


def default_pp(num_devices: int) -> int:
    """Stages for ours: the divisor of the device count closest to its square root (64 -> 8)."""
    divs = [k for k in range(1, num_devices + 1) if num_devices % k == 0]
    return min(divs, key=lambda k: (abs(k - math.sqrt(num_devices)), k))


class _Schedules:
    """Our scheduled layouts, cached per (case, variant, c_dp, c_pp, pp, dp): schedules depend on
    nothing else."""

    def __init__(self, method: str, seed: int, budget: dict):
        self.method, self.seed, self.budget, self.cache = method, seed, budget, {}

    def get(self, case: str, cluster: Cluster, workload: Workload, pp: int, dp: int):
        from system.scheduler import schedule

        sizes = tasklet_sizes(workload, pp, dp)
        key = (case, cluster.meta.get("variant"), sizes.c_dp_bytes, sizes.c_pp_bytes, pp, dp)
        if key not in self.cache:
            self.cache[key] = schedule(
                cluster,
                sizes,
                pp=pp,
                dp=dp,
                method=self.method,
                seed=self.seed,
                greedy_seeds=True,
                **self.budget,
            )
        return self.cache[key]


def _budget(cfg: DictConfig) -> dict:
    sch = cfg.get("scheduler") or {}
    out = {}
    for k, dflt in SIM_BUDGET.items():
        v = sch.get(k)
        out[k] = dflt if v is None else (float(v) if k == "time_limit_s" else int(v))
    return out


def _settings(cfg: DictConfig) -> list[tuple[str, int, int]]:
    model = str(cfg.get("model", "gpt3_xl"))
    base = get_model(model)
    layers = _as_list(cfg.get("layers"), PAPER_LAYERS if model == "gpt3_xl" else [base.num_layers])
    batches = _as_list(cfg.get("batch"), PAPER_BATCHES if model == "gpt3_xl" else [16])
    cases = _as_list(cfg.get("case"), ["1", "2", "3", "4", "5"])
    if str(cfg.get("case")).lower() == "all":
        cases = ["1", "2", "3", "4", "5"]
    return [(str(c), int(l), int(b)) for c in cases for l in layers for b in batches]


def _row(key: dict, res: SimResult, cluster: Cluster, **extra) -> dict:
    c = res.config
    ok = res.status == "ok"
    return make_row(
        key,
        status=res.status,
        num_devices=cluster.num_devices,
        iter_time_s=res.iter_time_s if ok else None,
        pflops=res.pflops if ok else None,
        compute_time_s=res.compute_time_s if ok else None,
        comm_time_s=res.comm_time_s if ok else None,
        tp=c.get("tp", 1),
        pp=c.get("pp"),
        dp=c.get("dp"),
        micro_batch_size=c.get("micro_batch_size"),
        zero=c.get("zero", 0),
        memory_gib=res.memory_bytes / 2**30,
        config=res.label(),
        mfu=res.pflops * 1e15 / (cluster.num_devices * V100.peak_flops) if ok else None,
        **{f"sim_{k}": v for k, v in res.breakdown.items()},
        **extra,
    )


def _simulate_setting(cfg, case, layers, batch, systems, schedules, repeats):
    """All rows of one (case, layers, batch) and a summary line. Raises ValueError on bad input."""
    variant = str(cfg.get("case_variant", "paper"))
    cluster = get_case(case, variant)
    model = get_model(str(cfg.get("model", "gpt3_xl")), layers)
    workload = Workload(
        model=model, global_batch_size=batch, micro_batch_size=int(cfg.get("micro_batch_size", 1))
    )
    d = cluster.num_devices
    pp = int(cfg.pp) if cfg.get("pp") else default_pp(d)
    dp = int(cfg.dp) if cfg.get("dp") else d // pp
    workload.check_layout(pp, dp)
    seed = int(cfg.get("seed", 0))
    base = {
        "mode": "simulate",
        "case": case,
        "case_variant": variant,
        "model": model.name,
        "num_layers": layers,
        "global_batch_size": batch,
        "seed": seed,
    }
    rows, line = [], {"case": case, "num_layers": layers, "global_batch_size": batch}
    oom = ValueError(
        f"case {case}, {layers} layers: not even one micro-batch of "
        f"{workload.micro_batch_size} fits in {V100.name} memory with pp={pp}"
    )
    if "ours" in systems:
        sched = schedules.get(case, cluster, workload, pp, dp)
        ours = simulate_ours(cluster, sched.assignment, workload)
        if ours.status != "ok":
            raise oom
        line["ours"] = ours
        info = {
            "scheduler": schedules.method,
            "search_time_s": sched.search_time_s,
            "best_cost_s": sched.cost.total_cost_s,
            "search_trials": sched.trials,
            "layout": sched.assignment.stages.tolist(),
        }
        for r in range(repeats):
            key = {
                **base,
                "system": "ours",
                "scheduler": schedules.method,
                "scheduler_budget": str(schedules.budget),
                "micro_batch_size": workload.micro_batch_size,
                "pp": pp,
                "dp": dp,
                "repeat": r,
            }
            rows.append(_row(key, ours, cluster, repeat_kind=REPEAT_COPY, **info))
    if "ours_random" in systems:  # the paper's random layouts: a new seeded rank map per run
        line["ours_random"] = []
        for k in range(max(MIN_RANDOM_LAYOUTS, repeats)):
            a = random_assignment(pp, dp, np.random.default_rng([seed, k]))
            res = simulate_ours(cluster, a, workload, system="ours_random")
            if res.status != "ok":
                raise oom
            line["ours_random"].append(res)
            key = {
                **base,
                "system": "ours_random",
                "micro_batch_size": workload.micro_batch_size,
                "pp": pp,
                "dp": dp,
                "layout_seed": [seed, k],
                "repeat": k,
            }
            rows.append(
                _row(
                    key,
                    res,
                    cluster,
                    scheduler="random_rank_map",
                    layout=a.stages.tolist(),
                    repeat_kind="random layout",
                )
            )
    for name, search in (("megatron", grid_search_megatron), ("deepspeed", grid_search_deepspeed)):
        if name not in systems:
            continue
        grid = search(cluster, workload)
        line[name], line[f"{name}_why"] = grid.best, grid.why()
        for res in grid.results:
            for r in range(repeats):
                key = {**base, "system": name, **res.config, "repeat": r}
                rows.append(
                    _row(
                        key,
                        res,
                        cluster,
                        is_best=res is grid.best,
                        repeat_kind=REPEAT_COPY,
                        variant=res.breakdown.get("variant", name),
                    )
                )
    return rows, line


def _paper_ratios() -> dict[str, str]:
    """The paper's claimed ratios as text, from ``repro/data/paper_claims.csv``."""
    from repro.claims import load_paper_claims

    out = {}
    for c in load_paper_claims().itertuples(index=False):
        lo, hi = (None if pd.isna(v) else str(v) for v in (c.paper_low, c.paper_high))
        out[c.claim_id] = (lo if lo == hi or not hi else f"{lo}–{hi}") + "×" if lo else ""
    return out


def _print_table(summary: pd.DataFrame, elapsed_s: float) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(
        title=f"simulated PFLOPS and iteration seconds (V100 model, "
        f"{V100.achievable_fraction:.0%} of peak; x = ours' speed-up) - {elapsed_s:.1f} s"
    )
    cols = [
        "case",
        "L",
        "batch",
        "ours",
        "ours s",
        "random",
        "Megatron (config)",
        "Meg s",
        "DeepSpeed (config)",
        "DS s",
        "x Meg",
        "x DS",
        "x rand",
        "paper x Meg",
        "paper x DS",
        "paper x rand",
    ]
    for c in cols:
        t.add_column(
            c, justify="right" if c not in ("Megatron (config)", "DeepSpeed (config)") else "left"
        )
    f = lambda v, p=2: "—" if v is None or (isinstance(v, float) and np.isnan(v)) else f"{v:.{p}g}"  # noqa: E731
    for r in summary.itertuples(index=False):
        t.add_row(
            r.case,
            str(r.num_layers),
            str(r.global_batch_size),
            f(r.ours_pflops, 3),
            f(r.ours_iter_time_s, 3),
            f(r.ours_random_pflops, 3),
            f"{f(r.megatron_pflops, 3)} ({r.megatron_config or '—'})",
            f(r.megatron_iter_time_s, 3),
            f"{f(r.deepspeed_pflops, 3)} ({r.deepspeed_config or '—'})",
            f(r.deepspeed_iter_time_s, 3),
            f(r.speedup_vs_megatron),
            f(r.speedup_vs_deepspeed),
            f(r.speedup_vs_random),
            r.paper_vs_megatron,
            r.paper_vs_deepspeed,
            r.paper_vs_random,
        )
    Console(width=200, highlight=False).print(t)


def _in_multirun() -> bool:
    try:
        from hydra.core.hydra_config import HydraConfig
        from hydra.types import RunMode

        return HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN
    except (ImportError, ValueError):
        return False


def _write_reports(results_dir: Path, summary: pd.DataFrame, elapsed_s: float) -> None:
    """fig3.png, summary.csv and claims.md from everything under ``results_dir``."""
    from repro.claims import evaluate_claims
    from repro.figures.fig3 import plot_fig3
    from repro.variance import best_configs

    path = results_dir / "summary.csv"  # keeps the settings other sweep jobs wrote
    merged = with_speedups(merge_summary(path, summary), _paper_ratios())
    atomic_write_text(path, merged.to_csv(index=False))
    if _in_multirun():  # the sweep's end-of-run report (repro/callbacks.py) draws these once
        return
    rows = read_rows(results_dir)
    plot_fig3(best_configs(rows), results_dir / "fig3.png")
    claims = evaluate_claims(rows)
    lines = [
        "# Simulated results vs the paper's claims",
        "",
        f"Generated by `python repro/run.py` (mode=simulate) in {elapsed_s:.1f} s; "
        f"{len(rows)} rows. Verdicts: `repro/claims.py` (tolerance 25%).",
        "",
        "| claim | paper | ours | verdict | note |",
        "|---|---|---|---|---|",
    ]
    for c in claims.itertuples(index=False):
        lines.append(f"| {c.claim_id} | {c.paper} | {c.ours} | {c.verdict} | {c.detail} |")
    lines += ["", "## Baseline grid picks (why)", ""]
    for r in summary.itertuples(index=False):
        lines.append(
            f"- case {r.case}, L{r.num_layers}, B{r.global_batch_size}: Megatron "
            f"{r.megatron_why}; DeepSpeed {r.deepspeed_why}"
        )
    atomic_write_text(results_dir / "claims.md", "\n".join(lines) + "\n")


def run(cfg: DictConfig) -> dict:
    """Simulate the configured settings; returns a summary with the written ``run_ids``."""
    t0 = time.perf_counter()
    system = str(cfg.get("system", "all"))
    systems = SYSTEMS if system == "all" else (system,)
    if system != "all" and system not in SYSTEMS:
        raise ValueError(
            f"mode=simulate: unknown system {system!r}; known: all, {', '.join(SYSTEMS)}"
        )
    method = SCHEDULER_METHODS.get(str((cfg.get("scheduler") or {}).get("name", "genetic")))
    if method is None:
        raise ValueError(
            f"unknown scheduler.name {cfg.scheduler.name!r}; known: {', '.join(SCHEDULER_METHODS)}"
        )
    repeats = int(cfg.get("repeats", 1))
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    results_dir = Path(str(cfg.get("results_dir", "results/adhoc")))
    schedules = _Schedules(method, int(cfg.get("seed", 0)), _budget(cfg))
    rows, lines = [], []
    for case, layers, batch in _settings(cfg):
        r, ln = _simulate_setting(cfg, case, layers, batch, systems, schedules, repeats)
        rows += r
        lines.append(ln)
    elapsed = time.perf_counter() - t0
    new = [r for r in rows if not has_row(results_dir, r["run_id"])]
    log.info(
        "simulated %d settings in %.1f s: %d rows (%d new) -> %s",
        len(lines),
        elapsed,
        len(rows),
        len(new),
        results_dir,
    )
    write_rows(results_dir, new)
    summary = with_speedups(summary_frame(lines), _paper_ratios())
    _write_reports(results_dir, summary, elapsed)
    _print_table(summary, elapsed)
    log.info(
        "mode=simulate took %.1f s in all (simulation %.1f s, rows/tables/figure %.1f s)",
        time.perf_counter() - t0,
        elapsed,
        time.perf_counter() - t0 - elapsed,
    )
    return {
        "run_ids": [r["run_id"] for r in rows],
        "rows": len(rows),
        "new_rows": len(new),
        "elapsed_s": elapsed,
        "results_dir": str(results_dir),
        "summary": summary.drop(columns=["megatron_why", "deepspeed_why"]).to_dict("records"),
    }
