"""A sweep's wall time, per job split into start, simulation, store and report: this tree beside
an earlier commit, under the serial launcher and joblib.

    python repro/run.py mode=bench_sweep sweep_name=paper base=370986d       # both launchers
    python repro/run.py mode=bench_sweep sweep_name=smoke launchers=[serial] base=HEAD~1

Each tree first runs one small simulation (:func:`warm_up`: its numeric kernels compiled and
kept on disk before any timing); then each (tree, launcher) runs
``python repro/run.py -m sweep=<sweep>`` once per round into a fresh folder (the earlier commit
from a ``git archive`` copy of it), the rounds alternating the order, so both trees see the
same machine load. The command's wall time comes from here; the jobs
phase, the pre-check and the report from the sweep's own summary line; each job's simulation
seconds from its ledger entry (``summary.elapsed_s``; both commits record it). Per job, with n
jobs and w workers (1 serial; joblib: ``n_jobs`` or the cores):

- ``start`` = (wall − jobs − report) / n: Python and Hydra start-up, checking every job before
  the first, the sweep's end;
- ``simulation`` = Σ simulation / (w·n);
- ``store`` = jobs / n − simulation: the rest of the jobs phase (rows typed and written, Hydra's
  per-job set-up; the earlier commit also merged a summary and drew figures per job);
- ``report`` = report / n.

They add up to wall / n. Every run of one tree must write the same iteration times (same
seeds); whether the two trees agree is a line of the table, with their largest relative
difference (:func:`agreement`: within 1e-9 they agree, as when only the order of floating-point
operations changed; a commit that changes the model or ours' search budget changes them). A
timing quoted from this table needs the machine to itself (``flock -x`` on a shared one). The
table, with the command, the commits and the load, is also written to
``<results_dir>/sweep_<sweep>.md``.
"""

from __future__ import annotations

import json
import os
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from repro.checks.bench.config import BenchSweepConfig
from repro.checks.tree import ROOT, dirty, materialise, short_rev
from system.lifeline import cancel, exit_on_signals, on_death, run_guarded

LAUNCHERS = {"serial": [], "joblib": ["hydra/launcher=joblib"]}

__all__ = ["run_sweep", "warm_up", "tree_env", "run"]

_SPLIT = re.compile(
    r"sweep \S+: (\d+) jobs ran.* in ([\d.]+) s \(check ([\d.]+) s, report ([\d.]+) s\);"
)


