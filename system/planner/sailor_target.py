"""The planner with Sailor's training framework as the plan's runtime (``framework=sailor``).

The objective is :func:`system.external.sailor.framework.predict_plan`'s iteration time (the
project's model of Sailor's framework: Megatron-DeepSpeed in FP32, DeepSpeed's 1F1B, tensor
parallelism inside a node) and a plan must fit its memory model
(:func:`~system.external.sailor.framework.replicas_fit`). The search space is what that
framework runs: per (stage, replica) one node of ``tp`` GPUs of one host (tp dividing the GPUs
of each host of that type and zone, one tp per GPU type), ``pp`` stages of ``dp`` replicas,
a micro-batch size with a profile for every (GPU, tp) used, any subset of the fleet's GPUs and
zones, and an uneven split of Sailor's layers (0 the embedding, the last the head).

The search:

1. **Heuristics** (:data:`~system.planner.search.HEURISTICS`, on the fleet's devices, one GPU a
   node, tp 1, every shape) get the same configuration search (every micro-batch size, the
   balanced layer split); each one's best is reported and the best of them seeds the search.
2. **Typed layouts**: per tp of each GPU type, per subset of the types, per number of stages of
   each type (a stage's replicas all one type), per dp, per type order along the pipeline and
   per anchor zone (the zones by bandwidth to the anchor) and per fill — pipeline-major (each
   replica's pipeline in one zone where it fits) or stage-major (each stage's replicas from
   the zones in order, stage after stage: a stage's data-parallel group spans fewer zones, its
   pipeline boundaries cross them) — every micro-batch size; dp: every divisor of the batch,
   the most the nodes allow, and per micro-batch size the least dp for each micro-batch count.
3. **Zone swaps**: the best plan's zones relabelled two at a time (a used zone with another
   used one — the ring's and the stages' zone order — or with an idle one of room enough),
   each swap simulated, the best taken while one improves (a local search; the last
   :data:`POLISH_SHARE` of the time limit is kept for it).

A configuration's layer split keeps its busiest stage's forward + backward time small within
each stage's memory (a contiguous split, greedy bisection on the time: the least within 0.2%
where a stage's layers cost alike, :func:`_bisect_split`). Configurations are
simulated in the order of an estimate — 1F1B over each stage's f + b plus its boundary sends
(Sailor's link fits), a ring all-reduce over the slowest link of each stage's group, the
optimizer step — skipping those whose compute bound (``(m − 1)·max(f + b) + Σ(f + b) +``
optimizer) reaches the incumbent, and stopping at the first estimated more than
:data:`ESTIMATE_MARGIN` above it, or at the time limit less :data:`POLISH_SHARE`. The stop is
a rule on the estimate, not a bound: a plan the estimate ranks that far off is not simulated.
Such entries are not even listed: an entry is dropped once its estimate's data-parallel part
alone passes the stop.
Before a configuration is simulated its floor
(:func:`~system.external.sailor.framework.iteration_floor_s`: the all-reduce and optimizer
step as the model times them after a bound on the pipeline with its sends) is compared with
the incumbent; one whose floor reaches it cannot beat it and is not simulated (``floored``),
so the floor changes how many configurations are simulated, never which plan is chosen.
"""

from __future__ import annotations

import heapq
import itertools
import math
import time
from dataclasses import dataclass, field

import numpy as np

from system.cluster import Cluster
from system.compiled import kernel
from system.external.sailor.bandwidth import NodeSpec
from system.external.sailor.errors import SailorFormatError
from system.external.sailor.framework import (
    ADAM_STATE_BYTES_PER_PARAM,
    BUCKET_ELEMENTS,
    BYTES_PER_ELEMENT,
    CONTEXT_BYTES,
    PlanPrediction,
    SailorInputs,
    head_is_tied,
    iteration_floor_s,
    predict_plan,
    replicas_fit,
    tied_head_times_s,
)
from system.external.sailor.gpus import SAILOR_GPUS
from system.external.sailor.plan import Replica, SailorPlan, Stage
from system.external.sailor.profile import PROFILED_TRANSFORMER_LAYERS
from system.gpus import get_gpu
from system.links import BandwidthCurve, CurveStack
from system.planner.prices import usd_per_hour
from system.planner.search import HEURISTICS, SMALL_FLEET, check_objective
from system.scheduler.heuristics import greedy_region_chains

__all__ = [
    "SailorCandidate",
    "SailorPlanResult",
    "SailorTargetPlanner",
    "plan_sailor",
    "sailor_gpu",
]

MICRO_BATCH_SIZES = (1, 2, 4, 8)
STAGE_COUNTS = (1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 14, 16, 20, 24, 28, 32)  # per type, and its max
# the search stops at the first configuration estimated this much above the incumbent (a stop
# rule on the estimate, not a bound: module docstring)
ESTIMATE_MARGIN = 0.15
# a configuration is skipped when its floor reaches the incumbent's score times 1 + this: where
# floor and prediction are equal in exact arithmetic (a one-stage plan), they may still differ
# in their last bits, being summed in another order
FLOOR_SLACK = 1e-9
HEURISTIC_SHARE = 0.3  # of the time limit, split evenly between the heuristics
POLISH_SHARE = 0.1  # of the time limit, kept for the zone swaps of the best plan
# relative: a bound summed in another order than the layer split's cumulative sums stays within
# this of its exact value (float64 sums of at most a few hundred positive terms)
SPLIT_ROUNDING = 1e-9
FILLS = ("pipeline", "stage")  # how a typed layout's replicas take the zones (module docstring)


def sailor_gpu(project: str, model: str, inputs: SailorInputs) -> str:
    """Sailor's name for the project's GPU type ``project``: the one with profiles of ``model``
    whose memory suffix (``A100-40``: 40 GB) is the project GPU's memory; ValueError if none."""
    names = [s for s, p in SAILOR_GPUS.items() if p == project]
    have = {g for (m, g, _, _) in inputs.profiles.rows if m == model}
    names = [s for s in names if s in have]
    gb = round(get_gpu(project).memory_bytes / 1e9)
    exact = [s for s in names if s.rsplit("-", 1)[-1] == str(gb)]
    if len(exact) == 1:
        return exact[0]
    if len(names) == 1:
        return names[0]
    raise ValueError(
        f"GPU {project!r}: no single Sailor profile of {model} matches it (candidates {names})"
    )


