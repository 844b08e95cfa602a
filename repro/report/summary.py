"""Per-setting summary of a simulated grid: each system's PFLOPS/seconds, picks and speed-ups.

One line per (case, num_layers, global_batch_size). Speed-ups are iteration-time ratios in the same
setting (same FLOPs), ``baseline / ours``; the paper's claimed ratio is put beside them. The
baselines' headline columns are under the run's ``baseline_placement``; with ``topology`` the
paper's launch-order protocol goes beside them as ``<baseline>_launch_*`` and
``speedup_vs_<baseline>_launch``. :func:`print_summary_table` and :func:`print_setting_rows` show
the same frame on the console.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from baselines.placement import Placement
from system.results import SIMULATED_SYSTEMS
from system.simulator import V100

__all__ = [
    "KEYS",
    "summary_frame",
    "with_speedups",
    "merge_summary",
    "paper_ratios",
    "print_summary_table",
    "print_setting_rows",
]

KEYS = ["case", "num_layers", "global_batch_size"]
SYSTEMS = SIMULATED_SYSTEMS  # one column group each


def summary_frame(lines: list[dict]) -> pd.DataFrame:
    """``lines``: dicts with KEYS and SimResults under ``ours``/``megatron``/``deepspeed``, a list
    of them under ``ours_random``, and ``<baseline>_why`` texts."""
    out = []
    for ln in lines:
        row = {k: ln[k] for k in KEYS}
        row["baseline_placement"] = ln.get("baseline_placement", Placement.launch)
        names = ["ours", "megatron", "deepspeed"]
        names += ["ours_search"] if "ours_search" in ln else []  # ours' best configuration
        names += [f"{b}_launch" for b in ("megatron", "deepspeed") if f"{b}_launch" in ln]
        for name in names:
            res = ln.get(name)
            row[f"{name}_pflops"] = res.pflops if res else None
            row[f"{name}_iter_time_s"] = res.iter_time_s if res else None
            if name != "ours":
                row[f"{name}_config"] = res.label() if res else None
                row[f"{name}_why"] = ln.get(f"{name}_why")
        rnd = ln.get("ours_random") or []
        row["ours_random_pflops"] = float(np.mean([r.pflops for r in rnd])) if rnd else None
        row["ours_random_iter_time_s"] = (
            float(np.mean([r.iter_time_s for r in rnd])) if rnd else None
        )
        out.append(row)
    return pd.DataFrame(out)


def with_speedups(df: pd.DataFrame, paper: dict[str, str]) -> pd.DataFrame:
    """Add speed-ups and the paper's ratios (``paper``: claim_id -> text, paper_claims.csv)."""
    df = df.copy()
    t = {
        k: pd.to_numeric(df[f"{k}_iter_time_s"], errors="coerce")
        for k in SYSTEMS
        if f"{k}_iter_time_s" in df.columns
    }
    df["speedup_vs_megatron"] = t["megatron"] / t["ours"]
    df["speedup_vs_deepspeed"] = t["deepspeed"] / t["ours"]
    df["speedup_vs_best_baseline"] = np.fmin(t["megatron"], t["deepspeed"]) / t["ours"]
    df["speedup_vs_random"] = t["ours_random"] / t["ours"]
    for b in ("megatron", "deepspeed"):
        if f"{b}_launch_iter_time_s" in df.columns:
            launch = pd.to_numeric(df[f"{b}_launch_iter_time_s"], errors="coerce")
            df[f"speedup_vs_{b}_launch"] = launch / t["ours"]
            if "ours_search" in t:
                df[f"speedup_best_vs_{b}_launch"] = launch / t["ours_search"]
        if "ours_search" in t:  # the best of each system: ours' search against each grid's best
            df[f"speedup_best_vs_{b}"] = t[b] / t["ours_search"]
    five = df["case"].astype(str) == "5"
    rest = paper.get("c1to4_vs_baselines", "")
    df["paper_vs_megatron"] = np.where(
        five, paper.get("c5_vs_megatron", ""), f"{rest} (best baseline)" if rest else ""
    )
    df["paper_vs_deepspeed"] = np.where(five, paper.get("c5_vs_deepspeed", ""), "")
    top = paper.get("scheduler_vs_random", "").split("–")[-1]
    df["paper_vs_random"] = np.where(five, f"up to {top}" if top else "", "")
    return df


def merge_summary(path: str | Path, summary: pd.DataFrame) -> pd.DataFrame:
    """``summary`` merged over an existing summary CSV (other sweep jobs); new values win."""
    path = Path(path)
    if not path.exists():
        return summary
    old = pd.read_csv(path, dtype={"case": str}).set_index(KEYS)
    old = old[[c for c in old.columns if not c.startswith(("speedup_", "paper_"))]]
    return summary.set_index(KEYS).combine_first(old).reset_index()


def paper_ratios() -> dict[str, str]:
    """The paper's claimed ratios as text, from ``repro/report/data/paper_claims.csv``."""
    from repro.report.claims import load_paper_claims

    out = {}
    for c in load_paper_claims().itertuples(index=False):
        lo, hi = (None if pd.isna(v) else str(v) for v in (c.paper_low, c.paper_high))
        out[c.claim_id] = (lo if lo == hi or not hi else f"{lo}–{hi}") + "×" if lo else ""
    return out


