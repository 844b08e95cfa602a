"""Sweeps: every job checked before the first, finished jobs skipped, one report at the end.

A sweep file (``conf/sweep/*.yaml``) registers :class:`WorkflowCallback`::

    hydra:
      callbacks:
        workflow:
          _target_: repro.sweep.WorkflowCallback

Before the first job the callback composes and validates every job (:func:`check_jobs`; under
the joblib launcher its worker processes do, :func:`_check_on_workers`); one
bad point stops the sweep with every bad point listed and nothing run (exit 2). Each job runs
through :func:`run_job`: it writes a ledger entry ``<results_dir>/jobs/<job_key>.json``
(atomically, after the mode wrote its rows) naming its rows, or, when it raised, an entry with
``status: error`` (:func:`record_failure`) and the sweep goes on. A sweep started again skips
every job whose entry is finished and whose rows are all stored. ``job_key`` hashes the typed
config without the keys that do not change results (:data:`NON_RESULT_KEYS`) together with the
performance model's version, so a sweep rerun after a model change recomputes. While a job
runs it holds ``jobs/<job_key>.lock``: a second sweep into the same folder waits and then skips.

A sweep's jobs write part files only (:func:`system.results.deferred_collect`); at the end
:func:`finish_study` folds them into ``runs.parquet`` once, builds the report
(:mod:`repro.report.build`), mirrors it to wandb when ``logger=wandb`` and logs one line saying
where everything is. The command exits 1 when the report or a job failed.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import json
import logging
import math
import os
import shutil
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from repro.config import RunConfig, as_dict, validate
from repro.hydra_fast import (
    SHARED,
    ShippedLoad,
    SweepComposer,
    SweepLoad,
    config_loader,
    hydra_state,
    is_multirun,
    job_overrides,
    output_dir,
    sweep_overrides,
)
from repro.keys import input_digests, rows_of
from system.results import (
    atomic_write_text,
    current_run_ids,
    deferred_collect,
    fold_here,
    model_version,
    read_parts_ahead,
    read_rows,
    run_id_for,
    run_id_sets,
    study_lock,
)
from system.results import run_ids as stored_run_ids

log = logging.getLogger(__name__)

__all__ = [
    "NON_RESULT_KEYS",
    "job_key",
    "ledger_path",
    "finished_job",
    "run_job",
    "record_failure",
    "WorkflowCallback",
    "Outcome",
    "count_jobs",
    "check_jobs",
    "ledger_stamps",
    "count_outcomes",
    "finish_study",
]

# Keys that only change how a run is reported (or how long it may take), never its rows.
NON_RESULT_KEYS = ("logger", "wandb", "workflow", "metrics_out", "limits")
JOB_LOCK_TIMEOUT_S = 24 * 3600.0


# ---- the ledger --------------------------------------------------------------------------------
def job_key(cfg: RunConfig) -> str:
    """Stable 16-hex key of a job: its typed config less :data:`NON_RESULT_KEYS`, the model, and
    the content of every file the config names (a topology case, an assignment, a settings
    file): a job whose input file was edited is a new job, not a finished one."""
    c = as_dict(cfg)
    for k in NON_RESULT_KEYS:
        c.pop(k, None)
    c["model_version"] = model_version()
    files = input_digests(c)
    if files:
        c["input_sha256"] = files
    return run_id_for(c)


def ledger_path(results_dir: str | Path, key: str) -> Path:
    return Path(results_dir) / "jobs" / f"{key}.json"


def finished_job(results_dir: str | Path, key: str) -> dict | None:
    """The ledger entry of a finished job whose rows are all stored, else None."""
    p = ledger_path(results_dir, key)
    if not p.exists():
        return None
    try:
        rec = json.loads(p.read_text())
    except json.JSONDecodeError:
        log.warning("ledger entry %s is unreadable: running the job again", p)
        return None
    if rec.get("status", "ok") != "ok":
        return None
    missing = set(rec.get("run_ids", [])) - current_run_ids(results_dir)
    if missing:
        log.warning(
            "job %s: %d of its rows are lost or superseded by newer rows of their settings: "
            "running it again",
            key,
            len(missing),
        )
        return None
    return rec


def _write_ledger(cfg: RunConfig, key: str, **fields) -> None:
    rec = {
        "job_key": key,
        "model_version": model_version(),
        "finished_utc": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "output_dir": output_dir(),
        "config": as_dict(cfg),
        **fields,
    }
    path = ledger_path(cfg.results_dir, key)
    atomic_write_text(path, json.dumps(rec, indent=1, default=str) + "\n")


def run_job(
    cfg: RunConfig,
    task: Callable[[RunConfig], dict | None],
    *,
    multirun: bool | None = None,
    ledger: bool = True,
) -> dict:
    """Run ``task(cfg)`` unless this config already finished in ``cfg.results_dir``.

    Skipping (and the job's lock) applies to sweep jobs only (``multirun=None``: ask Hydra), so
    a single ``python repro/run.py ...`` always runs; every finished job writes its ledger entry
    (``ledger=False``: a single run of a mode that stores no rows, such as a report).
    Returns the task's summary dict (or the stored one when skipped, with ``skipped: True``).
    """
    results_dir = Path(cfg.results_dir)
    key = job_key(cfg)
    multirun = is_multirun() if multirun is None else multirun
    # another sweep running this job: wait for it (at most a day, the longest job we run); a
    # single run takes no lock, so a run refused by its mode leaves no folder behind
    lock = study_lock(results_dir / "jobs", f"{key}.lock", timeout_s=JOB_LOCK_TIMEOUT_S)
    with lock if multirun else contextlib.nullcontext():
        if multirun and cfg.workflow.skip_finished:
            rec = finished_job(results_dir, key)
            if rec is not None:
                log.info(
                    "skip job %s: finished at %s (%d rows)",
                    key,
                    rec.get("finished_utc"),
                    len(rec.get("run_ids", [])),
                )
                return {**rec.get("summary", {}), "skipped": True, "job_key": key}
        before = run_id_sets(results_dir)  # joined only for a task that names no rows
        # a sweep's jobs add part files only; the sweep compacts them once (finish_study)
        # every row made by the task carries the key of its complete config (repro/keys.py)
        with rows_of(cfg), deferred_collect() if multirun else contextlib.nullcontext():
            summary = dict(task(cfg) or {})
        run_ids = summary.get("run_ids") or sorted(
            stored_run_ids(results_dir) - set().union(*before)
        )
        summary = json.loads(json.dumps(summary, default=str))
        if ledger or multirun:
            _write_ledger(cfg, key, status="ok", run_ids=list(run_ids), summary=summary)
    if cfg.logger == "wandb" and run_ids:
        from repro.report.wandb_log import log_job

        rows = read_rows(results_dir)
        log_job(cfg, rows[rows.run_id.isin(run_ids)])
    return {**summary, "skipped": False, "job_key": key}


def record_failure(cfg: RunConfig, error: BaseException) -> None:
    """Write a failed sweep job's ledger entry (``status: error``, what the sweep counts)."""
    try:
        _write_ledger(
            cfg,
            job_key(cfg),
            status="error",
            error=f"{type(error).__name__}: {error}"[:4000],
            run_ids=[],
        )
    except Exception as e:  # noqa: BLE001 - the folder itself may be what failed
        log.warning("could not record the failed job in its ledger: %s", e)


# ---- the sweep's jobs --------------------------------------------------------------------------
def count_jobs(config: DictConfig) -> int | None:
    """How many jobs the basic sweeper will launch (sweep-file params + command-line overrides)."""
    try:
        sizes = [
            len(list(o.sweep_string_iterator()))
            for o in sweep_overrides(config)
            if o.is_sweep_override()
        ]
        return math.prod(sizes)
    except Exception as e:  # a custom sweeper: progress without a total
        log.debug("cannot count jobs: %s", e)
        return None


def _check_one(composer: SweepComposer, n: int, overrides: list[str]) -> RunConfig | str:
    """Job ``n``'s typed config, or the line that says why it is bad."""
    try:
        return validate(composer.task(overrides))
    except Exception as e:  # noqa: BLE001 - every kind of bad point is reported, none run
        shown = " ".join(o for o in overrides if not o.startswith("hydra"))
        return f"job {n} ({shown}): {str(e).strip().splitlines()[0]}"


def _split(checked: list[RunConfig | str]) -> tuple[list[str], list[RunConfig]]:
    bad = [c for c in checked if isinstance(c, str)]
    return bad, [c for c in checked if not isinstance(c, str)]


def _check(
    config: DictConfig, composer: SweepComposer | None = None
) -> tuple[list[str], list[RunConfig]]:
    """(one line per bad job, the typed config of every good job)."""
    composer = composer or SweepComposer(config_loader(), config)
    return _split([_check_one(composer, n, o) for n, o in enumerate(job_overrides(config))])


def joblib_kwargs(config: DictConfig) -> dict:
    """The arguments hydra-joblib-launcher gives ``joblib.Parallel`` for this sweep: its config
    less ``_target_``, the loky backend, and the sizes it reads as integers where they are."""
    from omegaconf import OmegaConf

    kwargs = OmegaConf.to_container(config.hydra.launcher, resolve=True)
    kwargs.pop("_target_", None)
    kwargs["backend"] = "loky"
    for k in ("pre_dispatch", "batch_size", "max_nbytes"):
        if kwargs.get(k):
            with contextlib.suppress(ValueError):  # "2*n_jobs", "auto", "1M" stay text
                kwargs[k] = int(kwargs[k])
    return kwargs


def _check_part(
    load: SweepLoad | ShippedLoad,
    master: DictConfig,
    part: list[tuple[int, list[str]]],
    state: dict,
    sweep_pid: int,
):
    """A joblib worker's share of the pre-check, composed by the composer it keeps for the
    sweep's jobs, under the Hydra state the launcher gives each job (its version base, the
    job's name: they are part of a composed config). A worker (a process other than the
    sweep's, ``sweep_pid``) is first tied to the sweep's life (:func:`_tie_worker`)."""
    _tie_worker(sweep_pid)
    load.enter(state)  # a worker (joblib runs one share there, in order) takes the job's state
    composer = load.composer_for(master)
    checked = [_check_one(composer, n, overrides) for n, overrides in part]
    composed = composer.kept([overrides for _, overrides in part])
    # The jobs' code is loaded and warmed here, in the worker's first task: loky measures a
    # worker's memory after its first task and restarts a worker that grows 300 MB beyond it
    # (its leak guard), which one sized by the check alone reaches while it runs the paper's
    # grid (a restarted worker imports everything again and loses its caches).
    from repro.config import MODES

    for mode in dict.fromkeys(c.mode for c in checked if not isinstance(c, str)):
        MODES[mode].function()
        if MODES[mode].warm is not None:
            MODES[mode].function("warm")()
        elif MODES[mode].rows:
            import numba  # noqa: F401 - the kernels' compiler, loaded at a job's first kernel

    return checked, composed


def _tie_worker(sweep_pid: int) -> None:
    """In a joblib worker: have the kernel kill it when the sweep's process exits, SIGKILL
    included (loky's workers outlive a killed parent otherwise, idle and holding their
    memory), and exit at once when the sweep is already gone. Nothing in the sweep's own
    process (joblib runs a one-worker sweep's tasks there)."""
    if os.getpid() == sweep_pid:
        return
    from system.lifeline import die_with_parent

    die_with_parent()
    if os.getppid() != sweep_pid:  # the sweep died before the line above
        os._exit(137)


def _check_on_workers(config: DictConfig, load: SweepLoad) -> tuple[list[str], list[RunConfig]]:
    """:func:`_check` for the joblib launcher, run by its own worker processes.

    joblib keeps the loky workers of a ``Parallel`` call for the next call with the same
    arguments (its reusable executor), so the workers that check the jobs are the ones that
    then run them: they start (and import the code) while the jobs are checked instead of after,
    and each keeps the configs it composed for the jobs it is given next; this process keeps
    them too, for the sweeper's own check that every job composes. Job n goes to share
    n mod workers, as joblib then hands the jobs out in order to whichever worker is free: a
    worker's share holds the choices of config groups of the jobs it is likely to get (a job it
    did not check is composed from its kept defaults, or from scratch). Were the arguments to
    differ, joblib would start new workers for the jobs: slower, the same result.
    """
    from joblib import Parallel, delayed, effective_n_jobs

    kwargs = joblib_kwargs(config)
    jobs = list(enumerate(job_overrides(config)))
    workers = max(1, min(len(jobs), effective_n_jobs(kwargs.get("n_jobs", -1))))
    parts = [jobs[w::workers] for w in range(workers)]
    state = hydra_state()  # what the launcher ships with every job
    here = os.getpid()
    done = Parallel(**kwargs)(delayed(_check_part)(load, config, p, state, here) for p in parts)
    checked: list[RunConfig | str] = [""] * len(jobs)
    for part, (results, composed) in zip(parts, done, strict=True):
        for (n, _), result in zip(part, results, strict=True):
            checked[n] = result
        load.composer.keep(composed)  # Hydra's sweeper composes every job here once more
    return _split(checked)


def check_jobs(config: DictConfig) -> list[str]:
    """Compose and validate every job of the sweep; returns one line per bad job."""
    return _check(config)[0]


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


# ---- the end of a sweep ------------------------------------------------------------------------
def finish_study(
    cfg: RunConfig,
    *,
    elapsed_s: float | None = None,
    sweep_dir: str | None = None,
    outcome: Outcome | None = None,
    check_s: float | None = None,
) -> dict:
    """Collect, report and (optionally) mirror to wandb; returns where the outputs are.

    ``outcome`` (:func:`count_outcomes`) is what a sweep's summary line counts; a single run (no
    outcome) logs where its rows and report are. The sweep's line also gives the seconds spent
    checking the jobs (``check_s``) and building the report: with the jobs' own time
    (``elapsed_s``), where a sweep's wall time goes (``mode=bench_sweep`` prints them per
    launcher).
    """
    from system.results import has_stored_rows

    results_dir = Path(cfg.results_dir)
    if not has_stored_rows(results_dir):
        log.warning("no rows under %s: nothing to report", results_dir)
        return {"results_dir": str(results_dir)}
    with study_lock(results_dir, ".report.lock"):
        return _finish(cfg, results_dir, elapsed_s, sweep_dir, outcome, check_s)


def _finish(cfg: RunConfig, results_dir: Path, elapsed_s, sweep_dir, outcome, check_s) -> dict:
    import pandas as pd

    from system.results import compact, count_rows

    t0 = time.monotonic()
    runs_csv = results_dir / "runs.csv"
    out = {"results_dir": str(results_dir), "runs_csv": str(runs_csv)}
    if not cfg.workflow.report:
        compact(results_dir)  # the jobs' parts folded in once (nothing new: no rewrite)
    else:
        from repro.report.build import report_study

        paths = report_study(cfg)
        out["report"] = str(paths.report)
        if cfg.logger == "wandb":
            from repro.report.wandb_log import log_comparison

            log_comparison(
                cfg,
                pd.read_csv(paths.best),
                pd.read_csv(paths.variance),
                pd.read_csv(paths.claims),
                paths.figures,
            )
    n_rows = count_rows(results_dir)  # what runs.csv holds: the newest row of each setting
    report_s = time.monotonic() - t0
    if outcome is None:  # a single run
        log.info(
            "%d rows -> %s; report %s (%.1f s)",
            n_rows,
            runs_csv,
            out.get("report", "off"),
            report_s,
        )
        return out
    took = f" in {elapsed_s:.1f} s" if elapsed_s is not None else ""
    check = f"check {check_s:.1f} s, " if check_s is not None else ""
    took += f" ({check}report {report_s:.1f} s)"
    counts = (
        f"{outcome.ran} jobs ran, {outcome.skipped} skipped (already finished), "
        f"{len(outcome.failed)} failed"
    )
    log.info(
        "sweep %s: %s%s; %d rows -> %s; report %s; job folders %s",
        cfg.study,
        counts,
        took,
        n_rows,
        runs_csv,
        out.get("report", "off"),
        sweep_dir or "-",
    )
    return out


READ_AHEAD_EVERY_S = 0.5


def _read_ahead(results_dirs: list[str]) -> Callable[[], None]:
    """Read the parts the workers write while they run (a thread, every half second), so that
    the sweep's fold finds them read (:func:`system.results.read_parts_ahead`). Returns the
    function that stops it; it also stops by itself after :data:`JOB_LOCK_TIMEOUT_S`, or at a
    part it cannot read (the fold then says what is wrong with it)."""
    stop = threading.Event()
    deadline = time.monotonic() + JOB_LOCK_TIMEOUT_S

    def loop() -> None:
        try:
            while not stop.wait(READ_AHEAD_EVERY_S) and time.monotonic() < deadline:
                for d in results_dirs:
                    read_parts_ahead(d)
        except (OSError, ValueError) as e:
            log.debug("parts are no longer read ahead: %s", e)

    thread = threading.Thread(target=loop, name="read-parts-ahead", daemon=True)
    thread.start()

    def halt() -> None:
        stop.set()
        thread.join(timeout=60)

    return halt


def _release_workers(config: DictConfig) -> None:
    """Let joblib's workers go now, while the report is built, instead of when this process
    exits (loky waits for them then). The launcher has returned: no job is left to them, so
    they are killed rather than left to exit, which frees each worker's heap object by object
    and takes the cores from the report for a second or more. With one job at a time joblib ran
    the jobs here and started no worker: nothing to do."""
    from joblib import effective_n_jobs
    from joblib.externals.loky import get_reusable_executor

    if effective_n_jobs(joblib_kwargs(config).get("n_jobs", -1)) > 1:
        get_reusable_executor(reuse=True).shutdown(wait=False, kill_workers=True)


def _launcher_is(config: DictConfig, name: str) -> bool:
    """Whether the sweep's Hydra launcher is the class ``name`` (its ``_target_``'s last part)."""
    return str(config.hydra.launcher.get("_target_", "")).rsplit(".", 1)[-1] == name


class WorkflowCallback(Callback):
    """Check every job first, show progress, collect and report when the sweep ends."""

    def __init__(self, progress: bool = True) -> None:
        self.progress = progress
        self._bar = None
        self._task = None
        self._t0 = 0.0
        self._done = 0
        self._total: int | None = None
        self._studies: dict[str, tuple[RunConfig, dict]] = {}  # results_dir -> (a job, stamps)
        self._check_s: float | None = None
        self._stops: list = []  # what undoes the composer and stops each mode's prefetch
        self._pid = os.getpid()  # the submitting process

    def __getstate__(self) -> dict:
        """What a launcher ships to its workers with Hydra's context (joblib, Slurm): a worker
        only logs its job's end, so the sweep's own machinery (the composer and its configs, the
        helper process, the progress bar) stays here."""
        return {**self.__dict__, "_stops": [], "_bar": None, "_task": None, "_studies": {}}

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        t0 = time.monotonic()
        composer = SweepComposer(config_loader(), config)
        joblib = _launcher_is(config, "JoblibLauncher")
        remove = composer.install(once=joblib)
        if joblib:
            bad, jobs = _check_on_workers(config, composer.loader.load_sweep_config)
        else:
            bad, jobs = _check(config, composer)
        self._check_s = time.monotonic() - t0
        if bad:
            remove()
            for line in bad:
                log.error("%s", line)
            print(
                f"error: {len(bad)} of {count_jobs(config) or '?'} sweep jobs are invalid; "
                f"nothing ran. First: {bad[0]}",
                file=sys.stderr,
            )
            raise SystemExit(2)  # not an Exception: Hydra's callback wrapper lets it through
        by_dir: dict[str, list[RunConfig]] = {}
        for job in jobs:
            by_dir.setdefault(job.results_dir, []).append(job)
        self._studies = {
            d: (js[0], ledger_stamps(d, [job_key(j) for j in js])) for d, js in by_dir.items()
        }
        self._stops = [remove, *self._prefetch(config, jobs)]
        if _launcher_is(config, "BasicLauncher"):  # the jobs run here: the fold keeps their parts
            kept = contextlib.ExitStack()
            kept.enter_context(fold_here(list(self._studies)))
            self._stops.append(kept.close)
        if joblib:  # this process waits for the workers: it prepares the sweep's end meanwhile
            from repro.report.figures import load_plotting

            threading.Thread(target=load_plotting, name="load-plotting", daemon=True).start()
            self._stops.append(_read_ahead(list(self._studies)))
        self._pid = os.getpid()
        self._t0, self._done, self._total = time.monotonic(), 0, len(jobs)
        if self.progress and sys.stdout.isatty():
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TimeElapsedColumn,
                TimeRemainingColumn,
            )

            self._bar = Progress(
                "[progress.description]{task.description}",
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                "eta",
                TimeRemainingColumn(),
                transient=False,
            )
            self._bar.start()
            self._task = self._bar.add_task(f"sweep {config.study}", total=self._total)

    @staticmethod
    def _prefetch(config: DictConfig, jobs: list[RunConfig]) -> list:
        """Serial launcher only (its jobs run in this process, one core stays idle): each mode's
        prefetch of work its jobs share (:attr:`repro.config.ModeSpec.prefetch`)."""
        from repro.config import MODES

        if not _launcher_is(config, "BasicLauncher"):
            return []
        by_mode: dict[str, list[RunConfig]] = {}
        for job in jobs:
            by_mode.setdefault(job.mode, []).append(job)
        return [MODES[m].function("prefetch")(js) for m, js in by_mode.items() if MODES[m].prefetch]

    def on_job_end(self, config: DictConfig, job_return: Any, **kwargs: Any) -> None:
        status = getattr(getattr(job_return, "status", None), "name", "?")
        if os.getpid() != self._pid:  # a launcher's worker (joblib, Slurm): no shared count here
            log.info("job %s in worker process %d", status, os.getpid())
            return
        self._done += 1
        if self._bar is not None:
            self._bar.advance(self._task)
            return
        elapsed = time.monotonic() - self._t0
        left = ""
        if self._total:
            left = f", about {elapsed / self._done * (self._total - self._done):.0f} s left"
        log.info(
            "job %d/%s %s (%.0f s elapsed%s)", self._done, self._total or "?", status, elapsed, left
        )

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        for stop in self._stops:
            stop()
        if _launcher_is(config, "JoblibLauncher"):
            _release_workers(config)
        shutil.rmtree(Path(str(config.hydra.sweep.dir)) / SHARED, ignore_errors=True)
        if self._bar is not None:
            self._bar.stop()
            self._bar = None
        sweep_dir = str(config.hydra.sweep.dir)
        failed = 0
        for results_dir, (job, before) in self._studies.items():
            outcome = count_outcomes(results_dir, before, sweep_dir)
            try:
                finish_study(
                    job,
                    elapsed_s=time.monotonic() - self._t0,
                    sweep_dir=sweep_dir,
                    outcome=outcome,
                    check_s=self._check_s,
                )
            except Exception as e:  # noqa: BLE001 - any report failure fails the command
                if isinstance(e, (ValueError, OSError)):  # a bad input file: its one line
                    log.error("the report of study %s failed", job.study)
                else:  # anything else is a bug: its traceback
                    log.exception("the report of study %s failed", job.study)
                print(f"error: report failed: {type(e).__name__}: {e}", file=sys.stderr)
                raise SystemExit(1) from None
            for f in outcome.failed:
                log.error("failed job %s: %s", f["job_key"], f["error"])
            if outcome.failed:
                print(
                    f"error: {len(outcome.failed)} sweep job(s) failed (recorded under "
                    f"{results_dir}/jobs/; the report covers the others)",
                    file=sys.stderr,
                )
            failed += len(outcome.failed)
        if failed:
            raise SystemExit(1)
