"""``REPORT.md`` and the predicted-vs-measured figure for a folder of Sailor plans.

Everything here is computed from :class:`~system.external.sailor.predict.PlanRow` (no text is
hand-tuned per run): the MAPE table per set beside Sailor's own simulator's, the same split by
profile-row kind, signed and absolute error per measured plan, the logged gradient reduction
(``red_grads``) against its prediction per set and per plan, the excluded plans with their
reasons, the recorded warnings, and the model's constants (none is fitted to a measured
iteration).
"""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from repro.studies.external.score import (
    errors_frame,
    mape_table,
    profile_rows_table,
    warnings_frame,
)
from system.external.sailor.predict import PlanRow
from system.markdown import md_cell

__all__ = ["CONSTANTS", "render_report", "plot_predicted_vs_measured"]

# Every constant of the framework model, its value and where it comes from. None is fitted.
CONSTANTS: list[tuple[str, str, str]] = [
    ("bytes per element", "4", "FP32 training: Sailor's ds_config has no fp16/bf16 section"),
    ("gradient bucket", "5e8 elements", "DeepSpeed MEMORY_OPT_ALLREDUCE_SIZE"),
    ("early-send buffer", "4 MiB", "NCCL_BUFFSIZE default"),
    ("meta tensor", "1 KiB", "DeepSpeed TENSOR_META_SIZE (256 int32)"),
    ("profiled transformer layers", "2", "Sailor's profile.sh --num_prof_layers 2"),
    ("Adam state", "16 B/parameter", "FP32 weight, gradient, two moments"),
    ("CUDA context + allocator", "1 GiB", "assumption (memory only)"),
    ("GPU memory bandwidth", "datasheet", "system/gpus.py (bucket copies only)"),
    (
        "all-reduce algorithm (`dp_collective=auto`)",
        "NCCL's tuner",
        "NCCL 2.27.7 src/graph/tuning.cc constants (system/simulator/nccl_tuner.py)",
    ),
]


