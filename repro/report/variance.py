"""Repeats of a setting: mean, coefficient of variation, flags; the best configuration per setting.

The paper ran every setting three times and reports that the runs varied within 5% (appendix 10.1;
the scheduled layout stays fixed across the three runs, random layouts change every run). Here a
*setting* is (case, system, num_layers, global_batch_size); a *configuration* adds the layout knobs
a baseline grid search varies (tp, pp, dp, micro_batch_size, zero). Rows come from
:func:`system.results.read_rows` (one row per run; ``repeat`` numbers the runs of a configuration).

    >>> import pandas as pd
    >>> rows = pd.DataFrame({"case": ["5"] * 3, "system": ["ours"] * 3, "num_layers": [24] * 3,
    ...                      "global_batch_size": [1024] * 3, "status": ["ok"] * 3,
    ...                      "iter_time_s": [10.0, 10.2, 9.8], "pflops": [2.0, 1.96, 2.04]})
    >>> t = variance_table(rows)
    >>> int(t.n_repeats[0]), round(float(t.cv[0]), 3), bool(t.flagged[0])
    (3, 0.02, False)
"""

from __future__ import annotations

import logging

import numpy as np
import pandas as pd

log = logging.getLogger(__name__)

__all__ = [
    "SETTING_COLUMNS",
    "CONFIG_COLUMNS",
    "CV_LIMIT",
    "MEASURED_MODES",
    "ok_mask",
    "ok_rows",
    "measured_mask",
    "measured_rows",
    "config_columns",
    "variance_table",
    "best_configs",
]

SETTING_COLUMNS = ("case", "system", "num_layers", "global_batch_size")
# a baseline's grid-search knobs, including where its ranks were placed (launch / topology)
CONFIG_COLUMNS = (
    "tp",
    "pp",
    "dp",
    "micro_batch_size",
    "zero",
    "recompute",
    "placement",
    # the frameworks' features: Megatron's virtual stages and distributed optimizer with its
    # overlap, DeepSpeed's overlap_comm (configurations that differ only here are not repeats)
    "virtual_stages",
    "distributed_optimizer",
    "overlap_grad_reduce",
    "overlap_param_gather",
    "overlap_comm",
)
CV_LIMIT = 0.05  # appendix 10.1: "variance within 5%"
# Modes whose rows are timed runs. ``simulate`` rows are deterministic: their "repeats" are
# scheduler seeds (ours) and random layouts (ours_random) or identical copies (baselines), so
# they say nothing about run-to-run noise.
MEASURED_MODES = ("emulate", "train")


def ok_mask(rows: pd.DataFrame) -> pd.Series:
    """Which rows :func:`ok_rows` keeps: status ok (or none) and a positive finite iteration
    time."""
    missing = [c for c in (*SETTING_COLUMNS, "iter_time_s") if c not in rows.columns]
    if missing:
        raise ValueError(f"rows: missing columns {missing}; have {sorted(rows.columns)}")
    iter_time_s = pd.to_numeric(rows["iter_time_s"], errors="coerce")
    keep = np.isfinite(iter_time_s) & (iter_time_s > 0)
    if "status" in rows.columns:
        keep &= rows["status"].fillna("ok").astype(str) == "ok"
    return keep.fillna(False).astype(bool)  # a missing time is not a positive one


def ok_rows(rows: pd.DataFrame) -> pd.DataFrame:
    """Rows with status ok and a positive iteration time; ``case`` as text ("5", "debug")."""
    df = rows[ok_mask(rows)]  # one copy, of the rows kept only: a study's report asks this often
    df["iter_time_s"] = pd.to_numeric(df["iter_time_s"], errors="coerce")
    df["case"] = _map_distinct(df["case"], _case_text)
    if "pflops" in df.columns:
        df["pflops"] = pd.to_numeric(df["pflops"], errors="coerce")
    return df.reset_index(drop=True)


def measured_rows(rows: pd.DataFrame) -> pd.DataFrame:
    """Rows of timed runs (``mode`` in :data:`MEASURED_MODES`); rows without a ``mode`` column
    are taken as given (their writer did not say)."""
    if "mode" not in rows.columns:
        return rows
    return rows[measured_mask(rows)]


