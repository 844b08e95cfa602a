"""Planning for Sailor's framework (``mode=plan framework=sailor``) on Sailor's twelve trace
points: this tree beside an earlier commit.

    python repro/run.py mode=bench_plan_sailor base=4acee8c rounds=3 \
        profiles=$SAILOR results_dir=results/bench

``$SAILOR``: the folder of Sailor's published profiles and link fits, as
``results/planner/README.md`` sets it. Each point is the command of
``results/planner/sailor/COMMANDS.md`` (step 3b): its fleet file, model and batch, the profiles and
link fits of ``profiles``. Each tree first runs one small simulation
(:func:`~repro.checks.bench.sweep.warm_up`: the numeric kernels compiled before any timing); then
every round plans every point with each tree, the two trees' order alternating from one point to the
next and from one round to the next. A point's time is its plan's own ``search_time_s`` (the search,
without Python's start and the inputs' loading); the table gives each point's median over the rounds
and the ratio, the same for ``load_time_s + search_time_s`` (a tree that loads the model's modules
and kernels before its search, :func:`system.planner.sailor_target.warm_up`, counts them in
``load_time_s``, an earlier one in its search), and how many configurations each tree simulated.
Both trees must choose the same plan at a point (the same ``plan_config`` and iteration time) in
every round, or the run stops. The table, with the command, the commits and the load, is also
written to ``<results_dir>/plan_sailor.md``; a timing quoted from it needs the machine to itself.
Its runs and its temporary folder go with it however it is stopped (:mod:`system.lifeline`)."""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

from repro.checks.bench.config import POINTS, BenchPlanSailorConfig
from repro.checks.bench.sweep import tree_env, warm_up
from repro.checks.tree import ROOT, dirty, materialise, short_rev
from system.lifeline import cancel, exit_on_signals, on_death, run_guarded

__all__ = ["plan_point", "run"]

MODELS = {"OPT-350": ("opt_350", 1024), "GPT-Neo-2.7": ("gpt_neo_2_7", 2048)}


def plan_point(tree: Path, point: str, profiles: Path, out: Path, timeout_s: float = 600.0):
    """Plan one trace point (``<study>_<model>_p<k>``) with the repository copy ``tree``; its
    plan record."""
    study, model, k = point.split("_")
    name, batch = MODELS[model]
    fleet = ROOT / "results" / "planner" / "sailor" / "fleets" / f"{study}_{k}.json"
    cmd = [
        sys.executable,
        "repro/run.py",
        "mode=plan",
        f"case={fleet}",
        f"model={name}",
        f"batch={batch}",
        f"profiles={profiles}",
        "framework=sailor",
        f"out={out}",
        f"results_dir={out.parent}",
    ]
    p = run_guarded(cmd, cwd=tree, env=tree_env(tree), timeout_s=timeout_s)
    if p.returncode != 0:
        raise RuntimeError(f"{point} in {tree} failed ({p.returncode}):\n{p.stderr[-2000:]}")
    return json.loads(out.read_text())


def run(cfg: BenchPlanSailorConfig) -> dict:
    profiles = Path(cfg.profiles).resolve()
    points = list(cfg.points or POINTS)
    out: dict[tuple[str, str], list[dict]] = {}
    with exit_on_signals(), tempfile.TemporaryDirectory(prefix="dtfm-bench-plan-") as tmp:
        gone = on_death("rmtree", tmp)  # removed even if this process is SIGKILLed
        base = short_rev(cfg.base)
        trees = {base: Path(tmp) / "base", "this tree": ROOT}
        materialise(base, trees[base])
        for name, tree in trees.items():
            warm_up(tree, Path(tmp) / f"warm-{name.replace(' ', '_')}")
        load_before = os.getloadavg()[0]
        print(f"{len(points)} points, {os.cpu_count()} cores, load before {load_before:.2f}")
        for r in range(cfg.rounds):
            for i, point in enumerate(points):
                order = list(trees) if (r + i) % 2 == 0 else list(trees)[::-1]
                for name in order:
                    path = Path(tmp) / f"{name.replace(' ', '_')}-{point}-{r}" / "plan.json"
                    path.parent.mkdir(parents=True)
                    out.setdefault((point, name), []).append(
                        plan_point(trees[name], point, profiles, path)
                    )
                a, b = (out[(point, n)][-1] for n in trees)
                if (a["plan_config"], a["iteration_time_s"]) != (
                    b["plan_config"],
                    b["iteration_time_s"],
                ):
                    raise RuntimeError(f"{point}: the two trees chose other plans (round {r})")
                print(
                    f"round {r}: {point}: "
                    + ", ".join(f"{n} {out[(point, n)][-1]['search_time_s']:.2f} s" for n in trees),
                    flush=True,
                )
        cancel(gone)
    load_after = os.getloadavg()[0]
    lines = _table(out, list(trees), points)
    print("\n".join(lines))
    _write(cfg, lines, load_before, load_after)
    return {
        f"{p} {n}": statistics.median(r["search_time_s"] for r in out[(p, n)])
        for p in points
        for n in trees
    }


