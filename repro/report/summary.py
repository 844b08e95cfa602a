"""Per-setting summary of a simulated study: each system's seconds and PFLOPS, picks, speed-ups.

One line per (case, num_layers, global_batch_size), built from the study's rows alone
(:func:`summary_from_rows`): ours (the paper's configuration on the scheduled layout; the
paper's genetic scheduler where a study compares schedulers, the mean over seeds), ours' best
configuration when the study searched it (``ours_search_*``: its ``is_best`` row), ours with
random layouts (their mean), and each baseline's best configuration under every placement
protocol its rows carry. The headline baseline columns (``megatron_*``) are under the fair
protocol (``topology``) when the rows have it, else under the paper's (``launch``); the other
protocol goes beside them as ``<baseline>_launch_*``. Speed-ups are iteration-time ratios in
the same setting (same FLOPs), ``baseline / ours``; the paper's claimed ratio is put beside
them. :func:`print_compact` shows
the summary on a console in at most 100 columns, :func:`print_wide` every column.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from baselines.placement import Placement
from baselines.space import GridPoint, explain_pick
from system.results import BASELINE_SYSTEMS, SIMULATED_SYSTEMS
from system.simulator import V100

__all__ = [
    "KEYS",
    "SUMMARY_INPUTS",
    "summary_from_rows",
    "with_speedups",
    "paper_ratios",
    "case_claims",
    "print_compact",
    "print_wide",
]

KEYS = ["case", "num_layers", "global_batch_size"]
SYSTEMS = SIMULATED_SYSTEMS  # one column group each
# what the summary reads of a row
COLUMNS = [
    *KEYS,
    "system",
    "placement",
    "link_sharing",
    "dp_collective",
    "status",
    "repeat",
    "is_best",
    "iter_time_s",
    "pflops",
    "config",
    "sim_pipeline_s",
    "sim_dp_sync_s",
    "scheduler",
]
SUMMARY_INPUTS = ["mode", *COLUMNS]  # every column summary_from_rows reads


def _points(grid: pd.DataFrame) -> list[GridPoint]:
    """One point per row of ``grid``, read column by column (a missing time: 0 s)."""

    def seconds(name: str) -> list[float]:
        if name not in grid.columns:
            return [0.0] * len(grid)
        values = grid[name]
        if pd.api.types.is_float_dtype(values.dtype):  # the same floats, read at once
            s = values.to_numpy(dtype=float, na_value=np.nan)
            return np.where(np.isnan(s), 0.0, s).tolist()
        return [0.0 if v is None or pd.isna(v) else float(v) for v in values.tolist()]

    return [
        GridPoint(str(label), *times, str(status))
        for label, *times, status in zip(
            grid["config"].tolist(),
            seconds("iter_time_s"),
            seconds("sim_pipeline_s"),
            seconds("sim_dp_sync_s"),
            grid["status"].tolist(),
            strict=True,
        )
    ]


def _best(grid: pd.DataFrame) -> int | None:
    """The position in ``grid`` of its pick among the ok rows: the first marked ``is_best``,
    else the fastest (the first of equals); None when no row is ok."""
    ok = (grid["status"] == "ok").fillna(False).to_numpy(dtype=bool)
    if not ok.any():
        return None
    if "is_best" in grid:
        marked = ok & grid["is_best"].fillna(False).astype(bool).to_numpy(dtype=bool)
        if marked.any():
            return int(marked.argmax())
    at = np.flatnonzero(ok)
    return int(at[pd.to_numeric(grid["iter_time_s"].iloc[at]).reset_index(drop=True).idxmin()])


def summary_from_rows(rows: pd.DataFrame) -> pd.DataFrame:
    """The summary of the simulated rows of a study (module docstring), speed-ups included."""
    if rows.empty or "mode" not in rows:
        return pd.DataFrame(columns=KEYS)
    sim = rows.loc[rows["mode"] == "simulate", [c for c in COLUMNS if c in rows]].copy()
    sim["case"] = sim["case"].astype(str)
    if "placement" not in sim:  # rows from before placements were recorded: launch order
        sim["placement"] = Placement.launch.value
    if "config" not in sim:
        sim["config"] = None
    if "repeat" in sim:  # a repeat of a configuration is a deterministic copy: keep one
        first = sim["repeat"].fillna(0) == 0
        sim = sim[first | (sim["system"] == "ours_random")]
    sim["placement"] = sim["placement"].fillna(Placement.launch.value)
    # each link-sharing model is its own setting (rows from before the models: pair)
    if "link_sharing" not in sim:
        sim["link_sharing"] = "pair"
    sim["link_sharing"] = sim["link_sharing"].fillna("pair").astype(str)
    if "dp_collective" not in sim:
        sim["dp_collective"] = None
    by = [*KEYS, "link_sharing"]
    # each baseline's grid per setting and placement, and per setting the other systems' rows,
    # split once (a group keeps its rows' order)
    in_grid = sim["system"].isin(BASELINE_SYSTEMS)
    grids = {k: g for k, g in sim[in_grid].groupby([*by, "system", "placement"], sort=False)}
    others = {k: g for k, g in sim[~in_grid].groupby(by, sort=False)}
    placements: dict[tuple, set] = {}
    for *setting, _, placement in grids:
        placements.setdefault(tuple(setting), set()).add(placement)
    empty = sim.iloc[:0]
    out = []
    for key in sim.groupby(by, sort=True).indices:  # the settings, in order
        line: dict = dict(zip(by, key, strict=True))
        g = others.get(key, empty)
        have = placements.get(key, set())
        headline = Placement.topology if Placement.topology in have else Placement.launch
        line["baseline_placement"] = str(headline)
        for name in ("ours", "ours_random"):
            ok = g[(g["system"] == name) & (g["status"] == "ok")]
            if name == "ours" and "scheduler" in ok and (ok["scheduler"] == "genetic").any():
                ok = ok[ok["scheduler"] == "genetic"]  # the paper's scheduler, in an ablation
            line[f"{name}_pflops"] = ok["pflops"].mean() if len(ok) else None
            line[f"{name}_iter_time_s"] = ok["iter_time_s"].mean() if len(ok) else None
        search = g[g["system"] == "ours_search"]
        if len(search):  # ours' configuration search: its best (is_best) configuration
            at = _best(search)
            best = None if at is None else search.iloc[at]
            line["ours_search_pflops"] = None if best is None else best["pflops"]
            line["ours_search_iter_time_s"] = None if best is None else best["iter_time_s"]
            line["ours_search_config"] = None if best is None else best["config"]
            line["ours_search_layout"] = None if best is None else best["placement"]
            line["ours_search_dp_collective"] = None if best is None else best["dp_collective"]
        for b in BASELINE_SYSTEMS:
            for p in [headline, *sorted(have - {headline})]:
                name = b if p == headline else f"{b}_{p}"
                grid = grids.get((*key, b, p), empty)
                at = _best(grid)
                best = None if at is None else grid.iloc[at]
                line[f"{name}_pflops"] = None if best is None else best["pflops"]
                line[f"{name}_iter_time_s"] = None if best is None else best["iter_time_s"]
                line[f"{name}_config"] = None if best is None else best["config"]
                line[f"{name}_dp_collective"] = None if best is None else best["dp_collective"]
                if best is not None:
                    points = _points(grid)
                    line[f"{name}_why"] = explain_pick(points[at], points)
                else:
                    line[f"{name}_why"] = None
        out.append(line)
    return with_speedups(pd.DataFrame(out), paper_ratios()) if out else pd.DataFrame(columns=KEYS)


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


def paper_ratios() -> dict[str, str]:
    """The paper's claimed ratios as text, from ``repro/report/data/paper_claims.csv``."""
    from repro.report.claims import load_paper_claims

    out = {}
    for c in load_paper_claims().itertuples(index=False):
        lo, hi = (None if pd.isna(v) else str(v) for v in (c.paper_low, c.paper_high))
        out[c.claim_id] = (lo if lo == hi or not hi else f"{lo}–{hi}") + "×" if lo else ""
    return out


