"""Wall time of a sweep under Hydra's serial launcher vs the joblib launcher, side by side.

    python repro/bench_launchers.py                       # sweep=smoke, 2 rounds
    python repro/bench_launchers.py sweep=smoke rounds=3 n_jobs=2

Each round runs ``python repro/run.py -m sweep=<sweep>`` once with the default (basic, serial)
launcher and once with ``hydra/launcher=joblib``, alternating which goes first, each into a fresh
results folder, so both see the same machine load. Prints per-run wall times (the whole command:
Python start, every job, the report at the end), the medians and their ratio serial/joblib,
and checks both launchers wrote the same rows (same run ids; the sweep is seeded). The joblib
speed-up is bounded by the free cores: the load average is printed with the table.
"""

from __future__ import annotations

import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the checkout importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

ROOT = Path(__file__).resolve().parents[1]
LAUNCHERS = {"serial": [], "joblib": ["hydra/launcher=joblib"]}

__all__ = ["run_sweep", "main"]

_JOBS_S = re.compile(r"sweep \S+: .* in (\d+) s;")


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


@dataclass
class Args:
    """``key=value`` arguments (``python repro/bench_launchers.py rounds=3``)."""

    sweep: str = "smoke"  # conf/sweep/<name>.yaml
    rounds: int = 2  # rounds; launchers alternate their order between rounds
    n_jobs: int | None = None  # joblib workers (null = the launcher config's)

    def __post_init__(self) -> None:
        from repro.config import ConfigError

        if self.rounds < 1:
            raise ConfigError(f"rounds={self.rounds}: must be >= 1")
        if self.n_jobs is not None and self.n_jobs < 1:
            raise ConfigError(f"n_jobs={self.n_jobs}: must be >= 1")


def main(argv: list[str] | None = None) -> int:
    from repro.config import script_args

    args = script_args(Args, argv)  # exits 2 with one line on a bad argument
    sweep, rounds, n_jobs = args["sweep"], args["rounds"], args["n_jobs"]
    walls: dict[str, list[float]] = {k: [] for k in LAUNCHERS}
    ids: dict[str, set[str]] = {}
    print(f"sweep={sweep}, {os.cpu_count()} cores, load average before: {os.getloadavg()[0]:.2f}")
    # jobs_s: from the first job's start to the last job's end (the sweep's own summary line);
    # the rest of wall_s is Python/Hydra start-up and the report, which no launcher parallelises
    print(f"{'round':>5} {'launcher':>8} {'wall_s':>8} {'jobs_s':>7} {'load':>5}")
    with tempfile.TemporaryDirectory(prefix="dtfm-bench-launchers-") as tmp:
        for r in range(rounds):
            order = list(LAUNCHERS) if r % 2 == 0 else list(reversed(LAUNCHERS))
            for name in order:
                wall_s, got = run_sweep(sweep, name, Path(tmp) / f"{name}{r}", n_jobs=n_jobs)
                walls[name].append(wall_s)
                if ids.setdefault(name, got) != got:
                    raise RuntimeError(f"{name}: round {r} wrote different run ids")
                m = _JOBS_S.search((Path(tmp) / f"{name}{r}" / "sweep.log").read_text())
                jobs = f"{float(m.group(1)):7.0f}" if m else f"{'?':>7}"
                print(f"{r:>5} {name:>8} {wall_s:8.2f} {jobs} {os.getloadavg()[0]:5.2f}")
    if ids["serial"] != ids["joblib"]:
        raise RuntimeError("serial and joblib sweeps wrote different rows")
    med = {k: statistics.median(v) for k, v in walls.items()}
    print(
        f"median wall: serial {med['serial']:.2f} s, joblib {med['joblib']:.2f} s; "
        f"serial/joblib = {med['serial'] / med['joblib']:.2f}x "
        f"({len(ids['serial'])} rows each, identical run ids); "
        f"load average after: {os.getloadavg()[0]:.2f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