def print_summary_table(summary: pd.DataFrame, elapsed_s: float) -> None:
    """One line per setting: ours, then each baseline under the paper's protocol (launch order)
    and, when simulated, the fair one (topology-aware placement), ours' speed-up beside each."""
    from rich.console import Console
    from rich.table import Table

    t = Table(
        title=f"simulated iteration seconds (V100 model, {V100.achievable_fraction:.0%} of "
        f"peak; x = ours' speed-up; launch = the paper's protocol, topo = topology-aware "
        f"baseline placement) - {elapsed_s:.1f} s"
    )
    cols = [
        ("case", "right"),
        ("L", "right"),
        ("batch", "right"),
        ("ours s", "right"),
        ("random s", "right"),
        ("Meg launch s", "right"),
        ("Meg topo s (config)", "left"),
        ("DS launch s", "right"),
        ("DS topo s (config)", "left"),
        ("x Meg launch", "right"),
        ("x Meg topo", "right"),
        ("x DS launch", "right"),
        ("x DS topo", "right"),
        ("x rand", "right"),
        ("paper x Meg", "right"),
        ("paper x DS", "right"),
    ]
    for c, just in cols:
        t.add_column(c, justify=just)
    f = lambda v, p=3: "—" if v is None or (isinstance(v, float) and np.isnan(v)) else f"{v:.{p}g}"  # noqa: E731
    for r in summary.to_dict("records"):
        topo = r.get("baseline_placement") == Placement.topology

        def side(b: str, r=r, topo=topo) -> tuple[str, str, str, str]:
            """(launch s, topo s + config, x launch, x topo) of baseline ``b``."""
            head = f"{f(r.get(f'{b}_iter_time_s'))} ({r.get(f'{b}_config') or '—'})"
            if topo:
                return (
                    f(r.get(f"{b}_launch_iter_time_s")),
                    head,
                    f(r.get(f"speedup_vs_{b}_launch"), 2),
                    f(r.get(f"speedup_vs_{b}"), 2),
                )
            return head, "—", f(r.get(f"speedup_vs_{b}"), 2), "—"

        meg, ds = side("megatron"), side("deepspeed")
        t.add_row(
            str(r["case"]),
            str(r["num_layers"]),
            str(r["global_batch_size"]),
            f(r.get("ours_iter_time_s")),
            f(r.get("ours_random_iter_time_s")),
            meg[0],
            meg[1],
            ds[0],
            ds[1],
            meg[2],
            meg[3],
            ds[2],
            ds[3],
            f(r.get("speedup_vs_random"), 2),
            r.get("paper_vs_megatron", ""),
            r.get("paper_vs_deepspeed", ""),
        )
    Console(width=240, highlight=False).print(t)


def print_setting_rows(lines: list[dict]) -> None:
    """Per setting, one row per system and placement protocol: the picked configuration, where
    its ranks went, its time and ours' speed-up over it."""
    from rich.console import Console
    from rich.table import Table

    sharing = {ln.get("link_sharing") for ln in lines} - {None}
    t = Table(
        title="per system and placement (best configuration of each grid; ours = the paper's "
        "configuration, ours best = ours' configuration search; link sharing: "
        f"{', '.join(sorted(sharing)) or 'pair'})"
    )
    for c in (
        "case",
        "L",
        "batch",
        "system",
        "placement",
        "config",
        "rank map",
        "iter s",
        "x ours",
    ):
        t.add_column(c, justify="right" if c in ("L", "batch", "iter s", "x ours") else "left")
    t.add_column("collective")
    t.add_column("x ours best", justify="right")
    for ln in lines:
        ours = ln.get("ours")
        best = ln.get("ours_search")
        entries = [("ours", "scheduled", ours)] if ours else []
        if best is not None:
            entries.append(("ours best", best.config.get("layout", ""), best))
        for b in ("megatron", "deepspeed"):
            head = ln.get("baseline_placement", Placement.launch)
            if f"{b}_launch" in ln:
                entries.append((b, Placement.launch, ln[f"{b}_launch"]))
            if b in ln:
                entries.append((b, head, ln[b]))
        for name, placement, res in entries:
            mine = name.startswith("ours")
            layout = f"layout: {res.config.get('layout', 'scheduled')}"
            how = res.breakdown.get("placement_how", layout if mine else "")
            x = f"{res.iter_time_s / ours.iter_time_s:.2f}" if ours and not mine else ""
            xb = f"{res.iter_time_s / best.iter_time_s:.2f}" if best and not mine else ""
            t.add_row(
                str(ln["case"]),
                str(ln["num_layers"]),
                str(ln["global_batch_size"]),
                name,
                placement,
                res.label(),
                how,
                f"{res.iter_time_s:.1f}",
                x,
                res.breakdown.get("dp_collective", ""),
                xb,
            )
    Console(width=200, highlight=False).print(t)