def case_claims(case: str) -> str:
    """The paper's claimed speed-ups for ``case``, as one line of text."""
    paper = paper_ratios()
    if str(case) == "5":
        return (
            f"paper, case 5: {paper.get('c5_vs_megatron', '?')} over Megatron, "
            f"{paper.get('c5_vs_deepspeed', '?')} over DeepSpeed, up to "
            f"{paper.get('scheduler_vs_random', '?').split('–')[-1]} over random layouts"
        )
    if str(case) in ("1", "2", "3", "4"):
        return f"paper, cases 1-4: {paper.get('c1to4_vs_baselines', '?')} over the best baseline"
    return f"paper: no claim for case {case}"


def _fmt(v, digits: int = 3) -> str:
    return "—" if v is None or (isinstance(v, float) and np.isnan(v)) else f"{v:.{digits}g}"


# short names for the compact table (a cell is never cut)
SHORT_PLACEMENT = {
    "scheduled": "sched",
    "one_pipeline_per_region": "pipe/region",
    "greedy_region_fill": "greedy",
    "launch": "launch",
    "topology": "topo",
    "random": "random",
}
SHORT_SYSTEM = {"megatron": "Megatron", "deepspeed": "DeepSpeed"}


def _ascii_head():
    """Rich's SIMPLE_HEAD box drawn in ASCII: a line counts its bytes as its columns."""
    from rich.box import Box

    return Box("    \n    \n -- \n    \n    \n    \n    \n    \n", ascii=True)


