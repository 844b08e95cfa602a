"""Hydra callbacks for sweeps: check every job first, progress, then collect + report + summary.

Registered by the sweep files (``conf/sweep/*.yaml``)::

    hydra:
      callbacks:
        workflow:
          _target_: repro.callbacks.WorkflowCallback

Before the first job, :func:`check_jobs` composes and validates every job of the sweep
(:func:`repro.config.validate`); one bad point stops the sweep with every bad point listed and
nothing run (exit 2). A job that fails while running is recorded (:func:`repro.collect.
record_failure`) and the sweep goes on. At the end, :func:`finish_study` folds the jobs' part
files into ``runs.parquet`` and rebuilds ``runs.csv`` (:func:`system.results.compact`),
writes the variance and claims tables, the figures and ``REPORT.md`` (:mod:`repro.report`, from
``runs.parquet``), mirrors them to wandb when ``logger=wandb``, and logs one line saying where
everything is. The command exits 1 when the report failed or a job failed (after reporting).

One module (~330 lines): the sweep's life cycle (check before the first job, ledger
counts, the end-of-sweep report) is one Hydra callback and the helpers only it calls.
"""

from __future__ import annotations

import json
import logging
import math
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from repro.collect import job_key, ledger_path

log = logging.getLogger(__name__)

__all__ = [
    "WorkflowCallback",
    "Outcome",
    "count_jobs",
    "job_overrides",
    "check_jobs",
    "ledger_stamps",
    "count_outcomes",
    "finish_study",
]


def _sweep_overrides(config: DictConfig) -> list:
    """The basic sweeper's overrides: sweep-file params, then the command line (which wins)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    params = dict(config.hydra.sweeper.get("params") or {})
    lines = [f"{k}={v}" for k, v in params.items()] + list(config.hydra.overrides.task)
    by_key = {o.get_key_element(): o for o in OverridesParser.create().parse_overrides(lines)}
    return list(by_key.values())


def count_jobs(config: DictConfig) -> int | None:
    """How many jobs the basic sweeper will launch (sweep-file params + command-line overrides)."""
    try:
        sizes = [
            len(list(o.sweep_string_iterator()))
            for o in _sweep_overrides(config)
            if o.is_sweep_override()
        ]
        return math.prod(sizes)
    except Exception as e:  # a custom sweeper: progress without a total
        log.debug("cannot count jobs: %s", e)
        return None


def job_overrides(config: DictConfig) -> list[list[str]]:
    """One override list per job, in the basic sweeper's order."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper

    batches = BasicSweeper.split_arguments(_sweep_overrides(config), None)
    return [list(job) for batch in batches for job in batch]


def check_jobs(config: DictConfig) -> list[str]:
    """Compose and validate every job of the sweep; returns one line per bad job."""
    return _check(config)[0]


def _check(config: DictConfig) -> tuple[list[str], list[str]]:
    """(one line per bad job, the ledger key of every good job), from one composition each."""
    from hydra import compose

    from repro.config import validate

    bad, keys = [], []
    for n, overrides in enumerate(job_overrides(config)):
        try:
            typed = validate(compose(config_name=config.hydra.job.config_name, overrides=overrides))
            keys.append(job_key(typed))
        except Exception as e:  # noqa: BLE001 - every kind of bad point is reported, none run
            shown = " ".join(o for o in overrides if not o.startswith("hydra"))
            bad.append(f"job {n} ({shown}): {str(e).strip().splitlines()[0]}")
    return bad, keys


@dataclass
class Outcome:
    """What became of a sweep's jobs, read from the study's ledger (``results_dir/jobs/``).

    Launchers that run jobs in other processes (joblib's workers, Slurm jobs) return nothing
    this process could count, so the ledger, which every job writes whether it ran or failed,
    is the one source: an entry rewritten during this sweep by one of this sweep's job folders
    ran (or failed); an untouched finished entry was skipped; a missing entry never finished.
    """

    ran: int = 0
    skipped: int = 0
    failed: list = field(default_factory=list)


def _stamp(path: Path) -> tuple[int, int] | None:
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    return st.st_mtime_ns, st.st_size


def ledger_stamps(results_dir: str | Path, keys: list[str]) -> dict[str, tuple[int, int] | None]:
    """Each job's ledger entry (mtime, size) now, or None where it has none."""
    return {k: _stamp(ledger_path(results_dir, k)) for k in keys}


def count_outcomes(results_dir: str | Path, before: dict, sweep_dir: str | None) -> Outcome:
    """Count ran / skipped / failed jobs of a sweep from the ledger (see :class:`Outcome`).

    ``before`` is :func:`ledger_stamps` taken when the sweep started; ``sweep_dir`` is this
    sweep's Hydra folder, so a job another sweep ran into the same study meanwhile counts as
    skipped here, not ran.
    """
    out = Outcome()
    root = Path(sweep_dir).resolve() if sweep_dir else None
    for key, was in before.items():
        path = ledger_path(results_dir, key)
        now = _stamp(path)
        if now is None:
            out.failed.append({"job_key": key, "error": "no ledger entry: the job did not finish"})
            continue
        try:
            rec = json.loads(path.read_text())
        except json.JSONDecodeError as e:
            out.failed.append({"job_key": key, "error": f"unreadable ledger entry: {e}"})
            continue
        job_dir = rec.get("output_dir")
        ours = root is None or job_dir is None or Path(job_dir).resolve().is_relative_to(root)
        touched = now != was and ours
        if rec.get("status", "ok") != "ok":
            out.failed.append({"job_key": key, "error": rec.get("error", "?")})
        elif touched:
            out.ran += 1
        else:
            out.skipped += 1
    return out


