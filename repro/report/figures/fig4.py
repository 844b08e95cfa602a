"""Fig. 4 analogue: the scheduler ablation, best cost found vs trials, per method and case.

The paper's Fig. 4 compares the genetic scheduler with its tailored local search against the same
search with Kernighan–Lin and against random layouts. Input: the ablation table (case, method,
seed, trial, best_total_cost_s, as ``python repro/ablation.py`` writes it); lines are the median
over seeds of the best-so-far cost, bands span the seeds, and the trial axis is logarithmic.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pandas as pd

from repro.report.figures import save_figure

log = logging.getLogger(__name__)

__all__ = ["METHOD_COLORS", "plot_fig4"]

# the ablation's method labels (repro/ablation.py METHODS); others get matplotlib's cycle
METHOD_COLORS = {"tailored": "tab:blue", "kl": "tab:orange", "random": "tab:gray"}


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
    fig, axes = plt.subplots(1, len(cases), figsize=(3.6 * len(cases), 3.2), squeeze=False)
    for ax, case in zip(axes[0], cases, strict=True):
        sub = a[a.case == case]
        for method, g in sub.groupby("method", sort=False):
            # best-so-far per seed (carried forward where a seed stopped earlier), then the
            # median over seeds, with the band between the best and the worst seed
            curve = g.pivot_table(index="trial", columns="seed", values="best_total_cost_s")
            curve = curve.sort_index().cummin().ffill()
            x = curve.index.to_numpy() + 1  # trial 0 on a log axis
            color = METHOD_COLORS.get(str(method))
            ax.plot(x, curve.median(axis=1), color=color, label=str(method), drawstyle="steps-post")
            ax.fill_between(
                x, curve.min(axis=1), curve.max(axis=1), color=color, alpha=0.2, step="post"
            )
        ax.set_xscale("log")  # random layouts run thousands of trials, the GA tens
        ax.set_title(f"case {case}")
        ax.set_xlabel("trial + 1 (random: layouts)")
    axes[0][0].set_ylabel("best TOTAL cost (s / iteration)")
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    return save_figure(fig, path)