def _compact_entries(r: dict) -> list[tuple[str, str, str, object]]:
    """(system, placement, configuration and DP collective, seconds) of one summary line."""

    def config(name: str) -> str:
        text = str(r.get(f"{name}_config") or "")
        coll = r.get(f"{name}_dp_collective")
        return f"{text}; {coll}" if isinstance(coll, str) and coll else text

    out: list[tuple[str, str, str, object]] = [
        ("ours", "sched", "paper's shape", r.get("ours_iter_time_s"))
    ]
    if r.get("ours_search_iter_time_s") is not None:
        layout = str(r.get("ours_search_layout") or "scheduled")
        out.append(
            (
                "ours best",
                SHORT_PLACEMENT.get(layout, layout),
                config("ours_search").replace(f" [{layout}]", ""),
                r.get("ours_search_iter_time_s"),
            )
        )
    out.append(("random", "random", "paper's shape, mean of 3+", r.get("ours_random_iter_time_s")))
    head = str(r.get("baseline_placement", "launch"))
    for b in BASELINE_SYSTEMS:
        for name, placement in ((f"{b}_launch", "launch"), (b, head)):
            if f"{name}_iter_time_s" in r and not (name.endswith("_launch") and head == "launch"):
                short = SHORT_PLACEMENT.get(placement, placement)
                out.append(
                    (SHORT_SYSTEM.get(b, b), short, config(name), r.get(f"{name}_iter_time_s"))
                )
    return [e for e in out if e[3] is not None and not pd.isna(e[3])]


def _ratio_text(r: dict, key: str) -> str:
    v = r.get(key)
    return "-" if v is None or pd.isna(v) else f"{v:.2f}x"


def print_compact(summary: pd.DataFrame, elapsed_s: float, *, width: int = 100) -> None:
    """Per setting a header line and a table in at most ``width`` columns (no cell is cut): each
    system and placement with its configuration (and DP collective), seconds per iteration and
    the paper-shape ours' speed-up over it; below it ours over each baseline for the paper's
    shape and for the best of each (ours' searched configuration against each grid's best),
    then the paper's claims."""
    from rich.console import Console
    from rich.table import Table

    console = Console(width=width, highlight=False)
    console.print(
        f"simulated s/iteration, V100 model at {V100.achievable_fraction:.0%} of peak "
        f"({elapsed_s:.1f} s); x: ours (paper's shape) over the row"
    )
    for r in summary.to_dict("records"):
        t = Table(box=_ascii_head(), pad_edge=False)
        for c, just in (
            ("system", "left"),
            ("layout", "left"),
            ("configuration; DP collective", "left"),
            ("s/iter", "right"),
            ("x", "right"),
        ):
            t.add_column(c, justify=just, no_wrap=True)
        ours = r.get("ours_iter_time_s")
        for system, placement, config, sec in _compact_entries(r):
            x = "" if system == "ours" or ours is None else f"{sec / ours:.2f}"
            t.add_row(system, placement, config, _fmt(sec), x)
        sharing = r.get("link_sharing", "?")
        console.print(
            f"\ncase {r['case']}, {r['num_layers']} layers, batch {r['global_batch_size']}, "
            f"link sharing {sharing}"
        )
        console.print(t)
        head = "topo" if r.get("baseline_placement") == Placement.topology else "launch"
        for b, name in (("megatron", "Megatron"), ("deepspeed", "DeepSpeed")):
            parts = []
            for what, key in (
                ("paper's shape", f"speedup_vs_{b}"),
                ("best vs best", f"speedup_best_vs_{b}"),
            ):
                if key not in r:
                    continue
                text = f"{what} {_ratio_text(r, key)} {head}"
                if head != "launch" and f"{key}_launch" in r:
                    text += f", {_ratio_text(r, f'{key}_launch')} launch"
                parts.append(text)
            console.print(f"ours/{name:<9}  " + " | ".join(parts))
    for case in dict.fromkeys(str(c) for c in summary["case"]):
        console.print(case_claims(case))


def print_wide(summary: pd.DataFrame, elapsed_s: float) -> None:
    """One line per setting: ours (and ours' best configuration when searched), then each
    baseline under the paper's protocol (launch order) and, when simulated, the fair one
    (topology-aware placement), ours' speed-up beside each; "best x" is ours' best over each
    baseline's best (headline placement)."""
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
        ("sharing", "left"),
        ("ours s", "right"),
        ("ours best s (config)", "left"),
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
        ("best x Meg", "right"),
        ("best x DS", "right"),
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
            str(r.get("link_sharing", "—")),
            f(r.get("ours_iter_time_s")),
            f"{f(r.get('ours_search_iter_time_s'))} ({r.get('ours_search_config') or '—'})",
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
            f(r.get("speedup_best_vs_megatron"), 2),
            f(r.get("speedup_best_vs_deepspeed"), 2),
            r.get("paper_vs_megatron", ""),
            r.get("paper_vs_deepspeed", ""),
        )
    Console(width=240, highlight=False).print(t)
