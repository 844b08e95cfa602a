"""``mode=simulate``: the paper's Fig. 3 experiment in the performance simulator (§4, no GPU).

    python repro/run.py case=5 layers=40                 # 3 batch sizes, all systems
    python repro/run.py case=5 layers=40 batch=2048      # one setting
    python repro/run.py -m sweep=paper                   # the full grid, one job per setting

For every (case, layers, batch): schedule our layout (cached per case and tasklet sizes), simulate
ours, ours with random layouts (max(3, repeats) seeded rank maps), and Megatron's and DeepSpeed's
whole configuration grids under each of ``baseline_placements``: ``launch`` (ranks in launch
order, the paper's protocol) and ``topology`` (each configuration with its best topology-aware
rank map, :mod:`baselines.placement`); every baseline row records its ``placement`` and
``rank_map``. Prints ours' speed-up under each protocol and writes one row per (system,
layout/config, batch, repeat) with :func:`system.results.make_row`, then ``fig3.png``,
``summary.csv`` and ``claims.md`` into ``results_dir``. Everything is computed before anything is
written, so an input found bad only when simulated (nothing fits in memory) raises one
ValueError and leaves no half-written output. No torch import.
"""

from __future__ import annotations

import json
import logging
import time
from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import pandas as pd

from baselines.deepspeed.perf import grid_search_deepspeed
from baselines.megatron.perf import grid_search_megatron
from repro.config.base import as_dict, default_of
from repro.config.shared import SchedulerOptions, fill_layout
from repro.helper import Helper, take
from repro.hydra_fast import is_multirun, shared_store
from repro.modes.simulate.config import SimulateConfig
from repro.report.summary import print_compact, print_wide, summary_from_rows
from system.assignment import random_assignment
from system.cases import get_case
from system.cluster import Cluster
from system.config_search import OursSearch, search_ours
from system.results import (
    BASELINE_SYSTEMS,
    SIMULATED_SYSTEMS,
    current_of,
    make_row,
    make_rows,
    write_rows,
)
from system.simulator import V100, SimResult, simulate_ours
from system.simulator.sharing import link_sharing_of, with_link_sharing
from system.simulator.transfers import TRANSPORTS
from system.workload import Workload, get_model, tasklet_sizes

log = logging.getLogger(__name__)

__all__ = ["SIM_BUDGET", "MIN_RANDOM_LAYOUTS", "Schedules", "run"]

# What a simulated "repeat" is (column ``repeat_kind``): the simulator is deterministic, so a
# repeat of a fixed layout or configuration is an identical copy (run-to-run noise is measured
# only in mode=emulate/train); ours_random's repeats are different random layouts.
REPEAT_COPY = "deterministic copy"
# ours' search budget when scheduler.* is left null: trials, not wall time, so that a layout
# (and every number of ours) is the same on a loaded machine as on an idle one
SIM_BUDGET = {"trials": 4, "population": 4, "time_limit_s": None}
MIN_RANDOM_LAYOUTS = 3  # the paper's three random layouts per setting (appendix 10.1)


# Every schedule this process made or was handed, by everything it depends on
# (:meth:`Schedules.call`): the jobs of a sweep that one process runs (the serial launcher, a
# joblib worker) share them; a value may be a Future of a helper process (:func:`prefetch`).
SCHEDULE_CACHE: dict[tuple, object] = {}
# Ours' configuration searches a helper process runs ahead of the jobs (:func:`prefetch`), by the
# job's whole config and setting (:func:`_setting_key`): Futures of OursSearch.
SEARCH_CACHE: dict[tuple, Future] = {}
# The baselines' grids of a setting a helper process runs ahead of the jobs (:func:`prefetch`),
# keyed like SEARCH_CACHE: Futures of :func:`_baseline_grids`.
GRID_CACHE: dict[tuple, Future] = {}


