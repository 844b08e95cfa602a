"""The claims under each placement protocol × link-sharing model, in one table (paper §4).

Two placement protocols of the baselines: ``launch``, the paper's (baseline ranks in the order the
devices were listed), and ``topology``, the fair one (each baseline configuration with its best
topology-aware rank map, :mod:`baselines.placement`). Rows say which in their ``placement``
column; baseline rows without one are launch order.

Link-sharing models (:mod:`system.simulator.sharing`): every simulated row says which model it ran
under (``link_sharing``; a simulated row without the column predates the models and ran under
``pair``). Rows of one model are never mixed with another's: each model is its own group, and
rows that are not simulated (measured runs) belong to every group.

:func:`evaluate_claims_by_protocol` runs :func:`repro.report.claims.evaluate_claims` once per
(protocol, model) present in the rows and returns one long table; ``claims.csv``, ``claims.md``
and the claims of ``REPORT.md`` are all written from that one table
(:func:`claims_markdown`), so they cannot disagree.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from baselines.placement import Placement, check_placement
from repro.report.claims import BASELINES, CLAIM_INPUTS, evaluate_claims, load_paper_claims
from repro.report.variance import measured_mask, ok_mask
from system.simulator.sharing import DEFAULT_LINK_SHARING, LINK_SHARING

__all__ = [
    "CLAIM_COLUMNS",
    "PROTOCOL_TITLES",
    "protocol_rows",
    "sharing_models",
    "sharing_rows",
    "headline_rows",
    "best_as_ours",
    "evaluate_claims_by_protocol",
    "claims_markdown",
    "write_protocol_claims",
]

# the long table's columns, in order (claims.csv)
CLAIM_COLUMNS = [
    "claim_id",
    "statement",
    "paper",
    "protocol",
    "link_sharing",
    "ours",
    "tolerance",
    "verdict",
    "detail",
]
PROTOCOL_TITLES = {
    Placement.launch: "paper's protocol (launch order)",
    Placement.topology: "fair (topology-aware)",
}
# a simulated row without a link_sharing column ran before the models existed: pairs independent
UNRECORDED_SHARING = "pair"
# the speed-up claims asked again of ours at its best configuration (system ``ours_search``, its
# ``is_best`` row: :mod:`system.config_search`) in place of the paper's fixed shape; their ids
# carry :data:`BEST_SUFFIX`
BEST_OF = ("c5_vs_megatron", "c5_vs_deepspeed", "c1to4_vs_baselines")
BEST_SUFFIX = "_ours_best"


def protocol_rows(rows: pd.DataFrame, protocol: str) -> pd.DataFrame:
    """``rows`` with the baselines' rows of one placement protocol only (``launch`` or
    ``topology``); other systems' rows unchanged. Baseline rows without a ``placement`` are
    launch order."""
    protocol = check_placement(protocol)
    if rows.empty or "system" not in rows.columns:
        return rows
    return rows[_in_protocol(rows, protocol)].reset_index(drop=True)


def _in_protocol(rows: pd.DataFrame, protocol: str) -> pd.Series:
    """Which rows :func:`protocol_rows` keeps (every row when there is no ``system``)."""
    if "system" not in rows.columns:
        return pd.Series(True, index=rows.index)
    placement = (
        rows["placement"].fillna(Placement.launch).astype(str)
        if "placement" in rows.columns
        else pd.Series(Placement.launch.value, index=rows.index)
    )
    baseline = rows["system"].isin(BASELINES)
    return ~baseline | (placement == protocol)


def _simulated(rows: pd.DataFrame) -> pd.Series:
    if "mode" not in rows.columns:
        return pd.Series(True, index=rows.index)
    return rows["mode"].astype(str) == "simulate"


def _sharing(rows: pd.DataFrame) -> pd.Series:
    if "link_sharing" not in rows.columns:
        return pd.Series(UNRECORDED_SHARING, index=rows.index)
    return rows["link_sharing"].fillna(UNRECORDED_SHARING).astype(str)


def sharing_models(rows: pd.DataFrame) -> list[str]:
    """The link-sharing models of the simulated rows: the default first, then in the order of
    :data:`LINK_SHARING` (one group even when there are no simulated rows)."""
    have = set(_sharing(rows[_simulated(rows)]).unique()) if not rows.empty else set()
    order = [DEFAULT_LINK_SHARING, *(m for m in LINK_SHARING if m != DEFAULT_LINK_SHARING)]
    models = [m for m in order if m in have] + sorted(have - set(order))
    return models or [DEFAULT_LINK_SHARING]


def sharing_rows(rows: pd.DataFrame, model: str) -> pd.DataFrame:
    """The simulated rows of one link-sharing model, and every row that is not simulated."""
    if rows.empty:
        return rows
    return rows[_in_sharing(rows, model)].reset_index(drop=True)


def _in_sharing(rows: pd.DataFrame, model: str) -> pd.Series:
    """Which rows :func:`sharing_rows` keeps."""
    return ~_simulated(rows) | (_sharing(rows) == model)


def headline_rows(rows: pd.DataFrame) -> pd.DataFrame:
    """The rows of the headline link-sharing model (the default when present): what the
    per-setting tables and Fig. 3 show; the other models are in the claims and summary."""
    return sharing_rows(rows, sharing_models(rows)[0])


def best_as_ours(rows: pd.DataFrame) -> pd.DataFrame:
    """``rows`` with ours' best configuration (``ours_search``, ``is_best``) as system ``ours``
    and the paper-shape ``ours`` rows left out; empty when there is no such row."""
    if rows.empty or "is_best" not in rows.columns or "system" not in rows.columns:
        return rows.iloc[:0]
    best = _ours_best(rows)
    if not best.any():
        return rows.iloc[:0]
    return _as_ours(rows, best)


def _ours_best(rows: pd.DataFrame) -> pd.Series:
    """Which rows are ours' best configuration (needs ``system`` and ``is_best``)."""
    return (rows["system"] == "ours_search") & rows["is_best"].fillna(False).astype(bool)