def measured_mask(rows: pd.DataFrame) -> pd.Series:
    """Which rows :func:`measured_rows` keeps."""
    if "mode" not in rows.columns:
        return pd.Series(True, index=rows.index)
    return rows["mode"].astype(str).isin(MEASURED_MODES)


def _map_distinct(values: pd.Series, func) -> pd.Series:
    """``values.map(func)``, calling ``func`` once per distinct value (a study's rows hold a
    handful of cases): the distinct values, missing included, are mapped as a Series of the
    same dtype, then put back in place. Python objects are mapped one by one: factorize takes
    None and NaN for the same missing value, which ``func`` may tell apart."""
    if values.dtype == object:
        return values.map(func)
    codes, distinct = pd.factorize(values, use_na_sentinel=False)
    mapped = pd.Series(distinct).map(func)
    return pd.Series(mapped.array.take(codes), index=values.index, name=values.name)


def _case_text(v) -> str:
    """5, 5.0, "5" -> "5"; other names unchanged."""
    if isinstance(v, float) and v.is_integer():
        return str(int(v))
    return str(v)


def config_columns(rows: pd.DataFrame) -> list[str]:
    """The setting columns plus whichever configuration knobs the rows carry."""
    return list(SETTING_COLUMNS) + [c for c in CONFIG_COLUMNS if c in rows.columns]


def variance_table(rows: pd.DataFrame, cv_limit: float = CV_LIMIT) -> pd.DataFrame:
    """One line per configuration: repeats, mean/std of iter_time_s, CV, spread, flagged.

    ``cv`` is the sample standard deviation over the mean (NaN with one repeat); ``spread`` is
    (max - min) / mean; ``flagged`` is ``cv > cv_limit``.
    """
    if not 0 < cv_limit < 1:
        raise ValueError(f"cv_limit must be in (0, 1), got {cv_limit}")
    df = ok_rows(rows)
    keys = config_columns(df)
    if df.empty:
        return pd.DataFrame(
            columns=[
                *keys,
                "n_repeats",
                "iter_time_s_mean",
                "iter_time_s_std",
                "cv",
                "spread",
                "flagged",
            ]
        )
    groups = df.groupby(keys, dropna=False, sort=True)  # grouped once, for both columns
    out = groups["iter_time_s"].agg(
        n_repeats="size", iter_time_s_mean="mean", iter_time_s_std="std", _min="min", _max="max"
    )
    if "pflops" in df.columns:
        out["pflops_mean"] = groups["pflops"].mean()
    out = out.reset_index()
    one = out["n_repeats"] < 2
    out.loc[one, "iter_time_s_std"] = np.nan
    out["cv"] = out["iter_time_s_std"] / out["iter_time_s_mean"]
    out["spread"] = (out.pop("_max") - out.pop("_min")) / out["iter_time_s_mean"]
    cols = [*keys, "n_repeats", "iter_time_s_mean", "iter_time_s_std", "cv", "spread"]
    out = out[cols + [c for c in out.columns if c not in cols]]
    out["n_repeats"] = out["n_repeats"].astype(int)
    out["flagged"] = out["cv"].fillna(0.0) > cv_limit
    return out


def best_configs(rows: pd.DataFrame) -> pd.DataFrame:
    """Per setting, the configuration with the lowest mean iteration time (a grid search's pick).

    Systems with a single configuration per setting (ours, ours_random) pass through unchanged.
    Adds ``n_configs`` (how many configurations the search compared); ``pflops_mean`` is NaN when
    the rows carry no pflops.
    """
    table = variance_table(rows)
    if table.empty:
        return table.assign(n_configs=pd.Series(dtype=int))
    keys = list(SETTING_COLUMNS)
    table["n_configs"] = table.groupby(keys, dropna=False)["iter_time_s_mean"].transform("size")
    idx = table.groupby(keys, dropna=False)["iter_time_s_mean"].idxmin()
    best = table.loc[idx.to_numpy()].reset_index(drop=True)
    if "pflops_mean" not in best.columns:
        best["pflops_mean"] = np.nan
    return best.sort_values(keys, kind="stable").reset_index(drop=True)
