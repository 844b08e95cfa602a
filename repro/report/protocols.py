"""The claims under each placement protocol of the baselines, and ``claims.md`` (paper §4).

Two protocols: ``launch``, the paper's (baseline ranks in the order the devices were listed), and
``topology``, the fair one (each baseline configuration with its best topology-aware rank map,
:mod:`baselines.placement`). Rows say which in their ``placement`` column; baseline rows without
one are launch order. :func:`evaluate_claims_by_protocol` runs
:func:`repro.report.claims.evaluate_claims` once per protocol present in the rows.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from baselines.placement import Placement, check_placement
from repro.report.claims import BASELINES, evaluate_claims

__all__ = ["protocol_rows", "evaluate_claims_by_protocol", "write_protocol_claims"]


def protocol_rows(rows: pd.DataFrame, protocol: str) -> pd.DataFrame:
    """``rows`` with the baselines' rows of one placement protocol only (``launch`` or
    ``topology``); other systems' rows unchanged. Baseline rows without a ``placement`` are
    launch order."""
    protocol = check_placement(protocol)
    if rows.empty or "system" not in rows.columns:
        return rows
    placement = (
        rows["placement"].fillna(Placement.launch).astype(str)
        if "placement" in rows.columns
        else pd.Series(Placement.launch.value, index=rows.index)
    )
    baseline = rows["system"].isin(BASELINES)
    return rows[~baseline | (placement == protocol)].reset_index(drop=True)


def evaluate_claims_by_protocol(
    rows: pd.DataFrame, ablation: pd.DataFrame | None = None, *, tolerance: float = 0.25
) -> pd.DataFrame:
    """One line per claim with ours and the verdict under each protocol present in ``rows``:
    columns ``claim_id, statement, paper, tolerance, ours_<protocol>, verdict_<protocol>,
    note`` (a protocol without baseline rows is left out)."""
    have = {Placement.launch.value}
    if "placement" in rows.columns:
        have |= set(rows["placement"].dropna().astype(str))
    out = None
    for protocol in (p for p in Placement if p in have):
        c = evaluate_claims(protocol_rows(rows, protocol), ablation, tolerance=tolerance)
        part = c.rename(columns={"ours": f"ours_{protocol}", "verdict": f"verdict_{protocol}"})
        if out is None:
            out = part.rename(columns={"detail": "note"})
        else:
            out[f"ours_{protocol}"] = part[f"ours_{protocol}"].to_numpy()
            out[f"verdict_{protocol}"] = part[f"verdict_{protocol}"].to_numpy()
    return out


def write_protocol_claims(
    results_dir: Path, rows: pd.DataFrame, summary: pd.DataFrame | None = None
) -> Path:
    """``claims.md``: every claim under each placement protocol of the baselines, and why each
    baseline configuration won (from ``summary``, default ``results_dir/summary.csv``)."""
    from repro.report.tables import markdown_table
    from system.results import atomic_write_text

    if summary is None:
        path = results_dir / "summary.csv"
        summary = pd.read_csv(path) if path.exists() else pd.DataFrame()
    claims = evaluate_claims_by_protocol(rows)
    protocols = [p for p in Placement if f"verdict_{p}" in claims.columns]
    title = {
        Placement.launch: "paper's protocol (launch order)",
        Placement.topology: "fair (topology-aware)",
    }
    lines = [
        "# Simulated results vs the paper's claims",
        "",
        f"{len(rows)} rows. Verdicts: `repro/report/claims.py` (tolerance 25%), once per "
        "protocol of "
        "the baselines' rank placement: "
        + "; ".join(f"{p} = {title[p]}" for p in protocols)
        + ". `fig3.png` shows each baseline's best over all placements.",
        "",
    ]
    table = claims[["claim_id", "paper"]].rename(columns={"claim_id": "claim"})
    for p in protocols:
        table[f"{p}: ours"] = claims[f"ours_{p}"]
        table[f"{p}: verdict"] = claims[f"verdict_{p}"]
    table["note"] = claims["note"]
    lines += [markdown_table(table)]
    lines += ["", "## Baseline grid picks (why)", ""]
    for r in summary.to_dict("records"):
        head = r.get("baseline_placement", Placement.launch)
        for b, name in (("megatron", "Megatron"), ("deepspeed", "DeepSpeed")):
            lines.append(
                f"- case {r['case']}, L{r['num_layers']}, B{r['global_batch_size']}, {name} "
                f"({head}): {r.get(f'{b}_why')}"
            )
            if isinstance(r.get(f"{b}_launch_why"), str) and r[f"{b}_launch_why"]:
                lines.append(f"  - {name} (launch): {r[f'{b}_launch_why']}")
    out = results_dir / "claims.md"
    atomic_write_text(out, "\n".join(lines) + "\n")
    return out