def _as_ours(rows: pd.DataFrame, best: pd.Series) -> pd.DataFrame:
    """:func:`best_as_ours` of ``rows`` whose best configuration's rows are ``best``."""
    keep = best | ~rows["system"].isin(["ours", "ours_search"])
    out = rows[keep].copy()
    out.loc[best[keep], "system"] = "ours"
    return out.reset_index(drop=True)


def _read_by_claims(rows: pd.DataFrame) -> pd.Series:
    """The rows a claim can read: the ok rows, and the measured runs whether ok or not (the
    variance claim says whether there were any). Leaving the others out changes no verdict:
    a group without them is judged as one whose rows are all not ok. Every row when a column
    the claims need is missing (the claims then say which)."""
    try:
        return ok_mask(rows) | measured_mask(rows)
    except ValueError:
        return pd.Series(True, index=rows.index)


def evaluate_claims_by_protocol(
    rows: pd.DataFrame, ablation: pd.DataFrame | None = None, *, tolerance: float = 0.25
) -> pd.DataFrame:
    """One line per (link-sharing model, protocol, claim) present in ``rows``, with our number
    and verdict: columns :data:`CLAIM_COLUMNS`. Models in :func:`sharing_models` order, within
    each the protocols with baseline rows (launch always)."""
    # the columns the claims read: every selection below copies these only, not a study's ~90
    rows = rows[[c for c in CLAIM_INPUTS if c in rows.columns]]
    # Each group (model, protocol, and ours' best or not) is a mask over all the rows, and its
    # rows are copied once, less those no claim reads. Which groups exist is decided on every
    # row, as sharing_rows, protocol_rows and best_as_ours decide it.
    read = _read_by_claims(rows)
    in_protocol = {p: _in_protocol(rows, p) for p in Placement}
    has_best = not rows.empty and {"is_best", "system"} <= set(rows.columns)
    ours_best = _ours_best(rows) if has_best else None
    parts = []
    for model in sharing_models(rows):
        in_model = _in_sharing(rows, model)
        have = {Placement.launch.value}
        if "placement" in rows.columns and "system" in rows.columns:
            baseline = in_model & rows["system"].isin(BASELINES)
            have |= set(rows.loc[baseline, "placement"].dropna().astype(str).unique())
        best = ours_best[in_model] if has_best else None
        if best is not None and not best.any():
            best = None
        for protocol in (p for p in Placement if p in have):
            keep = in_model & in_protocol[protocol] & read
            group = rows[keep].reset_index(drop=True)
            c = evaluate_claims(group, ablation, tolerance=tolerance)
            parts.append(c.assign(protocol=str(protocol), link_sharing=model))
            if best is None:
                continue
            # protocol_rows(best_as_ours(...)) of the model's rows: a row is kept or relabelled
            # on its own, and the relabelled rows (ours) are in every protocol
            best_rows = _as_ours(group, ours_best[keep].reset_index(drop=True))
            c = evaluate_claims(best_rows, tolerance=tolerance, claims=_best_claims())
            c["claim_id"] = c["claim_id"] + BEST_SUFFIX
            c["statement"] = "Ours at its best configuration: " + c["statement"]
            parts.append(c.assign(protocol=str(protocol), link_sharing=model))
    # per model and protocol: the paper's claims in their order, then ours-at-its-best's
    return pd.concat(parts, ignore_index=True)[CLAIM_COLUMNS]


