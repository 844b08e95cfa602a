"""Ours at its best: shape, micro-batch, recomputation and schedule searched with the layout.

The paper runs its system in one fixed configuration — pp = dp = 8 on 64 devices, micro-batch 1,
full recomputation, GPipe, as many accumulation rounds as memory forces — while each baseline
gets a grid search (paper §4.1, appendix 10.2). :func:`search_ours` gives ours a grid too, so
both "the paper's system" and "the best this design can do" are reported:

- shapes (pp, dp): pp divides the device count and the layer count, dp the global batch;
- layouts per shape: the scheduler's (the paper's hybrid GA at the given budget, tasklet sizes
  of the workload's micro-batch) and the heuristic layouts a user would try first
  (:mod:`system.scheduler.heuristics`: one pipeline per region, greedy region fill);
- per (shape, layout): micro-batch {1, 2, 4, 8}, recomputation {full, selective, none} and
  schedule {gpipe, 1f1b} (:func:`system.simulator.simulate_ours`), where memory allows.

The paper's configuration on the scheduler's layout (:func:`paper_config`) is always one of the
candidates, so the best is never slower than it. Every result's ``config`` records the shape,
micro-batch, recomputation, schedule and ``layout``; ``runtime_supported`` says whether our
runtime runs it (GPipe with full or no recomputation, :data:`system.runtime.spec.SCHEDULES` and
``RECOMPUTE_MODES``; 1F1B and selective recomputation are simulator-only design options).
``configs`` (:data:`CONFIG_SETS`): ``runnable`` (default) searches only those, so ours is credited
only with what it can run, as the baselines are; ``all`` adds the rest, a labelled variant.
:func:`runtime_spec` builds the :class:`~system.runtime.spec.RunSpec` of a configuration and
refuses one the runtime cannot run; a GPipe configuration runs the accumulation passes its
memory needs (paper §4.1; the result's ``rounds``) as ``RunSpec.rounds``.

Candidates are simulated in order of a compute-only lower bound (the busiest device's
m·(f + b) + optimizer step, which no schedule beats), stopping once that bound reaches the best
time found; layouts are scheduled once per shape and kept in ``layouts`` (a dict the caller may
share between settings with the same tasklet sizes).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from system.assignment import Assignment
from system.cluster import Cluster
from system.runtime.spec import RECOMPUTE_MODES as RUNTIME_RECOMPUTE
from system.runtime.spec import SCHEDULES as RUNTIME_SCHEDULES
from system.runtime.spec import RunSpec
from system.simulator import V100, Hardware, SimResult, simulate_ours, stage_compute
from system.simulator.ours import SCHEDULES, accumulation_rounds, ours_memory_bytes
from system.workload import Workload, stage_gradient_params, tasklet_sizes

__all__ = [
    "CONFIG_SETS",
    "MICRO_BATCH_SIZES",
    "RUNTIME_SUPPORTED",
    "SEARCH_LAYOUTS",
    "OursConfig",
    "OursSearch",
    "paper_pp",
    "paper_config",
    "runtime_spec",
    "search_ours",
]

MICRO_BATCH_SIZES = (1, 2, 4, 8)  # the baselines' grid's micro-batch sizes
# the scheduler's layout for (pp, dp, workload), when the caller keeps its own schedules
ScheduledLayout = Callable[[int, int, Workload], Assignment]
SEARCH_LAYOUTS = ("scheduled", "one_pipeline_per_region", "greedy_region_fill")
# (schedule, recomputation) pairs that system/runtime implements
RUNTIME_SUPPORTED = frozenset((s, rc) for s in RUNTIME_SCHEDULES for rc in RUNTIME_RECOMPUTE)
CONFIG_SETS = ("runnable", "all")  # search_ours' ``configs``: what ours is credited with
RECOMPUTE_ORDER = ("none", "selective", "full")  # least recomputation first


def paper_pp(num_devices: int) -> int:
    """The paper's stage count for ours: the divisor of the device count closest to its square
    root (64 -> 8, pp = dp = 8 as in §4.1)."""
    divisors = [k for k in range(1, num_devices + 1) if num_devices % k == 0]
    return min(divisors, key=lambda k: (abs(k - math.sqrt(num_devices)), k))


@dataclass(frozen=True, slots=True)
class OursConfig:
    """One point of ours' grid."""

    pp: int
    dp: int
    micro_batch_size: int = 1
    recompute: str = "full"
    schedule: str = "gpipe"
    layout: str = "scheduled"

    def label(self) -> str:
        text = f"pp{self.pp}/dp{self.dp} mbs{self.micro_batch_size} {self.schedule}"
        text += f" rc-{self.recompute}" if self.recompute != "full" else ""
        return text + (f" [{self.layout}]" if self.layout != "scheduled" else "")

    @property
    def runtime_supported(self) -> bool:
        return (self.schedule, self.recompute) in RUNTIME_SUPPORTED


