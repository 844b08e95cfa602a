"""Fig. 4 analogue: the scheduler ablation, best cost found vs trials, per method and case.

The paper's Fig. 4 compares the genetic scheduler with its tailored local search against the same
search with Kernighan–Lin and against random layouts. Input: the ablation table (case, method,
seed, trial, best_total_cost_s); lines are the median over seeds of the best-so-far cost.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pandas as pd

from repro.report.figures import save_figure

log = logging.getLogger(__name__)

__all__ = ["plot_fig4"]


def plot_fig4(ablation: pd.DataFrame | None, path: str | Path) -> Path | None:
    """Write the figure to ``path`` (PNG); None when there is no usable ablation table."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    need = {"case", "method", "seed", "trial", "best_total_cost_s"}
    if ablation is None or ablation.empty or not need <= set(ablation.columns):
        return None
    a = ablation.assign(case=ablation.case.map(str))
    cases = sorted(a.case.unique(), key=lambda c: (0, int(c)) if c.isdigit() else (1, c))
    fig, axes = plt.subplots(1, len(cases), figsize=(4.0 * len(cases), 3.2), squeeze=False)
    for ax, case in zip(axes[0], cases, strict=True):
        sub = a[a.case == case].sort_values("trial")
        for method, g in sub.groupby("method"):
            # best-so-far per seed, then the median over seeds at each trial
            g = g.assign(best=g.groupby("seed")["best_total_cost_s"].cummin())
            curve = g.groupby("trial")["best"].median()
            ax.plot(
                curve.index,
                curve.to_numpy(),
                label=str(method),
                drawstyle="steps-post",
                marker="o",
                ms=3,
            )
        ax.set_title(f"case {case}")
        ax.set_xlabel("trial")
        ax.set_ylabel("best TOTAL cost (s)")
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    return save_figure(fig, path)
