"""Simulator vs emulated runs: table + figure from ``mode=emulate`` rows (the simulator's
validation).

    python repro/run.py mode=emulation_report results_dir=results/emulation

Reads the study's rows (``runs.parquet``), and writes ``<dir>/validation.csv`` (one line per run),
``<dir>/validation.md`` (MAPE, Kendall τ of the layout ranking, scheduled vs random, link
verification) and ``<dir>/validation.png`` (simulated vs measured, ±10% band).

Kendall τ is computed within each setting (same case, devices, model, batch, pp, dp: only the
layout differs) with :func:`scipy.stats.kendalltau` and pooled over settings, weighted by pairs.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

from repro.report.config import EmulationReportConfig
from repro.report.figures import save_figure
from repro.report.tables import markdown_table
from system.results import atomic_write_text, read_rows, write_set

SETTING = [
    "case",
    "devices",
    "num_devices",
    "pp",
    "dp",
    "global_batch_size",
    "num_layers",
    "hidden_size",
    "emu_bandwidth_scale",
    "emu_delay_scale",
]


def load(results_dir: str | Path) -> pd.DataFrame:
    df = read_rows(results_dir)
    df = df[(df["mode"] == "emulate") & (df["status"] == "ok")].copy()
    for c in ("devices", "stages"):
        df[c] = df[c].map(lambda v: json.dumps(v) if isinstance(v, list) else str(v))
    df["abs_pct_err"] = (df["predicted_iter_time_s"] / df["iter_time_s"] - 1).abs() * 100
    # sensitivity to the warm-up rule: the median of every iteration after the first instead
    its = [json.loads(t) if isinstance(t, str) else list(t) for t in df["iter_times_s"]]
    df["iter_time_after_first_s"] = [float(np.median(t[1:] if len(t) > 1 else t)) for t in its]
    df["setting"] = df[SETTING].astype(str).agg("|".join, axis=1)
    return df


def pooled_kendall(df: pd.DataFrame, a: str, b: str) -> tuple[float, int]:
    """Kendall τ of columns a vs b within each setting, pooled over settings: the mean of the
    settings' τ (SciPy's τ-b) weighted by their number of layout pairs; returns (τ, pairs).

    Without ties τ-b is (concordant − discordant) / pairs, so the pooled value is that ratio over
    all pairs of all settings.

    >>> df = pd.DataFrame({"setting": ["s"] * 3 + ["t"] * 2, "a": [1, 2, 3, 1, 2],
    ...                    "b": [1, 3, 2, 2, 1]})
    >>> pooled_kendall(df, "a", "b")
    (0.0, 4)
    """
    from scipy.stats import kendalltau

    weighted = pairs = 0.0
    for _, g in df.groupby("setting"):
        n = len(g) * (len(g) - 1) // 2
        if n == 0:
            continue
        tau = kendalltau(g[a], g[b]).statistic
        if np.isnan(tau):  # a constant column: no ordering to agree with
            tau = 0.0
        weighted += float(tau) * n
        pairs += n
    return (weighted / pairs if pairs else float("nan")), int(pairs)


def summarize(df: pd.DataFrame) -> dict:
    tau, pairs = pooled_kendall(df, "iter_time_s", "predicted_iter_time_s")
    first = (df["predicted_iter_time_s"] / df["iter_time_after_first_s"] - 1).abs() * 100
    tau_first, _ = pooled_kendall(df, "iter_time_after_first_s", "predicted_iter_time_s")
    speed = []
    for _, g in df.groupby("setting"):
        sch, rnd = g[g["layout"] == "scheduled"], g[g["layout"] == "random"]
        if len(sch) and len(rnd):
            speed.append(
                {
                    "case": g["case"].iloc[0],
                    "devices": g["devices"].iloc[0],
                    "batch": int(g["global_batch_size"].iloc[0]),
                    "hidden": int(g["hidden_size"].iloc[0]),
                    "pp": int(g["pp"].iloc[0]),
                    "dp": int(g["dp"].iloc[0]),
                    "scheduled_s": float(sch["iter_time_s"].mean()),
                    "random_mean_s": float(rnd["iter_time_s"].mean()),
                    "measured_speedup": float(
                        rnd["iter_time_s"].mean() / sch["iter_time_s"].mean()
                    ),
                    "simulated_speedup": float(
                        rnd["predicted_iter_time_s"].mean() / sch["predicted_iter_time_s"].mean()
                    ),
                }
            )
    return {
        "runs": len(df),
        "settings": int(df["setting"].nunique()),
        "mape_pct": float(df["abs_pct_err"].mean()),
        "max_abs_pct_err": float(df["abs_pct_err"].max()),
        "kendall_tau": tau,
        "kendall_pairs": pairs,
        "warmup_iters": sorted({int(w) for w in df["warmup_iters"]})
        if "warmup_iters" in df
        else [1],
        "mape_pct_after_first": float(first.mean()),
        "kendall_tau_after_first": tau_first,
        "delayer_mean_late_ms_max": float(df["delayer_mean_late_ms"].max())
        if "delayer_mean_late_ms" in df
        else float("nan"),
        "mean_signed_err_pct": float(
            ((df["predicted_iter_time_s"] / df["iter_time_s"] - 1) * 100).mean()
        ),
        "verify_all_ok": bool(df["verify_ok"].all()),
        "verify_max_rtt_err": float(df["verify_max_rtt_err"].max()),
        "verify_max_bw_err": float(df["verify_max_bw_err"].max()),
        "verify_max_tcp_err": float(df["verify_max_tcp_err"].max())
        if "verify_max_tcp_err" in df
        else float("nan"),
        "scheduled_vs_random": speed,
    }


def figure(df: pd.DataFrame, path: Path, summary: dict | None = None) -> None:
    """Simulated vs measured iteration time per run, log-log, with the ±10% band."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    fig, ax = plt.subplots(figsize=(5.4, 4.8))
    lo = 0.8 * float(min(df["iter_time_s"].min(), df["predicted_iter_time_s"].min()))
    hi = 1.25 * float(max(df["iter_time_s"].max(), df["predicted_iter_time_s"].max()))
    xs = np.geomspace(lo, hi, 50)
    ax.fill_between(xs, 0.9 * xs, 1.1 * xs, color="0.88", label="±10%", zorder=0)
    ax.plot(xs, xs, "k-", lw=0.8, zorder=1)
    for (case, layout), g in df.groupby(["case", "layout"]):
        ax.scatter(
            g["iter_time_s"],
            g["predicted_iter_time_s"],
            label=f"case {case}, {layout}",
            marker="o" if layout == "scheduled" else "x",
            s=30,
            zorder=3,
        )
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)
    ticks = [t for t in (0.25, 0.5, 1, 2, 5, 10, 20, 50) if lo <= t <= hi]
    for axis in (ax.xaxis, ax.yaxis):
        axis.set_major_locator(matplotlib.ticker.FixedLocator(ticks))
        axis.set_major_formatter(matplotlib.ticker.FixedFormatter([f"{t:g}" for t in ticks]))
        axis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.set_xlabel("measured iteration time on emulated links (s)")
    ax.set_ylabel("simulated iteration time (s)")
    title = "simulator vs emulation (scaled cases 4, 5)"
    if summary:
        title += (
            f"\n{summary['runs']} runs: MAPE {summary['mape_pct']:.1f}%, "
            f"Kendall τ {summary['kendall_tau']:.2f}"
        )
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    save_figure(fig, path, dpi=130)