def runtime_spec(
    config: OursConfig,
    workload: Workload,
    stages: list[list[int]] | None = None,
    *,
    rounds: int = 1,
    **options,
) -> RunSpec:
    """The runtime's checked :class:`~system.runtime.spec.RunSpec` of ``config`` on
    ``workload`` (``stages``: the layout's assignment table; ``rounds``: its accumulation
    passes, a simulated result's ``breakdown["rounds"]``; ``options``: more RunSpec fields).

    Raises ValueError when the runtime cannot run ``config``: a schedule other than
    :data:`system.runtime.spec.SCHEDULES`, a recomputation other than its ``RECOMPUTE_MODES``,
    or a shape :meth:`RunSpec.validate` refuses.
    """
    if config.schedule not in RUNTIME_SCHEDULES:
        raise ValueError(
            f"runtime_spec: {config.label()}: the runtime runs schedule {RUNTIME_SCHEDULES}, "
            f"not {config.schedule!r}"
        )
    if config.recompute not in RUNTIME_RECOMPUTE:
        raise ValueError(
            f"runtime_spec: {config.label()}: the runtime runs recomputation "
            f"{tuple(RUNTIME_RECOMPUTE)}, not {config.recompute!r}"
        )
    model = workload.model
    spec = RunSpec(
        model=model.name,
        layers=model.num_layers,
        hidden_size=model.hidden_size,
        seq_length=model.seq_length,
        vocab_size=model.vocab_size,
        pp=config.pp,
        dp=config.dp,
        global_batch_size=workload.global_batch_size,
        micro_batch_size=config.micro_batch_size,
        checkpointing=RUNTIME_RECOMPUTE[config.recompute],
        stages=stages,
        rounds=rounds,
        **options,
    )
    spec.validate(world_size=config.pp * config.dp)
    return spec


