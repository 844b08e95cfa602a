"""Local report of a study (no wandb needed): ``results/<study>/REPORT.md`` with tables and PNGs.

    python repro/run.py mode=report results_dir=results/paper
    python repro/run.py mode=report results_dir=results/paper workflow.ablation_csv=FILE.csv

Reads only the study's ``runs.parquet`` (:func:`system.results.read_rows`: the newest row of
each setting) and, for the scheduler claims, the ablation table. Writes next to them:
``best.csv`` (best configuration per setting, the Fig. 3 table), ``variance.csv`` (every
configuration's repeats, CV, flag), ``claims.csv`` (paper vs ours, PASS / FAIL / INCONCLUSIVE),
``fig3.png``, ``fig4.png`` (only in a study that compares schedulers), ``summary.csv`` (when there
are simulated rows: per setting each system's time and ours' speed-ups,
:func:`repro.report.summary.summary_from_rows`), ``claims.md`` (when there are baseline rows:
every claim under each placement protocol) and ``REPORT.md`` linking them. The files are one
set (:func:`system.results.write_set`): made in a staging folder and swapped in together, so a
report never sits beside the last one's tables and a report that fails leaves the last one as it
was; a single run and a sweep both end here (:func:`repro.sweep.finish_study`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from repro.config import RunConfig
from repro.helper import Helper, take
from repro.report.claims import CLAIM_INPUTS
from repro.report.config import CollectConfig, ReportConfig
from repro.report.figures.fig3 import plot_fig3
from repro.report.figures.fig4 import plot_fig4
from repro.report.protocols import (
    claims_markdown,
    evaluate_claims_by_protocol,
    headline_rows,
    write_protocol_claims,
)
from repro.report.summary import SUMMARY_INPUTS, summary_from_rows
from repro.report.tables import markdown_table
from repro.report.variance import CV_LIMIT, best_configs, variance_table
from system.results import atomic_write_text, read_rows, write_set

log = logging.getLogger(__name__)

# A study of at least this many rows gets its summary and Fig. 3 from a helper process while
# this one evaluates the claims (on the paper's grid each side takes seconds); a smaller study's
# report is made here alone (a process costs more than it saves).
SIDE_PROCESS_ROWS = 5000
# Every file a study's report may hold: one report replaces the last one's whole set
# (system.results.write_set), so a figure or table the new report does not make goes too.
REPORT_FILES = (
    "REPORT.md",
    "best.csv",
    "variance.csv",
    "claims.csv",
    "claims.md",
    "summary.csv",
    "fig3.png",
    "fig4.png",
)

# what ablation_from_rows reads of a row: the scheduler and its best cost under the first name
# present, the seed, status and case, and the search's curve
SCHEDULER_COLUMNS = ("scheduler", "method")
COST_COLUMNS = ("best_total_cost_s", "best_cost_s", "total_cost_s")
ABLATION_INPUTS = (*SCHEDULER_COLUMNS, *COST_COLUMNS, "seed", "status", "case", "history", "trials")
# every column build_report reads of the study's rows (check_rows: also the run id); the study's
# other columns are not read from its table, so no selection below copies them
REPORT_INPUTS = tuple(dict.fromkeys(("run_id", *CLAIM_INPUTS, *SUMMARY_INPUTS, *ABLATION_INPUTS)))

__all__ = [
    "ReportPaths",
    "build_report",
    "check_rows",
    "known_systems",
    "read_ablation",
    "ablation_from_rows",
    "report_study",
    "run",
    "collect",
]


@dataclass(frozen=True, slots=True)
class ReportPaths:
    report: Path
    variance: Path
    claims: Path
    best: Path
    figures: tuple[Path, ...]


def read_ablation(path: str | Path | None) -> pd.DataFrame | None:
    """The scheduler ablation table (csv or parquet), or None when ``path`` is unset or absent."""
    if path is None:
        return None
    path = Path(path)
    if not path.exists():
        log.info("no ablation table at %s: the scheduler claims will be INCONCLUSIVE", path)
        return None
    try:
        with open(path, "rb") as fh:  # one handle: a table replaced meanwhile is read whole
            return pd.read_parquet(fh) if path.suffix == ".parquet" else pd.read_csv(fh)
    except (OSError, ValueError) as e:  # pyarrow's and pandas' parser errors are ValueErrors
        lines = str(e).strip().splitlines() or [type(e).__name__]
        raise ValueError(f"ablation table {path} is unreadable: {lines[0]}") from None


def ablation_from_rows(rows: pd.DataFrame) -> pd.DataFrame | None:
    """An ablation table (case, method, seed, trial, best_total_cost_s) from scheduled rows.

    Used when no ablation table is given: rows that name their scheduler (``scheduler`` or
    ``method``) and its best cost (``best_total_cost_s``, ``best_cost_s`` or ``total_cost_s``)
    give one point per run, or a curve when they carry a ``history`` of (trial, best) pairs.
    """
    mcol = next((c for c in SCHEDULER_COLUMNS if c in rows.columns), None)
    ccol = next((c for c in COST_COLUMNS if c in rows.columns), None)
    if rows.empty or mcol is None or ccol is None or "seed" not in rows.columns:
        return None
    df = rows[rows[mcol].notna() & pd.to_numeric(rows[ccol], errors="coerce").notna()]
    if "status" in df.columns:
        df = df[df["status"].fillna("ok") == "ok"]
    out = []
    for r in df.to_dict("records"):
        hist = r.get("history")
        points = (
            [(int(t), float(c)) for t, c in hist]
            if isinstance(hist, list) and hist
            else [(int(r.get("trials") or 0), float(r[ccol]))]
        )
        out += [
            {
                "case": str(r["case"]),
                "method": str(r[mcol]),
                "seed": r["seed"],
                "trial": t,
                "best_total_cost_s": c,
            }
            for t, c in points
        ]
    return pd.DataFrame(out) if out else None


def known_systems() -> tuple[str, ...]:
    """Every value of the ``system`` column a mode writes: the simulated and trained systems,
    ours on each layout ``mode=emulate`` runs (``ours_<layout>``) and the quality study's."""
    from repro.config.shared import QUALITY_METHODS, QUALITY_STUDY_SYSTEMS, EmulateLayout
    from system.results import SIMULATED_SYSTEMS, TRAINED_SYSTEMS

    emulated = [f"ours_{layout}" for layout in EmulateLayout if layout != EmulateLayout.scheduled]
    return tuple(
        dict.fromkeys(
            (
                *SIMULATED_SYSTEMS,
                *TRAINED_SYSTEMS,
                *emulated,
                *QUALITY_STUDY_SYSTEMS,
                *QUALITY_METHODS,
            )
        )
    )


