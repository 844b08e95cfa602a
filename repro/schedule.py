"""Schedule one case and write the assignment as JSON (paper §3.4).

    python repro/schedule.py case=5 scheduler=genetic seed=0 workload=dtfm_reference out=FILE.json
    python repro/schedule.py case=4 workload=gpt3_xl_b1024 pp=8 dp=8 time_limit_s=5

Arguments are ``key=value`` (no Hydra here: only ``repro/run.py`` uses it):

    case          1..5 | debug | an alias (system.cases)           default 5
    case_variant  paper | dtfm_code                                default paper
    scheduler     genetic | genetic_kl | random                    default genetic
    workload      system.workload.WORKLOADS key                    default dtfm_reference
    pp, dp        stages / replicas (default: 8 x 8 for 64 devices, else a near-square split)
    seed, trials, population, time_limit_s, greedy_seeds (0/1), patience_trials
    objective     comm | iteration_time (needs a model workload, e.g. gpt3_xl_b1024) default comm
    out           JSON file (written atomically); omitted: print the JSON

Budget: with neither ``trials`` nor ``time_limit_s`` the search stops once the best TOTAL has not
improved for ``patience_trials`` trials (default 20), and after 60 s at most
(:data:`system.scheduler.api.DEFAULT_TIME_CAP_S`); ask for more with ``trials=`` or
``time_limit_s=``.
"""

from __future__ import annotations

import json
import logging
import math
import sys
from collections.abc import Sequence

from system.cases import get_case
from system.results import atomic_write_text
from system.scheduler import SCHEDULERS, schedule
from system.workload import TaskletSizes, Workload, get_workload, tasklet_sizes

log = logging.getLogger(__name__)

KEYS = {"case": "5", "case_variant": "paper", "scheduler": "genetic", "workload": "dtfm_reference",
        "pp": None, "dp": None, "seed": "0", "trials": None, "population": None,
        "time_limit_s": None, "greedy_seeds": "1", "patience_trials": None, "objective": "comm",
        "out": None}


def parse_args(argv: Sequence[str]) -> dict:
    """``key=value`` pairs over :data:`KEYS`; a ValueError names a bad or unknown one."""
    cfg = dict(KEYS)
    for arg in argv:
        if "=" not in arg:
            raise ValueError(f"argument {arg!r}: expected key=value (keys: {', '.join(KEYS)})")
        key, value = arg.split("=", 1)
        key = key.lstrip("-").replace("-", "_")
        if key not in KEYS:
            raise ValueError(f"argument {arg!r}: unknown key {key!r} (keys: {', '.join(KEYS)})")
        cfg[key] = value
    return cfg


def default_layout(num_devices: int) -> tuple[int, int]:
    """pp x dp for a device count: the most square split with pp >= dp (64 -> 8 x 8)."""
    dp = max(d for d in range(1, math.isqrt(num_devices) + 1) if num_devices % d == 0)
    return num_devices // dp, dp


def _int(cfg: dict, key: str) -> int | None:
    if cfg[key] in (None, "", "null", "None"):
        return None
    try:
        return int(cfg[key])
    except ValueError as e:
        raise ValueError(f"argument {key}={cfg[key]!r}: expected an integer") from e


def run(cfg: dict, on_progress=None) -> dict:
    """Schedule per ``cfg`` (see the module docstring); returns the JSON-ready record."""
    if cfg["scheduler"] not in SCHEDULERS:
        raise ValueError(f"scheduler={cfg['scheduler']!r}: known {', '.join(SCHEDULERS)}")
    cluster = get_case(cfg["case"], cfg["case_variant"])
    pp, dp = _int(cfg, "pp"), _int(cfg, "dp")
    if pp is None and dp is None:
        pp, dp = default_layout(cluster.num_devices)
    elif pp is None:
        pp = cluster.num_devices // dp
    elif dp is None:
        dp = cluster.num_devices // pp
    work = get_workload(cfg["workload"])
    sizes: TaskletSizes = tasklet_sizes(work, pp, dp) if isinstance(work, Workload) else work
    limit = None if cfg["time_limit_s"] in (None, "", "null") else float(cfg["time_limit_s"])
    result = schedule(cluster, sizes, pp=pp, dp=dp, method=cfg["scheduler"],
                      seed=_int(cfg, "seed") or 0, trials=_int(cfg, "trials"),
                      population=_int(cfg, "population"), time_limit_s=limit,
                      greedy_seeds=str(cfg["greedy_seeds"]).lower() in ("1", "true", "yes"),
                      patience_trials=_int(cfg, "patience_trials"),
                      objective=cfg["objective"],
                      workload=work if isinstance(work, Workload) else None,
                      on_progress=on_progress)
    record = {"case": str(cfg["case"]), "case_variant": cfg["case_variant"],
              "cluster": cluster.name, "num_devices": cluster.num_devices,
              "workload": cfg["workload"], "c_dp_bytes": sizes.c_dp_bytes,
              "c_pp_bytes": sizes.c_pp_bytes, **result.to_dict()}
    if cfg["out"]:
        atomic_write_text(cfg["out"], json.dumps(record, indent=1) + "\n")
    return record


def _fmt(value, spec: str = "{:.3f}") -> str:
    return "n/a" if value is None else spec.format(value)


def main(argv: Sequence[str] | None = None) -> int:
    from repro.console import setup_logging

    setup_logging()
    try:
        cfg = parse_args(sys.argv[1:] if argv is None else argv)
    except ValueError as e:
        log.error("%s", e)
        return 2
    if sys.stderr.isatty():
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

        with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.fields[best]}"),
                      TimeElapsedColumn(), transient=True) as bar:
            task = bar.add_task(f"{cfg['scheduler']} case {cfg['case']}", total=None, best="")

            def progress(trial: int, best_s: float) -> None:
                bar.update(task, completed=trial, best=f"best TOTAL {best_s:.3f} s")

            record = run(cfg, on_progress=progress)
    else:
        record = run(cfg)
    log.info("case %s %s: TOTAL %.3f s (DP %.3f + 2 x PP %.3f) after %d trials in %.2f s; "
             "lower bound %s s, certified gap %s%%",
             record["case"], record["method"], record["total_cost_s"], record["dp_cost_s"],
             record["pp_cost_s"], record["trials"], record["search_time_s"],
             _fmt(record.get("bound_total_s")), _fmt(record.get("gap_pct"), "{:.1f}"))
    if not cfg["out"]:
        sys.stdout.write(json.dumps(record) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