@kernel
def _bisect_split(cost, most, hi, best):
    """A contiguous layer split with a small busiest-stage time, by bisection on the time ``T``
    over ``[0, hi]`` until within 0.2% (the counts are integers: past their steps): ``cost[s]``
    stage ``s``'s cumulative f + b per layer (``L + 1`` entries), ``most[s, i]`` the last layer
    end its memory allows from first layer ``i``. For a ``T``, each stage but the last takes as
    many layers as ``T``, its memory and one layer for each later stage allow, and the last
    stage must take the rest within ``T``. Writes the counts of the least ``T`` found so into
    ``best`` and returns True; False where ``hi`` itself fails, which no split then fits
    (``hi`` is at least any stage's whole-model time, so only memory binds there).

    Taking as many layers as possible is exact where each stage's layers cost alike (then the
    split is within 0.2% of the best); where layers differ (an embedding or head layer) a
    stage pushed to start later may find its first layer over ``T``, so the best split can be
    missed."""
    pp, width = cost.shape
    total = width - 1
    last = pp - 1
    trial = np.empty(pp, dtype=np.int64)
    lo = 0.0
    for step in range(41):  # ``hi`` itself, then at most 40 halvings
        t = hi if step == 0 else 0.5 * (lo + hi)
        ok = True
        i = 0
        for s in range(last):
            j = np.searchsorted(cost[s], cost[s, i] + t, side="right") - 1
            j = min(j, total - last + s, most[s, i])
            if j <= i:
                ok = False
                break
            trial[s] = j - i
            i = j
        if ok and (cost[last, total] - cost[last, i] > t or most[last, i] < total):
            ok = False
        if ok:
            trial[last] = total - i
        if step == 0:
            if not ok:
                return False
            best[:] = trial
            continue
        if ok:
            hi = t
            best[:] = trial
        else:
            lo = t
        if hi - lo < 2e-3 * hi:
            break
    return True


def _runs(grid) -> list[list[tuple]]:
    """A grid (``grid[s][r]``: the cell of stage s, replica r) as runs: per stage its
    (cell, replicas in a row) pairs, in replica order."""
    return [[(cell, sum(1 for _ in same)) for cell, same in itertools.groupby(st)] for st in grid]


def _grid(runs) -> list[list[tuple]]:
    """The grid of :func:`_runs`' runs."""
    return [[cell for cell, n in st for _ in range(n)] for st in runs]


def _pipelines(runs) -> dict[tuple, int]:
    """A layout's pipelines (replica r's cells, stage by stage) and how many replicas each
    one is, from its :func:`_runs`: two grids with the same counts hold the same pipelines.
    Walked run by run: a layout's replicas repeat a few cells."""
    at = [0] * len(runs)
    left = [r[0][1] for r in runs]
    out: dict[tuple, int] = {}
    while True:
        n = min(left)
        p = tuple(r[k][0] for r, k in zip(runs, at, strict=True))
        out[p] = out.get(p, 0) + n
        for s, r in enumerate(runs):
            left[s] -= n
            if not left[s]:
                at[s] += 1
                if at[s] < len(r):
                    left[s] = r[at[s]][1]
        if at[0] == len(runs[0]):
            return out


@dataclass
class SailorCandidate:
    """One plan judged by the model of Sailor's framework."""

    layout: str
    plan: SailorPlan
    prediction: PlanPrediction
    usd_per_s: float
    entry: tuple | None = None  # (layout, grid, mbs, layer counts) it was made from

    @property
    def iter_time_s(self) -> float:
        return self.prediction.iter_time_s

    @property
    def cost_usd(self) -> float:
        return self.iter_time_s * self.usd_per_s

    def config(self) -> dict:
        tps = sorted({r.tp for st in self.plan.stages for r in st.replicas})
        return {
            "pp": self.plan.pp,
            "dp": self.plan.dp,
            "micro_batch_size": self.plan.mbs,
            "micro_batches": self.plan.micro_batches,
            "tp": tps[0] if len(tps) == 1 else tps,
            "schedule": "1f1b (DeepSpeed)",
            "recompute": "none",
        }

    def plan_config(self) -> dict:
        """The plan as a Sailor ``plan_config`` document."""
        p = self.plan
        return {
            "pipeline_list": [
                {
                    "num_stages": p.pp,
                    "layers_per_stage": [list(st.layers) for st in p.stages],
                    "tmp_per_stage": [
                        [[[[r.gpu, r.gpus, r.zone]], r.tp] for r in st.replicas] for st in p.stages
                    ],
                    "dp": [st.dp for st in p.stages],
                }
            ],
            "mbs": p.mbs,
            "gbs": p.gbs,
            "N": p.pp * p.dp,
        }


@dataclass
class SailorPlanResult:
    best: SailorCandidate | None
    heuristics: dict[str, SailorCandidate | None]
    search_time_s: float
    simulations: int
    estimates: int
    floored: int  # configurations not simulated: their floor reached the incumbent
    layouts: dict[str, int] = field(default_factory=dict)


@dataclass
class _TypeRow:
    """Per-layer times, parameters and activations of one (Sailor GPU, mbs, tp)."""

    cost_s: np.ndarray  # fwd + bwd per layer per micro-batch (the tied head's GEMM included)
    opt_s_per_param: float
    params: np.ndarray  # per GPU
    act: np.ndarray  # act_mem elements per sequence
    act_out: np.ndarray  # act_output elements per sequence (a stage boundary's send)
    memory_bytes: float