def _fmt(x, spec: str = ".3f", unit: str = "") -> str:
    """``x`` formatted with ``unit`` after it; empty for a missing value."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return ""
    return format(x, spec) + unit


def _num(x) -> float | None:
    return None if x is None or pd.isna(x) else float(x)


def render_report(rows: list[PlanRow], *, command: str, figure: str | None) -> str:
    """The report's Markdown."""
    table = mape_table(rows)
    err = errors_frame(rows)
    warn = warnings_frame(rows)
    collectives = sorted({r.prediction.dp_collective for r in rows if r.prediction is not None})
    lines = [
        "# Sailor's validation set: predicted vs measured iteration time",
        "",
        f"Written by `{command}`. Predictions of every plan: `predictions.csv`; per-plan errors:",
        "`errors.csv`; warnings: `warnings.csv`. Model: `system/external/sailor/framework.py`,",
        f"all-reduce algorithm `dp_collective={'/'.join(collectives)}`.",
        "",
        "## MAPE per set",
        "",
        "Sailor's columns are its simulator's errors on the same plans as ours: its published",
        "numbers where the scored plans are those they were published over, else computed from its",
        "published per-plan predictions; blank where it published none for these plans.",
        "",
        "| set | plans | excluded | MAPE | max abs error | mean signed error | Sailor's simulator"
        " MAPE | Sailor's max abs error | `red_grads` MAPE (below) |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for _, t in table.iterrows():
        lines.append(
            f"| {md_cell(t['set'])} | {t['plans']} | {t['excluded']} | "
            f"{_fmt(t['mape_pct'], '.1f', '%')} | "
            f"{_fmt(t['max_abs_error_pct'], '.1f', '%')} | "
            f"{_fmt(t['mean_signed_error_pct'], '+.1f', '%')} | "
            f"{_fmt(t['sailor_mape_pct'], '.1f', '%')} | "
            f"{_fmt(t['sailor_max_abs_error_pct'], '.1f', '%')} | "
            f"{_fmt(t['red_grads_mape_pct'], '.1f', '%')} |"
        )
    unmeasured = sorted({r.set for r in rows if r.real_s is None})
    if unmeasured:
        lines += ["", f"Sets without measurements (predicted only): {', '.join(unmeasured)}."]
    split = profile_rows_table(rows)
    if len(split):
        lines += [
            "",
            "Split by profile row (the GH-96 OPT-350 tp 4 rows whose forward times are round",
            "numbers are a known defect of the data; warnings below):",
            "",
            "| set | profile rows | plans | MAPE | max abs error |",
            "| --- | --- | --- | --- | --- |",
        ]
        lines += [
            f"| {md_cell(t['set'])} | {t['rows']} | {t['plans']} | "
            f"{_fmt(t['mape_pct'], '.1f', '%')} | "
            f"{_fmt(t['max_abs_error_pct'], '.1f', '%')} |"
            for _, t in split.iterrows()
        ]
    if figure:
        lines += ["", f"![predicted vs measured]({figure})"]
    lines += [
        "",
        "## Per plan",
        "",
        "| plan | measured s | ours s | signed | abs | Sailor's s | Sailor signed |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for _, e in err.iterrows():
        lines.append(
            f"| {md_cell(e['plan'])} | {e['real_s']:.4g} | {e['predicted_iter_time_s']:.4g} | "
            f"{e['signed_error_pct']:+.1f}% | {e['abs_error_pct']:.1f}% | "
            f"{_fmt(_num(e['sailor_simulator_s']), '.4g')} | "
            f"{_fmt(_num(e['sailor_signed_error_pct']), '+.1f', '%')} |"
        )
    lines += _red_grads_lines(table, err)
    excluded = [r for r in rows if r.prediction is None]
    lines += ["", "## Excluded plans", ""]
    lines += [f"- `{r.plan}`: {r.excluded}" for r in excluded] or ["None."]
    lines += ["", "## Warnings (known data defects, worked around)", ""]
    if len(warn):
        for (field, msg), g in warn.groupby(["field", "message"], sort=True):
            lines.append(f"- {len(g)} plan(s): `{field}`: {msg}")
    else:
        lines.append("None.")
    lines += [
        "",
        "## Constants",
        "",
        "No constant of the model is fitted to a measured iteration (so none is fitted on",
        "clariden OPT-350 and nothing carries over to GPT-Neo or the heterogeneous set).",
        "",
        "| constant | value | source |",
        "| --- | --- | --- |",
    ]
    lines += [f"| {n} | {v} | {s} |" for n, v, s in CONSTANTS]
    return "\n".join(lines) + "\n"


def _red_grads_lines(table: pd.DataFrame, err: pd.DataFrame) -> list[str]:
    """The logged gradient reduction against its prediction: per set, then per plan."""
    if not len(err) or err["measured_red_grads_s"].isna().all():
        return []
    lines = [
        "",
        "## The logged gradient reduction (`red_grads`)",
        "",
        "Predicted: global rank 0 (stage 0, replica 0, TP rank 0) from its `ReduceGrads` call to",
        "its return — the wait for the slowest member of its data-parallel group (zero: every",
        "rank leaves `ReduceTiedGrads`'s barrier together) plus its stage's all-reduce and the",
        "bucket copies. Plans without data parallelism still flatten and copy their gradients.",
        "",
        "| set | plans | MAPE | with dp > 1 | their MAPE | median measured / predicted |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for _, t in table.iterrows():
        lines.append(
            f"| {md_cell(t['set'])} | {t['red_grads_plans']} | "
            f"{_fmt(t['red_grads_mape_pct'], '.1f', '%')} | {t['red_grads_dp_plans']} | "
            f"{_fmt(t['red_grads_dp_mape_pct'], '.1f', '%')} | "
            f"{_fmt(t['red_grads_dp_median_ratio'], '.2f', '×')} |"
        )
    lines += [
        "",
        "| plan | algorithm | measured s | predicted s | signed |",
        "| --- | --- | --- | --- | --- |",
    ]
    for _, e in err.dropna(subset=["measured_red_grads_s"]).iterrows():
        lines.append(
            f"| {md_cell(e['plan'])} | {e['dp_algorithm']} | {e['measured_red_grads_s']:.4g} | "
            f"{e['predicted_red_grads_s']:.4g} | "
            f"{_fmt(_num(e['red_grads_signed_error_pct']), '+.1f', '%')} |"
        )
    return lines


def plot_predicted_vs_measured(rows: list[PlanRow], path: str | Path) -> None:
    """Log-log scatter of predicted vs measured seconds per iteration, ours and Sailor's,
    with the diagonal and a ±5% band."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    err = errors_frame(rows)
    fig, ax = plt.subplots(figsize=(6.4, 5.6))
    if len(err):
        lo = 0.8 * min(err["real_s"].min(), err["predicted_iter_time_s"].min())
        hi = 1.25 * max(err["real_s"].max(), err["predicted_iter_time_s"].max())
        xs = [lo, hi]
        ax.plot(xs, xs, color="0.3", lw=1, label="predicted = measured")
        ax.fill_between(
            xs, [x * 0.95 for x in xs], [x * 1.05 for x in xs], color="0.85", label="±5%"
        )
        for s, marker in zip(sorted(err["set"].unique()), "os^v", strict=False):
            e = err[err["set"] == s]
            ax.scatter(e["real_s"], e["predicted_iter_time_s"], marker=marker, label=f"ours, {s}")
            sl = e.dropna(subset=["sailor_simulator_s"])
            ax.scatter(
                sl["real_s"],
                sl["sailor_simulator_s"],
                marker=marker,
                facecolors="none",
                edgecolors="0.4",
                label=f"Sailor's simulator, {s}",
            )
        ax.set_xlim(lo, hi)
        ax.set_ylim(lo, hi)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("measured seconds per iteration")
    ax.set_ylabel("predicted seconds per iteration")
    ax.set_title("Sailor's GH200 runs: predicted vs measured")
    ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=120, format="png")
    plt.close(fig)
