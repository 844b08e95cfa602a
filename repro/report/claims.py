"""The paper's claims (paper §4 and appendix, ``repro/report/data/paper_claims.csv``) vs our rows.

Every claim gets the paper's number, ours, the tolerance and a verdict:

- two-sided ranges (speed-up ratios, fraction of peak): PASS when the median over the settings
  lies in [low·(1 − tol), high·(1 + tol)], FAIL otherwise; ``tol`` is ``tolerance`` (default 0.25);
- "up to X" claims (:data:`UP_TO_CLAIMS`: the paper's "up to 2.7× faster than random
  assignment", §4.2) are a statement about the largest speed-up: PASS when the maximum over the
  settings lies in [X·(1 − tol), X·(1 + tol)] and the minimum is not below low·(1 − tol); a
  maximum above X·(1 + tol) fails, as does one that never gets near X;
- one-sided claims ("beats", "narrows", "within 5%", "best configuration"): no tolerance, the
  stated rule decides;
- INCONCLUSIVE, with the reason, whenever the rows cannot test the claim (a system, case or
  column missing, no grid search, too few repeats, every repeat identical).

Throughput ratios are ratios of iteration times in the same setting (same model and batch, so the
same FLOPs: time ratio = PFLOPS ratio). Baselines are taken at their best configuration per
setting (:func:`repro.report.variance.best_configs`), as the paper's grid search did.

Two protocols (:mod:`repro.report.protocols`): ``launch``, the paper's (baseline ranks in
the order the devices were listed), and ``topology``, the fair one (each baseline configuration
with its best topology-aware rank map, :mod:`baselines.placement`). Rows say which in their
``placement`` column; baseline rows without one are launch order.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass
from importlib import resources
from pathlib import Path

import numpy as np
import pandas as pd

from repro.report.variance import (
    CONFIG_COLUMNS,
    CV_LIMIT,
    SETTING_COLUMNS,
    best_configs,
    measured_rows,
    ok_rows,
    variance_table,
)

log = logging.getLogger(__name__)

__all__ = [
    "ClaimResult",
    "load_paper_claims",
    "evaluate_claims",
    "VERDICTS",
    "UP_TO_CLAIMS",
    "CLAIM_INPUTS",
]

VERDICTS = ("PASS", "FAIL", "INCONCLUSIVE")
BASELINES = ("megatron", "deepspeed")
# claims the paper states as a maximum ("up to X"); their paper_high is X
UP_TO_CLAIMS = frozenset({"scheduler_vs_random"})
KEYS = ["case", "num_layers", "global_batch_size"]
# every column a claim reads of a row (with the placement protocol's and link-sharing model's
# groups, repro/report/protocols.py)
CLAIM_INPUTS = [
    "mode",
    "status",
    *SETTING_COLUMNS,
    *CONFIG_COLUMNS,
    "iter_time_s",
    "pflops",
    "mfu",
    "link_sharing",
    "is_best",
]

# every column a claim reads of a setting's best configuration (best_configs)
BEST_INPUTS = [*KEYS, "system", "iter_time_s_mean", "n_configs", "tp", "pp", "dp"]


@dataclass(frozen=True, slots=True)
class ClaimResult:
    claim_id: str
    statement: str
    paper: str
    ours: str
    tolerance: str
    verdict: str
    detail: str


def load_paper_claims(path: str | Path | None = None) -> pd.DataFrame:
    """The claims table shipped in ``repro/report/data/paper_claims.csv`` (or ``path``)."""
    if path is None:
        with resources.files("repro.report.data").joinpath("paper_claims.csv").open() as f:
            return pd.read_csv(f, dtype={"paper_low": str, "paper_high": str})
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"claims table {path} does not exist")
    return pd.read_csv(path, dtype={"paper_low": str, "paper_high": str})


# ---- helpers -------------------------------------------------------------------------------


def _times(best: pd.DataFrame, system: str, cases) -> pd.DataFrame:
    sel = best[(best.system == system) & best.case.isin([str(c) for c in cases])]
    return sel[KEYS + ["iter_time_s_mean"]].rename(columns={"iter_time_s_mean": system})


def _baseline_times(best: pd.DataFrame, cases) -> pd.DataFrame:
    """Per setting, the faster of the baselines present (``best_baseline`` column)."""
    parts = [_times(best, b, cases) for b in BASELINES]
    parts = [p for p in parts if not p.empty]
    if not parts:
        return pd.DataFrame(columns=KEYS + ["best_baseline"])
    m = parts[0]
    for p in parts[1:]:
        m = m.merge(p, on=KEYS, how="outer")
    m["best_baseline"] = m[[c for c in BASELINES if c in m.columns]].min(axis=1)
    return m[KEYS + ["best_baseline"]]


def _ratio(num: pd.DataFrame, den: pd.DataFrame, on=KEYS) -> pd.DataFrame:
    """Throughput ratio num/den per setting = den time / num time."""
    a, b = num.columns[-1], den.columns[-1]
    m = num.merge(den, on=on, suffixes=("_num", "_den"))
    ta = m[a + "_num"] if a + "_num" in m else m[a]
    tb = m[b + "_den"] if b + "_den" in m else m[b]
    m["ratio"] = tb.to_numpy(float) / ta.to_numpy(float)
    return m


def _fmt(x: float) -> str:
    return f"{x:.3g}"


def _num(s) -> float | None:
    try:
        v = float(s)
    except (TypeError, ValueError):
        return None
    return None if np.isnan(v) else v


def _range_verdict(values: np.ndarray, low: float, high: float, tol: float) -> tuple[str, str, str]:
    med = float(np.median(values))
    ours = f"median {_fmt(med)} ({_fmt(values.min())}–{_fmt(values.max())}, n={values.size})"
    lo, hi = low * (1 - tol), high * (1 + tol)
    verdict = "PASS" if lo <= med <= hi else "FAIL"
    return ours, f"±{tol:.0%} → [{_fmt(lo)}, {_fmt(hi)}]", verdict


def _max_verdict(values: np.ndarray, low: float, high: float, tol: float) -> tuple[str, str, str]:
    top, bottom, med = float(values.max()), float(values.min()), float(np.median(values))
    ours = f"max {_fmt(top)} (min {_fmt(bottom)}, median {_fmt(med)}, n={values.size})"
    lo, hi = high * (1 - tol), high * (1 + tol)
    floor = low * (1 - tol)
    verdict = "PASS" if lo <= top <= hi and bottom >= floor else "FAIL"
    return ours, f"max in [{_fmt(lo)}, {_fmt(hi)}], min ≥ {_fmt(floor)}", verdict


# ---- the claims ------------------------------------------------------------------------------


def _speedup(best, num_sys, den, cases, low, high, tol, *, up_to: bool = False):
    have = set(best.system)
    if num_sys not in have:
        return None, f"no {num_sys} rows"
    den_t = _baseline_times(best, cases) if den == "best_baseline" else _times(best, den, cases)
    if den != "best_baseline" and den not in have:
        return None, f"no {den} rows"
    r = _ratio(_times(best, num_sys, cases), den_t)
    if r.empty:
        return (
            None,
            f"no setting with both {num_sys} and {den} in case(s) {','.join(map(str, cases))}",
        )
    verdict = _max_verdict if up_to else _range_verdict
    return verdict(r["ratio"].to_numpy(float), low, high, tol), ""


def _claim_decentral(best, low, high, tol):
    meg = _times(best, "megatron", [1]).drop(columns="case")
    ours = _times(best, "ours", [5]).drop(columns="case")
    if meg.empty or ours.empty:
        return None, "needs megatron in case 1 and ours in case 5"
    r = _ratio(meg, ours, on=["num_layers", "global_batch_size"])
    return _range_verdict(r["ratio"].to_numpy(float), low, high, tol), ""


def _claim_gap(best, along: str):
    other = "num_layers" if along == "global_batch_size" else "global_batch_size"
    r = _ratio(
        _times(best, "ours", sorted(set(best.case))), _baseline_times(best, sorted(set(best.case)))
    )
    if r.empty:
        return None, "needs ours and a baseline in the same settings"
    slopes = []
    for _, g in r.groupby(["case", other]):
        if g[along].nunique() < 2:
            continue
        x = np.log(g[along].to_numpy(float))
        y = np.abs(np.log(g["ratio"].to_numpy(float)))  # the gap, whichever side is faster
        slopes.append(float(np.polyfit(x, y, 1)[0]))
    if not slopes:
        return None, f"needs at least two values of {along} per (case, {other})"
    k, n = sum(s < 0 for s in slopes), len(slopes)
    verdict = "PASS" if k > n / 2 else "FAIL"
    return (f"gap shrinks in {k}/{n} (case, {other}) groups", "majority of groups", verdict), ""


def _claim_variance(rows):
    timed = measured_rows(rows)  # simulated repeats are seeds/layouts, not run-to-run noise
    if timed.empty:
        return None, (
            "no measured runs: simulated rows are deterministic (a repeat is an identical copy, "
            "or another random layout); measured repeats: results/validation"
        )
    v = variance_table(timed)
    v3 = v[v.n_repeats >= 3]
    if "system" in v3.columns:
        # ours_random repeats are three different layouts (as in the paper), not re-runs of
        # one setting: their spread is layout-to-layout, so they do not test run-to-run noise
        v3 = v3[v3.system != "ours_random"]
    if v3.empty:
        return None, "no configuration has 3 or more repeats"
    if float(v3.spread.max()) == 0.0:
        return None, (
            f"all {len(v3)} configurations repeat exactly: the rows are deterministic, "
            "run-to-run noise is not measured"
        )
    worst = float(v3.cv.max())
    k = int((v3.cv > CV_LIMIT).sum())
    varied = int((v3.spread > 0).sum())
    ours = (
        f"max CV {worst:.3f}, max spread {float(v3.spread.max()):.3f}; {k}/{len(v3)} over 5%; "
        f"{varied}/{len(v3)} vary at all (the others repeat exactly)"
    )
    return (ours, f"CV ≤ {CV_LIMIT:.0%}", "PASS" if k == 0 else "FAIL"), ""


def _claim_megatron_best(best, cases, expected: str):
    # best_configs picks per setting, and a setting is one system in one case: its picks for
    # megatron in ``cases`` are those of best_configs of megatron's rows in ``cases``
    best = best[(best.system == "megatron") & best.case.isin([str(c) for c in cases])]
    if best.empty:
        return None, f"no megatron rows in case(s) {','.join(map(str, cases))}"
    if not {"tp", "pp", "dp"} <= set(best.columns):
        return None, "megatron rows carry no tp/pp/dp"
    if int(best.n_configs.max()) < 2:
        return None, "one megatron configuration per setting: no grid search in the rows"
    picks = [
        f"{int(t)}/{int(p)}/{int(d)}" for t, p, d in zip(best.tp, best.pp, best.dp, strict=True)
    ]
    top = max(dict.fromkeys(picks), key=picks.count)  # ties: the first setting's pick
    share = picks.count(expected) / len(picks)
    ours = f"most often {top}; {expected} best in {picks.count(expected)}/{len(picks)} settings"
    return (ours, "best in a majority", "PASS" if share > 0.5 else "FAIL"), ""


def _claim_deepspeed(ok):
    df = ok[ok.system == "deepspeed"]
    if df.empty or "zero" not in df.columns or "pp" not in df.columns:
        return None, "needs deepspeed rows with zero and pp columns"
    z = pd.to_numeric(df["zero"], errors="coerce")
    df = df.assign(
        variant=np.where(
            (z == 1) & (df.pp.astype(float) > 1), "pp+zero1", np.where(z == 3, "zero3", "other")
        )
    )
    df = df[df.variant != "other"]
    # best grid point of each variant per setting, compared best against best
    t = df.groupby(KEYS + ["variant"])["iter_time_s"].min().unstack("variant")
    if not {"pp+zero1", "zero3"} <= set(t.columns):
        return None, "needs both pp+zero1 and zero3 deepspeed rows"
    t = t.dropna()
    wins = (t["pp+zero1"] < t["zero3"]).groupby(level="case").agg(["sum", "size"])
    c1 = wins.loc["1"] if "1" in wins.index else None
    rest = wins.drop(index="1", errors="ignore")
    if c1 is None or rest.empty:
        return None, "needs case 1 and at least one of cases 2-5"
    ok = c1["sum"] > c1["size"] / 2 and int(rest["sum"].sum()) == int(rest["size"].sum())
    ours = (
        f"pp+zero1 wins {int(c1['sum'])}/{int(c1['size'])} in case 1, "
        f"{int(rest['sum'].sum())}/{int(rest['size'].sum())} in cases 2-5"
    )
    return (ours, "most of case 1, all of 2-5", "PASS" if ok else "FAIL"), ""


def _claim_kl(ablation: pd.DataFrame | None):
    if ablation is None or ablation.empty:
        return None, "no scheduler ablation table (run sweep=ablation)"
    need = {"case", "method", "seed", "best_total_cost_s"}
    if not need <= set(ablation.columns):
        return None, f"ablation table lacks {sorted(need - set(ablation.columns))}"
    methods = {str(m).lower() for m in ablation.method.unique()}
    tailored = next(
        (m for m in ("tailored", "genetic", "ours", "local_search") if m in methods), None
    )
    kl = next((m for m in ("kl", "genetic_kl") if m in methods), None)
    if tailored is None or kl is None:
        return None, f"ablation needs a tailored and a kl method, has {sorted(methods)}"
    case = ablation.case.map({c: str(c) for c in ablation.case.unique()})  # str of each value
    a = ablation.assign(method=ablation.method.astype(str).str.lower(), case=case)
    final = a.groupby(["case", "method", "seed"])["best_total_cost_s"].min().reset_index()
    med = final.groupby(["case", "method"])["best_total_cost_s"].median().unstack("method")
    med = med[[tailored, kl]].dropna()
    if med.empty:
        return None, "no case has both methods"
    ratio = (med[kl] / med[tailored]).to_numpy(float)
    ours = f"{kl}/{tailored} cost {_fmt(ratio.min())}–{_fmt(ratio.max())} over {ratio.size} case(s)"
    if np.allclose(ratio, 1.0, rtol=1e-9, atol=0.0):
        return None, (
            f"{ours}: both reach the same cost in every case (the search budget may be "
            "too small to tell them apart)"
        )
    verdict = "PASS" if bool((ratio >= 1.0).all()) else "FAIL"
    return (ours, "≥ 1 in every case, > 1 in one", verdict), ""


def _claim_fluidstack(ok, low, high, tol):
    df = ok
    if df.empty or "mfu" not in df.columns:
        return None, "no rows with an mfu column (the A40 two-region setting is not simulated)"
    sel = df[df.case.astype(str).str.startswith("fluidstack")]
    if sel.empty:
        return None, "no fluidstack case in the rows"
    return _range_verdict(pd.to_numeric(sel.mfu).to_numpy(float), low, high, tol), ""


def _check(claim_id: str, rows, ok, best, ablation, low, high, expected: str, tol: float):
    """Dispatch one claim to its check (``ok``: :func:`ok_rows` of ``rows``, ``best``: their
    :func:`best_configs`); returns ((ours, tolerance, verdict) | None, reason)."""
    speedups = {
        "c5_vs_megatron": ("megatron", [5]),
        "c5_vs_deepspeed": ("deepspeed", [5]),
        "c1to4_vs_baselines": ("best_baseline", [1, 2, 3, 4]),
        "scheduler_vs_random": ("ours_random", [5]),
    }
    if claim_id == "local_search_vs_kl":
        return _claim_kl(ablation)
    if best.empty:
        return None, "no ok rows"
    if claim_id in speedups:
        den, cases = speedups[claim_id]
        up_to = claim_id in UP_TO_CLAIMS
        return _speedup(best, "ours", den, cases, low, high, tol, up_to=up_to)
    if claim_id == "decentral_vs_datacenter":
        return _claim_decentral(best, low, high, tol)
    if claim_id == "gap_narrows_batch":
        return _claim_gap(best, "global_batch_size")
    if claim_id == "gap_narrows_depth":
        return _claim_gap(best, "num_layers")
    if claim_id == "variance_3runs":
        return _claim_variance(rows)
    if claim_id == "megatron_best_case1":
        return _claim_megatron_best(best, [1], expected)
    if claim_id == "megatron_best_case2to5":
        return _claim_megatron_best(best, [2, 3, 4, 5], expected)
    if claim_id == "deepspeed_best":
        return _claim_deepspeed(ok)
    if claim_id == "fluidstack_mfu":
        return _claim_fluidstack(ok, low, high, tol)
    return None, "no check implemented for this claim"


def evaluate_claims(
    rows: pd.DataFrame,
    ablation: pd.DataFrame | None = None,
    *,
    tolerance: float = 0.25,
    claims: pd.DataFrame | None = None,
) -> pd.DataFrame:
    """One line per claim of ``claims`` (default: the shipped table), with our verdict."""
    if not 0 <= tolerance < 1:
        raise ValueError(f"tolerance must be in [0, 1), got {tolerance}")
    claims = load_paper_claims() if claims is None else claims
    # the ok rows are selected once for every claim that reads them (ok_rows of its result is
    # the same rows)
    ok = ok_rows(rows) if not rows.empty else rows
    best = best_configs(ok) if not rows.empty else pd.DataFrame(columns=KEYS + ["system"])
    # the columns the claims read of the best configurations, which they select from often
    best = best[[c for c in BEST_INPUTS if c in best.columns]]
    out = []
    for c in claims.itertuples(index=False):
        paper = _paper_text(c.paper_low, c.paper_high)
        if c.claim_id in UP_TO_CLAIMS:
            paper = f"up to {c.paper_high} ({paper})"
        try:
            res, why = _check(
                c.claim_id,
                rows,
                ok,
                best,
                ablation,
                _num(c.paper_low),
                _num(c.paper_high),
                str(c.paper_low),
                tolerance,
            )
        except (KeyError, ValueError) as e:  # malformed rows: say so instead of crashing the report
            res, why = None, f"could not evaluate: {e}"
        if res is None:
            out.append(ClaimResult(c.claim_id, c.statement, paper, "—", "—", "INCONCLUSIVE", why))
        else:
            ours, tol_text, verdict = res
            out.append(
                ClaimResult(c.claim_id, c.statement, paper, ours, tol_text, verdict, c.metric)
            )
    return pd.DataFrame([asdict(r) for r in out])


def _paper_text(low, high) -> str:
    lo = "" if pd.isna(low) else str(low)
    hi = "" if pd.isna(high) else str(high)
    if lo and hi:
        return lo if lo == hi else f"{lo}–{hi}"
    if lo:
        return f"≥ {lo}"
    return "qualitative" if not hi else f"≤ {hi}"