@dataclass
class Schedules:
    """Our scheduled layouts under the search settings ``search`` and ``seed``, kept in
    :data:`SCHEDULE_CACHE`. No lower bound is computed (a simulated row does not report it)."""

    search: SchedulerOptions
    seed: int
    cache: dict = field(default_factory=lambda: SCHEDULE_CACHE)

    @property
    def method(self) -> str:
        return str(self.search.name)

    @property
    def key(self) -> dict:
        """The search's settings for a row's key: the budget, and what differs from default."""
        s = self.search
        changed = {
            "scheduler_patience_trials": s.patience_trials,
            "scheduler_greedy_seeds": None if s.greedy_seeds else False,
            "scheduler_objective": None if s.objective == "comm" else str(s.objective),
        }
        out = {"scheduler": self.method, "scheduler_budget": str(self.budget)}
        return {**out, **{k: v for k, v in changed.items() if v is not None}}

    @property
    def budget(self) -> dict:
        s = self.search
        given = {"trials": s.trials, "population": s.population, "time_limit_s": s.time_limit_s}
        return {k: SIM_BUDGET[k] if v is None else v for k, v in given.items()}

    def call(self, case: str, cluster: Cluster, workload: Workload, pp: int, dp: int):
        """(cache key, keyword arguments of :func:`system.scheduler.schedule`)."""
        sizes = tasklet_sizes(workload, pp, dp)
        search = self.search.search_kwargs(workload, **SIM_BUDGET)
        kwargs = dict(pp=pp, dp=dp, seed=self.seed, bound=False, **search)
        # a topology file's content, not only its path: an edited file is another cluster
        meta = cluster.meta
        key = (case, meta.get("variant"), meta.get("source_sha256"), sizes.c_dp_bytes)
        key = (*key, sizes.c_pp_bytes)
        return (*key, json.dumps({**kwargs, "workload": str(kwargs["workload"])})), (
            cluster,
            sizes,
            kwargs,
        )

    def get(self, case: str, cluster: Cluster, workload: Workload, pp: int, dp: int):
        """The schedule: this process's, else the sweep's other processes' (a launcher's
        workers: :func:`repro.hydra_fast.shared_store`), else made here (and shared)."""
        from system.scheduler import schedule

        key, (cl, sizes, kwargs) = self.call(case, cluster, workload, pp, dp)
        value = take(self.cache.get(key))
        if value is None:
            store = shared_store("schedules")
            name = json.dumps(key)
            value = store.get(name) if store is not None else None
            if value is None:
                value = schedule(cl, sizes, **kwargs)
                if store is not None:
                    store.put(name, value)
        self.cache[key] = value
        return value


def scheduled_layout(case: str, cluster: Cluster, workload: Workload, pp: int, dp: int, seed: int):
    """Ours' layout of ``case`` as ``mode=simulate`` makes it by default (the genetic scheduler
    at :data:`SIM_BUDGET`, greedy seeds), shared through :data:`SCHEDULE_CACHE`."""
    return Schedules(SchedulerOptions(), seed).get(case, cluster, workload, pp, dp).assignment


def _schedule(key: tuple, cluster: Cluster, sizes, kwargs: dict):
    """A queued schedule, kept in this process's :data:`SCHEDULE_CACHE` (the helper's searches
    reuse the ones it made)."""
    from system.scheduler import schedule

    SCHEDULE_CACHE[key] = schedule(cluster, sizes, **kwargs)
    return SCHEDULE_CACHE[key]


def _search_ahead(cfg: SimulateConfig, case: str, layers: int, batch: int):
    """A queued :func:`_search` of one setting, on this process's schedules."""
    return _search(cfg, case, layers, batch, Schedules(cfg.scheduler, cfg.seed))


def _setting_key(cfg: SimulateConfig, case: str, layers: int, batch: int, plain: Cluster) -> tuple:
    """Everything one setting's configuration search and baseline grids depend on: the job's
    whole config and the case as read (``plain``: a topology file also by its content)."""
    sha = plain.meta.get("source_sha256")
    return json.dumps(as_dict(cfg), sort_keys=True, default=str), case, layers, batch, sha


def _helper_start() -> None:
    """The helper's caches start empty: the copies forked from its parent hold the parent's
    queued tasks, which nothing in the helper would ever finish."""
    SCHEDULE_CACHE.clear()
    SEARCH_CACHE.clear()
    GRID_CACHE.clear()


