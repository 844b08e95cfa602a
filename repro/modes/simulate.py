"""``mode=simulate``: the paper's Fig. 3 experiment in the performance simulator (§4, no GPU).

    python repro/run.py case=5 layers=40                 # 3 batch sizes, all systems
    python repro/run.py case=5 layers=40 batch=2048      # one setting
    python repro/run.py -m sweep=paper                   # the full grid, one job per setting

For every (case, layers, batch): schedule our layout (cached per case and tasklet sizes), simulate
ours, ours with random layouts (max(3, repeats) seeded rank maps), Megatron's and DeepSpeed's whole
configuration grids under the paper's protocol (ranks in launch order) and, with
``baseline_placement=topology`` (the default), also under the fair protocol (each configuration
with its best topology-aware rank map, :mod:`baselines.placement`); every baseline row records its
``placement`` and ``rank_map``; print a table with ours' speed-up under both protocols; write one
row per (system, layout/config, batch, repeat) with :func:`system.results.make_row`, then
``fig3.png``, ``summary.csv`` and ``claims.md`` into ``results_dir``. Everything is computed before
anything is written, so bad input (unknown case, layers not divisible into stages, nothing fits in
memory) raises one ValueError and leaves no half-written output.
No torch import.

One module (~400 lines): the mode's settings and the per-setting simulation of every system are
one pipeline whose order (compute everything, then write) the module enforces; the console
tables live in :mod:`repro.report.summary`.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
from omegaconf import DictConfig, ListConfig

from baselines.deepspeed.perf import grid_search_deepspeed
from baselines.megatron.perf import grid_search_megatron
from baselines.placement import PLACEMENTS
from repro.config import default_pp
from repro.report.summary import (
    merge_summary,
    paper_ratios,
    print_setting_rows,
    print_summary_table,
    summary_frame,
    with_speedups,
)
from system.assignment import random_assignment
from system.cases import get_case
from system.cluster import Cluster
from system.results import (
    SIMULATED_SYSTEMS,
    atomic_write_text,
    make_row,
    read_rows,
    run_ids,
    study_lock,
    write_rows,
)
from system.simulator import V100, SimResult, simulate_ours
from system.simulator.comm import LINK_SHARING, NCCL, NCCL_RENDEZVOUS, with_link_sharing
from system.workload import Workload, get_model, tasklet_sizes

log = logging.getLogger(__name__)

SYSTEMS = SIMULATED_SYSTEMS
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


MODEL_DEFAULTS = {
    "compute_efficiency": V100.achievable_fraction,
    "link_sharing": "pair",
    "baseline_transport": "nccl",
}
TRANSPORTS = {"nccl": NCCL, "nccl_rendezvous": NCCL_RENDEZVOUS}


def _model_knobs(cfg: DictConfig) -> dict:
    """The sensitivity knobs (``compute_efficiency``, ``link_sharing``, ``baseline_transport``),
    checked; null means the model's default."""
    out = {}
    for k, dflt in MODEL_DEFAULTS.items():
        v = cfg.get(k)
        out[k] = dflt if v is None else (float(v) if k == "compute_efficiency" else str(v))
    if not 0 < out["compute_efficiency"] <= 1:
        raise ValueError(f"compute_efficiency must be in (0, 1], got {out['compute_efficiency']}")
    if out["link_sharing"] not in LINK_SHARING:
        raise ValueError(
            f"link_sharing must be one of {', '.join(LINK_SHARING)}, got {out['link_sharing']!r}"
        )
    if out["baseline_transport"] not in TRANSPORTS:
        raise ValueError(
            f"baseline_transport must be one of {', '.join(TRANSPORTS)}, "
            f"got {out['baseline_transport']!r}"
        )
    return out


def _row(key: dict, res: SimResult, cluster: Cluster, **extra) -> dict:
    c = res.config
    ok = res.status == "ok"
    breakdown = {k: v for k, v in res.breakdown.items() if k not in ("rank_map", "placement_how")}
    if "rank_map" in res.breakdown:  # baselines: where each launch rank ran
        extra["rank_map"] = json.dumps(res.breakdown["rank_map"])
        extra["placement_how"] = res.breakdown.get("placement_how")
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
        recompute=c.get("recompute", "full"),
        memory_gib=res.memory_bytes / 2**30,
        config=res.label(),
        mfu=res.pflops * 1e15 / (cluster.num_devices * V100.peak_flops) if ok else None,
        **{f"sim_{k}": v for k, v in breakdown.items()},
        **extra,
    )