def paper_config(num_devices: int, micro_batch_size: int = 1) -> OursConfig:
    """The paper's fixed configuration (§4.1): pp = dp = √64, micro-batch 1, full
    recomputation, GPipe, on the scheduler's layout."""
    pp = paper_pp(num_devices)
    return OursConfig(pp=pp, dp=num_devices // pp, micro_batch_size=micro_batch_size)


@dataclass
class OursSearch:
    """The best configuration, the paper's, and every one simulated (``results``)."""

    best: SimResult
    paper: SimResult
    results: list[SimResult] = field(default_factory=list)

    @property
    def best_supported(self) -> SimResult:
        """The fastest configuration our runtime implements today (GPipe, full or no
        recomputation); the paper's is one, so this always exists."""
        ok = [r for r in self.results if r.status == "ok" and r.config["runtime_supported"]]
        return min(ok, key=lambda r: r.iter_time_s)


def _shapes(cluster: Cluster, workload: Workload) -> list[tuple[int, int]]:
    n, layers, batch = cluster.num_devices, workload.model.num_layers, workload.global_batch_size
    return [
        (pp, n // pp)
        for pp in range(1, n + 1)
        if n % pp == 0 and layers % pp == 0 and batch % (n // pp) == 0
    ]


def _layout(
    cluster: Cluster,
    workload: Workload,
    pp: int,
    dp: int,
    name: str,
    *,
    seed: int,
    budget: dict,
    layouts: dict,
    scheduled: ScheduledLayout | None,
) -> Assignment | None:
    from system.scheduler import schedule
    from system.scheduler.heuristics import heuristic_assignment

    if name != "scheduled":
        return heuristic_assignment(cluster, pp, dp, name)
    if scheduled is not None:
        return scheduled(pp, dp, workload)
    sizes = tasklet_sizes(workload, pp, dp)
    key = (cluster.name, cluster.meta.get("variant"), pp, dp, sizes, seed, tuple(budget.items()))
    if key not in layouts:
        layouts[key] = schedule(
            cluster, sizes, pp=pp, dp=dp, method="genetic", seed=seed, bound=False, **budget
        ).assignment
    return layouts[key]


def _lower_bound_s(workload: Workload, c: OursConfig, hardware: Hardware) -> float:
    """Compute seconds of the busiest device: no schedule or layout finishes sooner."""
    model = workload.model
    m = workload.global_batch_size // (c.dp * c.micro_batch_size)
    params = [x for x in stage_gradient_params(model, c.pp)]
    comp = stage_compute(
        model,
        c.pp,
        c.micro_batch_size,
        hardware=hardware,
        params_per_device=params,
        recompute=c.recompute,
    )
    f, b, opt = comp.per_stage(c.pp)
    return float((m * (f + b) + opt).max())


def _simulate(
    cluster: Cluster,
    workload: Workload,
    c: OursConfig,
    layout: Assignment,
    hardware: Hardware,
    loss_scaling: bool,
) -> SimResult:
    w = replace(workload, micro_batch_size=c.micro_batch_size)
    res = simulate_ours(
        cluster,
        layout,
        w,
        hardware=hardware,
        recompute=c.recompute,
        schedule=c.schedule,
        loss_scaling=loss_scaling,
    )
    res.config["layout"] = c.layout
    res.config["runtime_supported"] = c.runtime_supported
    res.breakdown["layout_table"] = layout.stages.tolist()
    return res


def _grid(
    workload: Workload,
    pp: int,
    dp: int,
    kind: str,
    simulate: Callable[[OursConfig], SimResult],
    *,
    hardware: Hardware,
    best_s: float,
    space: tuple[tuple[int, ...], tuple[str, ...], tuple[str, ...]],
) -> tuple[list[SimResult], int]:
    """Every (micro-batch, recomputation, schedule) of one shape on one layout worth running,
    cheapest lower bound first; returns the results and how many candidates the bound skipped.

    Dominance: with the same number of passes (accumulation rounds; 1F1B always one) less
    recomputation never slows an iteration down — every event time of the GPipe and 1F1B
    timelines is monotone in the compute times, and the exchange does not depend on them — so
    per micro-batch size a recomputation mode is tried only where it needs fewer passes than
    every mode with less recomputation (1F1B: only the least one that fits)."""
    micro_batch_sizes, recompute, schedules = space
    per_replica = workload.global_batch_size // dp
    todo = []
    for mbs in micro_batch_sizes:
        if per_replica % mbs:
            continue
        w = replace(workload, micro_batch_size=mbs)
        for sch in schedules:
            fewest = math.inf  # passes of the modes with less recomputation
            for rc in sorted(recompute, key=RECOMPUTE_ORDER.index):
                if sch == "1f1b":
                    passes = 1 if _fits_1f1b(w, pp, dp, rc, hardware) else 0
                else:
                    passes = accumulation_rounds(w, pp, dp, hardware, recompute=rc)
                if passes and passes < fewest:
                    todo.append(OursConfig(pp, dp, mbs, rc, sch, kind))
                    fewest = passes
    bound = {c: _lower_bound_s(workload, c, hardware) for c in todo}
    todo.sort(key=lambda c: (bound[c], c.label()))
    results, skipped = [], 0
    for c in todo:
        if bound[c] >= best_s:
            skipped += 1
            continue
        res = simulate(c)
        results.append(res)
        if res.status == "ok":
            best_s = min(best_s, res.iter_time_s)
    return results, skipped


def _fits_1f1b(workload: Workload, pp: int, dp: int, recompute: str, hardware: Hardware) -> bool:
    """Whether a 1F1B pass (at most pp micro-batches in flight) fits in memory."""
    in_flight = min(pp, workload.micro_batches(dp))
    mem = ours_memory_bytes(workload, pp, in_flight, recompute=recompute, last_in_flight=1)
    return mem <= hardware.usable_memory_bytes


def search_ours(
    cluster: Cluster,
    workload: Workload,
    *,
    hardware: Hardware = V100,
    seed: int = 0,
    budget: dict | None = None,
    loss_scaling: bool = True,
    layouts: dict | None = None,
    scheduled: ScheduledLayout | None = None,
    micro_batch_sizes: tuple[int, ...] = MICRO_BATCH_SIZES,
    recompute: tuple[str, ...] = ("none", "selective", "full"),
    schedules: tuple[str, ...] = SCHEDULES,
    configs: str = "runnable",
) -> OursSearch:
    """Ours' best configuration on ``cluster`` and the paper's (module docstring).

    Per shape, the layout is picked by simulating micro-batch 1, full recomputation (GPipe, or
    1F1B where GPipe does not fit) on each applicable heuristic layout — and on the scheduler's
    for the paper's shape; the grid then runs on that layout. The shape that wins on a heuristic
    layout is also scheduled, and its grid rerun on the scheduler's layout. ``recompute`` is
    listed least recomputation first (the order 1F1B tries them in).

    ``budget``: the scheduler's (``trials``, ``population``, ``time_limit_s``, …; default its
    own); ``scheduled``: the caller's scheduler instead (``budget`` then unused).
    ``loss_scaling``: charge fp16's finite-flag all-reduce (the paper ran fp16).
    ``configs``: ``runnable`` keeps only the (schedule, recomputation) pairs our runtime runs
    (:data:`RUNTIME_SUPPORTED`) out of ``recompute`` × ``schedules``; ``all`` searches them all.
    ValueError when even the paper's configuration does not fit in memory, or for a bad
    ``configs``.
    """
    if configs not in CONFIG_SETS:
        raise ValueError(f"search_ours: configs must be one of {CONFIG_SETS}, got {configs!r}")
    if configs == "runnable":
        schedules = tuple(s for s in schedules if s in RUNTIME_SCHEDULES)
        recompute = tuple(r for r in recompute if r in RUNTIME_RECOMPUTE)
        if not schedules or not recompute:
            raise ValueError(
                "search_ours: configs='runnable' leaves no schedule or recomputation the "
                f"runtime runs (schedules {RUNTIME_SCHEDULES}, recomputation "
                f"{tuple(RUNTIME_RECOMPUTE)})"
            )
    budget = dict(budget or {})
    layouts = {} if layouts is None else layouts
    space = (tuple(micro_batch_sizes), tuple(recompute), tuple(schedules))
    paper = paper_config(cluster.num_devices, workload.micro_batch_size)
    memo: dict[OursConfig, SimResult] = {}  # each configuration simulated once

    def layout_of(pp: int, dp: int, kind: str) -> Assignment | None:
        return _layout(
            cluster,
            workload,
            pp,
            dp,
            kind,
            seed=seed,
            budget=budget,
            layouts=layouts,
            scheduled=scheduled,
        )

    def simulate_on(layout: Assignment) -> Callable[[OursConfig], SimResult]:
        def sim(c: OursConfig) -> SimResult:
            if c not in memo:
                memo[c] = _simulate(cluster, workload, c, layout, hardware, loss_scaling)
            return memo[c]

        return sim

    def grid(pp: int, dp: int, kind: str, layout: Assignment, best_s: float) -> SimResult | None:
        got, _ = _grid(
            workload,
            pp,
            dp,
            kind,
            simulate_on(layout),
            hardware=hardware,
            best_s=best_s,
            space=space,
        )
        ok = [r for r in got if r.status == "ok"]
        return min(ok, key=lambda r: r.iter_time_s) if ok else None

    paper_res = simulate_on(layout_of(paper.pp, paper.dp, "scheduled"))(paper)
    if paper_res.status != "ok":
        raise ValueError(
            f"ours on {cluster.name}: the paper's configuration {paper.label()} does not fit in "
            f"{hardware.name} memory"
        )
    best = paper_res
    for pp, dp in _shapes(cluster, workload):
        kinds = [k for k in SEARCH_LAYOUTS if k != "scheduled"]
        if (pp, dp) == (paper.pp, paper.dp):
            kinds = ["scheduled", *kinds]
        picked = None
        for kind in kinds:
            layout = layout_of(pp, dp, kind)
            if layout is None:
                continue
            for sch in [x for x in ("gpipe", "1f1b") if x in schedules]:
                probe = OursConfig(pp, dp, workload.micro_batch_size, "full", sch, kind)
                res = simulate_on(layout)(probe)
                if res.status == "ok":
                    break
            if res.status == "ok" and (picked is None or res.iter_time_s < picked[2]):
                picked = (kind, layout, res.iter_time_s)
        if picked is None:
            continue  # nothing fits in this shape
        kind, layout, _ = picked
        got = grid(pp, dp, kind, layout, best.iter_time_s)
        if got is not None and got.iter_time_s < best.iter_time_s - 1e-12:
            best = got
    top = best.config
    if top["layout"] != "scheduled":  # the winning shape on the scheduler's layout as well
        pp, dp = top["pp"], top["dp"]
        got = grid(pp, dp, "scheduled", layout_of(pp, dp, "scheduled"), best.iter_time_s)
        if got is not None and got.iter_time_s < best.iter_time_s - 1e-12:
            best = got
    return OursSearch(best=best, paper=paper_res, results=list(memo.values()))