def _best_claims() -> pd.DataFrame:
    claims = load_paper_claims()
    return claims[claims["claim_id"].isin(BEST_OF)].reset_index(drop=True)


def claims_markdown(claims: pd.DataFrame, *, only: str | None = None) -> list[str]:
    """Markdown of the long claims table: per link-sharing model (or ``only`` that one) a table,
    one line per claim, ours and the verdict under each protocol side by side."""
    from repro.report.tables import markdown_table

    lines: list[str] = []
    models = list(dict.fromkeys(claims["link_sharing"]))
    for model in models if only is None else [only]:
        part = claims[claims["link_sharing"] == model]
        protocols = list(dict.fromkeys(part["protocol"]))
        first = part[part["protocol"] == protocols[0]]
        table = first[["claim_id", "paper"]].rename(columns={"claim_id": "claim"})
        table = table.reset_index(drop=True)
        notes = first["detail"].reset_index(drop=True)
        for p in protocols:
            mine = part[part["protocol"] == p].reset_index(drop=True)
            table[f"{p}: ours"] = mine["ours"]
            table[f"{p}: verdict"] = mine["verdict"]
            # a note per protocol only where the protocols' reasons differ
            differ = mine["detail"] != notes
            notes = notes.where(~differ, notes + f" ({p}: " + mine["detail"] + ")")
        table["note"] = notes
        default = " (the default)" if model == DEFAULT_LINK_SHARING else ""
        lines += [f"### Link sharing `{model}`{default}", "", markdown_table(table), ""]
    return lines


def write_protocol_claims(
    results_dir: Path, rows: pd.DataFrame, claims: pd.DataFrame, summary: pd.DataFrame
) -> Path:
    """``claims.md``: the long claims table (:func:`evaluate_claims_by_protocol`) per link-sharing
    model, and why each baseline configuration won (``summary``:
    :func:`repro.report.summary.summary_from_rows`)."""
    from system.results import atomic_write_text

    protocols = list(dict.fromkeys(claims["protocol"]))
    models = list(dict.fromkeys(claims["link_sharing"]))
    lines = [
        "# Simulated results vs the paper's claims",
        "",
        f"{len(rows)} rows. Verdicts: `repro/report/claims.py` (tolerance "
        f"{_tolerance_text(claims)}), once per protocol of the baselines' rank placement ("
        + "; ".join(f"{p} = {PROTOCOL_TITLES[Placement(p)]}" for p in protocols)
        + ") and per link-sharing model of the simulator ("
        + ", ".join(f"`{m}`" for m in models)
        + ", `system/simulator/sharing.py`); a model simulated on some cases only leaves the "
        "claims about the others INCONCLUSIVE. The same table is `claims.csv` (one line per "
        "model, protocol and claim) and the claims of `REPORT.md`. `fig3.png` shows each "
        "baseline's best over all placements under the first model.",
        "",
        *claims_markdown(claims),
        "## Baseline grid picks (why)",
        "",
    ]
    for r in summary.to_dict("records"):
        head = r.get("baseline_placement", Placement.launch)
        sharing = r.get("link_sharing") or DEFAULT_LINK_SHARING
        for b, name in (("megatron", "Megatron"), ("deepspeed", "DeepSpeed")):
            lines.append(
                f"- case {r['case']}, L{r['num_layers']}, B{r['global_batch_size']}, "
                f"{sharing}, {name} ({head}): {r.get(f'{b}_why')}"
            )
            if isinstance(r.get(f"{b}_launch_why"), str) and r[f"{b}_launch_why"]:
                lines.append(f"  - {name} (launch): {r[f'{b}_launch_why']}")
    out = results_dir / "claims.md"
    atomic_write_text(out, "\n".join(lines) + "\n")
    return out


def _tolerance_text(claims: pd.DataFrame) -> str:
    ranges = claims.loc[claims["tolerance"].astype(str).str.startswith("±"), "tolerance"]
    return str(ranges.iloc[0]).split(" ")[0] if len(ranges) else "—"
