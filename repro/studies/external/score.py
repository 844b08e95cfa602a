"""Tables of Sailor-plan predictions and their errors against the measured runs.

Pure functions over :class:`~system.external.sailor.predict.PlanRow`: :func:`predictions_frame`
(one row per plan, the prediction and its parts; no measurement), :func:`errors_frame` (signed
and absolute error per measured plan, beside Sailor's own simulator, and the logged gradient
reduction ``red_grads`` beside its prediction), :func:`mape_table` (per set: MAPE of the
iteration, max absolute error, mean signed error, plans scored and excluded, and the MAPE of
``red_grads``; Sailor's simulator's on the same plans only, :func:`sailor_on_same_plans`),
:func:`profile_rows_table` (the same per set, split by whether a plan uses a profile row with
hand-entered round forward times).

Sailor's simulator's numbers (:data:`SAILOR_SIMULATOR_S`, :data:`SAILOR_SIMULATOR_MAPE`) are
those its own validation driver gives on these plans from these inputs, as published with the
data (Sailor's validation set, eth-easl/sailor @cf2c8e3, run with its ``runtime_simulator.py``).
"""

from __future__ import annotations

import pandas as pd

from system.external.sailor.predict import PlanRow

__all__ = [
    "SAILOR_SIMULATOR_S",
    "SAILOR_SIMULATOR_MAPE",
    "PREDICTION_COLUMNS",
    "predictions_frame",
    "errors_frame",
    "warnings_frame",
    "mape_table",
    "sailor_on_same_plans",
    "SAILOR_PUBLISHED_PLANS",
    "profile_rows_table",
]

# Sailor's simulator per clariden plan, seconds (plan file stem without "plan_config_").
SAILOR_SIMULATOR_S: dict[str, dict[str, float]] = {
    "clariden/OPT-350": {
        "N1_D1_M4_G1": 0.0830,
        "N1_D1_M4_G32": 2.641,
        "N2_D1": 0.625,
        "N2_D2": 0.727,
        "N4_D1": 1.571,
        "N4_D2": 1.523,
        "N4_D4": 1.037,
        "N8_D2": 2.300,
        "N8_D4": 2.204,
        "N16_D4": 2.303,
        "N16_D8": 2.208,
        "N16_D16": 1.884,
        "N32_D8": 1.244,
        "N32_D16": 1.167,
        "N32_D32": 0.964,
    },
    "clariden/GPT-NEO": {
        "N2_D1": 0.126,
        "N4_D1": 2.325,
        "N4_D2": 2.255,
        "N8_D2": 12.57,
        "N8_D4": 11.81,
        "N16_D4": 6.441,
        "N16_D8": 6.048,
        "N32_D8": 3.378,
        "N32_D16": 3.169,
        "N64_D8": 2.062,
        "N64_D16": 1.849,
    },
}
# (MAPE %, max abs error %, mean signed error % or None) as published per set
SAILOR_SIMULATOR_MAPE: dict[str, tuple[float, float, float | None]] = {
    "clariden/OPT-350": (8.9, 16.1, -4.4),
    "clariden/GPT-NEO": (10.1, 39.5, None),
    "mit": (10.3, 27.3, -9.6),
}
# The plans each published MAPE is over (file stems): clariden's are the per-plan predictions
# above (GPT-NEO without its broken N4_D4 plan); the heterogeneous set's are its nine plans.
SAILOR_PUBLISHED_PLANS: dict[str, frozenset[str]] = {
    **{s: frozenset(per_plan) for s, per_plan in SAILOR_SIMULATOR_S.items()},
    "mit": frozenset(
        ("N2_D1", "N2_D2", "N3_D1", "N4_D1", "N4_D2", "N4_D4", "N6_D2", "N6_D3", "N6_D6")
    ),
}

