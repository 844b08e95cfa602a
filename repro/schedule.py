"""Schedule one case and write the assignment as JSON (paper §3.4).

    python repro/schedule.py case=5 scheduler=genetic seed=0 workload=dtfm_reference out=FILE.json
    python repro/schedule.py case=4 workload=gpt3_xl_b1024 pp=8 dp=8 time_limit_s=5 verbose=true

Arguments are ``key=value`` over :class:`ScheduleConfig`, parsed and checked by
:func:`repro.config.parse_cli` (the same typed parsing and one-line errors as ``repro/run.py``;
exit 2 on bad input):

    case          1..5 | debug | an alias | a topology file (system.cases)   default 5
    case_variant  paper | dtfm_code                                         default paper
    scheduler     genetic | genetic_kl | random                             default genetic
    workload      system.workload.WORKLOADS key                             default dtfm_reference
    pp, dp        stages / replicas (default: 8 x 8 for 64 devices, else a near-square split)
    seed, trials, population, greedy_seeds (true/false), patience_trials
    objective     comm | iteration_time (needs a model workload, e.g. gpt3_xl_b1024) default comm
    time_limit_s  wall-time cap of the search; default null: stop on convergence (below)
    out           JSON file (written atomically); omitted: print the JSON
    verbose       true: report progress (a bar on a terminal, else a log line per second)

Budget: with neither ``trials`` nor ``time_limit_s`` the search stops once the best TOTAL has not
improved for ``patience_trials`` trials (default 20), and after 60 s at most
(:data:`system.scheduler.api.DEFAULT_TIME_CAP_S`): seconds on the paper's cases. Ask for more with
``trials=`` or ``time_limit_s=``.
"""

from __future__ import annotations

import json
import logging
import math
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the checkout importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from repro.config import ConfigError, SearchOptions, parse_cli  # noqa: E402
from system.results import atomic_write_text  # noqa: E402

log = logging.getLogger("repro.schedule")

__all__ = ["ScheduleConfig", "parse_args", "default_layout", "run", "main"]


@dataclass
class ScheduleConfig(SearchOptions):
    """The arguments of this script (the search knobs come from :class:`SearchOptions`)."""

    case: str = "5"
    case_variant: str = "paper"
    scheduler: str = "genetic"
    workload: str = "dtfm_reference"
    pp: int | None = None
    dp: int | None = None
    seed: int = 0
    greedy_seeds: bool = True
    out: str | None = None
    verbose: bool = False
    patience_trials: int | None = None  # convergence rule; null = the scheduler's default (20)
    objective: str = "comm"  # comm | iteration_time

    def __post_init__(self) -> None:
        super().__post_init__()
        from repro.config import CASE_VARIANTS, _at_least, _choice, _cluster, check_layout
        from system.scheduler import SCHEDULERS
        from system.workload import WORKLOADS

        _choice("scheduler", self.scheduler, tuple(SCHEDULERS))
        _choice("case_variant", self.case_variant, CASE_VARIANTS)
        _choice("workload", self.workload, tuple(WORKLOADS))
        for k in ("pp", "dp"):
            _at_least(k, getattr(self, k), 1)
        _at_least("seed", self.seed, 0, optional=False)
        _at_least("patience_trials", self.patience_trials, 1)
        _choice("objective", self.objective, ("comm", "iteration_time"))
        n = _cluster(self.case, self.case_variant).num_devices
        check_layout(self.case, n, self.pp, self.dp)
        if self.out is not None:
            p = Path(self.out)
            if not self.out.strip() or p.is_dir() or (p.parent.exists() and not p.parent.is_dir()):
                raise ConfigError(f"out={self.out!r}: not a file path")


def parse_args(argv: Sequence[str]) -> ScheduleConfig:
    """``key=value`` pairs -> :class:`ScheduleConfig`; a ConfigError names a bad or unknown one."""
    return parse_cli(ScheduleConfig, argv)


def default_layout(num_devices: int) -> tuple[int, int]:
    """pp x dp for a device count: the most square split with pp >= dp (64 -> 8 x 8)."""
    dp = max(d for d in range(1, math.isqrt(num_devices) + 1) if num_devices % d == 0)
    return num_devices // dp, dp