def finish_study(
    config: DictConfig,
    *,
    elapsed_s: float | None = None,
    sweep_dir: str | None = None,
    outcome: Outcome | None = None,
    check_s: float | None = None,
) -> dict:
    """Collect, report and (optionally) mirror to wandb; returns where the outputs are.

    ``outcome`` (:func:`count_outcomes`) is what the summary line counts; without it the line
    says the counts are unknown. The line also gives the seconds spent checking the jobs
    (``check_s``) and building the report: with the jobs' own time (``elapsed_s``), where a
    sweep's wall time goes (``repro/bench_launchers.py`` prints them per launcher).
    """

    from system.results import has_stored_rows, study_lock

    wf = config.get("workflow") or {}
    results_dir = Path(str(config.results_dir))
    if not has_stored_rows(results_dir):
        log.warning("no rows under %s: nothing to report", results_dir)
        return {"results_dir": str(results_dir)}
    with study_lock(results_dir, ".report.lock"):
        return _finish(config, wf, results_dir, elapsed_s, sweep_dir, outcome, check_s)


def _finish(config, wf, results_dir: Path, elapsed_s, sweep_dir, outcome, check_s) -> dict:
    import pandas as pd

    t0 = time.monotonic()

    from system.results import compact

    runs_csv = compact(results_dir)  # the jobs' parts folded in once (nothing new: no rewrite)
    out = {"results_dir": str(results_dir), "runs_csv": str(runs_csv)}
    if wf.get("report", True):
        from repro.report import build_report

        paths = build_report(
            results_dir,
            ablation_path=wf.get("ablation_csv"),
            tolerance=float(wf.get("tolerance", 0.25)),
            study=str(config.study),
        )
        out["report"] = str(paths.report)
        if str(config.get("logger", "none")) == "wandb":
            from repro.report.wandb_log import log_comparison

            log_comparison(
                config,
                pd.read_csv(paths.best),
                pd.read_csv(paths.variance),
                pd.read_csv(paths.claims),
                paths.figures,
            )
    n_rows = len(pd.read_csv(runs_csv, usecols=["run_id"]))  # runs.csv: newest row per setting
    took = f" in {elapsed_s:.1f} s" if elapsed_s is not None else ""
    check = f"check {check_s:.1f} s, " if check_s is not None else ""
    took += f" ({check}report {time.monotonic() - t0:.1f} s)"
    if outcome is None:
        counts = "jobs ran/skipped/failed not counted"
    else:
        counts = (
            f"{outcome.ran} jobs ran, {outcome.skipped} skipped (already finished), "
            f"{len(outcome.failed)} failed"
        )
    log.info(
        "sweep %s: %s%s; %d rows -> %s; report %s; job folders %s",
        config.study,
        counts,
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
        self._before: dict = {}
        self._check_s: float | None = None
        self._pid = os.getpid()  # the submitting process

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        t0 = time.monotonic()
        bad, keys = _check(config)
        self._check_s = time.monotonic() - t0
        if bad:
            for line in bad:
                log.error("%s", line)
            print(
                f"error: {len(bad)} of {count_jobs(config) or '?'} sweep jobs are invalid; "
                f"nothing ran. First: {bad[0]}",
                file=sys.stderr,
            )
            raise SystemExit(2)  # not an Exception: Hydra's callback wrapper lets it through
        self._pid = os.getpid()
        self._before = ledger_stamps(str(config.results_dir), keys)
        self._t0, self._done = time.monotonic(), 0
        self._total = len(keys)
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
        if os.getpid() != self._pid:  # a launcher's worker (joblib, Slurm): no shared count here
            status = getattr(getattr(job_return, "status", None), "name", "?")
            log.info("job %s in worker process %d", status, os.getpid())
            return
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
        sweep_dir = str(config.hydra.sweep.dir)
        outcome = count_outcomes(str(config.results_dir), self._before, sweep_dir)
        try:
            finish_study(
                config,
                elapsed_s=time.monotonic() - self._t0,
                sweep_dir=sweep_dir,
                outcome=outcome,
                check_s=self._check_s,
            )
        except Exception as e:  # noqa: BLE001 - any report failure fails the command
            log.exception("the report of study %s failed", config.study)
            print(f"error: report failed: {type(e).__name__}: {e}", file=sys.stderr)
            raise SystemExit(1) from None
        if outcome.failed:
            for f in outcome.failed:
                log.error("failed job %s: %s", f["job_key"], f["error"])
            print(
                f"error: {len(outcome.failed)} sweep job(s) failed (recorded under "
                f"{config.results_dir}/jobs/; the report covers the others)",
                file=sys.stderr,
            )
            raise SystemExit(1)