def prefetch(jobs: list[SimulateConfig]):
    """Run the jobs' schedules, configuration searches and baseline grids in a helper process
    (the serial launcher leaves a core idle), in job order; a job takes them from
    :data:`SCHEDULE_CACHE`, :data:`SEARCH_CACHE` and :data:`GRID_CACHE` when it gets there, does
    them itself where the helper has not started them yet, and does the queue's last ones while
    it waits (:func:`repro.helper.take`), so the two cores share the sweep's simulations.
    Deterministic work (:data:`SIM_BUDGET` has no wall-time cap), so a job stores what it would
    have computed. Returns the function that stops the helper."""
    helper = Helper(_helper_start)
    for cfg in jobs:
        schedules = Schedules(cfg.scheduler, cfg.seed)
        baselines = cfg.system == "all" or str(cfg.system) in BASELINE_SYSTEMS
        for case, layers, batch in cfg.settings():
            plain, _, _, workload, pp, dp = _setting(cfg, case, layers, batch)
            search = _setting_key(cfg, case, layers, batch, plain)
            if baselines and search not in GRID_CACHE:
                GRID_CACHE[search] = helper.submit(_baseline_grids, cfg, case, layers, batch)
            if cfg.system not in ("all", "ours", "ours_search"):
                continue
            key, (cl, sizes, kwargs) = schedules.call(case, plain, workload, pp, dp)
            if key not in SCHEDULE_CACHE:
                SCHEDULE_CACHE[key] = helper.submit(_schedule, key, cl, sizes, kwargs)
            if cfg.system in ("all", "ours_search") and search not in SEARCH_CACHE:
                SEARCH_CACHE[search] = helper.submit(_search_ahead, cfg, case, layers, batch)
    helper.start()

    def stop() -> None:
        helper.stop()
        SEARCH_CACHE.clear()
        GRID_CACHE.clear()
        for key in [k for k, v in SCHEDULE_CACHE.items() if isinstance(v, Future) and not v.done()]:
            del SCHEDULE_CACHE[key]  # never made: a later job in this process makes its own

    return stop


def warm() -> None:
    """A launcher worker's warm-up before its first job (:attr:`repro.config.base.ModeSpec.warm`):
    one small setting of the debug case scheduled, simulated for every system and its rows
    typed, all thrown away, so that the compiled kernels (the scheduler's, the replay's, the
    collectives') and the row store's writer are loaded before the first job. Nothing is
    shared or written."""
    import pyarrow.parquet  # noqa: F401 - the store's writer

    from system.scheduler import schedule

    cfg = SimulateConfig(case="debug", layers=8, batch=64)
    plain, cluster, hw, workload, pp, dp = _setting(cfg, "debug", 8, 64)
    _, (cl, sizes, kwargs) = Schedules(cfg.scheduler, cfg.seed).call(
        "debug", plain, workload, pp, dp
    )
    ours = simulate_ours(cluster, schedule(cl, sizes, **kwargs).assignment, workload, hardware=hw)
    _row({"system": "ours"}, ours, cluster)
    for search in (grid_search_megatron, grid_search_deepspeed):
        grid = search(cluster, workload, hw, placement="topology")
        _row({"system": grid.best.system}, grid.best, cluster)


def _model_knobs(cfg: SimulateConfig) -> dict:
    """The sensitivity knobs as configured (null efficiency: the hardware model's): what the
    simulator's inputs are built from (:func:`_setting`)."""
    return {
        "compute_efficiency": cfg.compute_efficiency or V100.achievable_fraction,
        "link_sharing": str(cfg.link_sharing),
        "baseline_transport": str(cfg.baseline_transport),
        "dp_collective_request": str(cfg.dp_collective),
        "baseline_features": bool(cfg.baseline_features),
    }


def _changed_knobs(cfg: SimulateConfig, cluster: Cluster, hw) -> dict:
    """The knobs that go into the rows' key (and run ids): the link-sharing model always (every
    row says which model it ran under), the others when set away from their default. The
    modelling choices are read off what the simulator is given (the cluster's link-sharing
    model, the hardware's efficiency), the requests off ``cfg``."""
    default = {
        "compute_efficiency": V100.achievable_fraction,
        "baseline_transport": default_of(SimulateConfig, "baseline_transport"),
        "dp_collective_request": default_of(SimulateConfig, "dp_collective"),
        "baseline_features": default_of(SimulateConfig, "baseline_features"),
    }
    knobs = {
        **_model_knobs(cfg),
        "compute_efficiency": hw.achievable_fraction,
        "link_sharing": link_sharing_of(cluster),
    }
    return {k: v for k, v in knobs.items() if k == "link_sharing" or v != default[k]}


