"""wandb mirror of a study: one run per configuration, plus a comparison run grouped like Fig. 3.

``logger=wandb`` turns it on. The mode comes from ``WANDB_MODE`` when set, else ``wandb.mode``
(default ``offline``: no account, no network; files go to ``<wandb.dir>/wandb/offline-run-*``,
upload later with ``wandb sync``). ``wandb.mode=online`` logs to ``wandb.entity``/``wandb.project``.

- :func:`log_job`: for each setting among a job's rows (case, system, layers, batch), a run with
  the job's resolved config, the setting, its best configuration, a ``grid`` Table of every
  configuration tried (mean, CV, repeats) and the summary metrics of the best one.
- :func:`log_comparison`: one ``job_type=report`` run holding wandb Tables (best configuration per
  setting, variance, claims) and one bar chart per case (PFLOPS per system and setting), plus the
  local PNGs. wandb's Reports API needs network and an account, so offline it is not used: the
  Tables and bar charts of this run are the comparison report; online, build a Report from them in
  the UI (its panels read these keys).

The tidy rows stay the source of truth; wandb only mirrors them: the mirror runs after the rows
are stored, and a failure of wandb's (a server out of reach, a refused login) is one warning
line, the run going on to its report. Every file wandb writes stays under the study's wandb
folder (``wandb.dir``, else ``results_dir``): its run folders in ``wandb/``, and what it would
keep under the home folder (staged Table files, its cache, artifacts) in ``wandb/data``,
``wandb/cache`` and ``wandb/artifact``.
"""

from __future__ import annotations

import contextlib
import logging
import os
from pathlib import Path

import pandas as pd

from repro.config import RunConfig, as_dict
from repro.config.base import WANDB_FOLDER_VARS
from repro.report.variance import SETTING_COLUMNS, best_configs, config_columns, variance_table

log = logging.getLogger(__name__)

__all__ = ["wandb_mode", "wandb_folder", "log_job", "log_comparison"]


def wandb_mode(cfg: RunConfig) -> str:
    """``WANDB_MODE`` if set, else ``cfg.wandb.mode`` (checked with the config, before any
    work: :meth:`repro.config.base.WandbConfig.check_for`)."""
    return cfg.wandb.effective_mode()


def wandb_folder(cfg: RunConfig) -> Path:
    """The folder of the study's wandb files: ``wandb.dir``, else ``results_dir``."""
    return Path(cfg.wandb.dir or cfg.results_dir)


@contextlib.contextmanager
def _folders(cfg: RunConfig):
    """wandb's folders outside its run folders (:data:`WANDB_FOLDER_VARS`: staged Table files,
    which it makes read-only, its cache, downloaded artifacts) under ``<wandb folder>/wandb/``
    while the mirror runs, unless the environment names them (checked to be inside
    ``results_dir``); the environment as it was afterwards."""
    base = wandb_folder(cfg) / "wandb"
    saved = {v: os.environ.get(v) for v in WANDB_FOLDER_VARS}
    try:
        for v in WANDB_FOLDER_VARS:
            if not saved[v]:
                os.environ[v] = str(base / v.removeprefix("WANDB_").removesuffix("_DIR").lower())
        yield
    finally:
        for v, old in saved.items():
            if old is None:
                os.environ.pop(v, None)
            else:
                os.environ[v] = old


# results folders whose mirror failed in this process: their later mirror steps are skipped
_FAILED: set[str] = set()


@contextlib.contextmanager
def _mirror(cfg: RunConfig, what: str):
    """The rows are stored before the mirror runs, and stay the source of truth: a failure of
    wandb (a server out of reach, a refused login, a name it rejects) is one warning line and
    the run goes on to its report; the later mirror steps of the study are skipped."""
    try:
        yield
    except Exception as e:  # noqa: BLE001 - any error of wandb's, the run's rows are stored
        first = (str(e).strip().splitlines() or [""])[0][:300]
        _FAILED.add(str(cfg.results_dir))
        log.warning(
            "wandb mirror failed, skipped for this run (%s): %s: %s", what, type(e).__name__, first
        )