class SailorTargetPlanner:
    """One planning problem (module docstring); :meth:`run` plans it."""

    def __init__(
        self,
        cluster: Cluster,
        model: str,
        batch: int,
        inputs: SailorInputs,
        *,
        objective: str = "throughput",
        max_iter_time_s: float | None = None,
        time_limit_s: float = 50.0,
        micro_batch_sizes: tuple[int, ...] = MICRO_BATCH_SIZES,
        heuristics: tuple[str, ...] = HEURISTICS,
        typed: bool = True,
    ) -> None:
        check_objective(objective, max_iter_time_s)
        if model not in inputs.shapes:
            raise ValueError(
                f"model {model!r}: no Sailor training config (have {list(inputs.shapes)})"
            )
        self.cluster, self.model, self.batch, self.inputs = cluster, model, int(batch), inputs
        self.objective, self.max_iter_time_s = objective, max_iter_time_s
        self.time_limit_s = float(time_limit_s)
        self.micro_batch_sizes = tuple(micro_batch_sizes)
        self.heuristic_names, self.typed_layouts = tuple(heuristics), typed
        self.num_layers = inputs.shapes[model].num_all_layers
        self.sgpu = {g: sailor_gpu(g, model, inputs) for g in sorted(set(cluster.gpus))}
        self.price = {g: usd_per_hour(g) / 3600.0 for g in self.sgpu}
        self.project = {s: g for g, s in self.sgpu.items()}
        self._rows: dict[tuple[str, int, int], _TypeRow | None] = {}
        self._bw: dict[tuple, object] = {}
        self._sends: dict[tuple, float] = {}
        self._split: dict[tuple, tuple | None] = {}
        self._limits: dict[tuple, tuple] = {}
        self._param_sums: dict[tuple[int, int, int], float] = {}
        self._seen: set = set()
        self._usd: dict[tuple, float] = {}
        self._steps: dict[tuple, float] = {}
        self._outs: dict[tuple, float] = {}  # kept :meth:`_boundary_bytes`
        self._stacks: dict[tuple, CurveStack | None] = {}
        self._replicas: dict[tuple[str, str, int], Replica] = {}
        self._least_layers: dict[tuple, tuple[float, float]] = {}
        self.prune_s = math.inf  # the incumbent's score while layouts are enumerated
        self.simulations = self.estimates = self.floored = 0
        self.layouts: dict[str, int] = {}
        self.t0 = time.perf_counter()
        self.deadline_s = math.inf

    # ---- inputs ----------------------------------------------------------------------------
    def row(self, gpu: str, mbs: int, tp: int) -> _TypeRow | None:
        """Per-layer figures of Sailor GPU ``gpu`` at (mbs, tp); None without a profile."""
        key = (gpu, mbs, tp)
        if key not in self._rows:
            self._rows[key] = None
            if (self.model, gpu, mbs, tp) in self.inputs.profiles.rows and (
                (self.model, tp) in self.inputs.sizes.rows
            ):
                self._rows[key] = self._make_row(gpu, mbs, tp)
        return self._rows[key]

    def _make_row(self, gpu: str, mbs: int, tp: int) -> _TypeRow:
        times = self.inputs.profiles.get(self.model, gpu, mbs, tp)
        sizes = self.inputs.sizes.get(self.model, tp)
        shape = self.inputs.shapes[self.model]
        cost = (times.fwd_s + times.bwd_s).astype(float)
        if head_is_tied(self.inputs.sizes.get(self.model, 1), shape):
            hf, hb, _ = tied_head_times_s(times, sizes, shape, mbs, tp)
            cost[-1] += hf + hb
        n = PROFILED_TRANSFORMER_LAYERS
        profiled = sizes.params[0] + n * sizes.params[1] + sizes.params[-1]
        return _TypeRow(
            cost_s=cost,
            opt_s_per_param=times.profiled_opt_s / profiled,
            params=sizes.params.astype(float),
            act=sizes.act_mem.astype(float),
            act_out=sizes.act_output.astype(float),
            memory_bytes=get_gpu(self.project[gpu]).memory_bytes,
        )

    def send_s(self, za: str, zb: str, gpu: str, tp: int, nbytes: float) -> float:
        """Seconds for a message of ``nbytes`` per GPU between nodes of ``tp`` GPUs of ``gpu`` in
        zones za and zb, every GPU sending at once (Sailor's fit; the one-GPU nodes' where the
        fits have no ``tp``-GPU node)."""
        k = ((za, zb, gpu, tp), nbytes)
        got = self._sends.get(k)
        if got is None:
            c = self._curve(za, zb, gpu, tp)
            got = self._sends[k] = math.inf if c is None else float(c.time_s(nbytes))
        return got

    def _curve(self, za: str, zb: str, gpu: str, tp: int) -> BandwidthCurve | None:
        """The fit :meth:`send_s` reads for (za, zb, gpu, tp); None where the fits have none."""
        key = (za, zb, gpu, tp)
        if key not in self._bw:
            self._bw[key] = None
            for n in (tp, 1):
                try:
                    self._bw[key] = self.inputs.fits.curve(
                        NodeSpec(za, gpu, n), NodeSpec(zb, gpu, n)
                    )
                    break
                except SailorFormatError:
                    continue
        return self._bw[key]

    def _boundary_bytes(self, gpu: str, tp: int, mbs: int, end: int) -> float:
        """Bytes per GPU of a micro-batch's activations sent on from a stage whose layers end
        before layer ``end``, on nodes of ``tp`` GPUs of Sailor GPU ``gpu``."""
        return self.row(gpu, mbs, tp).act_out[end - 1] * mbs * BYTES_PER_ELEMENT / tp

    def _slowest_send_s(self, zones: list[str], gpu: str, tp: int, nbytes: float) -> float:
        """The slowest :meth:`send_s` from one of ``zones`` to one of them (a zone to itself
        included), kept per (zones, GPU, tp, size); every pair's fit timed in one array step
        (:class:`~system.links.CurveStack`, the same numbers)."""
        key = (tuple(zones), gpu, tp, nbytes)
        step = self._steps.get(key)
        if step is None:
            stack = self._stacks.get(key[:3], False)
            if stack is False:
                curves = [self._curve(a, b, gpu, tp) for a in zones for b in zones]
                stack = None if None in curves else CurveStack(curves)
                self._stacks[key[:3]] = stack
            step = math.inf if stack is None else float(stack.time_s(nbytes).max())
            self._steps[key] = step
        return step

    def _cell_usd(self, cell: tuple[str, str, int]) -> float:
        """Dollars per second of one grid cell (zone, Sailor GPU, tp): its node's GPUs."""
        usd = self._usd.get(cell)
        if usd is None:
            usd = self._usd[cell] = self.price[self.project[cell[1]]] * cell[2]
        return usd

    def layer_s(self, gpu: str) -> float:
        """Seconds of one micro-batch through the model on one GPU of project type ``gpu`` at
        its smallest profiled (mbs, tp) (the heuristics' speed order)."""
        for mbs, tp in itertools.product(sorted(self.micro_batch_sizes), (1, 2, 4, 8)):
            r = self.row(self.sgpu[gpu], mbs, tp)
            if r is not None:
                return float(r.cost_s.sum()) * tp / mbs
        return math.inf

    # ---- objective -------------------------------------------------------------------------
    def score(self, c: SailorCandidate | None) -> float:
        if c is None or not math.isfinite(c.iter_time_s):
            return math.inf
        if self.max_iter_time_s is not None and c.iter_time_s > self.max_iter_time_s:
            return math.inf
        return c.iter_time_s if self.objective == "throughput" else c.cost_usd

    def _bound_score(self, t: float, usd_per_s: float) -> float:
        if self.max_iter_time_s is not None and t > self.max_iter_time_s:
            return math.inf
        return t if self.objective == "throughput" else t * usd_per_s

    def left_out_above(self) -> float:
        """Estimates above this are left out of :meth:`configs`' entries: :meth:`best_first`
        stops at the first estimate above (1 + ESTIMATE_MARGIN)·its incumbent's score, and that
        incumbent is never above ``prune_s``, so such an entry would never be simulated."""
        return (1.0 + ESTIMATE_MARGIN) * self.prune_s

    def out_of_time(self) -> bool:
        return time.perf_counter() - self.t0 > min(self.time_limit_s, self.deadline_s)

    # ---- one layout's configurations -------------------------------------------------------
    def split(self, stage_keys: tuple, mbs: int, dp: int) -> tuple | None:
        """(layer counts per stage, compute bound s, parameters per GPU per stage, f + b per
        stage, optimizer s): the split of :func:`_bisect_split`, its busiest stage's f + b
        small within memory; None if none fits.
        ``stage_keys``: per stage the (gpu, tp) of its replicas."""
        m = math.ceil(self.batch / (mbs * dp))
        pp = len(stage_keys)
        key = (stage_keys, mbs, dp > 1, min(m, pp))
        if key not in self._split:
            self._split[key] = self._balanced(stage_keys, mbs, dp > 1, min(m, pp))
        got = self._split[key]
        if got is None:
            return None
        counts, fb, opt, params = got
        return counts, (m - 1) * max(fb) + sum(fb) + opt, params, fb, opt

    def _stage_limits(self, keys, mbs: int, replicated: bool, in_flight: int):
        """A stage of replicas ``keys``: cumulative f + b per layer (its slowest replica's) and,
        per first layer i, the last end j whose layers i..j−1 fit every replica's memory; as
        lists, then the same as arrays."""
        key = (keys, mbs, replicated, in_flight)
        if key in self._limits:
            return self._limits[key]
        rs = [self.row(g, mbs, tp) for g, tp in keys]
        L = self.num_layers
        zero = np.zeros(1)
        c = np.concatenate([zero, np.cumsum(np.max([r.cost_s for r in rs], axis=0))])
        fits = np.full((L + 1, L + 1), True)
        for r in rs:
            P = np.concatenate([zero, np.cumsum(r.params)])
            A = np.concatenate([zero, np.cumsum(r.act)])
            params = P[None, :] - P[:, None]
            acts = in_flight * mbs * (A[None, :] - A[:, None]) * BYTES_PER_ELEMENT
            bucket = BYTES_PER_ELEMENT * np.minimum(params, BUCKET_ELEMENTS) if replicated else 0
            mem = ADAM_STATE_BYTES_PER_PARAM * params + np.maximum(acts, bucket) + CONTEXT_BYTES
            fits &= mem <= r.memory_bytes
        ends = []
        for i in range(L + 1):
            j = i
            while j < L and fits[i, j + 1]:
                j += 1
            ends.append(j)
        self._limits[key] = (c.tolist(), ends, c, np.array(ends, dtype=np.int64))
        return self._limits[key]

    def _balanced(self, stage_keys, mbs: int, replicated: bool, m_cap: int):
        pp, L = len(stage_keys), self.num_layers
        if pp > L:
            return None
        rows = {}  # per distinct (GPU, tp) set: its replicas' rows (stages repeat a few sets)
        for keys in dict.fromkeys(stage_keys):
            rs = [self.row(g, mbs, tp) for g, tp in keys]
            if any(r is None for r in rs):
                return None
            rows[keys] = rs
        limits = [
            self._stage_limits(keys, mbs, replicated, min(pp - s, m_cap))
            for s, keys in enumerate(stage_keys)
        ]
        cost = [x[0] for x in limits]
        found = np.empty(pp, dtype=np.int64)
        hi = max(c[-1] for c in cost)
        # every stage's row has L + 1 entries: one concatenation, then rows
        cost_a = np.concatenate([x[2] for x in limits]).reshape(pp, -1)
        most_a = np.concatenate([x[3] for x in limits]).reshape(pp, -1)
        if not _bisect_split(cost_a, most_a, hi, found):
            return None
        best = found.tolist()
        bounds = [0, *itertools.accumulate(best)]
        fb = [cost[s][bounds[s + 1]] - cost[s][bounds[s]] for s in range(pp)]
        opt, params = 0.0, np.zeros(pp)
        sums = self._param_sums  # a row's parameters over layers i..j−1 depend on its tp alone
        for s, keys in enumerate(stage_keys):
            i, j = bounds[s], bounds[s + 1]
            for (_, tp), r in zip(keys, rows[keys], strict=True):
                p = sums.get((tp, i, j))
                if p is None:
                    p = sums[tp, i, j] = float(r.params[i:j].sum())
                opt = max(opt, r.opt_s_per_param * p)
                params[s] = max(params[s], p)
        return tuple(best), fb, opt, params

    def configs(self, name: str, runs: list[list[tuple]], sizes=None, pipelines=None) -> list:
        """(estimate, bound, (name, grid, mbs, counts)) per micro-batch size (of ``sizes``,
        default all) that fits; ``grid[s][r]`` = (zone, Sailor GPU, tp) of stage s, replica r,
        given as its :func:`_runs`. ``pipelines``: :func:`_pipelines` of the runs, where the
        caller has it."""
        self.layouts[name] = self.layouts.get(name, 0) + 1
        pp, dp = len(runs), sum(n for _, n in runs[0])
        # what the estimate reads of the grid is sets of cells (a stage's replicas repeat a few
        # distinct cells), the dollars cell by cell in grid order
        grid = None  # the grid itself, once an entry or the dollars need it
        if pipelines is None:
            pipelines = _pipelines(runs)
        cells = [{c for c, _ in st} for st in runs]
        stage_keys = tuple(tuple(sorted({(g, tp) for _, g, tp in c})) for c in cells)
        # dollars only where the objective reads them (:meth:`_bound_score`)
        usd = 0.0
        if self.objective == "cost":
            grid = _grid(runs)
            usd = sum(map(self._cell_usd, itertools.chain.from_iterable(grid)))
        # an entry is left out as soon as its estimate's data-parallel part alone is above
        # this (the estimate's other parts are not negative)
        stop = self.left_out_above()
        pairs = None  # per boundary its (zone, GPU, tp, next zone) kinds, once an entry needs them
        # per stage its zones (a sorted tuple, as :meth:`_slowest_send_s` keys the times it
        # keeps) and its (GPU, tp) kinds; the kept times of that method and of :meth:`send_s`
        # are read here first (the same numbers, without a call per stage and boundary)
        zone_sets = [
            (tuple(sorted({z for z, _, _ in c})), k) for c, k in zip(cells, stage_keys, strict=True)
        ]
        steps, sends_kept, outs = self._steps, self._sends, self._outs
        out = []
        for mbs in sizes or self.micro_batch_sizes:
            got = self.split(stage_keys, mbs, dp)
            self.estimates += 1
            if got is None:
                continue
            counts, bound, params, fb, opt = got
            if self._bound_score(bound, usd) >= self.prune_s:
                continue
            dp_worst = 0.0
            if dp > 1:
                for (zones, kinds), p in zip(zone_sets, params.tolist(), strict=True):
                    chunk = p * BYTES_PER_ELEMENT / dp
                    for g, tp in kinds:
                        step = steps.get((zones, g, tp, chunk))
                        if step is None:
                            step = self._slowest_send_s(zones, g, tp, chunk)
                        dp_worst = max(dp_worst, 2 * (dp - 1) * step)
            if self._bound_score(bound + dp_worst, usd) > stop:
                continue
            if pairs is None:
                pairs = [{(*p[s][:3], p[s + 1][0]) for p in pipelines} for s in range(pp - 1)]
            m = math.ceil(self.batch / (mbs * dp))
            ends = list(itertools.accumulate(counts))
            sends = []
            for s in range(pp - 1):
                worst = 0.0
                for za, g, tp, zb in pairs[s]:
                    part = outs.get((g, tp, mbs, ends[s]))
                    if part is None:
                        part = outs[g, tp, mbs, ends[s]] = self._boundary_bytes(g, tp, mbs, ends[s])
                    got = sends_kept.get(((za, zb, g, tp), part))
                    if got is None:
                        got = self.send_s(za, zb, g, tp, part)
                    worst = max(worst, got)
                sends.append(worst)
            eff = [
                fb[s] + (sends[s] if s < pp - 1 else 0.0) + (sends[s - 1] if s else 0.0)
                for s in range(pp)
            ]
            comm = (m - 1) * max(eff) + sum(eff) + sum(sends) + opt - bound
            comm += dp_worst
            b = self._bound_score(bound, usd)
            e = self._bound_score(bound + comm, usd)
            if b < self.prune_s and not e > stop:
                if grid is None:
                    grid = _grid(runs)
                out.append((e, b, (name, grid, mbs, counts)))
        return out

    def evaluate(self, entry: tuple, beat: float = math.inf) -> SailorCandidate | None:
        """The model's prediction of a configuration; None where it does not fit memory, or
        where its floor (:func:`~system.external.sailor.framework.iteration_floor_s`) shows it
        cannot score below ``beat`` (then it is not simulated)."""
        plan = self.plan_of(entry)
        if not replicas_fit(plan, self.inputs):
            return None
        usd = sum(self.price[self.project[r.gpu]] * r.tp for st in plan.stages for r in st.replicas)
        if math.isfinite(beat):
            need = beat * (1.0 + FLOOR_SLACK)
            if self.objective == "throughput":
                above = need
            else:
                above = need / usd if usd > 0 else math.inf
            floor = iteration_floor_s(plan, self.inputs, above=above)
            if self._bound_score(floor, usd) >= need:
                self.floored += 1
                return None
        self.simulations += 1
        pred = predict_plan(plan, self.inputs)
        return SailorCandidate(entry[0], plan, pred, usd, entry)

    def plan_of(self, entry: tuple) -> SailorPlan:
        """A configuration ((name, grid, mbs, layer counts)) as a plan of Sailor's framework."""
        name, grid, mbs, counts = entry
        bounds = np.concatenate([[0], np.cumsum(counts)]).astype(int)
        kept = self._replicas  # one (immutable) replica per grid cell
        for cell in set(itertools.chain.from_iterable(grid)) - kept.keys():
            z, g, tp = cell
            kept[cell] = Replica(g, tp, z, tp)
        stages = tuple(
            Stage(tuple(range(bounds[s], bounds[s + 1])), tuple(map(kept.__getitem__, st)))
            for s, st in enumerate(grid)
        )
        plan = SailorPlan(
            file=f"planner:{name}",
            model=self.model,
            stages=stages,
            mbs=mbs,
            gbs=self.batch,
            nodes_declared=len(grid) * len(grid[0]),
            real_s=None,
            max_mem_bytes=None,
        )
        return plan

    def best_first(self, entries: list[tuple], incumbent: SailorCandidate | None):
        heap = [(e, b, k, item) for k, (e, b, item) in enumerate(entries)]
        heapq.heapify(heap)
        while heap and not self.out_of_time():
            e, b, _, item = heapq.heappop(heap)
            if e > (1.0 + ESTIMATE_MARGIN) * self.score(incumbent):
                break  # the rest are estimated well above the incumbent
            if b >= self.score(incumbent):
                continue
            c = self.evaluate(item, self.score(incumbent))
            if self.score(c) < self.score(incumbent):
                incumbent = c
        return incumbent

    # ---- layouts ---------------------------------------------------------------------------
    def shapes(self, n: int) -> list[tuple[int, int]]:
        """(pp, dp) as :meth:`system.planner.search.Planner.shapes` lists them."""
        out, L = [], self.num_layers - 2
        for dp in range(1, min(n, self.batch) + 1):
            if self.batch % dp:
                continue
            top = min(L, n // dp)
            if top < 1:
                continue
            if n <= SMALL_FLEET:
                pps = set(range(1, top + 1))
            else:
                pps = {top} | {p for p in range(1, top) if L % p == 0 and p * dp * 2 > n}
            out += [(p, dp) for p in sorted(pps)]
        return out

    def heuristic_grid(self, name: str, pp: int, dp: int):
        """A heuristic's (pp, dp) device grid, as :meth:`Planner.heuristic` places it."""
        cl = self.cluster
        n, total = pp * dp, cl.num_devices
        if n > total:
            return None
        regions_list = list(cl.regions)
        rindex = {r: k for k, r in enumerate(regions_list)}
        rate1 = {g: 1.0 / self.layer_s(g) for g in self.sgpu}
        if name == "launch_order":
            return np.arange(n).reshape(pp, dp)
        if name == "fastest_first":
            devs = sorted(range(total), key=lambda d: (-rate1[cl.gpus[d]], d))[:n]
            return np.asarray(devs).reshape(pp, dp)
        regions = [[] for _ in regions_list]
        for d in sorted(range(total), key=lambda d: (rindex[cl.region_of[d]], cl.host_of[d], d)):
            regions[rindex[cl.region_of[d]]].append(d)
        if name == "one_pipeline_per_region":
            if n == total and any(len(r) % pp for r in regions):
                return None
            chains = [r[i : i + pp] for r in regions for i in range(0, len(r) - pp + 1, pp)]
            if len(chains) < dp:
                return None
            return np.asarray(chains[:dp]).T
        if name == "greedy_region_fill":
            return np.asarray(greedy_region_chains(regions, pp, dp)).T
        raise ValueError(f"unknown heuristic {name!r}")

    def node_pools(self) -> dict:
        """Per (zone, GPU type) the sizes of its hosts."""
        hosts: dict[tuple[str, str], dict[int, int]] = {}
        for d in range(self.cluster.num_devices):
            key = (self.cluster.region_of[d], self.cluster.gpus[d])
            h = self.cluster.host_of[d]
            hosts.setdefault(key, {})
            hosts[key][h] = hosts[key].get(h, 0) + 1
        return {k: sorted(v.values()) for k, v in hosts.items()}

    def typed_entries(self) -> list[tuple]:
        """Every typed layout's configurations (module docstring), each layout once."""
        self._seen = set()
        pools = self.node_pools()
        zones = sorted({z for z, _ in pools})
        types = sorted({g for _, g in pools})
        tps = {}
        for g in types:
            smallest = min(min(v) for (z, gg), v in pools.items() if gg == g)
            tps[g] = [
                t
                for t in (1, 2, 4, 8)
                if smallest % t == 0
                and any(self.row(self.sgpu[g], b, t) for b in self.micro_batch_sizes)
            ]
        speed = {g: self.layer_s(g) for g in types}
        entries = []
        for tp_combo in itertools.product(*(tps[g] for g in types)):
            tp_of = dict(zip(types, tp_combo, strict=True))
            nodes = {  # zone -> type -> nodes of tp_of[type] GPUs
                z: {g: sum(h // tp_of[g] for h in pools.get((z, g), [])) for g in types}
                for z in zones
            }
            total = {g: sum(nodes[z][g] for z in zones) for g in types}
            for k in range(1, len(types) + 1):
                for used in itertools.combinations(types, k):
                    if any(tp_of[g] != min(tps[g]) for g in types if g not in used):
                        continue  # an idle type's tp does not matter
                    entries += self._typed_for(used, tp_of, nodes, total, zones, speed)
        return entries

    def _typed_for(self, used, tp_of, nodes, total, zones, speed) -> list[tuple]:
        L = self.num_layers
        dps = set()
        for dp in range(1, min(total[g] for g in used) + 1):
            if self.batch % dp == 0:
                dps.add(dp)
        out = []
        max_dp = min(total[g] for g in used)
        # per stage-count vector also its largest dp
        vectors = []
        ranges = []
        for g in used:
            top = min(total[g], L)
            ranges.append(sorted({c for c in STAGE_COUNTS if c <= top} | {top}))
        for vec in itertools.product(*ranges):
            if sum(vec) > L:
                continue
            most = min(total[g] // c for g, c in zip(used, vec, strict=True))
            if most < 1:
                continue
            vectors.append((vec, most))
        # fastest first, then slowest first: a list, not a set, so that the configurations'
        # order (which breaks the estimate's ties) does not follow the strings' hash seed
        orders = [tuple(sorted(used, key=lambda g: speed[g]))]
        slowest_first = tuple(sorted(used, key=lambda g: -speed[g]))
        if slowest_first != orders[0]:
            orders.append(slowest_first)
        anchors = self._anchor_orders(zones, used, tp_of)
        for vec, most in vectors:
            if self.out_of_time():
                break
            for dp, sizes in self._dp_choices(most, dps).items():
                if dp > max_dp:
                    continue
                for order in orders:
                    count = dict(zip(used, vec, strict=True))
                    kinds = [g for g in order for _ in range(count[g])]
                    if not self._may_beat(kinds, tp_of, dp, sizes):
                        continue
                    fills = FILLS if len(zones) > 1 else FILLS[:1]  # one zone: one grid
                    for zone_order, fill in itertools.product(anchors, fills):
                        runs = self._fill(kinds, dp, tp_of, nodes, zone_order, fill)
                        if runs is None:
                            continue
                        pipelines = _pipelines(runs)
                        key = tuple(sorted(pipelines.items()))
                        if key not in self._seen:  # the same pipelines another way
                            self._seen.add(key)
                            out += self.configs("typed", runs, sizes, pipelines)
        return out

    def _dp_choices(self, most: int, dps: set[int]) -> dict[int, tuple[int, ...]]:
        """dp (at most ``most``) -> the micro-batch sizes tried with it: every dp dividing the
        batch, and ``most``, at every size; and per size b and micro-batch count m the least dp
        giving m micro-batches, ⌈batch / (b·m)⌉ (a larger dp with the same m adds replicas
        and sequences without shortening the pipeline)."""
        out = {d: set(self.micro_batch_sizes) for d in dps if d <= most}
        out.setdefault(most, set()).update(self.micro_batch_sizes)
        for b in self.micro_batch_sizes:
            m = math.ceil(self.batch / (b * most))
            while True:
                d = math.ceil(self.batch / (b * m))
                out.setdefault(d, set()).add(b)
                if d <= 1:
                    break
                m = math.ceil(self.batch / (b * (d - 1)))  # the next m with a smaller dp
        return {d: tuple(sorted(v)) for d, v in sorted(out.items())}

    def _may_beat(self, kinds, tp_of, dp: int, sizes: tuple[int, ...]) -> bool:
        """Whether some micro-batch size's compute bound of these stages is below the
        incumbent's score (``prune_s``): no placement of them can beat it otherwise. A size
        whose :meth:`_least_compute_s` already reaches it is not split."""
        keys = tuple(((self.sgpu[g], tp_of[g]),) for g in kinds)
        usd = 0.0  # dollars only where the objective reads them (:meth:`_bound_score`)
        if self.objective == "cost":
            usd = sum(self.price[g] * tp_of[g] for g in kinds) * dp
        for mbs in sizes:
            least = self._least_compute_s(keys, mbs, dp)
            if self._bound_score(least * (1.0 - SPLIT_ROUNDING), usd) >= self.prune_s:
                continue
            got = self.split(keys, mbs, dp)
            if got is not None and self._bound_score(got[1], usd) < self.prune_s:
                return True
        return False

    def _least_compute_s(self, keys, mbs: int, dp: int) -> float:
        """A lower bound on :meth:`split`'s compute bound ``(m − 1)·max(f + b) + Σ(f + b) +
        opt`` for these stages without splitting them: each layer runs on some stage, at least
        at the fastest of their kinds' times for it (W, the sum of those), so Σ(f + b) ≥ W and
        the busiest stage holds at least W / pp and at least the dearest such layer; opt ≥ 0.
        0 where a kind has no profile (the split then finds nothing)."""
        got = self._least_layers.get((keys, mbs))
        if got is None:
            rows = [self.row(g, mbs, tp) for g, tp in {k for (k,) in keys}]
            if any(r is None for r in rows):
                got = (0.0, 0.0)
            else:
                fastest = np.min([r.cost_s for r in rows], axis=0)
                got = (float(fastest.sum()), float(fastest.max()))
            self._least_layers[keys, mbs] = got
        total, dearest = got
        m = math.ceil(self.batch / (mbs * dp))
        return (m - 1) * max(total / len(keys), dearest) + total

    def _anchor_orders(self, zones, used, tp_of) -> list[tuple[str, ...]]:
        """Per anchor zone, the zones by the time of 100 MB from it (the anchor first); each
        order once."""
        g = self.sgpu[used[0]]
        t = tp_of[used[0]]
        out = []
        for a in zones:
            rest = sorted(
                (z for z in zones if z != a), key=lambda z: (self.send_s(a, z, g, t, 1e8), z)
            )
            order = (a, *rest)
            if order not in out:
                out.append(order)
        return out

    def _fill(self, kinds, dp, tp_of, nodes, zone_order, fill="pipeline"):
        """``dp`` pipelines of stage types ``kinds``, as the grid's :func:`_runs`.
        ``fill="pipeline"``: each in the first zone (in order) that has its nodes left, else its
        stages from the zones in order; ``"stage"``: stage after stage, each replica from the
        first zone with a node left."""
        free = {z: dict(nodes[z]) for z in zone_order}
        need = {}
        for g in kinds:
            need[g] = need.get(g, 0) + 1
        if any(sum(free[z][g] for z in zone_order) < n * dp for g, n in need.items()):
            return None
        sgpu = self.sgpu
        if len(zone_order) == 1:  # one zone: every fill is the same grid
            return [[((zone_order[0], sgpu[g], tp_of[g]), dp)] for g in kinds]
        if fill == "stage":  # each replica from the first zone in order with a node left
            runs = []
            for g in kinds:
                row, left = [], dp
                for z in zone_order:
                    take = min(free[z][g], left)
                    if take > 0:
                        row.append(((z, sgpu[g], tp_of[g]), take))
                        free[z][g] -= take
                        left -= take
                runs.append(row)
            return runs
        # pipeline-major: each pipeline in the first zone (in order) with room for all of it;
        # a zone that has no room for one never gets it back, so the zones take their whole
        # pipelines in order, and the pipelines left over take each stage's node from the
        # first zone with one left
        homes, homed = [], 0  # (zone, its pipelines)
        for z in zone_order:
            take = min(min(free[z][g] // n for g, n in need.items()), dp - homed)
            if take > 0:
                homes.append((z, take))
                homed += take
                for g, n in need.items():
                    free[z][g] -= n * take
        runs = [[((z, sgpu[g], tp_of[g]), take) for z, take in homes] for g in kinds]
        for _ in range(dp - homed):
            for row, g in zip(runs, kinds, strict=True):
                z = next(z for z in zone_order if free[z][g] > 0)
                free[z][g] -= 1
                cell = (z, sgpu[g], tp_of[g])
                if row and row[-1][0] == cell:
                    row[-1] = (cell, row[-1][1] + 1)
                else:
                    row.append((cell, 1))
        return runs

    # ---- zone swaps ------------------------------------------------------------------------
    def _room(self, grid, pools: dict) -> bool:
        """Whether every zone has the nodes ``grid`` takes there (one tp per zone and type);
        ``pools``: :meth:`node_pools`."""
        need: dict[tuple[str, str], dict[int, int]] = {}
        for st in grid:
            for z, g, tp in st:
                by_tp = need.setdefault((z, g), {})
                by_tp[tp] = by_tp.get(tp, 0) + 1
        for (z, g), by_tp in need.items():
            if len(by_tp) != 1:
                return False  # nodes of two sizes on one zone's hosts: not checked, not tried
            ((tp, n),) = by_tp.items()
            if n > sum(h // tp for h in pools.get((z, self.project[g]), [])):
                return False
        return True

    def swap_zones(self, best: SailorCandidate | None) -> SailorCandidate | None:
        """The zone swaps (module docstring): every transposition of two of the fleet's zones
        applied to ``best``'s grid, each simulated; the best one taken while it improves."""
        zones = sorted(set(self.cluster.region_of))
        if best is None or best.entry is None or len(zones) < 2:
            return best
        pools = self.node_pools()
        tried = set()
        for _ in range(len(zones) ** 2):  # rounds, each one an improvement, at most this many
            name, grid, mbs, counts = best.entry
            found = best
            for a, b in itertools.combinations(zones, 2):
                if self.out_of_time():
                    return found
                swap = {a: b, b: a}
                moved = [[(swap.get(z, z), g, tp) for z, g, tp in st] for st in grid]
                key = tuple(tuple(st) for st in moved)
                if moved == grid or key in tried or not self._room(moved, pools):
                    continue
                tried.add(key)
                label = name if name.endswith(" + zone swaps") else f"{name} + zone swaps"
                c = self.evaluate((label, moved, mbs, counts), self.score(found))
                if self.score(c) < self.score(found):
                    found = c
            if found is best:
                return best
            best = found
        return best

    # ---- the search ------------------------------------------------------------------------
    def run(self) -> SailorPlanResult:
        self.t0 = time.perf_counter()
        heuristics: dict[str, SailorCandidate | None] = {}
        share = HEURISTIC_SHARE * self.time_limit_s / max(len(self.heuristic_names), 1)
        shapes = self.shapes(self.cluster.num_devices)
        for k, name in enumerate(self.heuristic_names):
            self.deadline_s = share * (k + 1)
            entries = []
            for pp, dp in shapes:
                if self.out_of_time():
                    break
                got = self.heuristic_grid(name, pp, dp)
                if got is None:
                    continue
                grid = [
                    [(self.cluster.region_of[d], self.sgpu[self.cluster.gpus[d]], 1) for d in row]
                    for row in np.asarray(got).tolist()
                ]
                entries += self.configs(name, _runs(grid))
            heuristics[name] = self.best_first(entries, None)
        best = min(heuristics.values(), key=self.score, default=None)
        self.deadline_s = (1.0 - POLISH_SHARE) * self.time_limit_s
        if self.typed_layouts and not self.out_of_time():
            self.prune_s = self.score(best)
            best = self.best_first(self.typed_entries(), best)
        self.deadline_s = math.inf
        best = self.swap_zones(best)
        return SailorPlanResult(
            best=best,
            heuristics=heuristics,
            search_time_s=time.perf_counter() - self.t0,
            simulations=self.simulations,
            estimates=self.estimates,
            floored=self.floored,
            layouts=dict(self.layouts),
        )


def plan_sailor(cluster: Cluster, model: str, batch: int, inputs: SailorInputs, **kw):
    """Plan Sailor's ``model`` at global batch ``batch`` on ``cluster`` for Sailor's framework."""
    return SailorTargetPlanner(cluster, model, batch, inputs, **kw).run()


def warm_up(cluster: Cluster, model: str, inputs: SailorInputs) -> bool:
    """Load once per process what the model of Sailor's framework loads at its first prediction
    — the simulator's modules imported on first use and its compiled kernels (read from
    numba's disk cache) — by predicting, and bounding, a plan of two stages of two one-GPU
    replicas on ``cluster``'s first devices, and the layer split's kernel by splitting it. A
    search timed after it times the search alone, as Sailor's planner is timed after its
    tables are built. False where the fleet or the profiles give no such plan (nothing
    loaded)."""
    planner = SailorTargetPlanner(cluster, model, 2, inputs, heuristics=())
    grid = planner.heuristic_grid("launch_order", 2, 2)
    if grid is None:
        return False
    cells = [[(cluster.region_of[d], planner.sgpu[cluster.gpus[d]], 1) for d in st] for st in grid]
    for mbs in planner.micro_batch_sizes:
        if all(planner.row(g, mbs, 1) is not None for _, g, _ in itertools.chain(*cells)):
            half = planner.num_layers // 2
            plan = planner.plan_of(("warm-up", cells, mbs, (half, planner.num_layers - half)))
            iteration_floor_s(plan, inputs)
            predict_plan(plan, inputs)
            planner.split(tuple(tuple(sorted({(g, 1) for _, g, _ in st})) for st in cells), mbs, 2)
            return True
    return False
