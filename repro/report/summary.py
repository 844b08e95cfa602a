"""Per-setting summary of a simulated grid: each system's PFLOPS/seconds, picks and speed-ups.

One line per (case, num_layers, global_batch_size). Speed-ups are iteration-time ratios in the same
setting (same FLOPs), ``baseline / ours``; the paper's claimed ratio is put beside them. The
baselines' headline columns are under the run's ``baseline_placement``; with ``topology`` the
paper's launch-order protocol goes beside them as ``<baseline>_launch_*`` and
``speedup_vs_<baseline>_launch``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from system.results import SIMULATED_SYSTEMS

__all__ = ["KEYS", "summary_frame", "with_speedups", "merge_summary"]

KEYS = ["case", "num_layers", "global_batch_size"]
SYSTEMS = SIMULATED_SYSTEMS  # one column group each


def summary_frame(lines: list[dict]) -> pd.DataFrame:
    """``lines``: dicts with KEYS and SimResults under ``ours``/``megatron``/``deepspeed``, a list
    of them under ``ours_random``, and ``<baseline>_why`` texts."""
    out = []
    for ln in lines:
        row = {k: ln[k] for k in KEYS}
        row["baseline_placement"] = ln.get("baseline_placement", "launch")
        names = ["ours", "megatron", "deepspeed"]
        names += [f"{b}_launch" for b in ("megatron", "deepspeed") if f"{b}_launch" in ln]
        for name in names:
            res = ln.get(name)
            row[f"{name}_pflops"] = res.pflops if res else None
            row[f"{name}_iter_time_s"] = res.iter_time_s if res else None
            if name != "ours":
                row[f"{name}_config"] = res.label() if res else None
                row[f"{name}_why"] = ln.get(f"{name}_why")
        rnd = ln.get("ours_random") or []
        row["ours_random_pflops"] = float(np.mean([r.pflops for r in rnd])) if rnd else None
        row["ours_random_iter_time_s"] = (
            float(np.mean([r.iter_time_s for r in rnd])) if rnd else None
        )
        out.append(row)
    return pd.DataFrame(out)


def with_speedups(df: pd.DataFrame, paper: dict[str, str]) -> pd.DataFrame:
    """Add speed-ups and the paper's ratios (``paper``: claim_id -> text, paper_claims.csv)."""
    df = df.copy()
    t = {k: pd.to_numeric(df[f"{k}_iter_time_s"], errors="coerce") for k in SYSTEMS}
    df["speedup_vs_megatron"] = t["megatron"] / t["ours"]
    df["speedup_vs_deepspeed"] = t["deepspeed"] / t["ours"]
    df["speedup_vs_best_baseline"] = np.fmin(t["megatron"], t["deepspeed"]) / t["ours"]
    df["speedup_vs_random"] = t["ours_random"] / t["ours"]
    for b in ("megatron", "deepspeed"):
        if f"{b}_launch_iter_time_s" in df.columns:
            launch = pd.to_numeric(df[f"{b}_launch_iter_time_s"], errors="coerce")
            df[f"speedup_vs_{b}_launch"] = launch / t["ours"]
    five = df["case"].astype(str) == "5"
    rest = paper.get("c1to4_vs_baselines", "")
    df["paper_vs_megatron"] = np.where(
        five, paper.get("c5_vs_megatron", ""), f"{rest} (best baseline)" if rest else ""
    )
    df["paper_vs_deepspeed"] = np.where(five, paper.get("c5_vs_deepspeed", ""), "")
    top = paper.get("scheduler_vs_random", "").split("–")[-1]
    df["paper_vs_random"] = np.where(five, f"up to {top}" if top else "", "")
    return df


def merge_summary(path: str | Path, summary: pd.DataFrame) -> pd.DataFrame:
    """``summary`` merged over an existing summary CSV (other sweep jobs); new values win."""
    path = Path(path)
    if not path.exists():
        return summary
    old = pd.read_csv(path, dtype={"case": str}).set_index(KEYS)
    old = old[[c for c in old.columns if not c.startswith(("speedup_", "paper_"))]]
    return summary.set_index(KEYS).combine_first(old).reset_index()