def run(cfg: ScheduleConfig, on_progress=None) -> dict:
    """Schedule per ``cfg`` (see the module docstring); returns the JSON-ready record."""
    from system.cases import get_case
    from system.scheduler import schedule
    from system.workload import Workload, get_workload, tasklet_sizes

    cluster = get_case(cfg.case, cfg.case_variant)
    pp, dp = cfg.pp, cfg.dp
    if pp is None and dp is None:
        pp, dp = default_layout(cluster.num_devices)
    elif pp is None:
        pp = cluster.num_devices // dp
    elif dp is None:
        dp = cluster.num_devices // pp
    work = get_workload(cfg.workload)
    sizes = tasklet_sizes(work, pp, dp) if isinstance(work, Workload) else work
    result = schedule(
        cluster,
        sizes,
        pp=pp,
        dp=dp,
        method=cfg.scheduler,
        seed=cfg.seed,
        trials=cfg.trials,
        population=cfg.population,
        time_limit_s=cfg.time_limit_s,
        greedy_seeds=cfg.greedy_seeds,
        patience_trials=cfg.patience_trials,
        objective=cfg.objective,
        workload=work if isinstance(work, Workload) else None,
        on_progress=on_progress,
    )
    record = {
        "case": str(cfg.case),
        "case_variant": cfg.case_variant,
        "cluster": cluster.name,
        "num_devices": cluster.num_devices,
        "workload": cfg.workload,
        "c_dp_bytes": sizes.c_dp_bytes,
        "c_pp_bytes": sizes.c_pp_bytes,
        "time_limit_s": cfg.time_limit_s,
        **result.to_dict(),
    }
    if cfg.out:
        atomic_write_text(cfg.out, json.dumps(record, indent=1) + "\n")
    return record


def _fmt(value, spec: str = "{:.3f}") -> str:
    return "n/a" if value is None else spec.format(value)


class _LogProgress:
    """``on_progress`` for a log (no terminal): one line per ``every_s`` seconds at most."""

    def __init__(self, every_s: float = 1.0) -> None:
        self.every_s, self.last = every_s, time.monotonic()

    def __call__(self, trial: int, best_s: float) -> None:
        now = time.monotonic()
        if now - self.last >= self.every_s:
            self.last = now
            log.info("trial %d: best TOTAL %.4f s", trial, best_s)


def main(argv: Sequence[str] | None = None) -> int:
    from repro.console import setup_logging

    setup_logging()
    try:
        cfg = parse_args(sys.argv[1:] if argv is None else argv)
    except ConfigError as e:
        log.error("%s", e)
        print(f"error: {e}", file=sys.stderr)
        return 2
    try:
        if cfg.verbose and sys.stderr.isatty():
            from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

            with Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                TextColumn("{task.fields[best]}"),
                TimeElapsedColumn(),
                transient=True,
            ) as bar:
                task = bar.add_task(f"{cfg.scheduler} case {cfg.case}", total=None, best="")

                def progress(trial: int, best_s: float) -> None:
                    bar.update(task, completed=trial, best=f"best TOTAL {best_s:.3f} s")

                record = run(cfg, on_progress=progress)
        else:
            record = run(cfg, on_progress=_LogProgress() if cfg.verbose else None)
    except (ValueError, FileNotFoundError, OSError) as e:
        log.error("%s", e)
        print(f"error: {e}", file=sys.stderr)
        return 2
    log.info(
        "case %s %s: TOTAL %.3f s (DP %.3f + 2 x PP %.3f) after %d trials in %.2f s; "
        "lower bound %s s, certified gap %s%%",
        record["case"],
        record["method"],
        record["total_cost_s"],
        record["dp_cost_s"],
        record["pp_cost_s"],
        record["trials"],
        record["search_time_s"],
        _fmt(record.get("bound_total_s")),
        _fmt(record.get("gap_pct"), "{:.1f}"),
    )
    if not cfg.out:
        sys.stdout.write(json.dumps(record) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
