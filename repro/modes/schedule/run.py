"""``mode=schedule``: schedule one case and write the layout as JSON (paper §3.4).

    python repro/run.py mode=schedule case=5 scheduler.name=genetic seed=0 out=FILE.json
    python repro/run.py mode=schedule case=4 workload=gpt3_xl_b1024 scheduler.time_limit_s=30

With ``scheduler.trials`` and ``scheduler.time_limit_s`` null the search stops once
``scheduler.patience_trials`` trials (default 20) bring no better layout, after 60 s at most
(:data:`system.scheduler.api.DEFAULT_TIME_CAP_S`): seconds on the paper's cases.
``scheduler.objective=iteration_time`` needs a model workload (``workload=gpt3_xl_b1024``).
The record (stages, DP/PP/TOTAL cost, the lower bound and certified gap, search statistics)
goes to ``out`` or ``results_dir/case<case>-<method>-seed<seed>.json``; no result rows.
"""

from __future__ import annotations

import json
import logging
import sys
import time

from repro.config.shared import fill_layout
from repro.modes.schedule.config import ScheduleConfig
from system.cases import case_label
from system.results import atomic_write_text, path_in

log = logging.getLogger(__name__)

__all__ = ["schedule_case", "run"]


def schedule_case(cfg: ScheduleConfig, on_progress=None) -> dict:
    """Schedule per ``cfg``; returns the JSON-ready record."""
    from system.scheduler import schedule
    from system.workload import Workload, get_workload, tasklet_sizes

    cluster = cfg.cluster()
    pp, dp = fill_layout(cluster.num_devices, cfg.pp, cfg.dp)
    work = get_workload(cfg.workload)
    sizes = tasklet_sizes(work, pp, dp) if isinstance(work, Workload) else work
    result = schedule(
        cluster,
        sizes,
        pp=pp,
        dp=dp,
        seed=cfg.seed,
        on_progress=on_progress,
        **cfg.scheduler.search_kwargs(work if isinstance(work, Workload) else None),
    )
    return {
        "case": cfg.case,
        "case_variant": str(cfg.case_variant),
        "cluster": cluster.name,
        "num_devices": cluster.num_devices,
        "workload": str(cfg.workload),
        "c_dp_bytes": sizes.c_dp_bytes,
        "c_pp_bytes": sizes.c_pp_bytes,
        "time_limit_s": cfg.scheduler.time_limit_s,
        **result.to_dict(),
    }


class _LogProgress:
    """``on_progress`` for a log (no terminal): one line per ``every_s`` seconds at most."""

    def __init__(self, every_s: float = 1.0) -> None:
        self.every_s, self.last = every_s, time.monotonic()

    def __call__(self, trial: int, best_s: float) -> None:
        now = time.monotonic()
        if now - self.last >= self.every_s:
            self.last = now
            log.info("trial %d: best TOTAL %.4f s", trial, best_s)


def _search(cfg: ScheduleConfig) -> dict:
    if not (cfg.verbose and sys.stderr.isatty()):
        return schedule_case(cfg, on_progress=_LogProgress() if cfg.verbose else None)
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.fields[best]}"),
        TimeElapsedColumn(),
        transient=True,
    ) as bar:
        task = bar.add_task(f"{cfg.scheduler.name} case {cfg.case}", total=None, best="")

        def progress(trial: int, best_s: float) -> None:
            bar.update(task, completed=trial, best=f"best TOTAL {best_s:.3f} s")

        return schedule_case(cfg, on_progress=progress)


def _fmt(value, spec: str = "{:.3f}") -> str:
    return "n/a" if value is None else spec.format(value)


def run(cfg: ScheduleConfig) -> dict:
    out = cfg.out or str(
        path_in(
            cfg.results_dir, f"case{case_label(cfg.case)}-{cfg.scheduler.name}-seed{cfg.seed}.json"
        )
    )
    record = _search(cfg)
    atomic_write_text(out, json.dumps(record, indent=1) + "\n")
    log.info(
        "case %s %s: TOTAL %.3f s (DP %.3f + 2 x PP %.3f) after %d trials in %.2f s; "
        "lower bound %s s, certified gap %s%% -> %s",
        record["case"],
        record["method"],
        record["total_cost_s"],
        record["dp_cost_s"],
        record["pp_cost_s"],
        record["trials"],
        record["search_time_s"],
        _fmt(record.get("bound_total_s")),
        _fmt(record.get("gap_pct"), "{:.1f}"),
        out,
    )
    return {
        "out": out,
        "total_cost_s": record["total_cost_s"],
        "trials": record["trials"],
        "search_time_s": record["search_time_s"],
        "run_ids": [],
    }
