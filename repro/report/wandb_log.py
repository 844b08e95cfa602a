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

The tidy rows stay the source of truth; wandb only mirrors them.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pandas as pd

from repro.config import RunConfig, as_dict
from repro.config.base import WandbMode
from repro.report.variance import SETTING_COLUMNS, best_configs, config_columns, variance_table

log = logging.getLogger(__name__)

__all__ = ["wandb_mode", "log_job", "log_comparison"]


def wandb_mode(cfg: RunConfig) -> str:
    """``WANDB_MODE`` if set, else ``cfg.wandb.mode``."""
    mode = os.environ.get("WANDB_MODE") or str(cfg.wandb.mode)
    if mode not in {m.value for m in WandbMode}:
        raise ValueError(f"WANDB_MODE must be one of {', '.join(WandbMode)}, got {mode!r}")
    return mode


def _init(cfg: RunConfig, **kw):
    import wandb

    wdir = Path(cfg.wandb.dir or cfg.results_dir)
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
    if hasattr(v, "item"):
        return v.item()
    return None if isinstance(v, float) and pd.isna(v) else v


def log_job(cfg: RunConfig, rows: pd.DataFrame) -> list[str]:
    """One wandb run per setting (case, system, layers, batch) in ``rows``; returns the names.

    A baseline's grid search is one setting: the run's summary is its best configuration and
    the whole grid (every configuration's mean, CV, repeats) goes in a ``grid`` Table.
    """
    if rows.empty or wandb_mode(cfg) == "disabled":
        return []
    resolved = as_dict(cfg)
    stats = variance_table(rows)
    best = best_configs(rows)
    keys = list(SETTING_COLUMNS)
    names = []
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
    return names


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
    if wandb_mode(cfg) == "disabled":
        return None
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