PREDICTION_COLUMNS = [
    "plan",
    "set",
    "model",
    "status",
    "predicted_iter_time_s",
    "pipeline_s",
    "tied_grads_s",
    "data_parallel_s",
    "optimizer_s",
    "predicted_peak_memory_bytes",
    "micro_batches",
    "dp_algorithm",
    "dp_collective",
    "predicted_red_grads_s",
    "red_grads_wait_s",
    "red_grads_no_barrier_s",
    "note",
]


def _stem(plan: str) -> str:
    name = plan.rsplit("/", 1)[-1]
    return name.removeprefix("plan_config_").removesuffix(".json")


def predictions_frame(rows: list[PlanRow]) -> pd.DataFrame:
    """One row per plan (excluded plans too, with ``status`` = excluded and the reason)."""
    out = []
    for r in rows:
        p = r.prediction
        base = {"plan": r.plan, "set": r.set, "model": r.model}
        if p is None:
            out.append({**base, "status": "excluded", "note": r.excluded})
            continue
        out.append(
            {
                **base,
                "status": "ok",
                "predicted_iter_time_s": p.iter_time_s,
                "pipeline_s": p.pipeline_s,
                "tied_grads_s": p.tied_s,
                "data_parallel_s": p.dp_s,
                "optimizer_s": p.optimizer_s,
                "predicted_peak_memory_bytes": p.peak_memory_bytes,
                "micro_batches": p.micro_batches,
                "dp_algorithm": p.dp_algorithm,
                "dp_collective": p.dp_collective,
                "predicted_red_grads_s": p.red_grads_s,
                "red_grads_wait_s": p.red_grads_wait_s,
                "red_grads_no_barrier_s": p.red_grads_no_barrier_s,
                "note": f"{len(r.findings)} warning(s)" if r.findings else "",
            }
        )
    return pd.DataFrame(out, columns=PREDICTION_COLUMNS)


def warnings_frame(rows: list[PlanRow]) -> pd.DataFrame:
    """Every recorded warning: plan, file, field, message."""
    out = [
        {"plan": r.plan, "file": f.file, "field": f.field, "message": f.message}
        for r in rows
        for f in r.findings
    ]
    return pd.DataFrame(out, columns=["plan", "file", "field", "message"])


def _pct(pred: float, real: float | None) -> float | None:
    return None if real is None or real <= 0 else 100.0 * (pred - real) / real


def errors_frame(rows: list[PlanRow]) -> pd.DataFrame:
    """Measured plans with a prediction: real, ours, signed/absolute error (%), Sailor's; the
    logged reduction and ours (``red_grads``), its signed error (%); whether the plan uses a
    round-number profile row; the data-parallel degree."""
    out = []
    for r in rows:
        if r.real_s is None or r.prediction is None:
            continue
        ours = r.prediction.iter_time_s
        sailor = SAILOR_SIMULATOR_S.get(r.set, {}).get(_stem(r.plan))
        out.append(
            {
                "plan": r.plan,
                "set": r.set,
                "real_s": r.real_s,
                "predicted_iter_time_s": ours,
                "signed_error_pct": 100.0 * (ours - r.real_s) / r.real_s,
                "abs_error_pct": 100.0 * abs(ours - r.real_s) / r.real_s,
                "sailor_simulator_s": sailor,
                "sailor_signed_error_pct": (
                    None if sailor is None else 100.0 * (sailor - r.real_s) / r.real_s
                ),
                "measured_peak_memory_bytes": r.max_mem_bytes,
                "predicted_peak_memory_bytes": r.prediction.peak_memory_bytes,
                "measured_red_grads_s": r.red_grads_s,
                "predicted_red_grads_s": r.prediction.red_grads_s,
                "red_grads_signed_error_pct": _pct(r.prediction.red_grads_s, r.red_grads_s),
                "dp_algorithm": r.prediction.dp_algorithm,
                "round_rows": r.round_rows,
            }
        )
    return pd.DataFrame(out)