def _init(cfg: RunConfig, **kw):
    import wandb

    wdir = wandb_folder(cfg)
    wdir.mkdir(parents=True, exist_ok=True)
    return wandb.init(
        project=cfg.wandb.project,
        entity=cfg.wandb.entity,
        mode=wandb_mode(cfg),
        dir=str(wdir),
        group=cfg.study,
        reinit="finish_previous",
        **kw,
    )


def _plain(v):
    """A table cell as JSON can hold it: numpy scalars as Python, missing values (None, NaN,
    pandas' NA of a nullable column) as None."""
    if hasattr(v, "item"):
        v = v.item()
    if isinstance(v, (list, tuple, dict, str)):
        return v
    return None if pd.isna(v) else v


def log_job(cfg: RunConfig, rows: pd.DataFrame) -> list[str]:
    """One wandb run per setting (case, system, layers, batch) in ``rows``; returns the names.

    A baseline's grid search is one setting: the run's summary is its best configuration and
    the whole grid (every configuration's mean, CV, repeats) goes in a ``grid`` Table.
    """
    if rows.empty or wandb_mode(cfg) == "disabled" or str(cfg.results_dir) in _FAILED:
        return []
    names: list[str] = []
    with _mirror(cfg, "job runs"), _folders(cfg):
        _log_job(cfg, rows, names)
    return names


def _log_job(cfg: RunConfig, rows: pd.DataFrame, names: list[str]) -> None:
    resolved = as_dict(cfg)
    stats = variance_table(rows)
    best = best_configs(rows)
    keys = list(SETTING_COLUMNS)
    for _, b in best.iterrows():
        setting = {k: _plain(b[k]) for k in keys}
        grid = stats
        for k in keys:
            grid = grid[grid[k].astype(str) == str(setting[k])]
        name = "-".join(f"{k}{setting[k]}" for k in keys)
        best_cfg = {k: _plain(b[k]) for k in config_columns(best) if k not in keys}
        run = _init(
            cfg,
            name=name,
            job_type=cfg.mode,
            config={**resolved, "setting": setting, "best_config": best_cfg},
        )
        run.log({"grid": _table(grid)})
        summary = (
            "n_configs",
            "n_repeats",
            "iter_time_s_mean",
            "iter_time_s_std",
            "cv",
            "pflops_mean",
        )
        run.summary.update({k: _plain(b[k]) for k in summary if k in b.index})
        run.finish()
        names.append(name)
    log.info("wandb (%s): %d runs", wandb_mode(cfg), len(names))


def _table(df: pd.DataFrame):
    import wandb

    df = df.astype(object).where(df.notna(), None)
    return wandb.Table(columns=[str(c) for c in df.columns], data=df.values.tolist())


def log_comparison(
    cfg: RunConfig,
    best: pd.DataFrame,
    variance: pd.DataFrame,
    claims: pd.DataFrame,
    figures: tuple[Path, ...] = (),
) -> str | None:
    """The comparison run (tables + bar charts per case); returns its name or None when off."""
    if wandb_mode(cfg) == "disabled" or str(cfg.results_dir) in _FAILED:
        return None
    with _mirror(cfg, "comparison run"), _folders(cfg):
        return _log_comparison(cfg, best, variance, claims, figures)
    return None


def _log_comparison(cfg, best, variance, claims, figures) -> str:
    import wandb

    name = f"{cfg.study}-report"
    run = _init(cfg, name=name, job_type="report")
    payload = {"best_configs": _table(best), "variance": _table(variance), "claims": _table(claims)}
    y = (
        "pflops_mean"
        if "pflops_mean" in best.columns and best["pflops_mean"].notna().any()
        else "iter_time_s_mean"
    )
    for case, sub in best.groupby("case"):
        t = sub.assign(
            label=sub.system
            + " L"
            + sub.num_layers.astype(str)
            + " B"
            + sub.global_batch_size.astype(str)
        )[["label", y]]
        payload[f"fig3/case{case}"] = wandb.plot.bar(
            _table(t), "label", y, title=f"case {case}: {y}"
        )
    for p in figures:
        payload[f"figures/{Path(p).stem}"] = wandb.Image(str(p))
    run.log(payload)
    run.summary.update({f"claims/{r.claim_id}": r.verdict for r in claims.itertuples()})
    run.finish()
    log.info("wandb (%s): comparison run %s", wandb_mode(cfg), name)
    return name