def _rows(key: dict, res: SimResult, cluster: Cluster, repeats: int, **extra) -> list[dict]:
    """The rows of one deterministic result, one per repeat (``repeat`` 0, 1, ... appended to
    ``key``): copies but for their key and identity (:data:`REPEAT_COPY`), so what the row
    says of the result is worked out once (:func:`_row_fields`)."""
    key, values = _row_fields(key, res, cluster, **extra)
    return make_rows(key, "repeat", range(repeats), **values)


def _row(key: dict, res: SimResult, cluster: Cluster, **extra) -> dict:
    """The row of one simulated result (:func:`_row_fields`)."""
    key, values = _row_fields(key, res, cluster, **extra)
    return make_row(key, **values)


def _row_fields(key: dict, res: SimResult, cluster: Cluster, **extra) -> tuple[dict, dict]:
    """(key, values) of the row of one simulated result, for :func:`system.results.make_row`.
    The link-sharing model and the DP collective asked for are recorded as the result says it
    ran them (the link-sharing model: the cluster's where nothing was simulated, an over-memory
    point); a key that says otherwise is a bug, refused."""
    c = res.config
    ok = res.status == "ok"
    own = ("rank_map", "placement_how", "dp_collective", "layout_table")  # row columns
    own += ("dp_collective_request", "dp_nccl_choice", "link_sharing")
    breakdown = {k: v for k, v in res.breakdown.items() if k not in own}
    ran = {"link_sharing": link_sharing_of(cluster), **res.breakdown}
    for k in ("link_sharing", "dp_collective_request"):
        if k in key and k in ran:
            if key[k] != ran[k]:
                raise RuntimeError(f"{res.system}: simulated with {k}={ran[k]!r}, keyed {key[k]!r}")
            key = {**key, k: ran[k]}
    extra.setdefault("dp_collective", res.breakdown.get("dp_collective"))
    for k in ("dp_collective_request", "dp_nccl_choice"):  # baselines: asked, NCCL's pick
        if k in res.breakdown and k not in key:
            extra.setdefault(k, res.breakdown[k])
    # the baselines' pipelines run 1F1B, Megatron's interleaved with virtual stages
    # (``virtual_stages``); without a pipeline (pp = 1) there is no schedule
    baseline = "schedule" not in c
    if baseline and c.get("pp", 1) == 1:
        extra.setdefault("schedule", "none")
    elif baseline:
        interleaved = c.get("virtual_stages", 1) > 1
        extra.setdefault("schedule", "interleaved-1f1b" if interleaved else "1f1b")
    else:
        extra.setdefault("schedule", c["schedule"])
    if "runtime_supported" in c:
        extra.setdefault("runtime_supported", c["runtime_supported"])
    if "rank_map" in res.breakdown:  # baselines: where each launch rank ran
        extra["rank_map"] = json.dumps(res.breakdown["rank_map"])
        extra["placement_how"] = res.breakdown.get("placement_how")
    return key, dict(
        status=res.status,
        num_devices=cluster.num_devices,
        iter_time_s=res.iter_time_s if ok else None,
        pflops=res.pflops if ok else None,
        compute_time_s=res.compute_time_s if ok else None,
        comm_time_s=res.comm_time_s if ok else None,
        tp=c.get("tp", 1),
        pp=c.get("pp"),
        dp=c.get("dp"),
        micro_batch_size=c.get("micro_batch_size"),
        zero=c.get("zero", 0),
        recompute=c.get("recompute", "full"),
        memory_gib=res.memory_bytes / 2**30,
        config=res.label(),
        mfu=res.pflops * 1e15 / (cluster.num_devices * V100.peak_flops) if ok else None,
        **{f"sim_{k}": v for k, v in breakdown.items()},
        **extra,
    )


def _setting(cfg: SimulateConfig, case: str, layers: int, batch: int):
    """(the case as the scheduler sees it, the simulated cluster, hardware, workload, pp, dp)."""
    plain = get_case(case, cfg.case_variant)  # what the scheduler sees (α, β only)
    knobs = _model_knobs(cfg)
    cluster = with_link_sharing(plain, knobs["link_sharing"])
    hw = replace(V100, achievable_fraction=knobs["compute_efficiency"])
    workload = Workload(
        model=get_model(cfg.model, layers),
        global_batch_size=batch,
        micro_batch_size=cfg.micro_batch_size,
    )
    pp, dp = fill_layout(cluster.num_devices, cfg.pp, cfg.dp)
    workload.check_layout(pp, dp)
    return plain, cluster, hw, workload, pp, dp