def _red_grads_stats(e: pd.DataFrame) -> dict:
    """MAPE of ``red_grads`` over the plans that log one, over those with data parallelism,
    and the median of measured / predicted over the latter."""
    r = e.dropna(subset=["measured_red_grads_s"]) if len(e) else e
    dp = r[r["dp_algorithm"] != "none"] if len(r) else r
    nan = float("nan")
    return {
        "red_grads_plans": len(r),
        "red_grads_mape_pct": (
            float(r["red_grads_signed_error_pct"].abs().mean()) if len(r) else nan
        ),
        "red_grads_dp_plans": len(dp),
        "red_grads_dp_mape_pct": (
            float(dp["red_grads_signed_error_pct"].abs().mean()) if len(dp) else nan
        ),
        "red_grads_dp_median_ratio": (
            float((dp["measured_red_grads_s"] / dp["predicted_red_grads_s"]).median())
            if len(dp)
            else nan
        ),
    }


def mape_table(rows: list[PlanRow]) -> pd.DataFrame:
    """Per set with measurements: plans scored, excluded, MAPE, max |error|, mean signed error
    (ours, %), and Sailor's simulator's MAPE / max |error| on the same plans beside them
    (:func:`sailor_on_same_plans`); then the logged reduction's scores
    (:func:`_red_grads_stats`)."""
    err = errors_frame(rows)
    sets = sorted({r.set for r in rows if r.real_s is not None})
    out = []
    for s in sets:
        e = err[err["set"] == s] if len(err) else err
        excluded = sum(1 for r in rows if r.set == s and r.prediction is None)
        ref = sailor_on_same_plans(s, e)
        out.append(
            {
                "set": s,
                "plans": len(e),
                "excluded": excluded,
                "mape_pct": float(e["abs_error_pct"].mean()) if len(e) else float("nan"),
                "max_abs_error_pct": float(e["abs_error_pct"].max()) if len(e) else float("nan"),
                "mean_signed_error_pct": (
                    float(e["signed_error_pct"].mean()) if len(e) else float("nan")
                ),
                "sailor_mape_pct": ref[0],
                "sailor_max_abs_error_pct": ref[1],
                **_red_grads_stats(e),
            }
        )
    return pd.DataFrame(out)


def profile_rows_table(rows: list[PlanRow]) -> pd.DataFrame:
    """Per set and profile-row kind (``profiler`` or ``round-number``): plans, iteration MAPE,
    max |error| — the kinds apart, as the round-number rows are a known defect of the data."""
    err = errors_frame(rows)
    out = []
    if not len(err):
        return pd.DataFrame(out, columns=["set", "rows", "plans", "mape_pct", "max_abs_error_pct"])
    for (s, rnd), e in err.groupby(["set", "round_rows"], sort=True):
        out.append(
            {
                "set": s,
                "rows": "round-number" if rnd else "profiler",
                "plans": len(e),
                "mape_pct": float(e["abs_error_pct"].mean()),
                "max_abs_error_pct": float(e["abs_error_pct"].max()),
            }
        )
    return pd.DataFrame(out)


def sailor_on_same_plans(set_name: str, scored: pd.DataFrame) -> tuple[float | None, float | None]:
    """Sailor's simulator's (MAPE %, max |error| %) over exactly the plans of ``scored`` (rows of
    :func:`errors_frame` of one set): its published numbers when they are the plans its numbers
    were published over, else computed from its per-plan predictions when every scored plan has
    one, else (None, None) — a number over other plans is no comparison."""
    stems = frozenset(_stem(p) for p in scored["plan"]) if len(scored) else frozenset()
    published = SAILOR_SIMULATOR_MAPE.get(set_name)
    whole = stems == SAILOR_PUBLISHED_PLANS.get(set_name) and len(stems) == len(scored)
    if published is not None and stems and whole:
        return published[0], published[1]
    if not stems or scored["sailor_simulator_s"].isna().any():
        return None, None
    err = 100.0 * (scored["sailor_simulator_s"].astype(float) - scored["real_s"]).abs()
    err = err / scored["real_s"]
    return float(err.mean()), float(err.max())