# modes whose rows measure no time per iteration (loss curves trained without links)
UNTIMED_MODES = ("quality_curves",)
# modes whose study has a report of its own ("module:function" taking the results folder)
OWN_REPORTS = {
    "quality": "repro.studies.quality.report:build_quality_report",
    "quality_curves": "repro.studies.quality_curves.report:build_report",
    "quality_links": "repro.studies.quality_curves.report:build_report",
}


def _own_report(rows: pd.DataFrame) -> str | None:
    """The report of the study when every row is of modes sharing one report of their own."""
    if rows.empty or "mode" not in rows:
        return None
    found = {OWN_REPORTS.get(str(m)) for m in rows["mode"].dropna().unique()}
    return found.pop() if len(found) == 1 and None not in found else None


def check_rows(rows: pd.DataFrame, folder: str | Path) -> None:
    """ValueError, one line naming the table, when ``rows`` (a study's stored rows) hold what no
    mode writes, as a table edited by hand may: a system no report knows (its rows would drop
    out of every table), or an ok row whose ``iter_time_s`` is not a positive finite number of
    seconds, or whose ``pflops`` is negative or not finite (every speed-up, PFLOPS and claim
    is computed from them)."""
    where = f"{Path(folder) / 'runs.parquet'}"
    if rows.empty:
        return
    known = known_systems()
    system = rows["system"].astype("string") if "system" in rows else pd.Series(dtype="string")
    unknown = sorted(set(system.dropna().unique()) - set(known))
    if unknown:
        n = int(system.isin(unknown).sum())
        raise ValueError(
            f"{where}: {n} row(s) of system {', '.join(map(repr, unknown))}, which no mode "
            f"writes: edited by hand? fix or remove them (known: {', '.join(known)})"
        )
    ok = rows["status"].fillna("ok").eq("ok") if "status" in rows else pd.Series(True, rows.index)
    timed = ~rows["mode"].isin(UNTIMED_MODES) if "mode" in rows else pd.Series(True, rows.index)
    for column, bad in (
        ("iter_time_s", lambda v: timed & ~(v.gt(0) & v.lt(float("inf")))),
        ("pflops", lambda v: v.notna() & ~(v.ge(0) & v.lt(float("inf")))),
    ):
        if column not in rows:
            continue
        values = pd.to_numeric(rows[column], errors="coerce").astype(float)
        wrong = ok & bad(values)
        if wrong.any():
            first = rows.index[wrong][0]
            run_id = rows.at[first, "run_id"] if "run_id" in rows else first
            raise ValueError(
                f"{where}: {int(wrong.sum())} ok row(s) with {column} not a "
                f"{'positive' if column == 'iter_time_s' else 'non-negative'} finite number "
                f"(first: run_id {run_id}, {column}={rows.at[first, column]}): edited by hand? "
                "fix or remove them"
            )


