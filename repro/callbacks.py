"""Hydra callbacks for sweeps: a progress bar over jobs, then collect + report + summary line.

Registered by the sweep files (``conf/sweep/*.yaml``)::

    hydra:
      callbacks:
        workflow:
          _target_: repro.callbacks.WorkflowCallback

At the end of a multirun, :func:`finish_study` rebuilds ``runs.csv`` / ``runs.parquet``, writes
the variance and claims tables, the figures and ``REPORT.md`` (:mod:`repro.report`), mirrors them
to wandb when ``logger=wandb``, and logs one line saying where everything is.
"""

from __future__ import annotations

import logging
import math
import sys
import time
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from repro.collect import SESSION, collect_study

log = logging.getLogger(__name__)

__all__ = ["WorkflowCallback", "count_jobs", "finish_study"]


def count_jobs(config: DictConfig) -> int | None:
    """How many jobs the basic sweeper will launch (sweep-file params + command-line overrides)."""
    try:
        from hydra.core.override_parser.overrides_parser import OverridesParser

        params = dict(config.hydra.sweeper.get("params") or {})
        lines = [f"{k}={v}" for k, v in params.items()] + list(config.hydra.overrides.task)
        by_key = {o.get_key_element(): o for o in OverridesParser.create().parse_overrides(lines)}
        sizes = [
            len(list(o.sweep_string_iterator())) for o in by_key.values() if o.is_sweep_override()
        ]
        return math.prod(sizes)
    except Exception as e:  # a custom sweeper: progress without a total
        log.debug("cannot count jobs: %s", e)
        return None


def finish_study(
    config: DictConfig, *, elapsed_s: float | None = None, sweep_dir: str | None = None
) -> dict:
    """Collect, report and (optionally) mirror to wandb; returns where the outputs are."""
    from repro.report import build_report

    wf = config.get("workflow") or {}
    results_dir = Path(str(config.results_dir))
    if not (results_dir / "rows").is_dir():
        log.warning("no rows under %s: nothing to collect", results_dir)
        return {"results_dir": str(results_dir)}
    runs_csv = collect_study(results_dir)
    out = {"results_dir": str(results_dir), "runs_csv": str(runs_csv)}
    if wf.get("report", True):
        paths = build_report(
            results_dir,
            ablation_path=wf.get("ablation_csv"),
            tolerance=float(wf.get("tolerance", 0.25)),
            study=str(config.study),
        )
        out["report"] = str(paths.report)
        if str(config.get("logger", "none")) == "wandb":
            import pandas as pd

            from repro.wandb_log import log_comparison

            log_comparison(
                config,
                pd.read_csv(paths.best),
                pd.read_csv(paths.variance),
                pd.read_csv(paths.claims),
                paths.figures,
            )
    n_rows = sum(1 for _ in (results_dir / "rows").glob("*.json"))
    took = f" in {elapsed_s:.0f} s" if elapsed_s is not None else ""
    log.info(
        "sweep %s: %d jobs ran, %d skipped (already finished)%s; %d rows -> %s; report %s; "
        "job folders %s",
        config.study,
        SESSION.ran,
        SESSION.skipped,
        took,
        n_rows,
        runs_csv,
        out.get("report", "off"),
        sweep_dir or "-",
    )
    return out


class WorkflowCallback(Callback):
    """Progress over a sweep's jobs; collect and report when it ends."""

    def __init__(self, progress: bool = True) -> None:
        self.progress = progress
        self._bar = None
        self._task = None
        self._t0 = 0.0
        self._done = 0
        self._total: int | None = None

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        SESSION.reset()
        self._t0, self._done = time.monotonic(), 0
        self._total = count_jobs(config)
        if self.progress and sys.stdout.isatty():
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

            self._bar = Progress(
                "[progress.description]{task.description}",
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                transient=False,
            )
            self._bar.start()
            self._task = self._bar.add_task(f"sweep {config.study}", total=self._total)

    def on_job_end(self, config: DictConfig, job_return: Any, **kwargs: Any) -> None:
        self._done += 1
        if self._bar is not None:
            self._bar.advance(self._task)
        else:
            status = getattr(getattr(job_return, "status", None), "name", "?")
            log.info(
                "job %d/%s %s (%.0f s elapsed)",
                self._done,
                self._total or "?",
                status,
                time.monotonic() - self._t0,
            )

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None
        finish_study(
            config, elapsed_s=time.monotonic() - self._t0, sweep_dir=str(config.hydra.sweep.dir)
        )
