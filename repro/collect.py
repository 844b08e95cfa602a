"""Sweep bookkeeping: skip finished jobs, record failed ones, keyed by their resolved config.

A Hydra job is one resolved configuration. When its mode returns, :func:`run_job` writes a
ledger entry ``<results_dir>/jobs/<job_key>.json`` (atomically, after the mode has written its
rows) naming the rows it produced; a job that raised gets an entry with ``status: error`` and the
message (:func:`record_failure`), and is run again next time. A sweep killed half-way and started
again skips every finished job whose rows are all stored (``runs.parquet`` or its parts) and
reruns the others. A sweep job's rows go to part files only (:func:`system.results.
deferred_collect`); the sweep folds them into ``runs.parquet`` once, at its end.

``job_key`` hashes the resolved config without the keys that do not change results
(:data:`NON_RESULT_KEYS`) together with the performance model's version
(:func:`system.results.model_version`), so a sweep rerun after a model change recomputes.
While a job runs it holds ``jobs/<job_key>.lock``: a second sweep into the same folder waits for
it and then skips it instead of running it twice.

``python -m repro.collect DIR`` rewrites ``runs.parquet`` (parts, old schema and old
``rows/*.json`` folded in) and ``runs.csv``: what a sweep killed before its end leaves to do.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import json
import logging
import sys
from collections.abc import Callable, Mapping
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

import repro.config  # noqa: F401  (registers the config schema that conf/config.yaml names)
from system.results import (
    atomic_write_text,
    collect,
    deferred_collect,
    has_stored_rows,
    model_version,
    read_rows,
    run_id_for,
    study_lock,
)
from system.results import run_ids as stored_run_ids

log = logging.getLogger(__name__)

__all__ = [
    "NON_RESULT_KEYS",
    "job_key",
    "ledger_path",
    "finished_job",
    "is_multirun",
    "run_job",
    "record_failure",
    "collect_study",
    "main",
]

# Keys that only change how a run is reported (or how long it may take), never its rows.
NON_RESULT_KEYS = ("logger", "wandb", "workflow", "metrics_out", "limits")
JOB_LOCK_TIMEOUT_S = 24 * 3600.0


def _resolved(cfg: DictConfig | Mapping) -> dict:
    if isinstance(cfg, DictConfig):
        return OmegaConf.to_container(cfg, resolve=True, throw_on_missing=False)  # type: ignore[return-value]
    return json.loads(json.dumps(dict(cfg), default=str))


def job_key(cfg: DictConfig | Mapping) -> str:
    """Stable 16-hex key of a job: resolved config (less :data:`NON_RESULT_KEYS`, hydra) + model."""
    c = _resolved(cfg)
    for k in ("hydra", *NON_RESULT_KEYS):
        c.pop(k, None)
    c["model_version"] = model_version()
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
    missing = set(rec.get("run_ids", [])) - stored_run_ids(results_dir)
    if missing:
        log.warning("job %s lost %d of its rows: running it again", key, len(missing))
        return None
    return rec


def _workflow(cfg) -> dict:
    w = cfg.get("workflow") if hasattr(cfg, "get") else None
    return dict(_resolved(w)) if w is not None else {}


def _output_dir() -> str | None:
    try:
        from hydra.core.hydra_config import HydraConfig

        return str(HydraConfig.get().runtime.output_dir)
    except (ImportError, ValueError):  # not under Hydra (tests call run_job directly)
        return None


def is_multirun() -> bool:
    try:
        from hydra.core.hydra_config import HydraConfig
        from hydra.types import RunMode

        return HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN
    except (ImportError, ValueError):
        return False


def _write_ledger(results_dir: Path, key: str, **fields) -> None:
    rec = {
        "job_key": key,
        "model_version": model_version(),
        "finished_utc": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "output_dir": _output_dir(),
        **fields,
    }
    atomic_write_text(ledger_path(results_dir, key), json.dumps(rec, indent=1, default=str) + "\n")


def run_job(
    cfg: DictConfig, task: Callable[[DictConfig], dict | None], *, multirun: bool | None = None
) -> dict:
    """Run ``task(cfg)`` unless this resolved config already finished in ``cfg.results_dir``.

    Skipping applies to multirun jobs only (``multirun=None``: ask Hydra), so a single
    ``python repro/run.py ...`` always runs; every finished job writes its ledger entry.
    Returns the task's summary dict (or the stored one when skipped, with ``skipped: True``).
    """
    results_dir = Path(str(cfg.results_dir))
    key = job_key(cfg)
    wf = _workflow(cfg)
    multirun = is_multirun() if multirun is None else multirun
    # another sweep running this job: wait for it (at most a day, the longest job we run)
    with study_lock(results_dir / "jobs", f"{key}.lock", timeout_s=JOB_LOCK_TIMEOUT_S):
        if multirun and wf.get("skip_finished", True):
            rec = finished_job(results_dir, key)
            if rec is not None:
                log.info(
                    "skip job %s: finished at %s (%d rows)",
                    key,
                    rec.get("finished_utc"),
                    len(rec.get("run_ids", [])),
                )
                return {**rec.get("summary", {}), "skipped": True, "job_key": key}
        before = stored_run_ids(results_dir)
        # a sweep's jobs add part files only; the sweep compacts them once (finish_study)
        with deferred_collect() if multirun else contextlib.nullcontext():
            summary = dict(task(cfg) or {})
        run_ids = summary.get("run_ids") or sorted(stored_run_ids(results_dir) - before)
        _write_ledger(
            results_dir,
            key,
            status="ok",
            run_ids=list(run_ids),
            summary=json.loads(json.dumps(summary, default=str)),
            config=_strip(_resolved(cfg)),
        )
    if str(cfg.get("logger", "none")) == "wandb" and run_ids:
        from repro.report.wandb_log import log_job

        rows = read_rows(results_dir)
        log_job(cfg, rows[rows.run_id.isin(run_ids)])
    return {**summary, "skipped": False, "job_key": key}


def record_failure(cfg: DictConfig, error: BaseException) -> None:
    """Write a failed sweep job's ledger entry (``status: error``, what the sweep's summary
    counts) when its config resolves."""
    try:
        key = job_key(cfg)
    except Exception:  # noqa: BLE001 - an unresolvable config still counts as a failure
        key = None
    if key is None:
        return
    try:
        _write_ledger(
            Path(str(cfg.results_dir)),
            key,
            status="error",
            error=f"{type(error).__name__}: {error}"[:4000],
            run_ids=[],
            config=_strip(_resolved(cfg)),
        )
    except Exception as e:  # noqa: BLE001 - the folder itself may be what failed
        log.warning("could not record the failed job in its ledger: %s", e)


def _strip(c: dict) -> dict:
    c = dict(c)
    c.pop("hydra", None)
    return c


def collect_study(results_dir: str | Path) -> Path:
    """Rewrite a study's runs.parquet (upgraded, parts folded in) and runs.csv; returns
    runs.csv's path."""
    d = Path(results_dir)
    if not has_stored_rows(d):
        raise FileNotFoundError(f"{d} has no runs.parquet, parts/ or rows/: nothing ran there yet")
    return collect(d)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m repro.collect RESULTS_DIR", file=sys.stderr)
        return 2
    try:
        print(f"collected: {collect_study(args[0])}")
    except (FileNotFoundError, NotADirectoryError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