def _simulate_setting(cfg, case, layers, batch, systems, schedules, repeats, placement):
    """All rows of one (case, layers, batch) and a summary line. Raises ValueError on bad input.

    ``placement``: ``launch`` (baselines in launch order only) or ``topology`` (both protocols;
    the summary's headline baseline is the topology-aware one, launch order goes beside it)."""
    variant = str(cfg.get("case_variant", "paper"))
    plain = get_case(case, variant)  # what the scheduler sees (α, β only)
    knobs = _model_knobs(cfg)
    cluster = with_link_sharing(plain, knobs["link_sharing"])
    hw = replace(V100, achievable_fraction=knobs["compute_efficiency"])
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
        **{k: v for k, v in knobs.items() if v != MODEL_DEFAULTS[k]},  # in run ids if changed
    }
    rows, line = [], {"case": case, "num_layers": layers, "global_batch_size": batch}
    oom = ValueError(
        f"case {case}, {layers} layers: not even one micro-batch of "
        f"{workload.micro_batch_size} fits in {V100.name} memory with pp={pp}"
    )
    if "ours" in systems:
        sched = schedules.get(case, plain, workload, pp, dp)
        ours = simulate_ours(cluster, sched.assignment, workload, hardware=hw)
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
            rows.append(
                _row(key, ours, cluster, placement="scheduled", repeat_kind=REPEAT_COPY, **info)
            )
    if "ours_random" in systems:  # the paper's random layouts: a new seeded rank map per run
        line["ours_random"] = []
        for k in range(max(MIN_RANDOM_LAYOUTS, repeats)):
            a = random_assignment(pp, dp, np.random.default_rng([seed, k]))
            res = simulate_ours(cluster, a, workload, system="ours_random", hardware=hw)
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
                    placement="random",
                    layout=a.stages.tolist(),
                    repeat_kind="random layout",
                )
            )
    protocols = ["launch"] if placement == "launch" else ["launch", "topology"]
    cache: dict = {}  # (config, rank map) -> simulation, shared by the two protocols
    for name, search in (("megatron", grid_search_megatron), ("deepspeed", grid_search_deepspeed)):
        if name not in systems:
            continue
        for protocol in protocols:
            grid = search(
                cluster,
                workload,
                hw,
                placement=protocol,
                cache=cache,
                transport=TRANSPORTS[knobs["baseline_transport"]],
            )
            suffix = "" if protocol == placement else f"_{protocol}"
            line[name + suffix], line[f"{name}{suffix}_why"] = grid.best, grid.why()
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
                            placement=protocol,
                        )
                    )
    return rows, line


def _in_multirun() -> bool:
    try:
        from hydra.core.hydra_config import HydraConfig
        from hydra.types import RunMode

        return HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN
    except (ImportError, ValueError):
        return False


def merge_summary_file(results_dir: Path, summary: pd.DataFrame) -> pd.DataFrame:
    """``summary.csv`` of ``results_dir`` with ``summary``'s settings merged in (the settings
    other sweep jobs wrote are kept), rewritten; returns the merged table. The read-merge-write
    holds a lock of its own: parallel sweep jobs (joblib workers, Slurm jobs) would otherwise
    each rewrite the file from what they read and lose each other's lines."""
    path = Path(results_dir) / "summary.csv"
    with study_lock(results_dir, ".summary.lock"):
        merged = with_speedups(merge_summary(path, summary), paper_ratios())
        atomic_write_text(path, merged.to_csv(index=False))
    return merged


def _write_reports(results_dir: Path, summary: pd.DataFrame, elapsed_s: float) -> None:
    """fig3.png, summary.csv and claims.md from everything under ``results_dir``."""
    from repro.report.figures.fig3 import plot_fig3
    from repro.report.protocols import write_protocol_claims
    from repro.report.variance import best_configs

    merged = merge_summary_file(results_dir, summary)
    if _in_multirun():  # the sweep's end-of-run report (repro/report.py) draws these once
        return
    rows = read_rows(results_dir)
    plot_fig3(best_configs(rows), results_dir / "fig3.png")
    write_protocol_claims(results_dir, rows, merged)


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
    placement = str(cfg.baseline_placement)
    if placement not in PLACEMENTS:
        raise ValueError(
            f"baseline_placement must be one of {', '.join(PLACEMENTS)}, got {placement!r}"
        )
    results_dir = Path(str(cfg.results_dir))
    schedules = _Schedules(method, int(cfg.get("seed", 0)), _budget(cfg))
    rows, lines = [], []
    for case, layers, batch in _settings(cfg):
        r, ln = _simulate_setting(cfg, case, layers, batch, systems, schedules, repeats, placement)
        ln["baseline_placement"] = placement
        rows += r
        lines.append(ln)
    elapsed = time.perf_counter() - t0
    stored = run_ids(results_dir)  # same settings and model version: nothing new to write
    new = [r for r in rows if r["run_id"] not in stored]
    log.info(
        "simulated %d settings in %.1f s: %d rows (%d new) -> %s",
        len(lines),
        elapsed,
        len(rows),
        len(new),
        results_dir,
    )
    if new or not (results_dir / "runs.parquet").exists():
        write_rows(results_dir, new)
    summary = with_speedups(summary_frame(lines), paper_ratios())
    _write_reports(results_dir, summary, elapsed)
    if len(lines) <= 9:  # one case or fewer: the per-system rows too
        print_setting_rows(lines)
    print_summary_table(summary, elapsed)
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
        "summary": summary.drop(columns=[c for c in summary.columns if c.endswith("_why")]).to_dict(
            "records"
        ),
    }
