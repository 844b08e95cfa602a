"""Sweep bookkeeping: skip finished jobs, keyed by their resolved config; collect the study's rows.

A Hydra job is one resolved configuration. When its mode returns, :func:`run_job` writes a
ledger entry ``<results_dir>/jobs/<job_key>.json`` (atomically, after the mode has written its
rows) naming the rows it produced. A sweep killed half-way and started again skips every job with
a ledger entry whose rows are all still there and reruns the others; rows are keyed by their own
``run_id`` (:mod:`system.results`), so a rerun job replaces its rows instead of duplicating them.

``job_key`` hashes the resolved config without the keys that do not change results
(:data:`NON_RESULT_KEYS`: logging, wandb, the workflow switches). ``python -m repro.collect DIR``
rebuilds ``runs.csv`` / ``runs.parquet`` from the rows.
"""

from __future__ import annotations

import datetime as _dt
import json
import logging
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from system.results import atomic_write_text, collect, read_rows, run_id_for

log = logging.getLogger(__name__)

__all__ = [
    "NON_RESULT_KEYS",
    "SESSION",
    "job_key",
    "ledger_path",
    "finished_job",
    "run_job",
    "collect_study",
    "main",
]

# Keys that only change how a run is reported, never its rows.
NON_RESULT_KEYS = ("logger", "wandb", "workflow", "metrics_out")


@dataclass(slots=True)
class _Session:
    """Counts of this process's jobs (Hydra's basic launcher runs them all in one process)."""

    ran: int = 0
    skipped: int = 0

    def reset(self) -> None:
        self.ran = self.skipped = 0


SESSION = _Session()


def _resolved(cfg: DictConfig | Mapping) -> dict:
    if isinstance(cfg, DictConfig):
        return OmegaConf.to_container(cfg, resolve=True, throw_on_missing=False)  # type: ignore[return-value]
    return json.loads(json.dumps(dict(cfg), default=str))


def job_key(cfg: DictConfig | Mapping) -> str:
    """Stable 16-hex key of a job's resolved config, without :data:`NON_RESULT_KEYS` and hydra."""
    c = _resolved(cfg)
    for k in ("hydra", *NON_RESULT_KEYS):
        c.pop(k, None)
    return run_id_for(c)


def ledger_path(results_dir: str | Path, key: str) -> Path:
    return Path(results_dir) / "jobs" / f"{key}.json"


def finished_job(results_dir: str | Path, key: str) -> dict | None:
    """The ledger entry of a finished job whose rows all still exist, else None."""
    p = ledger_path(results_dir, key)
    if not p.exists():
        return None
    try:
        rec = json.loads(p.read_text())
    except json.JSONDecodeError:
        log.warning("ledger entry %s is unreadable: running the job again", p)
        return None
    rows = Path(results_dir) / "rows"
    missing = [r for r in rec.get("run_ids", []) if not (rows / f"{r}.json").exists()]
    if missing:
        log.warning("job %s lost %d of its rows: running it again", key, len(missing))
        return None
    return rec


def _row_files(results_dir: Path) -> dict[str, float]:
    return {p.stem: p.stat().st_mtime for p in (results_dir / "rows").glob("*.json")}


def _workflow(cfg) -> dict:
    w = cfg.get("workflow") if hasattr(cfg, "get") else None
    return dict(_resolved(w)) if w is not None else {}


def _output_dir() -> str | None:
    try:
        from hydra.core.hydra_config import HydraConfig

        return str(HydraConfig.get().runtime.output_dir)
    except (ImportError, ValueError):  # not under Hydra (tests call run_job directly)
        return None


def _is_multirun() -> bool:
    try:
        from hydra.core.hydra_config import HydraConfig
        from hydra.types import RunMode

        return HydraConfig.get().mode == RunMode.MULTIRUN
    except (ImportError, ValueError):
        return False


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
    multirun = _is_multirun() if multirun is None else multirun
    if multirun and wf.get("skip_finished", True):
        rec = finished_job(results_dir, key)
        if rec is not None:
            SESSION.skipped += 1
            log.info(
                "skip job %s: finished at %s (%d rows)",
                key,
                rec.get("finished_utc"),
                len(rec.get("run_ids", [])),
            )
            return {**rec.get("summary", {}), "skipped": True, "job_key": key}
    before = _row_files(results_dir)
    summary = dict(task(cfg) or {})
    after = _row_files(results_dir)
    run_ids = summary.get("run_ids") or sorted(r for r, t in after.items() if before.get(r) != t)
    rec = {
        "job_key": key,
        "finished_utc": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "run_ids": list(run_ids),
        "output_dir": _output_dir(),
        "summary": json.loads(json.dumps(summary, default=str)),
        "config": _strip(_resolved(cfg)),
    }
    atomic_write_text(ledger_path(results_dir, key), json.dumps(rec, indent=1) + "\n")
    SESSION.ran += 1
    if str(cfg.get("logger", "none")) == "wandb" and run_ids:
        from repro.wandb_log import log_job

        rows = read_rows(results_dir)
        log_job(cfg, rows[rows.run_id.isin(run_ids)])
    return {**summary, "skipped": False, "job_key": key}


def _strip(c: dict) -> dict:
    c = dict(c)
    c.pop("hydra", None)
    return c


def collect_study(results_dir: str | Path) -> Path:
    """Rebuild runs.csv / runs.parquet of a study; returns runs.csv's path."""
    d = Path(results_dir)
    if not (d / "rows").is_dir():
        raise FileNotFoundError(f"{d} has no rows/ folder: nothing ran there yet")
    return collect(d)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m repro.collect RESULTS_DIR", file=sys.stderr)
        return 2
    print(f"collected: {collect_study(args[0])}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