def _python_strings(rows: pd.DataFrame, columns) -> pd.DataFrame:
    """``rows`` with the Arrow-backed text columns among ``columns`` held as Python strings: the
    same values and missing marks, but the claims and the summary select rows hundreds of times
    and a Python-string column is copied by one numpy take, where an Arrow one goes through a
    compute kernel per column. The other columns (run ids, rank maps) are read a few times
    and stay as they are."""
    wanted = set(columns)
    arrow = {
        c: pd.StringDtype("python")
        for c, t in rows.dtypes.items()
        if c in wanted and isinstance(t, pd.StringDtype) and t.storage == "pyarrow"
    }
    return rows.astype(arrow) if arrow else rows


def build_report(
    results_dir: str | Path,
    *,
    ablation_path: str | Path | None = None,
    tolerance: float = 0.25,
    study: str | None = None,
    cv_limit: float = CV_LIMIT,
) -> ReportPaths:
    """Build every table, figure and REPORT.md of the study in ``results_dir``."""
    d = Path(results_dir)
    if not d.is_dir():
        raise FileNotFoundError(f"results_dir {d} does not exist")
    rows = _python_strings(read_rows(d, columns=REPORT_INPUTS), [*CLAIM_INPUTS, *SUMMARY_INPUTS])
    check_rows(rows, d)
    own = _own_report(rows)
    if own is not None:  # a study whose rows have their own report (the paper's does not fit)
        from importlib import import_module

        module, func = own.split(":")
        report = getattr(import_module(module), func)(d)
        return ReportPaths(
            report=report,
            variance=d / "variance.csv",
            claims=d / "claims.csv",
            best=d / "best.csv",
            figures=(),
        )
    every = rows  # the claims and the summary: every link-sharing model, each on its own
    rows = headline_rows(rows)  # the tables and Fig. 3: the headline model's rows only
    ablation = read_ablation(ablation_path)
    if ablation is None:
        ablation = ablation_from_rows(rows)
        if ablation is not None:
            ablation_path = "the study's rows (scheduler + best cost columns)"
    variance = (
        variance_table(rows, cv_limit)
        if not rows.empty
        else variance_table(
            pd.DataFrame(
                columns=["case", "system", "num_layers", "global_batch_size", "iter_time_s"]
            )
        )
    )
    best = best_configs(rows) if not rows.empty else variance.assign(n_configs=pd.Series(dtype=int))
    # every file of the report is made in a staging folder and swapped in as one set: a reader
    # never finds this report beside the last one's tables, a failing report leaves the last
    # one as it was
    with write_set(d, name="report", owns=REPORT_FILES) as stage:
        side = Helper() if len(every) >= SIDE_PROCESS_ROWS else None
        inputs = (every[[c for c in SUMMARY_INPUTS if c in every]], best, stage / "fig3.png")
        try:
            if side is not None:
                beside = side.submit(_summary_and_fig3, *inputs)
                side.start()
            claims = evaluate_claims_by_protocol(every, ablation, tolerance=tolerance)
            for table, name in (
                (variance, "variance.csv"),
                (claims, "claims.csv"),
                (best, "best.csv"),
            ):
                atomic_write_text(stage / name, table.to_csv(index=False))
            # Fig. 4 belongs to the study that compares schedulers (sweep=ablation); the other
            # studies use the ablation table for the scheduler claims only, so it exists once.
            own = ablation_from_rows(rows)
            fig4 = (
                plot_fig4(ablation, stage / "fig4.png")
                if own is not None and own.method.nunique() > 1
                else None
            )
            made = take(beside) if side is not None else None  # None: not started there
        finally:
            if side is not None:
                side.stop()
        summary, fig3 = made if made is not None else _summary_and_fig3(*inputs)
        figs = tuple(d / p.name for p in (fig3, fig4) if p)
        atomic_write_text(
            stage / "REPORT.md",
            _render(
                study or d.name,
                rows,
                best,
                variance,
                claims,
                figs,
                ablation_path,
                cv_limit,
                has_ablation=ablation is not None and not ablation.empty,
                has_summary=len(summary) > 0,
            ),
        )
        if len(summary):
            atomic_write_text(stage / "summary.csv", summary.to_csv(index=False))
        write_protocol_claims(stage, every, claims, summary)  # claims.md: as claims.csv
    paths = ReportPaths(
        report=d / "REPORT.md",
        variance=d / "variance.csv",
        claims=d / "claims.csv",
        best=d / "best.csv",
        figures=figs,
    )
    counts = claims.verdict.value_counts().to_dict()
    log.info("report %s: %d rows, claims %s", paths.report, len(rows), counts)
    return paths


