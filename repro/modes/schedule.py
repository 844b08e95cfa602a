"""``mode=schedule``: schedule one case and write the assignment JSON (paper §3.4).

    python repro/run.py mode=schedule case=5 scheduler.name=genetic seed=0 out=FILE.json
    python repro/run.py mode=schedule case=4 workload=gpt3_xl_b1024 scheduler.time_limit_s=30

The same search and record as ``repro/schedule.py`` (:func:`repro.schedule.run`), configured by
:class:`repro.config.ScheduleModeConfig`; the JSON goes to ``out`` or, when unset, to
``results_dir/case<case>-<scheduler>-seed<seed>.json``. No result rows: the record is the output.
"""

from __future__ import annotations

import logging
from pathlib import Path

from omegaconf import DictConfig

from repro.schedule import ScheduleConfig, _LogProgress
from repro.schedule import run as schedule_case

log = logging.getLogger(__name__)

__all__ = ["run"]

_METHODS = {"kl": "genetic_kl"}  # run.py's scheduler.name alias


def run(cfg: DictConfig) -> dict:
    sch = cfg.scheduler
    method = _METHODS.get(str(sch.name), str(sch.name))
    out = cfg.out or str(
        Path(str(cfg.results_dir)) / f"case{cfg.case}-{method}-seed{cfg.seed}.json"
    )
    args = ScheduleConfig(
        case=str(cfg.case),
        case_variant=str(cfg.case_variant),
        scheduler=method,
        workload=str(cfg.workload),
        pp=cfg.pp,
        dp=cfg.dp,
        seed=int(cfg.seed),
        trials=sch.trials,
        population=sch.population,
        time_limit_s=sch.time_limit_s,
        greedy_seeds=bool(cfg.greedy_seeds),
        out=out,
        verbose=bool(cfg.verbose),
        patience_trials=cfg.patience_trials,
        objective=str(cfg.objective),
    )
    record = schedule_case(args, on_progress=_LogProgress() if args.verbose else None)
    log.info(
        "case %s %s: TOTAL %.3f s after %d trials in %.2f s -> %s",
        record["case"],
        record["method"],
        record["total_cost_s"],
        record["trials"],
        record["search_time_s"],
        out,
    )
    return {
        "out": out,
        "total_cost_s": record["total_cost_s"],
        "trials": record["trials"],
        "search_time_s": record["search_time_s"],
        "run_ids": [],
    }