# The files of the emulation report: one report replaces the last one's whole set
VALIDATION_FILES = ("validation.csv", "validation.json", "validation.md", "validation.png")


def run(cfg: EmulationReportConfig) -> dict:
    d = Path(cfg.results_dir)
    df = load(d)
    if df.empty:
        raise ValueError(f"no ok mode=emulate rows in {d}/runs.parquet")
    s = summarize(df)
    cols = [
        "case",
        "devices",
        "pp",
        "dp",
        "global_batch_size",
        "hidden_size",
        "layout",
        "layout_seed",
        "stages",
        "iter_time_s",
        "predicted_iter_time_s",
        "abs_pct_err",
        "measured_dp_s",
        "sim_dp_span_s",
        "measured_wait_s",
        "sim_pipeline_s",
        "compute_share",
        "verify_max_rtt_err",
        "verify_max_bw_err",
        "verify_max_tcp_err",
        "delayer_mean_late_ms",
        "iter_times_s",
    ]
    table = df[[c for c in cols if c in df]].sort_values(
        ["case", "devices", "pp", "global_batch_size", "hidden_size", "layout", "layout_seed"]
    )
    with write_set(d, name="validation", owns=VALIDATION_FILES) as stage:
        _write_validation(stage, df, s, table)
    print((d / "validation.md").read_text(), end="")
    return {"runs": s["runs"], "mape_pct": s["mape_pct"], "kendall_tau": s["kendall_tau"]}