def _with_load_s(record: dict) -> float:
    """A plan's search and loading seconds together (what a tree counts as loading may differ:
    the model's kernels loaded before the search or during it)."""
    return record["search_time_s"] + record["load_time_s"]


def _table(out: dict, names: list[str], points: list[str]) -> list[str]:
    """Each point's median search seconds per tree and their ratio, the same for search and
    loading together, the simulations; the totals."""
    a, b = names
    cols = {"search": lambda r: r["search_time_s"], "load + search": _with_load_s}
    head = " | ".join(f"{k + ': ' + a:>17} {b:>9} {'ratio':>6}" for k in cols)
    lines = [f"{'point':>22} | {head} | simulations {a} -> {b} (floored)"]
    total = {(k, n): 0.0 for k in cols for n in names}
    for p in points:
        parts = []
        for k, of in cols.items():
            med = {n: statistics.median(of(r) for r in out[(p, n)]) for n in names}
            for n in names:
                total[k, n] += med[n]
            parts.append(f"{med[a]:17.2f} {med[b]:9.2f} {med[a] / med[b]:5.2f}x")
        last = {n: out[(p, n)][-1] for n in names}
        floored = last[b].get("floored")
        lines.append(
            f"{p:>22} | {' | '.join(parts)} | "
            f"{last[a]['simulations']} -> {last[b]['simulations']}"
            + (f" ({floored})" if floored is not None else "")
        )
    sums = [
        f"{total[k, a]:17.2f} {total[k, b]:9.2f} {total[k, a] / total[k, b]:5.2f}x" for k in cols
    ]
    lines.append(f"{'all points':>22} | {' | '.join(sums)} |")
    lines.append(f"{a} and {b} chose the same plan at every point in every round")
    return lines


def _write(cfg: BenchPlanSailorConfig, lines: list[str], load_before: float, load_after: float):
    """The table as Markdown, with what produced it, in ``results_dir``."""
    from system.results import atomic_write_text

    command = (
        f"python repro/run.py mode=bench_plan_sailor base={cfg.base} rounds={cfg.rounds}"
        + (f" points=[{','.join(cfg.points)}]" if cfg.points else "")
        + f" profiles={cfg.profiles}"
        + f" results_dir={cfg.results_dir}"
    )
    text = [
        "# Planning for Sailor's framework on Sailor's trace points: search seconds",
        "",
        f"`{command}` at {short_rev('HEAD')}{' (uncommitted changes)' if dirty() else ''}, "
        f"{os.cpu_count()} cores, 1-minute load {load_before:.2f} before, {load_after:.2f} "
        f"after; medians of {cfg.rounds} round(s) of each plan's `search_time_s`, and of its "
        "`load_time_s + search_time_s`; simulations: the last round's (floored: configurations "
        "whose floor reached the incumbent, not simulated).",
        "",
        "```",
        *lines,
        "```",
        "",
    ]
    path = Path(cfg.results_dir) / "plan_sailor.md"
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, "\n".join(text))
    print(f"table -> {path}")