def tree_env(tree: Path) -> dict:
    """The environment of a run of the repository copy ``tree``."""
    return {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled", "PYTHONPATH": str(tree)}


def run_sweep(
    sweep: str,
    launcher: str,
    results_dir: Path,
    *,
    tree: Path = ROOT,
    n_jobs: int | None = None,
    overrides: list[str] | None = None,
    timeout_s: float = 1800.0,
) -> tuple[float, set[str]]:
    """Run one sweep of the repository copy ``tree``; returns (wall seconds, run ids it
    stored). The command's output is kept in ``results_dir/sweep.log``."""
    extra = list(LAUNCHERS[launcher]) + list(overrides or [])
    if launcher == "joblib" and n_jobs is not None:
        extra.append(f"hydra.launcher.n_jobs={n_jobs}")
    cmd = [
        sys.executable,
        "repro/run.py",
        "-m",
        f"sweep={sweep}",
        f"results_dir={results_dir}",
        f"hydra.sweep.dir={results_dir}/multirun",
        *extra,
    ]
    t0 = time.perf_counter()
    p = run_guarded(cmd, cwd=tree, env=tree_env(tree), timeout_s=timeout_s)
    wall_s = time.perf_counter() - t0
    results_dir.mkdir(parents=True, exist_ok=True)
    (results_dir / "sweep.log").write_text(p.stdout + p.stderr)
    if p.returncode != 0:
        raise RuntimeError(
            f"{launcher} sweep in {tree} failed ({p.returncode}):\n{p.stderr[-2000:]}"
        )
    from system.results import read_rows

    return wall_s, set(read_rows(results_dir)["run_id"])


def warm_up(tree: Path, results_dir: Path, timeout_s: float = 600.0) -> None:
    """One small simulation of ``tree`` before the timed sweeps: the numeric kernels it compiles
    at their first call (:mod:`system.compiled`) are then on disk, so no timed run pays for
    compiling them (a fresh checkout's first run does, once)."""
    cmd = [sys.executable, "repro/run.py", "mode=simulate", "case=debug", "model=debug"]
    p = run_guarded(
        [*cmd, f"results_dir={results_dir}"], cwd=tree, env=tree_env(tree), timeout_s=timeout_s
    )
    if p.returncode != 0:
        raise RuntimeError(f"warm-up in {tree} failed ({p.returncode}):\n{p.stderr[-2000:]}")


def split(results_dir: Path, wall_s: float, workers: int) -> dict:
    """The per-job split of one sweep (module docstring) from its log and ledger."""
    m = _SPLIT.search((results_dir / "sweep.log").read_text())
    if m is None:
        raise RuntimeError(f"no summary line in {results_dir}/sweep.log")
    n, jobs_s, check_s, report_s = int(m[1]), float(m[2]), float(m[3]), float(m[4])
    sims = [
        json.loads(f.read_text()).get("summary", {}).get("elapsed_s", 0.0)
        for f in (results_dir / "jobs").glob("*.json")
    ]
    simulation = sum(sims) / (workers * n)
    return {
        "jobs": n,
        "wall_s": wall_s,
        "check_s": check_s,
        "start": (wall_s - jobs_s - report_s) / n,
        "simulation": simulation,
        "store": jobs_s / n - simulation,
        "report": report_s / n,
    }


def _iter_times(results_dir: Path) -> list[float]:
    from system.results import read_rows

    rows = read_rows(results_dir)
    keys = ["case", "system", "num_layers", "global_batch_size", "config", "placement", "repeat"]
    rows = rows.sort_values([k for k in keys if k in rows])
    return rows["iter_time_s"].fillna(-1.0).tolist()


def agreement(a: list[float], b: list[float]) -> str:
    """How two trees' iteration times compare: the same within a relative 1e-9 (floating-point
    order; the largest difference quoted) or other times."""
    if len(a) != len(b):
        return f"other iteration times ({len(a)} rows against {len(b)})"
    x, y = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    rel = float((np.abs(x - y) / np.maximum(np.abs(y), 1e-30)).max()) if len(x) else 0.0
    if rel <= 1e-9:
        return f"the same iteration times (largest relative difference {rel:.1e})"
    return f"other iteration times (largest relative difference {rel:.1e})"


def run(cfg: BenchSweepConfig) -> dict:
    trees = {"this tree": ROOT}
    out: dict[tuple[str, str], list[dict]] = {}
    with exit_on_signals(), tempfile.TemporaryDirectory(prefix="dtfm-bench-sweep-") as tmp:
        gone = on_death("rmtree", tmp)  # removed even if this process is SIGKILLed
        if cfg.base:
            base = short_rev(cfg.base)
            materialise(base, Path(tmp) / "base")
            trees = {base: Path(tmp) / "base", **trees}
        workers = {"serial": 1, "joblib": cfg.n_jobs or os.cpu_count() or 1}
        for name, tree in trees.items():
            warm_up(tree, Path(tmp) / f"warm-{name.replace(' ', '_')}")
        load_before = os.getloadavg()[0]
        print(f"sweep={cfg.sweep_name}, {os.cpu_count()} cores, load before {load_before:.2f}")
        seen: dict[str, list[float]] = {}  # tree -> its first run's iteration times
        for r in range(cfg.rounds):
            order = [(t, la) for t in trees for la in cfg.launchers]
            for name, launcher in order if r % 2 == 0 else order[::-1]:
                d = Path(tmp) / f"{name.replace(' ', '_')}-{launcher}-{r}"
                wall_s, _ = run_sweep(
                    cfg.sweep_name, str(launcher), d, tree=trees[name], n_jobs=cfg.n_jobs
                )
                if seen.setdefault(name, _iter_times(d)) != _iter_times(d):
                    raise RuntimeError(
                        f"{name} {launcher}: other iteration times than its first run"
                    )
                row = split(d, wall_s, workers[str(launcher)])
                out.setdefault((name, str(launcher)), []).append(row)
                print(f"round {r}: {name} {launcher}: {wall_s:.1f} s", flush=True)
        cancel(gone)
    load_after = os.getloadavg()[0]
    print(f"load after {load_after:.2f}")
    lines = _table(out)
    if len(seen) == 2:
        (a, ta), (b, tb) = seen.items()
        lines.append(f"{a} and {b} wrote {agreement(ta, tb)}")
    print("\n".join(lines))
    _write(cfg, lines, load_before, load_after)
    return {" ".join(k): statistics.median(r["wall_s"] for r in v) for k, v in out.items()}


def _table(out: dict) -> list[str]:
    """The medians of each (tree, launcher) as text lines, and each launcher's ratio."""
    cols = ("wall_s", "start", "simulation", "store", "report")
    lines = [
        f"{'tree':>10} {'launcher':>8} {'jobs':>4} {'wall s':>7} | per job: "
        f"{'start':>6} {'sim':>6} {'store':>6} {'report':>6}"
    ]
    med = {}
    for (name, launcher), rows in out.items():
        m = {k: statistics.median(r[k] for r in rows) for k in cols}
        med[(name, launcher)] = m
        lines.append(
            f"{name:>10} {launcher:>8} {rows[0]['jobs']:>4} {m['wall_s']:7.1f} |          "
            f"{m['start']:6.2f} {m['simulation']:6.2f} {m['store']:6.2f} {m['report']:6.2f}"
        )
    names = list(dict.fromkeys(n for n, _ in out))
    for launcher in dict.fromkeys(la for _, la in out):
        if len(names) == 2 and (names[0], launcher) in med and (names[1], launcher) in med:
            a, b = med[(names[0], launcher)]["wall_s"], med[(names[1], launcher)]["wall_s"]
            lines.append(f"{launcher}: {names[0]} {a:.1f} s / {names[1]} {b:.1f} s = {a / b:.2f}x")
    return lines


_COLUMNS = (
    "seconds per job: start (Python, Hydra, the pre-check, the sweep's end), sim (the jobs' "
    "own time over the workers), store (the rest of the jobs phase: rows typed and written, "
    "Hydra's per-job set-up), report (the report at the end); they add up to wall / jobs"
)


def _write(cfg: BenchSweepConfig, lines: list[str], load_before: float, load_after: float):
    """The table as Markdown, with what produced it, in ``results_dir``."""
    from system.results import atomic_write_text

    command = (
        f"python repro/run.py mode=bench_sweep sweep_name={cfg.sweep_name} "
        f"launchers=[{','.join(map(str, cfg.launchers))}] rounds={cfg.rounds}"
        + (f" base={cfg.base}" if cfg.base else "")
        + f" results_dir={cfg.results_dir}"
    )
    text = [
        f"# sweep={cfg.sweep_name}: wall time per job",
        "",
        f"`{command}` at {short_rev('HEAD')}{' (uncommitted changes)' if dirty() else ''}, "
        f"{os.cpu_count()} cores, 1-minute load {load_before:.2f} before, {load_after:.2f} "
        f"after; medians of {cfg.rounds} round(s). Columns: {_COLUMNS}.",
        "",
        "```",
        *lines,
        "```",
        "",
    ]
    path = Path(cfg.results_dir) / f"sweep_{cfg.sweep_name}.md"
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, "\n".join(text))
    print(f"table -> {path}")