def _write_validation(stage: Path, df, s: dict, table) -> None:
    """The report's files into the staging folder of their set."""
    atomic_write_text(stage / "validation.csv", table.to_csv(index=False))
    atomic_write_text(stage / "validation.json", json.dumps(s, indent=1))
    ok = s["mape_pct"] <= 10.0 and s["kendall_tau"] >= 0.9 and s["runs"] >= 12
    lines = [
        "# Simulator vs emulated runs",
        "",
        f"{s['runs']} runs in {s['settings']} settings: MAPE {s['mape_pct']:.1f}% "
        f"(max {s['max_abs_pct_err']:.1f}%, mean signed {s['mean_signed_err_pct']:+.1f}%), "
        f"pooled Kendall τ of the layout ranking {s['kendall_tau']:.2f} over "
        f"{s['kendall_pairs']} layout pairs. Target: MAPE ≤ 10% and τ ≥ 0.9 over "
        f"≥ 12 runs: {'MET' if ok else 'MISSED'}.",
        f"Measured = median iteration after {s['warmup_iters']} warm-up iteration(s); with "
        f"only the first left out: MAPE {s['mape_pct_after_first']:.1f}%, τ "
        f"{s['kendall_tau_after_first']:.2f}. Userspace delayer: worst per-run mean release "
        f"lateness {s['delayer_mean_late_ms_max']:.2f} ms.",
        f"Links verified before every run: all within tolerance = {s['verify_all_ok']}, "
        f"max |RTT err| {100 * s['verify_max_rtt_err']:.1f}%, max |capacity err| "
        f"{100 * s['verify_max_bw_err']:.1f}%, max |TCP message err| "
        f"{100 * s['verify_max_tcp_err']:.1f}%.",
        "",
    ]
    runs = pd.DataFrame(
        {
            "case": table["case"],
            "devices": table["devices"],
            "pp×dp": [f"{p}×{q}" for p, q in zip(table["pp"], table["dp"], strict=True)],
            "batch": table["global_batch_size"],
            "hidden": table["hidden_size"],
            "layout": table["layout"],
            "measured s": table["iter_time_s"],
            "simulated s": table["predicted_iter_time_s"],
            "err %": table["abs_pct_err"],
            "DP span meas/sim s": [
                f"{m:.2f}/{p:.2f}"
                for m, p in zip(table["measured_dp_s"], table["sim_dp_span_s"], strict=True)
            ],
            "compute share": table["compute_share"],
            "delayer late ms": table.get("delayer_mean_late_ms", float("nan")),
        }
    )
    lines += [
        markdown_table(runs, floatfmt=".2f", formats={"err %": ".1f"}),
        "",
        "Scheduled vs random layouts (measured on emulated links):",
        "",
    ]
    pairs = pd.DataFrame(s["scheduled_vs_random"]).reindex(
        columns=[
            "case",
            "devices",
            "pp",
            "dp",
            "batch",
            "hidden",
            "scheduled_s",
            "random_mean_s",
            "measured_speedup",
            "simulated_speedup",
        ]
    )
    pairs.insert(2, "pp×dp", [f"{p}×{q}" for p, q in zip(pairs["pp"], pairs["dp"], strict=True)])
    headers = {
        "scheduled_s": "scheduled s",
        "random_mean_s": "random mean s",
        "measured_speedup": "measured ×",
        "simulated_speedup": "simulated ×",
    }
    lines.append(markdown_table(pairs.drop(columns=["pp", "dp"]), floatfmt=".2f", headers=headers))
    atomic_write_text(stage / "validation.md", "\n".join(lines) + "\n")
    figure(df, stage / "validation.png", s)