def _summary_and_fig3(
    rows: pd.DataFrame, best: pd.DataFrame, fig3: Path
) -> tuple[pd.DataFrame, Path | None]:
    """The study's summary (of every row) and its Fig. 3 (of the best configurations)."""
    return summary_from_rows(rows), plot_fig3(best, fig3)


def _render(
    study,
    rows,
    best,
    variance,
    claims,
    figs,
    ablation_path,
    cv_limit,
    has_ablation=False,
    has_summary=False,
) -> str:
    n_ok = int((rows["status"].fillna("ok") == "ok").sum()) if not rows.empty else 0
    counts = claims.verdict.value_counts()
    lines = [
        f"# Study `{study}`",
        "",
        f"{len(rows)} rows ({n_ok} ok) from `runs.parquet` (their text view: `runs.csv`); "
        "tables: `best.csv`, `variance.csv`, `claims.csv`"
        + (", `summary.csv`" if has_summary else "")
        + ".",
        "",
        "Verdicts: "
        + ", ".join(f"{v} {int(counts.get(v, 0))}" for v in ("PASS", "FAIL", "INCONCLUSIVE")),
        "",
        "## Claims of the paper",
        "",
        "Ranges: PASS when our median over the settings lies inside the paper's range widened "
        'by the tolerance; an "up to X" claim when our maximum lies within the tolerance of '
        "X; one-sided claims use the stated rule. INCONCLUSIVE says why the rows cannot test "
        "the claim. One table per link-sharing model, both placement protocols side by side; "
        "the same table is `claims.csv` and `claims.md` (with why each baseline configuration "
        "won). The tolerance of each claim:",
        "",
        markdown_table(_claim_rules(claims)),
        "",
        *claims_markdown(claims),
    ]
    lines += ["## Throughput per setting (Fig. 3 analogue)", ""]
    if any(p.name == "fig3.png" for p in figs):
        lines += ["![Fig. 3 analogue](fig3.png)", ""]
    if not best.empty:
        cols = [
            c
            for c in (
                "case",
                "system",
                "num_layers",
                "global_batch_size",
                "tp",
                "pp",
                "dp",
                "zero",
                "n_configs",
                "n_repeats",
                "iter_time_s_mean",
                "pflops_mean",
            )
            if c in best.columns
        ]
        lines += [
            "Baselines at their best configuration per setting (`n_configs` compared).",
            "",
            markdown_table(best[cols]),
            "",
        ]
    else:
        lines += ["No ok rows yet.", ""]
    lines += ["## Scheduler ablation (Fig. 4 analogue)", ""]
    if any(p.name == "fig4.png" for p in figs):
        lines += [f"From `{ablation_path}`.", "", "![Fig. 4 analogue](fig4.png)", ""]
    elif has_ablation:
        lines += [
            f"The scheduler claims use `{ablation_path}`; its figure is drawn once, by the study "
            "that compares schedulers (`python repro/run.py -m sweep=ablation`, "
            "`results/ablation/fig4.png`).",
            "",
        ]
    else:
        lines += [f"No ablation table (looked for `{ablation_path}`); run `sweep=ablation`.", ""]
    lines += [f"## Repeats and variance (CV > {cv_limit:.0%} flagged)", ""]
    flagged = variance[variance.flagged] if not variance.empty else variance
    if variance.empty:
        lines += ["No rows.", ""]
    else:
        lines += [
            f"{len(variance)} configurations, {int((variance.n_repeats >= 3).sum())} with 3+ "
            f"repeats, {len(flagged)} flagged.",
            "",
        ]
        show = flagged if len(flagged) else variance.head(0)
        cols = [c for c in variance.columns if c not in ("pflops_mean",)]
        if len(show):
            lines += ["Flagged configurations:", "", markdown_table(show[cols]), ""]
        lines += ["Full table: `variance.csv`.", ""]
    return "\n".join(lines)


