"""Fig. 3 analogue: throughput (PFLOPS) per system, one panel per case, bars per (layers, batch).

The paper's Fig. 3 shows, for each network case, bars of PFLOPS for Megatron, DeepSpeed, ours with
the scheduler and ours with random layouts, over layers {24, 32, 40} × batch {1024, 2048, 4096}.
Baselines are drawn at their best configuration per setting
(:func:`repro.report.variance.best_configs`);
error bars are the standard deviation over repeats when there are several.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pandas as pd

from repro.report.figures import save_figure

log = logging.getLogger(__name__)

__all__ = ["SYSTEM_ORDER", "plot_fig3"]

SYSTEM_ORDER = ("megatron", "deepspeed", "ours", "ours_random")


def _case_key(c: str):
    return (0, int(c)) if str(c).isdigit() else (1, str(c))


def plot_fig3(best: pd.DataFrame, path: str | Path) -> Path | None:
    """Write the figure to ``path`` (PNG); the path, or None when there is nothing to draw."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if best.empty:
        return None
    df = best.copy()
    # PFLOPS when the rows carry it, else throughput relative to the fastest system per setting
    use_pflops = "pflops_mean" in df.columns and df["pflops_mean"].notna().all()
    if use_pflops:
        df["y"] = df["pflops_mean"]
        df["yerr"] = df["pflops_mean"] * df["iter_time_s_std"].fillna(0) / df["iter_time_s_mean"]
    else:
        fastest = df.groupby(["case", "num_layers", "global_batch_size"])[
            "iter_time_s_mean"
        ].transform("min")
        df["y"], df["yerr"] = fastest / df["iter_time_s_mean"], 0.0
    cases = sorted(df.case.unique(), key=_case_key)
    systems = [s for s in SYSTEM_ORDER if s in set(df.system)] + sorted(
        set(df.system) - set(SYSTEM_ORDER)
    )
    fig, axes = plt.subplots(1, len(cases), figsize=(4.2 * len(cases), 3.4), squeeze=False)
    width = 0.8 / max(len(systems), 1)
    for ax, case in zip(axes[0], cases, strict=True):
        sub = df[df.case == case]
        settings = sorted(
            {(int(l), int(b)) for l, b in zip(sub.num_layers, sub.global_batch_size, strict=True)}
        )
        x = np.arange(len(settings))
        for i, system in enumerate(systems):
            s = sub[sub.system == system].set_index(["num_layers", "global_batch_size"])
            y = [float(s.y.get(k, np.nan)) for k in settings]
            e = [float(s.yerr.get(k, 0.0)) for k in settings]
            ax.bar(
                x + (i - (len(systems) - 1) / 2) * width, y, width, yerr=e, label=system, capsize=2
            )
        ax.set_xticks(x, [f"L{l}\nB{b}" for l, b in settings], fontsize=7)
        ax.set_title(f"case {case}")
        ax.set_ylabel("PFLOPS" if use_pflops else "throughput / fastest")
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    return save_figure(fig, path)