def _search(cfg: SimulateConfig, case: str, layers: int, batch: int, schedules) -> OursSearch:
    """Ours' configuration search of one setting (:func:`system.config_search.search_ours`) on
    the scheduled layouts of ``schedules``."""
    plain, cluster, hw, workload, _, _ = _setting(cfg, case, layers, batch)
    return search_ours(
        cluster,
        workload,
        hardware=hw,
        seed=cfg.seed,
        loss_scaling=True,
        scheduled=lambda p, d, w: schedules.get(case, plain, w, p, d).assignment,
        configs=str(cfg.ours_configs),
    )


def _baseline_grids(cfg: SimulateConfig, case: str, layers: int, batch: int) -> list[tuple]:
    """(system, placement protocol, grid search) of every baseline and protocol of one setting,
    each protocol's simulations shared with the next (launch order first: its rank maps are
    the topology search's first candidates)."""
    _, cluster, hw, workload, _, _ = _setting(cfg, case, layers, batch)
    knobs = _model_knobs(cfg)
    cache: dict = {}  # (config, rank map) -> simulation, shared by the protocols
    out = []
    for name, search in (("megatron", grid_search_megatron), ("deepspeed", grid_search_deepspeed)):
        if cfg.system not in ("all", name):
            continue
        for protocol in sorted(cfg.baseline_placements):
            grid = search(
                cluster,
                workload,
                hw,
                placement=protocol,
                cache=cache,
                transport=TRANSPORTS[knobs["baseline_transport"]],
                dp_collective=knobs["dp_collective_request"],
                features=knobs["baseline_features"],
            )
            out.append((name, str(protocol), grid))
    return out


def _simulate_setting(cfg: SimulateConfig, case: str, layers: int, batch: int, schedules):
    """All rows of one (case, layers, batch). Raises ValueError on bad input."""
    systems = SIMULATED_SYSTEMS if cfg.system == "all" else (str(cfg.system),)
    repeats = cfg.repeats
    knobs = _model_knobs(cfg)
    plain, cluster, hw, workload, pp, dp = _setting(cfg, case, layers, batch)
    model = workload.model
    seed = cfg.seed
    base = {
        "mode": "simulate",
        "case": case,
        "case_variant": str(cfg.case_variant),
        "model": model.name,
        "num_layers": layers,
        "global_batch_size": batch,
        "seed": seed,
        **_changed_knobs(cfg, cluster, hw),
    }
    # the baselines first: a helper process may meanwhile finish this setting's schedules and
    # search (:func:`prefetch`); their rows still come after ours'
    baseline_rows = []
    request = {"dp_collective_request": knobs["dp_collective_request"]}  # ZeRO-3's rows too
    grids = take(GRID_CACHE.pop(_setting_key(cfg, case, layers, batch, plain), None))
    if grids is None:
        grids = _baseline_grids(cfg, case, layers, batch)
    for name, protocol, grid in grids:  # the systems asked for, in order
        for res in grid.results:
            key = {**base, "system": name, **res.config}
            baseline_rows += _rows(
                key,
                res,
                cluster,
                repeats,
                is_best=res is grid.best,
                repeat_kind=REPEAT_COPY,
                variant=res.breakdown.get("variant", name),
                placement=str(protocol),
                **({} if "dp_collective_request" in key else request),
            )
    rows = []
    oom = ValueError(
        f"case {case}, {layers} layers: not even one micro-batch of "
        f"{workload.micro_batch_size} fits in {V100.name} memory with pp={pp}"
    )
    if "ours" in systems:  # the paper's system: its fixed configuration on the scheduled layout
        sched = schedules.get(case, plain, workload, pp, dp)
        ours = simulate_ours(cluster, sched.assignment, workload, hardware=hw, loss_scaling=True)
        if ours.status != "ok":
            raise oom
        info = {
            "scheduler": schedules.method,
            "search_time_s": sched.search_time_s,
            "best_cost_s": sched.cost.total_cost_s,
            "search_trials": sched.trials,
            "layout": sched.assignment.stages.tolist(),
        }
        key = {
            **base,
            "system": "ours",
            **schedules.key,
            "micro_batch_size": workload.micro_batch_size,
            "pp": pp,
            "dp": dp,
        }
        rows += _rows(
            key,
            ours,
            cluster,
            repeats,
            placement="scheduled",
            repeat_kind=REPEAT_COPY,
            variant="paper",
            runtime_supported=True,
            **info,
        )
    if "ours_search" in systems:  # the best this design can do (system/config_search.py)
        found = take(SEARCH_CACHE.pop(_setting_key(cfg, case, layers, batch, plain), None))
        if found is None:
            found = _search(cfg, case, layers, batch, schedules)
        for res in found.results:
            c = res.config
            key = {
                **base,
                "system": "ours_search",
                **schedules.key,
                **{k: c[k] for k in ("pp", "dp", "micro_batch_size", "recompute", "schedule")},
                "ours_configs": str(cfg.ours_configs),  # what the search was credited with
                "placement": c["layout"],
            }
            rows += _rows(
                key,
                res,
                cluster,
                repeats,
                is_best=res is found.best,
                repeat_kind=REPEAT_COPY,
                variant="paper" if res is found.paper else "search",
                layout=res.breakdown["layout_table"],
            )
    if "ours_random" in systems:  # the paper's random layouts: a new seeded rank map per run
        for k in range(max(MIN_RANDOM_LAYOUTS, repeats)):
            a = random_assignment(pp, dp, np.random.default_rng([seed, k]))
            res = simulate_ours(
                cluster, a, workload, system="ours_random", hardware=hw, loss_scaling=True
            )
            if res.status != "ok":
                raise oom
            key = {
                **base,
                "system": "ours_random",
                "micro_batch_size": workload.micro_batch_size,
                "pp": pp,
                "dp": dp,
                "layout_seed": [seed, k],
                "repeat": k,
            }
            rows.append(
                _row(
                    key,
                    res,
                    cluster,
                    scheduler="random_rank_map",
                    placement="random",
                    layout=a.stages.tolist(),
                    repeat_kind="random layout",
                )
            )
    rows += baseline_rows
    return rows