def _claim_rules(claims: pd.DataFrame) -> pd.DataFrame:
    """Per claim: statement, the paper's number and the rule it is tested by (the tolerance
    where some group could test it)."""
    tested = claims[claims["verdict"] != "INCONCLUSIVE"].drop_duplicates("claim_id")
    rule = dict(zip(tested["claim_id"], tested["tolerance"], strict=True))
    head = claims.drop_duplicates("claim_id")[["claim_id", "statement", "paper"]]
    return head.assign(rule=[rule.get(c, "—") for c in head["claim_id"]])


def report_study(cfg: RunConfig) -> ReportPaths:
    """Every file of the study in ``cfg.results_dir`` from its stored rows: the jobs' parts
    folded into ``runs.parquet`` and ``runs.csv`` rebuilt (:func:`system.results.compacting`:
    the text view is written while the report is built from the table), then
    :func:`build_report` under ``cfg.workflow``'s ablation table and tolerance. What a single
    run, a sweep's end and ``mode=report`` all do."""
    from system.results import compacting

    with compacting(cfg.results_dir):
        return build_report(
            cfg.results_dir,
            ablation_path=cfg.workflow.ablation_csv,
            tolerance=cfg.workflow.tolerance,
        )


def run(cfg: ReportConfig) -> dict:
    """``mode=report``: the study's report from its rows (``workflow.*``: ablation, tolerance).
    A study without rows is an error: a report of nothing would judge the paper's claims on
    other studies' files alone."""
    from system.results import read_rows

    rows = read_rows(cfg.results_dir)
    if rows.empty:
        raise ValueError(f"{cfg.results_dir}: no rows in its runs.parquet: nothing to report")
    check_rows(rows, cfg.results_dir)  # before the parts are folded in or any file written
    paths = report_study(cfg)
    print(f"report: {paths.report}")
    return {"report": str(paths.report)}


def collect(cfg: CollectConfig) -> dict:
    """``mode=collect``: rewrite the study's runs.parquet (parts, old schema and old
    ``rows/*.json`` folded in) and runs.csv; what a sweep killed before its end leaves to do."""
    from system.results import collect as fold

    path = fold(cfg.results_dir)
    print(f"collected: {path}")
    return {"runs_csv": str(path)}
