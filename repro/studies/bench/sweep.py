"""Wall time of a sweep under Hydra's serial launcher vs the joblib launcher, side by side.

    python repro/run.py mode=bench_sweep                       # sweep=smoke, 2 rounds
    python repro/run.py mode=bench_sweep sweep=smoke rounds=3 n_jobs=2

Each round runs ``python repro/run.py -m sweep=<sweep>`` once with the default (basic, serial)
launcher and once with ``hydra/launcher=joblib``, alternating which goes first, each into a fresh
results folder, so both see the same machine load. Prints per-run wall times (the whole command:
Python start, every job, the report at the end), the medians and their ratio serial/joblib,
and checks both launchers wrote the same rows (same run ids; the sweep is seeded). The joblib
speed-up is bounded by the free cores: the load average is printed with the table.

Each run's wall time is split with the sweep's own summary line: ``check_s`` (composing and
validating every job before the first), ``jobs_s`` (first job's start to last job's end) and
``report_s`` (folding the jobs' part files into ``runs.parquet`` once, then REPORT.md);
``other_s`` is the rest (Python and Hydra start-up, Hydra's own pass over the sweep). Only
``jobs_s`` can run in parallel, so the last line gives Amdahl's bound on the ratio: the serial
launcher's wall time over its non-job seconds plus its job seconds spread perfectly over
``n_jobs`` workers (or the cores).
"""

from __future__ import annotations

import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from repro.config import BenchSweepConfig

ROOT = Path(__file__).resolve().parents[3]
LAUNCHERS = {"serial": [], "joblib": ["hydra/launcher=joblib"]}

__all__ = ["run_sweep", "run"]

_SPLIT = re.compile(r"sweep \S+: .* in ([\d.]+) s \(check ([\d.]+) s, report ([\d.]+) s\);")


def run_sweep(
    sweep: str,
    launcher: str,
    results_dir: Path,
    *,
    n_jobs: int | None = None,
    overrides: list[str] | None = None,
    timeout_s: float = 900.0,
) -> tuple[float, set[str]]:
    """Run one sweep; returns (wall seconds, run ids in its runs.csv). The command's output is
    kept in ``results_dir/sweep.log``."""
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
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "WANDB_MODE": "disabled",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }
    t0 = time.perf_counter()
    p = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout_s)
    wall_s = time.perf_counter() - t0
    (results_dir / "sweep.log").write_text(p.stdout + p.stderr)
    if p.returncode != 0:
        raise RuntimeError(f"{launcher} sweep failed ({p.returncode}):\n{p.stderr[-2000:]}")
    lines = (results_dir / "runs.csv").read_text().splitlines()
    col = lines[0].split(",").index("run_id")
    return wall_s, {ln.split(",")[col] for ln in lines[1:]}


def run(cfg: BenchSweepConfig) -> dict:
    sweep, rounds, n_jobs = cfg.sweep, cfg.rounds, cfg.n_jobs
    walls: dict[str, list[float]] = {k: [] for k in LAUNCHERS}
    jobs_s: dict[str, list[float]] = {k: [] for k in LAUNCHERS}
    ids: dict[str, set[str]] = {}
    print(f"sweep={sweep}, {os.cpu_count()} cores, load average before: {os.getloadavg()[0]:.2f}")
    head = ("round", "launcher", "wall_s", "check_s", "jobs_s", "report_s", "other_s", "load")
    print("{:>5} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>5}".format(*head))
    with tempfile.TemporaryDirectory(prefix="dtfm-bench-launchers-") as tmp:
        for r in range(rounds):
            order = list(LAUNCHERS) if r % 2 == 0 else list(reversed(LAUNCHERS))
            for name in order:
                wall_s, got = run_sweep(sweep, name, Path(tmp) / f"{name}{r}", n_jobs=n_jobs)
                walls[name].append(wall_s)
                if ids.setdefault(name, got) != got:
                    raise RuntimeError(f"{name}: round {r} wrote different run ids")
                m = _SPLIT.search((Path(tmp) / f"{name}{r}" / "sweep.log").read_text())
                if m is None:
                    raise RuntimeError(f"{name}: no summary line in {tmp}/{name}{r}/sweep.log")
                jobs, check, report = (float(g) for g in m.groups())
                jobs_s[name].append(jobs)
                other = wall_s - jobs - check - report
                print(
                    f"{r:>5} {name:>8} {wall_s:8.2f} {check:8.1f} {jobs:8.1f} {report:8.1f} "
                    f"{other:8.1f} {os.getloadavg()[0]:5.2f}"
                )
    if ids["serial"] != ids["joblib"]:
        raise RuntimeError("serial and joblib sweeps wrote different rows")
    med = {k: statistics.median(v) for k, v in walls.items()}
    print(
        f"median wall: serial {med['serial']:.2f} s, joblib {med['joblib']:.2f} s; "
        f"serial/joblib = {med['serial'] / med['joblib']:.2f}x "
        f"({len(ids['serial'])} rows each, identical run ids); "
        f"load average after: {os.getloadavg()[0]:.2f}"
    )
    workers = n_jobs or os.cpu_count() or 1
    jobs_med = {k: statistics.median(v) for k, v in jobs_s.items()}
    serial_part = med["serial"] - jobs_med["serial"]
    bound = med["serial"] / (serial_part + jobs_med["serial"] / workers)
    jobs_ratio = jobs_med["serial"] / jobs_med["joblib"]
    print(
        f"Amdahl: serial launcher {serial_part:.2f} s outside its jobs + "
        f"{jobs_med['serial']:.2f} s of jobs; at a perfect {workers}x on the jobs the ratio "
        f"could reach at most {bound:.2f}x; the jobs phase itself ran {jobs_ratio:.2f}x "
        "faster under joblib"
    )
    return {"serial_s": med["serial"], "joblib_s": med["joblib"]}