def run(cfg: SimulateConfig) -> dict:
    """Simulate the configured settings, write their rows, print their summary; returns it with
    the written ``run_ids`` (the study's report files are the entry's, :mod:`repro.sweep`);
    with ``plan=FILE`` the plan of ``mode=plan`` simulated again (:mod:`repro.modes.plan.run`)."""
    if cfg.plan is not None:
        from repro.modes.plan.run import simulate_plan

        return simulate_plan(cfg)
    t0 = time.perf_counter()
    results_dir = Path(cfg.results_dir)
    schedules = Schedules(cfg.scheduler, cfg.seed)
    rows = []
    for case, layers, batch in cfg.settings():
        rows += _simulate_setting(cfg, case, layers, batch, schedules)
    elapsed = time.perf_counter() - t0
    # same settings, model version and input files as the rows reported now: nothing to write
    # (a row stored but superseded, e.g. a topology file edited back, is written again)
    current = current_of(results_dir, [r["setting_id"] for r in rows])
    new = [r for r in rows if current.get(r["setting_id"]) != r["run_id"]]
    log.info(
        "simulated %d settings in %.1f s: %d rows (%d new) -> %s",
        len(cfg.settings()),
        elapsed,
        len(rows),
        len(new),
        results_dir,
    )
    if new or not (results_dir / "runs.parquet").exists():
        write_rows(results_dir, new)
    out = {
        "run_ids": [r["run_id"] for r in rows],
        "rows": len(rows),
        "new_rows": len(new),
        "elapsed_s": elapsed,
        "store_s": time.perf_counter() - t0 - elapsed,
        "results_dir": str(results_dir),
    }
    if is_multirun():  # a sweep shows its progress; one table per job would drown it
        return out
    summary = summary_from_rows(pd.DataFrame(rows))
    (print_wide if cfg.tables == "wide" else print_compact)(summary, elapsed)
    why = [c for c in summary.columns if c.endswith("_why")]
    return {**out, "summary": summary.drop(columns=why).to_dict("records")}
