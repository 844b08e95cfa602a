"""Mixed GPU fleet: the ``iteration_time`` objective against the paper's ``comm`` objective.

    python repro/run.py mode=bench_hetero results_dir=results/scheduler    # hetero.{csv,md}
    python repro/run.py mode=bench_hetero seeds=[0] workload=gpt3_xl_b1024 results_dir=DIR

Case ``mixed`` (16 A100 + 16 V100 + 16 T4 + 16 L4 in four regions, :func:`system.cases.mixed`),
pp = dp = 8. Plans, each confirmed by the event simulator (:func:`system.simulator.simulate_ours`)
with per-stage compute times from the slowest GPU of each stage and the plan's layer split:

- ``comm_even``: the paper's objective, layers split evenly (a scheduler blind to GPU types);
- ``comm_balanced``: the same assignment with layers split by stage speed afterwards;
- ``iteration_time``: the surrogate objective (compute by GPU type + TOTAL) searched directly.

``ratio_vs_*`` columns: simulated iteration time of that plan / of the ``iteration_time`` plan.
"""

from __future__ import annotations

import logging

import numpy as np
import pandas as pd

from repro.checks.bench.config import BenchHeteroConfig
from system.assignment import Assignment
from system.cost.iteration import IterationTimeEvaluator
from system.results import atomic_write_text
from system.scheduler import schedule
from system.simulator import simulate_ours
from system.simulator.hardware import stage_compute_for
from system.simulator.sharing import with_link_sharing
from system.workload import get_workload, tasklet_sizes

log = logging.getLogger(__name__)


def _even(num_layers: int, pp: int) -> list[int]:
    return [num_layers // pp + (1 if s < num_layers % pp else 0) for s in range(pp)]


def plans(cfg: BenchHeteroConfig) -> pd.DataFrame:
    """The three plans per seed, each simulated (module docstring)."""
    # every pair its own pipe (link sharing ``pair``): the model this benchmark was made under
    cluster = with_link_sharing(cfg.cluster(), "pair")
    work = get_workload(cfg.workload)
    pp = dp = 8
    sizes = tasklet_sizes(work, pp, dp)
    ev = IterationTimeEvaluator(cluster, sizes, pp=pp, dp=dp, workload=work)
    rows = []
    for seed in cfg.seeds:
        comm = schedule(cluster, sizes, pp=pp, dp=dp, seed=seed)
        it = schedule(
            cluster, sizes, pp=pp, dp=dp, seed=seed, objective="iteration_time", workload=work
        )
        comm_part = [tuple(sorted(comm.assignment.group(s))) for s in range(pp)]
        plans = {
            "comm_even": (comm, _even(work.model.num_layers, pp)),
            "comm_balanced": (comm, _layers_in_order(ev, comm_part, comm.assignment)),
            "iteration_time": (it, it.stats["layers_per_stage"]),
        }
        sim = {}
        for name, (res, layers) in plans.items():
            a = res.assignment
            comp = stage_compute_for(cluster, a, work, layers)
            r = simulate_ours(cluster, a, work, compute=comp)
            sim[name] = r.iter_time_s
            part = [tuple(sorted(a.group(s))) for s in range(pp)]
            rows.append(
                {
                    "case": cfg.case,
                    "workload": str(cfg.workload),
                    "seed": seed,
                    "plan": name,
                    "total_cost_s": res.cost.total_cost_s,
                    "surrogate_iter_s": ev.total(part) if name != "comm_even" else None,
                    "sim_iter_time_s": r.iter_time_s,
                    "status": r.status,
                    "layers_per_stage": " ".join(str(x) for x in layers),
                    "stage_gpus": " ".join(
                        "/".join(sorted({cluster.gpus[d] for d in a.group(s)})) for s in range(pp)
                    ),
                    "search_time_s": res.search_time_s,
                }
            )
        for row in rows[-3:]:
            row["ratio_vs_iteration_time"] = row["sim_iter_time_s"] / sim["iteration_time"]
        log.info("seed %d: simulated iteration %s", seed, {k: round(v, 2) for k, v in sim.items()})
    return pd.DataFrame(rows)


def _layers_in_order(ev: IterationTimeEvaluator, part, a: Assignment) -> list[int]:
    from system.scheduler.api import layers_in_stage_order

    return layers_in_stage_order(ev, part, a)


def _markdown(df: pd.DataFrame) -> str:
    from repro.report.tables import markdown_table

    cols = [
        "seed",
        "plan",
        "total_cost_s",
        "surrogate_iter_s",
        "sim_iter_time_s",
        "ratio_vs_iteration_time",
        "layers_per_stage",
        "stage_gpus",
    ]
    title = "# Mixed fleet: iteration_time vs comm objective (`mode=bench_hetero`)"
    return f"{title}\n\n{markdown_table(df.reindex(columns=cols), floatfmt='.3f')}\n"


def run(cfg: BenchHeteroConfig) -> dict:
    from rich.console import Console
    from rich.table import Table

    df = plans(cfg)
    atomic_write_text(f"{cfg.results_dir}/hetero.csv", df.to_csv(index=False))
    atomic_write_text(f"{cfg.results_dir}/hetero.md", _markdown(df))
    table = Table(title="mixed fleet: simulated iteration time per plan")
    for c in (
        "seed",
        "plan",
        "TOTAL s",
        "surrogate s",
        "simulated s",
        "ratio",
        "layers",
        "stage GPUs",
    ):
        table.add_column(c)
    for _, r in df.iterrows():
        sur = r["surrogate_iter_s"]
        table.add_row(
            str(r["seed"]),
            r["plan"],
            f"{r['total_cost_s']:.2f}",
            "" if sur is None or np.isnan(sur) else f"{sur:.2f}",
            f"{r['sim_iter_time_s']:.2f}",
            f"{r['ratio_vs_iteration_time']:.3f}",
            r["layers_per_stage"],
            r["stage_gpus"],
        )
    Console().print(table)
    return {"rows": len(df), "results_dir": cfg.results_dir}
