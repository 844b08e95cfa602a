"""Time per iteration at paper scale: GPT3-XL, batch 1024, a paper case's 64 devices, pp = dp
= 8 on the scheduler's layout, priced by the simulator for a method's options (the same
``RunSpec`` options the in-process runs trained with)."""

from __future__ import annotations

from functools import cache

__all__ = ["paper_iter_time_s", "PAPER_MODEL", "PAPER_BATCH"]

PAPER_MODEL, PAPER_BATCH, PAPER_PP, PAPER_DP = "gpt3_xl", 1024, 8, 8
TRIALS = 30  # the scheduler's genetic search, by count (a time limit would make it load-bound)


@cache
def _setting(case: str):
    from system.cases import get_case
    from system.scheduler import schedule
    from system.workload import Workload, get_model, tasklet_sizes

    wl = Workload(model=get_model(PAPER_MODEL), global_batch_size=PAPER_BATCH, micro_batch_size=1)
    cluster = get_case(str(case))
    layout = schedule(
        cluster,
        tasklet_sizes(wl, PAPER_PP, PAPER_DP),
        pp=PAPER_PP,
        dp=PAPER_DP,
        seed=0,
        trials=TRIALS,
        time_limit_s=3600,  # never binding: the layout depends on the seed alone, not the load
    ).assignment
    return cluster, layout, wl


def paper_iter_time_s(case: str, options: dict) -> float:
    """Simulated seconds per iteration of ours with ``options`` (a method's setting: RunSpec
    options ``compression`` and ``lr``, :mod:`.methods`)."""
    from system.runtime.spec import RunSpec
    from system.simulator import simulate_ours

    cluster, layout, wl = _setting(str(case))
    spec = RunSpec(**{k: v for k, v in options.items() if k != "lr"})
    sim = simulate_ours(cluster, layout, wl, compression=spec.compression, dp_mode=spec.dp_mode)
    return float(sim.iter_time_s)
