"""``results/quality/REPORT.md`` from the stored rows of ``mode=quality_curves`` (and of
``mode=quality_links``, the time per iteration on emulated links, where present).

Targets are the reference's held-out test loss at 25, 50, 75 and 100% of its run (the highest
over its scored seeds at that evaluation, so every reference seed reaches each target). Per
method and target: iterations to the target per seed (linear between evaluations; a seed that
never reaches it counts as infinitely late), the time per iteration (the simulator at paper
scale per case; the emulated runtime where measured), and time to target relative to the
reference — the ratio of the medians over seeds with a percentile-bootstrap 95% interval (the
method's and the reference's seeds resampled independently). A method is "sooner" or "later"
only where the interval excludes 1×.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from repro.studies.quality_curves.methods import GRIDS, REFERENCE, setting_of
from repro.studies.quality_curves.targets import bootstrap_median_ci, iters_to_target, verdict

__all__ = ["build_report", "TARGET_FRACTIONS", "reference_band", "outside_band"]

TARGET_FRACTIONS = (0.25, 0.5, 0.75, 1.0)
RESAMPLES = 10_000
BAND_SLACK = 0.02  # nats: the band is the reference seeds' [min, max] widened by this


def _rows(results_dir: Path) -> pd.DataFrame:
    from repro.studies.quality_curves.run import decoded
    from system.results import read_rows

    df = read_rows(results_dir)
    if df.empty or "mode" not in df.columns:
        return df.iloc[:0]
    df = df[(df["mode"] == "quality_curves") & (df["status"] == "ok")]
    return pd.DataFrame([decoded(r) for r in df.to_dict("records")])


def reference_band(curves: list[list[float]], slack: float = BAND_SLACK) -> np.ndarray:
    """(2, points): the lowest and highest held-out loss of the reference's seeds at each
    evaluation, widened by ``slack``."""
    a = np.asarray(curves, dtype=float)
    if a.ndim != 2 or a.shape[0] < 2:
        raise ValueError("reference_band: needs two or more curves of equal length")
    return np.stack([a.min(axis=0) - slack, a.max(axis=0) + slack])


def outside_band(curve: list[float], band: np.ndarray, *, skip: int = 1) -> list[int]:
    """Indices of the evaluations of ``curve`` outside ``band`` (the first ``skip`` left out:
    the untrained model's loss is the same for every method)."""
    c = np.asarray(curve, dtype=float)
    if c.shape[0] != band.shape[1]:
        raise ValueError(f"outside_band: {c.shape[0]} points against a band of {band.shape[1]}")
    bad = (c < band[0]) | (c > band[1])
    return [int(i) for i in np.nonzero(bad)[0] if i >= skip]


def _ratio_ci(method: np.ndarray, ref: np.ndarray, seed: int = 0) -> tuple[float, float, float]:
    """Median ratio method/reference and its bootstrap 95% interval (seeds resampled)."""
    rng = np.random.default_rng(seed)
    mi = rng.integers(0, method.size, size=(RESAMPLES, method.size))
    ri = rng.integers(0, ref.size, size=(RESAMPLES, ref.size))
    with np.errstate(invalid="ignore", divide="ignore"):
        boot = np.median(method[mi], axis=1) / np.median(ref[ri], axis=1)
        point = float(np.median(method) / np.median(ref))
    boot = np.where(np.isnan(boot), np.inf, boot)
    # inverted_cdf: an order statistic, no interpolation (which turns inf − inf into NaN)
    low, high = np.quantile(boot, [0.025, 0.975], method="inverted_cdf")
    return point, float(low), float(high)


def _fmt(x: float, spec: str = ".2f") -> str:
    if x is None or not np.isfinite(x):
        return "never"
    return format(x, spec)


def _paper_times(cases: list[str], chosen: dict[str, dict]) -> pd.DataFrame:
    from repro.studies.quality_curves.project import paper_iter_time_s

    out = [
        {"case": c, "system": m, "iter_time_s": paper_iter_time_s(c, opts)}
        for c in cases
        for m, opts in chosen.items()
    ]
    return pd.DataFrame(out)


def _baseline_paper_times(cases: list[str]) -> pd.DataFrame:
    """Megatron's and DeepSpeed's simulated seconds per iteration at the same paper-scale
    setting, from the headline sweep's rows (``results/paper``): the best configuration on its
    best topology-aware rank map, and in launch order; NCCL's own collective, ``tc_class``."""
    from repro.studies.quality_curves.project import PAPER_BATCH, PAPER_MODEL
    from system.workload import get_model

    path = Path("results/paper/runs.parquet")
    if not path.is_file():
        return pd.DataFrame()
    cols = ["system", "case", "model", "num_layers", "global_batch_size", "placement"]
    cols += ["link_sharing", "dp_collective_request", "iter_time_s", "status"]
    df = pd.read_parquet(path, columns=cols)
    df = df[
        df["system"].isin(["megatron", "deepspeed"])
        & df["case"].isin(cases)
        & (df["model"] == PAPER_MODEL)
        & (df["num_layers"] == get_model(PAPER_MODEL).num_layers)
        & (df["global_batch_size"] == PAPER_BATCH)
        & (df["link_sharing"] == "tc_class")
        & (df["dp_collective_request"] == "auto")
        & (df["status"] == "ok")
    ]
    g = df.groupby(["case", "system", "placement"])["iter_time_s"].min().reset_index()
    return g


def _plot(df: pd.DataFrame, methods: list[str], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    for m in methods:
        d = df[(df["phase"] == "score") & (df["system"] == m)]
        if d.empty:
            continue
        tokens = np.asarray(d.iloc[0]["eval_iters"]) * d.iloc[0]["global_batch_size"]
        tokens = tokens * d.iloc[0]["seq_length"]
        a = np.asarray(list(d["eval_loss"]), dtype=float)
        (line,) = ax.plot(tokens[1:], np.median(a, axis=0)[1:], label=f"{m} ({len(a)} seeds)")
        ax.fill_between(
            tokens[1:], a.min(axis=0)[1:], a.max(axis=0)[1:], alpha=0.2, color=line.get_color()
        )
    ax.set_xlabel("training tokens")
    ax.set_ylabel("held-out test loss (nats/token)")
    ax.set_xscale("log")
    ax.set_title("Loss against tokens: median over seeds, band = min–max")
    ax.legend(fontsize=8)
    fig.tight_layout()
    tmp = path.with_suffix(".tmp.png")
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    tmp.replace(path)


def _links(results_dir: Path) -> pd.DataFrame:
    """The ``mode=quality_links`` rows (emulated timing and the end-to-end checks)."""
    from system.results import read_rows

    df = read_rows(results_dir)
    if df.empty or "mode" not in df.columns:
        return df.iloc[:0]
    return df[(df["mode"] == "quality_links") & (df["status"] == "ok")].reset_index(drop=True)


def _iters_to(runs: pd.DataFrame, target: float) -> np.ndarray:
    """Iterations to ``target`` per run (inf where never reached)."""
    return np.array(
        [
            np.inf if (n := iters_to_target(i, c, target)) is None else n
            for i, c in zip(runs["eval_iters"], runs["eval_loss"], strict=True)
        ],
        dtype=float,
    )


def build_report(results_dir: str | Path) -> Path:
    """Write REPORT.md, quality_table.csv and quality_curves.png under ``results_dir``."""
    from system.results import atomic_write_text

    d = Path(results_dir)
    df = _rows(d)
    if df.empty:
        raise ValueError(f"build_report: no quality_curves rows in {d}")
    links = _links(d)
    methods = [REFERENCE, *[m for m in GRIDS if m in set(df["system"])]]
    score = df[df["phase"] == "score"]
    tune = df[df["phase"] == "tune"]
    ref = score[score["system"] == REFERENCE]
    if len(ref) < 2:
        raise ValueError(f"build_report: {len(ref)} scored reference runs; need two or more")
    iters = list(ref.iloc[0]["eval_iters"])
    ref_curves = np.asarray(list(ref["eval_loss"]), dtype=float)
    total = int(ref.iloc[0]["iters"])
    at = [min(iters, key=lambda i, f=f: abs(i - f * total)) for f in TARGET_FRACTIONS]
    # the highest of the reference seeds' losses there: a loss every reference seed reaches
    targets = {
        f: float(ref_curves[:, iters.index(a)].max())
        for f, a in zip(TARGET_FRACTIONS, at, strict=True)
    }
    chosen = {
        m: setting_of(score[score["system"] == m].iloc[0]["hparams"])
        for m in methods
        if not score[score["system"] == m].empty
    }
    cases = ["4", "5"]
    paper = _paper_times(cases, chosen)
    per_iter = {(f"paper {r.case}", r.system): r.iter_time_s for r in paper.itertuples()}
    timing = links[links["phase"] == "timing"] if not links.empty else links
    for r in timing.itertuples():
        per_iter[(f"emulated {r.case}", r.system)] = float(r.iter_time_s)
    sources = [f"emulated {c}" for c in cases] + [f"paper {c}" for c in cases]
    band = reference_band(list(ref_curves))

    table = []
    for m in chosen:
        runs = score[score["system"] == m]
        out_pts = [len(outside_band(c, band)) for c in runs["eval_loss"]]
        for f, target in targets.items():
            n, nr = _iters_to(runs, target), _iters_to(ref, target)
            reached = int(np.isfinite(n).sum())
            med, lo, hi = (
                bootstrap_median_ci(n) if reached == len(n) else (np.median(n), np.nan, np.nan)
            )
            ri, rlo, rhi = _ratio_ci(n, nr)
            row = dict(
                method=m,
                target_fraction=f,
                target_loss=target,
                seeds=len(n),
                reached=reached,
                iters_median=float(med),
                iters_ci_low=lo,
                iters_ci_high=hi,
                iters_ratio=ri,
                iters_ratio_low=rlo,
                iters_ratio_high=rhi,
                band_points_outside=int(np.median(out_pts)),
            )
            for src in sources:
                if (src, m) not in per_iter or (src, REFERENCE) not in per_iter:
                    continue
                k = per_iter[(src, m)] / per_iter[(src, REFERENCE)]
                tag = src.replace(" ", "_case")
                row[f"s_per_iter_{tag}"] = per_iter[(src, m)]
                row[f"time_ratio_{tag}"] = ri * k
                row[f"time_ratio_low_{tag}"] = rlo * k
                row[f"time_ratio_high_{tag}"] = rhi * k
                row[f"verdict_{tag}"] = verdict(rlo * k, rhi * k)
            table.append(row)
    tab = pd.DataFrame(table)
    atomic_write_text(d / "quality_table.csv", tab.to_csv(index=False, float_format="%.6g"))
    _plot(df, list(chosen), d / "quality_curves.png")
    base = _baseline_paper_times(cases)
    checks = links[links["phase"] == "check"] if not links.empty else links
    text = _markdown(df, tune, tab, targets, at, chosen, per_iter, sources, base, checks)
    out = d / "REPORT.md"
    atomic_write_text(out, text)
    return out


def _ratio_cell(r, tag: str) -> str:
    v = getattr(r, f"time_ratio_{tag}", None)
    if v is None or (isinstance(v, float) and np.isnan(v)):
        return "—"
    lo, hi = getattr(r, f"time_ratio_low_{tag}"), getattr(r, f"time_ratio_high_{tag}")
    return f"{_fmt(v)}× [{_fmt(lo)}–{_fmt(hi)}] {getattr(r, f'verdict_{tag}')}"


def _markdown(df, tune, tab, targets, at, chosen, per_iter, sources, base, checks) -> str:
    r0 = df.iloc[0]
    tokens_per_iter = int(r0["global_batch_size"]) * int(r0["seq_length"])
    epochs = int(r0["iters"]) * int(r0["global_batch_size"]) / int(r0["train_sequences"])
    n_ref = df[(df["phase"] == "score") & (df["system"] == REFERENCE)].shape[0]
    lines = [
        "# Time to quality",
        "",
        "Rebuilt from the stored rows by `python repro/run.py mode=report "
        "results_dir=results/quality`; the rows come from `python repro/run.py "
        "mode=quality_curves results_dir=results/quality` (loss against tokens: trains only the "
        "runs not stored yet) and `python repro/run.py mode=quality_links "
        "results_dir=results/quality` (seconds per iteration on emulated links, root).",
        "",
        "## Setup",
        "",
        f"- GPT `{r0['model']}` ({int(r0['num_layers'])} layers), the character-level corpus, "
        f"{int(r0['train_sequences'])} training windows of {int(r0['seq_length'])} tokens "
        f"({epochs:.1f} epochs), global batch {int(r0['global_batch_size'])} "
        f"({tokens_per_iter} tokens), pp 2 × dp 2, {int(r0['iters'])} iterations, AdamW with a "
        "linear warm-up and cosine decay to 10% of the peak rate.",
        "- Loss against tokens from runs trained in one process with the runtime's own parts "
        "(`system/runtime/inprocess.py`; a test shows its losses equal the launched runtime's "
        "for eight variants): loss per token needs no links. Held-out loss every "
        f"{int(r0['eval_every'])} iterations on {int(r0['eval_sequences'])} windows: the "
        "validation half of the held-out text for tuning, the test half for scoring.",
        f"- Equal budget: {len(tune) // max(1, tune['system'].nunique())} settings per method "
        "on the validation split at one seed; the chosen setting then at "
        f"{n_ref} seeds on the test split. Time to target = iterations to target × seconds "
        "per iteration, both factors below.",
        "",
        "## Tuning (validation split)",
        "",
        "A method's setting is the one reaching the reference's validation loss at 75% of its "
        "run soonest in time on case 5 at paper scale (iterations × the simulator's seconds per "
        "iteration for that setting); the reference's is its lowest final loss.",
        "",
        "| method | setting | final val loss | chosen |",
        "| --- | --- | --- | --- |",
    ]
    for r in tune.sort_values(["system", "lr"]).itertuples():
        h = setting_of(r.hparams)
        mark = "✓" if h == chosen.get(r.system) else ""
        lines.append(f"| {r.system} | `{r.hparams}` | {r.eval_loss[-1]:.4f} | {mark} |")
    unscored = sorted(set(tune["system"]) - set(chosen))
    if unscored:
        lines += [
            "",
            f"**Not scored yet: {', '.join(unscored)}** — tuned above, their test-split seeds "
            "not run (the same command trains them; stored runs are skipped).",
        ]
    short = {m: n for m, n in df[df["phase"] == "score"].groupby("system").size().items()}
    short = {m: n for m, n in short.items() if n < n_ref}
    if short:
        lines += [
            "",
            "Fewer scored seeds than the reference: "
            + ", ".join(f"{m} {n}" for m, n in sorted(short.items()))
            + ".",
        ]
    lines += ["", "## Targets (the highest test loss of the reference's seeds there)", ""]
    lines += [
        f"- {int(f * 100)}% of its run (iteration {a}): {targets[f]:.4f}"
        for f, a in zip(TARGET_FRACTIONS, at, strict=True)
    ]
    lines += [
        "",
        "## Iterations to target (test split; medians over seeds, 95% bootstrap intervals)",
        "",
        "| method | target | reached | iterations | iterations / reference |",
        "| --- | --- | --- | --- | --- |",
    ]
    for r in tab.itertuples():
        ci = (
            f"{_fmt(r.iters_median, '.0f')} [{_fmt(r.iters_ci_low, '.0f')}–"
            f"{_fmt(r.iters_ci_high, '.0f')}]"
        )
        rat = f"{_fmt(r.iters_ratio)}× [{_fmt(r.iters_ratio_low)}–{_fmt(r.iters_ratio_high)}]"
        lines.append(
            f"| {r.method} | {int(r.target_fraction * 100)}% | {r.reached}/{r.seeds} | {ci} | "
            f"{rat} |"
        )
    lines += [
        "",
        "## Seconds per iteration",
        "",
        "Emulated: this model on 4 devices of the case (the first of four regions) in network "
        "namespaces at 0.1× the case's bandwidths, the scheduler's layout "
        "(`mode=quality_links`). Paper scale: the simulator, GPT3-XL, batch 1024, pp 8 × dp 8 "
        "on the case's 64 devices — a projection.",
        "",
        "| method | " + " | ".join(sources) + " |",
        "| --- |" + " --- |" * len(sources),
    ]
    for m in chosen:
        cells = [f"{per_iter[(s, m)]:.3f}" if (s, m) in per_iter else "—" for s in sources]
        lines.append(f"| {m} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "## Time to target relative to the reference (95% bootstrap intervals over seeds)",
        "",
        "The ratio of iterations to target × the ratio of seconds per iteration. A method is "
        "*sooner* or *later* only where the interval excludes 1×. Paper-scale columns are a "
        "projection: iterations measured on the small model, seconds per iteration simulated.",
        "",
        "| method | target | " + " | ".join(sources) + " |",
        "| --- | --- |" + " --- |" * len(sources),
    ]
    for r in tab[tab["method"] != REFERENCE].itertuples():
        cells = [_ratio_cell(r, s.replace(" ", "_case")) for s in sources]
        lines.append(
            f"| {r.method} | {int(r.target_fraction * 100)}% | " + " | ".join(cells) + " |"
        )
    lines += ["", "## The baselines at the same paper-scale setting", ""]
    if base.empty:
        lines.append("(`results/paper/runs.parquet` absent: no baseline times.)")
    else:
        lines += [
            "Megatron and DeepSpeed run the reference's arithmetic (synchronous AdamW on the "
            "same batches, the same model): their iterations to each target are the "
            "reference's, not trained again here; the band test below checks our runtime's "
            "synchronous variants against it. Their seconds per iteration are the paper-scale "
            "simulator's (`results/paper`: best configuration, NCCL's own collective, "
            "`tc_class` sharing), not CPU runs: time to any target relative to ours is that "
            "ratio.",
            "",
            "| case | system | rank placement | s/iter | time to target / ours |",
            "| --- | --- | --- | --- | --- |",
        ]
        for r in base.itertuples():
            ours = per_iter[(f"paper {r.case}", REFERENCE)]
            lines.append(
                f"| {r.case} | {r.system} | {r.placement} | {r.iter_time_s:.2f} | "
                f"{r.iter_time_s / ours:.2f}× |"
            )
    lines += ["", "## End-to-end check of the product", ""]
    if checks is None or checks.empty:
        lines.append("(no `mode=quality_links` check rows yet)")
    else:
        lines += [
            "A full run on emulated links with its own short schedule; the target is the "
            "in-process curve's training loss (16-iteration mean) at 75% of the run. "
            "Predicted = iterations to target × the run's median seconds per iteration; "
            "measured = the run's clock when its own loss reached the target.",
            "",
            "| method | case | iterations | target | iterations to it | predicted s | "
            "measured s | measured / predicted |",
            "| --- | --- | --- | --- | --- | --- | --- | --- |",
        ]
        for r in checks.itertuples():
            p, q = r.check_predicted_s, r.check_measured_s
            ratio = f"{q / p:.3f}" if p and q and np.isfinite(p) and np.isfinite(q) else "—"
            lines.append(
                f"| {r.system} | {r.case} | {int(r.iters)} | {r.check_target_loss:.4f} | "
                f"{r.check_iters_to_target} | {_fmt(p, '.1f')} | {_fmt(q, '.1f')} | {ratio} |"
            )
    lines += [
        "",
        "## Convergence band",
        "",
        "The reference's test curves over seeds, [min, max] at each evaluation widened by "
        f"{BAND_SLACK} nats; per method the median count of its evaluations outside it (of "
        f"{len(df.iloc[0]['eval_iters']) - 1} after the first):",
        "",
    ]
    for m in chosen:
        k = int(tab[tab["method"] == m]["band_points_outside"].iloc[0])
        lines.append(f"- {m}: {k}")
    wall = df["wall_s"].astype(float)
    lines += [
        "",
        "## Cost of the sweep",
        "",
        f"{len(df)} runs of `mode=quality_curves`, {wall.sum() / 3600:.2f} h of run time "
        f"(median {wall.median():.0f} s per run), two at a time on this machine's 2 cores "
        "(shared with other work while it ran).",
        "",
        "![loss against tokens](quality_curves.png)",
        "",
    ]
    return "\n".join(lines)
