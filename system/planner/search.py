"""The planner: devices, shape, layer split, micro-batch, recomputation, schedule and placement
of ours on a heterogeneous fleet, with the simulator's iteration time as the objective.

A plan uses ``pp × dp`` of the fleet's devices (the others stay idle): ``stages[s][r]`` runs
stage ``s`` of replica ``r``; stage ``s`` holds ``layers[s]`` layers (an uneven split by stage
speed and memory). Each stage runs at its slowest device (the pipeline waits for it and its
data-parallel group for its gradients); its memory is checked against its smallest GPU.
Every candidate is judged by :func:`system.simulator.simulate_ours` (fp16 loss scaling, the
cluster's link-sharing model) on the fleet restricted to the devices it uses, with the stages'
compute times from :mod:`system.planner.compute`.

Objectives: ``throughput`` (the shortest iteration) or ``cost`` (the fewest dollars per
iteration, :mod:`system.planner.prices`, at most ``max_iter_time_s`` per iteration when given).

The search (:meth:`Planner.run`) is best-first: layouts (a pool of devices, a shape, a
placement) in the order of their compute lower bound (:meth:`Planner.layout_bound`), each
layout's configurations (micro-batch, recomputation, schedule, layer split) in the order of a
bound no schedule beats (:meth:`Planner.configs`), until the bound passes the incumbent (as
:mod:`system.config_search` does for one layout). The layouts: first the heuristics'
(:data:`HEURISTICS`, generalised to shapes using fewer than all devices), each one's best
reported and the best of them the first incumbent, so the plan is never worse than any
heuristic under the same simulator (tested); then the planner's own (``typed``, ``regional``,
``anchored``, ``stagewise``) over pools of devices (:meth:`Planner.pools`) in the shapes of
:meth:`Planner.pool_shapes`; then a local search
on the incumbent's placement (:meth:`Planner._improve`).

**Budget.** A search whose phases end by the clock gives a plan that depends on the machine's
speed and load. With a work budget (``budget_device_sims``) every phase ends at its share of
the work instead, charged per simulation in device-simulations (:meth:`Planner.work`): the
same fleet, model and budget give the same plan on any machine, and the time limit is only a
safety stop (``time_cut`` says it struck, and the plan is then the machine's).

Our runtime (:mod:`system.runtime.spec`) runs GPipe with full or no recomputation and an even
layer split; a plan outside that is labelled (``runtime_supported``) and the best plan the
runtime can run is reported beside it (``runnable_only`` plans only those).
"""

from __future__ import annotations

import heapq
import itertools
import math
import time
from dataclasses import dataclass, field

import numpy as np

from system.assignment import Assignment
from system.cluster import Cluster
from system.gpus import get_gpu
from system.planner.bounds import layout_exchange_terms
from system.planner.compute import ComputeModel
from system.planner.prices import usd_per_hour
from system.scheduler.heuristics import greedy_region_chains
from system.simulator import Hardware, StageCompute, simulate_ours
from system.simulator.hardware import (
    ADAM_BYTES_PER_PARAM,
    layer_forward_flops,
    logits_forward_flops,
)
from system.simulator.memory import training_memory
from system.simulator.sharing import subset
from system.workload import GPTConfig, Workload, stage_gradient_params

__all__ = [
    "OBJECTIVES",
    "check_objective",
    "HEURISTICS",
    "Candidate",
    "PlanResult",
    "Planner",
    "plan",
    "RESERVED_BYTES",
]

OBJECTIVES = ("throughput", "cost")


def check_objective(objective: str, max_iter_time_s: float | None) -> None:
    """ValueError naming the argument unless ``objective`` is one of :data:`OBJECTIVES` and
    ``max_iter_time_s`` is None or a positive number of seconds."""
    if objective not in OBJECTIVES:
        raise ValueError(f"objective={objective!r}: expected one of {', '.join(OBJECTIVES)}")
    if max_iter_time_s is not None and not max_iter_time_s > 0:
        raise ValueError(f"max_iter_time_s={max_iter_time_s}: must be > 0")


HEURISTICS = ("launch_order", "one_pipeline_per_region", "greedy_region_fill", "fastest_first")
MICRO_BATCH_SIZES = (1, 2, 4, 8)
RECOMPUTE = ("none", "selective", "full")  # least recomputation first
SCHEDULES = ("gpipe", "1f1b")
RUNTIME_SUPPORTED = {("gpipe", "full"), ("gpipe", "none")}
SMALL_FLEET = 64  # devices: up to here every stage count is a shape
# seconds of simulation per data-parallel message before any is timed: 1,024 GPUs at pp 4,
# dp 256 took 5.4 s on this project's shared two-core machine (~2e-5 s per message)
SECONDS_PER_MESSAGE = 2e-5
# The work budget's prices (:meth:`Planner.work`), set from rough costs on this project's
# two-core machine and fixed since: a budgeted plan depends on them, not on the machine. A
# simulation costs about 5 µs per device; copying a subset's link matrices about 0.06 µs per
# device pair (so n² / 64 device-simulations); the sharded exchange's max-min sharing about a
# device's worth per 8 data-parallel messages (pp 16 × dp 256: about 0.6 s of exchange).
SUBSET_PAIRS_PER_DEVICE = 64
MESSAGES_PER_DEVICE = 8
# the default budget: at 1,024–4,096 GPUs a search of a few tens of seconds on that machine;
# smaller fleets' searches end before it
DEFAULT_BUDGET_DEVICE_SIMS = 8_000_000
RESERVED_BYTES = Hardware().reserved_bytes  # CUDA context and fragmentation, per GPU
GRADIENT_BYTES = Workload.__dataclass_fields__["gradient_bytes"].default  # on the wire
REPLAY = {"none": 0.0, "full": 1.0}  # forward replays per layer in the backward pass
# memory is the planner's check (per stage, against its smallest GPU), not the simulator's
_NO_MEMORY_CHECK = Hardware(name="planner", memory_bytes=1e30, reserved_bytes=0.0)


@dataclass
class Candidate:
    """One simulated plan."""

    layout: str  # which constructor placed it
    stages: np.ndarray  # (pp, dp) device ids of the fleet
    layers: tuple[int, ...]
    micro_batch_size: int
    recompute: str
    schedule: str
    rounds: int
    iter_time_s: float
    cost_usd: float
    stage_memory_bytes: tuple[float, ...]
    breakdown: dict = field(default_factory=dict)

    @property
    def pp(self) -> int:
        return int(self.stages.shape[0])

    @property
    def dp(self) -> int:
        return int(self.stages.shape[1])

    @property
    def runtime_supported(self) -> bool:
        even = len(set(self.layers)) == 1
        return even and (self.schedule, self.recompute) in RUNTIME_SUPPORTED

    def config(self) -> dict:
        return {
            "tp": 1,
            "pp": self.pp,
            "dp": self.dp,
            "micro_batch_size": self.micro_batch_size,
            "recompute": self.recompute,
            "schedule": self.schedule,
            "rounds": self.rounds,
            "layout": self.layout,
            "runtime_supported": self.runtime_supported,
        }


@dataclass
class PlanResult:
    best: Candidate
    best_runtime: Candidate | None  # the best plan our runtime can run
    heuristics: dict[str, Candidate | None]
    lower_bound_s: float
    search_time_s: float
    simulations: int
    layouts: int
    heuristics_cut: tuple[str, ...] = ()  # heuristics whose search stopped at its share
    skipped: int = 0  # configurations that did not fit the phase's budget or time, not simulated
    budget_device_sims: float | None = None  # the work budget (None: phases by the clock)
    spent_device_sims: float = 0.0  # the work charged
    time_cut: bool = False  # the time limit stopped the search: the plan depends on the machine


class Planner:
    """One planning problem (module docstring); :meth:`run` plans it."""

    def __init__(
        self,
        cluster: Cluster,
        model: GPTConfig,
        batch: int,
        compute: ComputeModel,
        *,
        objective: str = "throughput",
        max_iter_time_s: float | None = None,
        time_limit_s: float = 50.0,
        seed: int = 0,
        micro_batch_sizes: tuple[int, ...] = MICRO_BATCH_SIZES,
        recompute: tuple[str, ...] = RECOMPUTE,
        schedules: tuple[str, ...] = SCHEDULES,
        runnable_only: bool = False,
        local_search: bool = True,
        layouts: tuple[str, ...] = ("typed", "regional", "anchored", "stagewise"),
        max_anchors: int = 4,
        budget_device_sims: float | None = DEFAULT_BUDGET_DEVICE_SIMS,
    ) -> None:
        check_objective(objective, max_iter_time_s)
        if budget_device_sims is not None and not budget_device_sims >= 1:
            raise ValueError(f"budget_device_sims={budget_device_sims}: must be >= 1")
        self.cluster, self.model, self.batch, self.compute = cluster, model, int(batch), compute
        self.objective, self.max_iter_time_s = objective, max_iter_time_s
        self.time_limit_s, self.rng = float(time_limit_s), np.random.default_rng(seed)
        self.micro_batch_sizes = tuple(micro_batch_sizes)
        self.schedules = ("gpipe",) if runnable_only else tuple(schedules)
        rc = tuple(r for r in RECOMPUTE if r in recompute)
        self.recompute = tuple(r for r in rc if r in REPLAY) if runnable_only else rc
        self.runnable_only, self.local_search, self.layouts = runnable_only, local_search, layouts
        self.max_anchors = max_anchors
        gpus = cluster.gpus
        kinds = sorted(set(gpus))
        kind_of = np.array([kinds.index(g) for g in gpus])
        self._rates: dict[int, np.ndarray] = {}  # micro-batch size -> rate per device
        for b in sorted({1, *micro_batch_sizes}):
            self._rates[b] = np.array([compute.rate(g, b) for g in kinds])[kind_of]
        self.rate1 = self._rates[1]  # sorting key
        self.usable = np.array([get_gpu(g).memory_bytes - RESERVED_BYTES for g in gpus])
        self.usd_per_s = np.array([usd_per_hour(g) / 3600.0 for g in gpus])
        self.hbm = np.array([get_gpu(g).hbm_bandwidth_bps for g in gpus])
        self.region_index = {r: k for k, r in enumerate(cluster.regions)}
        self._subsets: dict[bytes, Cluster] = {}  # by :meth:`_used`'s bytes
        self._mem: dict[tuple, float] = {}
        self.even_only = runnable_only  # our runtime splits the layers evenly
        self.deadline_s = math.inf  # the current phase's end, seconds after t0
        self.cut = False  # a phase stopped at its deadline
        self._orders: dict[tuple, list[int]] = {}
        self.simulations = 0
        self.skipped = 0  # configurations left out as too slow to simulate in time
        self.seconds_per_message = SECONDS_PER_MESSAGE
        # the work budget (module docstring, "Budget"): None leaves the phases to the clock
        self.budget = None if budget_device_sims is None else float(budget_device_sims)
        self.spent = 0.0  # work charged so far, device-simulations
        self.phase_end = math.inf  # the current phase's end, device-simulations
        self.time_cut = False  # the wall-clock limit stopped the search
        self.layouts_tried = 0
        self.t0 = time.perf_counter()

    # ---- objective -------------------------------------------------------------------------
    def score(self, c: Candidate | None) -> float:
        """The objective's value (lower is better; inf when infeasible)."""
        if c is None or not math.isfinite(c.iter_time_s):
            return math.inf
        if self.max_iter_time_s is not None and c.iter_time_s > self.max_iter_time_s:
            return math.inf
        if self.objective == "throughput":
            return c.iter_time_s
        return c.cost_usd if math.isfinite(c.cost_usd) else math.inf

    def _bound_score(self, time_bound_s: float, usd_per_s: float) -> float:
        if self.max_iter_time_s is not None and time_bound_s > self.max_iter_time_s:
            return math.inf
        if self.objective == "throughput":
            return time_bound_s
        return time_bound_s * usd_per_s if math.isfinite(usd_per_s) else math.inf

    def out_of_time(self) -> bool:
        """Whether the current phase is over: its share of the work budget spent, or (with no
        budget) its share of the time limit passed; and whatever the budget, the time limit
        passed (``time_cut``: the plan then depends on the machine's speed)."""
        if self.budget is not None and self.spent >= self.phase_end:
            self.cut = True
            return True
        now = time.perf_counter() - self.t0
        if now > self.time_limit_s:
            self.cut = self.time_cut = True
            return True
        if self.budget is None and now > self.deadline_s:
            self.cut = True
            return True
        return False

    def _phase(self, share: float) -> None:
        """Start a phase that ends at ``share`` of the budget (or of the time limit)."""
        self.deadline_s = share * self.time_limit_s
        self.phase_end = math.inf if self.budget is None else share * self.budget
        self.cut = False

    # ---- memory ----------------------------------------------------------------------------
    def stage_memory(self, s: int, pp: int, layers: int, mbs: int, in_flight: int, rc: str):
        key = (s == 0, s == pp - 1, layers, mbs, in_flight, rc)
        if key not in self._mem:
            self._mem[key] = training_memory(
                self.model,
                layers=layers,
                micro_batch_size=mbs,
                in_flight=in_flight,
                embedding=s in (0, pp - 1),
                logits=s == pp - 1,
                recompute=rc,
            ).total_bytes
        return self._mem[key]

    def layer_caps(self, usable: np.ndarray, in_flight: list[int], mbs: int, rc: str) -> list[int]:
        """Most layers each stage can hold with ``in_flight[s]`` micro-batches (memory is linear
        in the layer count)."""
        pp = len(usable)
        caps = []
        for s in range(pp):
            one = self.stage_memory(s, pp, 1, mbs, in_flight[s], rc)
            two = self.stage_memory(s, pp, 2, mbs, in_flight[s], rc)
            per = two - one
            caps.append(
                int(max(0, math.floor((usable[s] - one) / per + 1e-9)) + 1)
                if one <= usable[s]
                else 0
            )
        return caps

    def fits(self, layers, usable, in_flight: list[int], mbs: int, rc: str) -> np.ndarray | None:
        pp = len(layers)
        mem = np.array(
            [self.stage_memory(s, pp, layers[s], mbs, in_flight[s], rc) for s in range(pp)]
        )
        return mem if np.all(mem <= usable) else None

    # ---- layer split -------------------------------------------------------------------------
    def split(self, per_layer_s: np.ndarray, extra_s: np.ndarray, caps: list[int]) -> tuple | None:
        """Layers per stage minimising max_s layers_s·per_layer_s + extra_s, 1 <= layers_s <=
        caps_s: each layer to the stage whose time after taking it is least (optimal for a
        min-max of increasing terms); None when memory cannot hold the model."""
        pp, total = len(per_layer_s), self.model.num_layers
        if total < pp or min(caps) < 1 or sum(caps) < total:
            return None
        layers = [1] * pp
        for _ in range(total - pp):
            best, arg = math.inf, -1
            for s in range(pp):
                if layers[s] < caps[s]:
                    t = (layers[s] + 1) * per_layer_s[s] + extra_s[s]
                    if t < best:
                        best, arg = t, s
            layers[arg] += 1
        return tuple(layers)

    # ---- one layout, every configuration -------------------------------------------------------
    def _sub(self, stages: np.ndarray) -> tuple[Cluster, Assignment]:
        used = self._used(stages)
        if used.size == self.cluster.num_devices and np.array_equal(used, np.arange(used.size)):
            return self.cluster, Assignment(stages.copy())
        key = used.tobytes()
        if key not in self._subsets:
            if len(self._subsets) > 64:
                self._subsets.clear()
            self._subsets[key] = subset(self.cluster, used.tolist(), name=self.cluster.name)
        where = np.full(self.cluster.num_devices, -1, dtype=np.int64)
        where[used] = np.arange(used.size)
        return self._subsets[key], Assignment(where[stages])

    def layout_bound(self, stages: np.ndarray) -> float:
        """Compute lower bound of any configuration of this layout: each replica's forward and
        backward FLOPs (no recomputation) spread over its devices at their best rates."""
        pp, dp = stages.shape
        per_seq = 3.0 * (
            self.model.num_layers * layer_forward_flops(self.model, 1)
            + logits_forward_flops(self.model, 1)
        )
        best_rate = self.best_rate[stages].sum(axis=0).min()  # the slowest replica
        return (self.batch / dp) * per_seq / best_rate

    def configs(self, name: str, stages: np.ndarray) -> list[tuple]:
        """Every configuration of one layout, each with its lower bound: entries
        ``(score bound, time bound, name, stages, mbs, schedule, recompute, layers, rounds)``.

        The time bound is the larger of the busiest stage's compute (m·(f + b) + optimizer
        step) and, per stage k, the fill and drain every pass pays: the first micro-batch
        reaches k through the stages and links before it, k computes all m micro-batches, and
        the last backward returns through them to stage 0 (each link at its fastest replica's
        α + 8·X/β), then stage 0's optimizer step; the busiest pipeline link, which streams
        its replica's m messages one way at 8·X/β each; and, per stage, its compute, then its
        data-parallel exchange (:func:`system.planner.bounds.layout_exchange_terms`: the
        slowest flow of a sender's link class or of its cap) and its optimizer step. Neither
        overlap nor sharing beats that."""
        self.layouts_tried += 1
        pp, dp = stages.shape
        if self.batch % dp:
            return []
        per_replica = self.batch // dp
        usable = self.usable[stages].min(axis=1)
        price = float(self.usd_per_s[stages].sum())
        if pp > 1:
            src, dst = stages[:-1], stages[1:]
            delay = self.cluster.delay_s[src, dst]
            inv_bw = 8.0 / self.cluster.bandwidth_bps[src, dst]
        ex_alpha, ex_per_byte = layout_exchange_terms(self, stages)
        out = []
        for mbs in self.micro_batch_sizes:
            if per_replica % mbs:
                continue
            m = per_replica // mbs
            rate = self._rates[mbs][stages].min(axis=1)
            f1 = layer_forward_flops(self.model, mbs)
            fl = logits_forward_flops(self.model, mbs)
            act = mbs * self.model.seq_length * self.model.hidden_size * 2.0  # fp16 activations
            hop = np.zeros(pp)  # fastest forward + backward message across boundary s-1 -> s
            busy = 0.0  # the busiest link streams m messages one way (a replica's own link)
            if pp > 1:
                hop[1:] = 2.0 * (delay + act * inv_bw).min(axis=1)
                busy = float(m * act * inv_bw.max())
            for sch in self.schedules:
                for rc in self.recompute:
                    again = self._replay_flops(rc, mbs, f1)
                    per_layer = (3.0 * f1 + again) / rate
                    extra = np.zeros(pp)
                    extra[-1] = 3.0 * fl / rate[-1]
                    for layers, rounds in self._splits(
                        pp, m, mbs, rc, sch, usable, per_layer, extra
                    ):
                        fwd, bwd, opt = self.stage_times(stages, layers, mbs, rc)
                        work = fwd + bwd
                        fill = np.concatenate(([0.0], np.cumsum(work + hop)[:-1])) + hop
                        passes = rounds if sch == "gpipe" else 1
                        drain = float((passes * (fill - hop) + m * work).max() + opt[0])
                        bound = max(float((m * work + opt).max()), drain, busy)
                        if dp > 1:  # each stage's own compute, then its exchange
                            shard = self._shard_bytes(pp, dp, layers)
                            ex = ex_alpha + ex_per_byte * shard
                            bound = max(bound, float((m * work + ex + opt).max()))
                        out.append(
                            (self._bound_score(bound, price), bound, name, stages, mbs, sch, rc)
                            + (layers, rounds)
                        )
        return out

    def _shard_bytes(self, pp: int, dp: int, layers) -> np.ndarray:
        """Each stage's data-parallel shard, bytes (the simulator's fp16 gradients / dp)."""
        params = stage_gradient_params(self.model, pp, layers=layers)
        return GRADIENT_BYTES * np.asarray(params, dtype=float) / dp

    def simulate_entry(self, entry: tuple) -> Candidate:
        self.spent += self.work(entry[3])
        t0 = time.perf_counter()
        c = self._simulate_entry(entry)
        pp, dp = entry[3].shape
        took = (time.perf_counter() - t0) / (pp * dp * dp)
        self.seconds_per_message = max(self.seconds_per_message, took)
        return c

    def _simulate_entry(self, entry: tuple) -> Candidate:
        _, _, name, stages, mbs, sch, rc, layers, rounds = entry
        return self._simulate_layout(name, stages, mbs, sch, rc, layers, rounds)

    def _simulate_layout(self, name, stages, mbs, sch, rc, layers, rounds) -> Candidate:
        """``stages`` under one configuration: its stage times, price and usable memory, then
        the simulator (no memory check)."""
        fwd, bwd, opt = self.stage_times(stages, layers, mbs, rc)
        price = float(self.usd_per_s[stages].sum())
        usable = self.usable[stages].min(axis=1)
        return self._simulate(
            name,
            stages,
            self._sub(stages),
            layers,
            mbs,
            sch,
            rc,
            rounds,
            fwd,
            bwd,
            opt,
            price,
            usable,
        )

    def stage_times(self, stages: np.ndarray, layers, mbs: int, rc: str):
        """(fwd, bwd, opt) seconds per stage: each stage at its slowest device."""
        rate = self._rates[mbs][stages].min(axis=1)
        hbm = self.hbm[stages].min(axis=1)
        f1 = layer_forward_flops(self.model, mbs)
        fl = logits_forward_flops(self.model, mbs)
        again = self._replay_flops(rc, mbs, f1)
        lay = np.asarray(layers, dtype=float)
        fwd = lay * f1 / rate
        fwd[-1] += fl / rate[-1]
        bwd = lay * (2.0 * f1 + again) / rate
        bwd[-1] += 2.0 * fl / rate[-1]
        opt = 8.0 * ADAM_BYTES_PER_PARAM * lay * self.model.params_per_layer / hbm
        return fwd, bwd, opt

    def _replay_flops(self, rc: str, mbs: int, f1: float) -> float:
        """Forward FLOPs one layer replays in its backward pass (hardware.py's modes)."""
        if rc in REPLAY:
            return REPLAY[rc] * f1
        return 4.0 * self.model.seq_length**2 * self.model.hidden_size * mbs  # selective

    def evaluate(
        self, name: str, stages: np.ndarray, layers, mbs: int, rc: str, sch: str, rounds: int
    ) -> Candidate:
        """One given plan, simulated (iteration time inf where it does not fit in memory)."""
        pp, dp = stages.shape
        if self.batch % (dp * mbs):
            raise ValueError(f"plan: batch {self.batch} is not divisible by dp {dp} x mbs {mbs}")
        m = self.batch // (dp * mbs)
        if sch not in SCHEDULES or rc not in RECOMPUTE:
            raise ValueError(f"plan: unknown schedule {sch!r} or recomputation {rc!r}")
        if sch == "gpipe" and (rounds < 1 or m % rounds):
            raise ValueError(f"plan: rounds={rounds} must divide the {m} micro-batches")
        usable = self.usable[stages].min(axis=1)
        in_flight = [min(pp - s, m) for s in range(pp)] if sch == "1f1b" else [m // rounds] * pp
        c = self._simulate_layout(name, stages, mbs, sch, rc, layers, rounds)
        if self.fits(layers, usable, in_flight, mbs, rc) is None:
            c.iter_time_s, c.cost_usd = math.inf, math.nan
        return c

    def _splits(self, pp, m, mbs, rc, sch, usable, per_layer, extra):
        """(layers, rounds) candidates: the split by speed under each memory regime, and the
        even split where the layers divide evenly."""
        total = self.model.num_layers
        found = []
        if self.even_only:
            if total % pp:
                return []
            even = (total // pp,) * pp
            for r in (1,) if sch == "1f1b" else [r for r in range(1, m + 1) if m % r == 0]:
                k = [min(pp - s, m) for s in range(pp)] if sch == "1f1b" else [m // r] * pp
                if self.fits(even, usable, k, mbs, rc) is not None:
                    return [(even, r)]
            return []
        if sch == "1f1b":
            in_flight = [min(pp - s, m) for s in range(pp)]
            caps = self.layer_caps(usable, in_flight, mbs, rc)
            sp = self.split(per_layer, extra, caps) if min(caps) >= 1 else None
            if sp is not None:
                found.append((sp, 1))
            if total % pp == 0:
                even = (total // pp,) * pp
                if even != sp and self.fits(even, usable, in_flight, mbs, rc) is not None:
                    found.append((even, 1))
            return found
        divisors = [r for r in range(1, m + 1) if m % r == 0]
        seen = set()
        for r_cap in (1, m):  # caps at a whole pass in flight, and at one micro-batch
            in_flight = [m // r_cap] * pp
            caps = self.layer_caps(usable, in_flight, mbs, rc)
            if min(caps) < 1:
                continue
            sp = self.split(per_layer, extra, caps)
            if sp is not None:
                seen.add(sp)
        if total % pp == 0:
            seen.add((total // pp,) * pp)
        for layers in seen:
            for r in divisors:
                if self.fits(layers, usable, [m // r] * pp, mbs, rc) is not None:
                    found.append((layers, r))
                    break
        return found

    def _simulate(
        self, name, stages, sub, layers, mbs, sch, rc, rounds, fwd, bwd, opt, price, usable
    ) -> Candidate:
        cl, a = sub
        w = Workload(model=self.model, global_batch_size=self.batch, micro_batch_size=mbs)
        res = simulate_ours(
            cl,
            a,
            w,
            compute=StageCompute(fwd_s=tuple(fwd), bwd_s=tuple(bwd), opt_s=tuple(opt)),
            hardware=_NO_MEMORY_CHECK,
            rounds=rounds if sch == "gpipe" else None,
            recompute=rc,
            schedule=sch,
            loss_scaling=True,
            layers_per_stage=layers,
        )
        self.simulations += 1
        pp, dp = stages.shape
        m = self.batch // (dp * mbs)
        in_flight = [min(pp - s, m) for s in range(pp)] if sch == "1f1b" else [m // rounds] * pp
        mem = tuple(self.stage_memory(s, pp, layers[s], mbs, in_flight[s], rc) for s in range(pp))
        t = res.iter_time_s if res.status == "ok" else math.inf
        return Candidate(
            layout=name,
            stages=stages,
            layers=tuple(int(x) for x in layers),
            micro_batch_size=mbs,
            recompute=rc,
            schedule=sch,
            rounds=int(rounds),
            iter_time_s=t,
            cost_usd=t * price if math.isfinite(price) else math.nan,
            stage_memory_bytes=mem,
            breakdown={k: v for k, v in res.breakdown.items() if isinstance(v, (int, float, str))},
        )

    # ---- layouts -----------------------------------------------------------------------------
    def shapes(self, n: int) -> list[tuple[int, int]]:
        """(pp, dp) with pp·dp <= n devices: dp divides the batch, pp at most the layers; per dp
        every pp on a small fleet (at most :data:`SMALL_FLEET` devices), else the most stages
        that fit and every smaller pp dividing the layers that uses over half the devices."""
        out = []
        for dp in range(1, min(n, self.batch) + 1):
            if self.batch % dp:
                continue
            top = min(self.model.num_layers, n // dp)
            if top < 1:
                continue
            if n <= SMALL_FLEET:
                pps = set(range(1, top + 1))
            else:
                pps = {top} | {
                    p for p in range(1, top) if self.model.num_layers % p == 0 and p * dp * 2 > n
                }
            out += [(p, dp) for p in sorted(pps)]
        return out

    def pool_shapes(self, n: int, sizes) -> list[tuple[int, int]]:
        """The shapes the planner's layouts take from a pool of ``n`` devices: :meth:`shapes`,
        and each smaller pool size's (``sizes``) fullest shapes (the most stages its devices
        hold at that ``dp``, over half of them used), built from this pool's first devices
        in each layout's order. So a shape that fills the fastest types alone is also
        tried with the devices nearest an anchor region, whatever their type."""
        out = self.shapes(n)
        have = set(out)
        for m in sorted(set(sizes)):
            if m >= n:
                continue
            for pp, dp in self.shapes(m):
                full = pp == min(self.model.num_layers, m // dp) and pp * dp * 2 > m
                if full and (pp, dp) not in have:
                    have.add((pp, dp))
                    out.append((pp, dp))
        return out

    def _order(self, devs, key) -> list[int]:
        return sorted(devs, key=key)

    def _host_key(self, d: int):
        return (self.region_index[self.cluster.region_of[d]], self.cluster.host_of[d], d)

    def heuristic(self, name: str, pp: int, dp: int) -> np.ndarray | None:
        n, total = pp * dp, self.cluster.num_devices
        if n > total:
            return None
        if name == "launch_order":
            return np.arange(n, dtype=np.int64).reshape(pp, dp)
        if name == "fastest_first":
            devs = sorted(range(total), key=lambda d: (-self.rate1[d], d))[:n]
            return np.asarray(devs, dtype=np.int64).reshape(pp, dp)
        regions = [[] for _ in self.cluster.regions]
        for d in sorted(range(total), key=self._host_key):
            regions[self.region_index[self.cluster.region_of[d]]].append(d)
        if name == "one_pipeline_per_region":
            if n == total and any(len(r) % pp for r in regions):
                return None
            chains = [r[i : i + pp] for r in regions for i in range(0, len(r) - pp + 1, pp)]
            if len(chains) < dp:
                return None
            return np.asarray(chains[:dp], dtype=np.int64).T.copy()
        if name == "greedy_region_fill":
            chains = greedy_region_chains(regions, pp, dp)
            return np.asarray(chains, dtype=np.int64).T.copy()
        raise ValueError(f"unknown heuristic {name!r}")

    def pools(self) -> list[tuple[str, list[int]]]:
        """Device pools the planner's layouts draw from: all devices; the devices of the k
        fastest GPU types (fewer than all); those of the k regions with the most compute (k at
        most 3, fewer than all)."""
        total = self.cluster.num_devices
        out = [("all", list(range(total)))]
        speeds = sorted({float(x) for x in self.rate1}, reverse=True)
        for k in range(1, len(speeds)):
            keep = [d for d in range(total) if self.rate1[d] >= speeds[k - 1]]
            out.append((f"fastest {k} type(s)", keep))
        region = np.asarray(self.cluster.region_of)
        power = {r: float(self.rate1[region == r].sum()) for r in self.cluster.regions}
        ranked = sorted(self.cluster.regions, key=lambda r: (-power[r], self.region_index[r]))
        for k in range(1, min(len(ranked), 4)):
            keep = [d for d in range(total) if region[d] in ranked[:k]]
            out.append((f"top {k} region(s)", keep))
        return out

    def typed(self, pool: list[int], pp: int, dp: int, pool_name: str = "") -> np.ndarray | None:
        """The fastest devices first, each stage's group one GPU type where it can, each
        replica's next stage on the same host as its last, else in the same region."""
        n = pp * dp
        if n > len(pool):
            return None
        key = ("typed", pool_name or tuple(pool))
        if key not in self._orders:
            self._orders[key] = sorted(pool, key=lambda d: (-self.rate1[d], *self._host_key(d)))
        devs = self._orders[key][:n]
        blocks = [devs[s * dp : (s + 1) * dp] for s in range(pp)]
        host = self.cluster.host_of
        region = self.cluster.region_of
        chains = [[d] for d in blocks[0]]
        for s in range(1, pp):
            left = list(blocks[s])
            by_host: dict[int, list[int]] = {}
            by_region: dict[str, list[int]] = {}
            for d in left:
                by_host.setdefault(host[d], []).append(d)
                by_region.setdefault(region[d], []).append(d)
            taken = set()
            need = []
            for ch in chains:
                last = ch[-1]
                pick = None
                for cand in by_host.get(host[last], ()):
                    if cand not in taken:
                        pick = cand
                        break
                if pick is None:
                    need.append(ch)
                    continue
                taken.add(pick)
                ch.append(pick)
            rest = []
            for ch in need:
                pick = None
                for cand in by_region.get(region[ch[-1]], ()):
                    if cand not in taken:
                        pick = cand
                        break
                if pick is None:
                    rest.append(ch)
                    continue
                taken.add(pick)
                ch.append(pick)
            spare = [d for d in left if d not in taken]
            for ch, d in zip(rest, spare, strict=True):
                ch.append(d)
        return np.asarray(chains, dtype=np.int64).T.copy()

    def regional(self, pool: list[int], pp: int, dp: int) -> np.ndarray | None:
        """Pipelines inside one region, the chains of the fastest devices first."""
        region = self.cluster.region_of
        by_region: dict[str, list[int]] = {}
        for d in sorted(pool, key=lambda d: (-self.rate1[d], *self._host_key(d))):
            by_region.setdefault(region[d], []).append(d)
        chains = []
        for devs in by_region.values():
            chains += [devs[i : i + pp] for i in range(0, len(devs) - pp + 1, pp)]
        if len(chains) < dp:
            return None
        chains.sort(key=lambda ch: -min(self.rate1[d] for d in ch))
        return np.asarray(chains[:dp], dtype=np.int64).T.copy()

    def anchored(
        self, pool: list[int], pp: int, dp: int, anchor: str, pool_name: str = ""
    ) -> np.ndarray | None:
        """Devices near ``anchor`` first: its region, then the others by their bandwidth to
        it; inside a region the machines with the most compute first; pipelines of consecutive
        devices (so a pipeline stays on a machine where it can), each one's stages fastest
        last (the last stage also computes the logits)."""
        devs = self._anchored_devices(pool, pp * dp, anchor, pool_name)
        if devs is None:
            return None
        chains = [
            sorted(devs[r * pp : (r + 1) * pp], key=lambda d: (self.rate1[d], d)) for r in range(dp)
        ]
        return np.asarray(chains, dtype=np.int64).T.copy()

    def stagewise(
        self, pool: list[int], pp: int, dp: int, anchor: str, pool_name: str = ""
    ) -> np.ndarray | None:
        """The anchored order's devices stage by stage: stage s takes the next ``dp`` of them,
        so each stage's data-parallel group spans as few regions (and machines) as the order
        allows and the pipelines cross them instead (the paper's trade, §3: data parallelism
        inside a region, pipeline boundaries over the slow links)."""
        devs = self._anchored_devices(pool, pp * dp, anchor, pool_name)
        if devs is None:
            return None
        return np.asarray(devs, dtype=np.int64).reshape(pp, dp).copy()

    def _anchored_devices(self, pool, n: int, anchor: str, pool_name: str) -> list[int] | None:
        """The first ``n`` devices of the pool's anchored order (kept per pool and anchor);
        None if the pool has fewer."""
        if n > len(pool):
            return None
        key = ("anchored", anchor, pool_name or tuple(pool))
        if key not in self._orders:
            self._orders[key] = self._anchored_order(pool, anchor)
        return self._orders[key][:n]

    def _anchored_order(self, pool: list[int], anchor: str) -> list[int]:
        region = np.asarray(self.cluster.region_of)
        first = {r: int(np.flatnonzero(region == r)[0]) for r in self.cluster.regions}
        bw = self.cluster.bandwidth_gbps[first[anchor]]
        rank = {r: (r != anchor, -bw[first[r]], self.region_index[r]) for r in first}
        host_power: dict[int, float] = {}
        for d in pool:
            h = self.cluster.host_of[d]
            host_power[h] = host_power.get(h, 0.0) + float(self.rate1[d])
        return sorted(
            pool,
            key=lambda d: (
                rank[region[d]],
                -host_power[self.cluster.host_of[d]],
                self.cluster.host_of[d],
                -self.rate1[d],
                d,
            ),
        )

    # ---- the search --------------------------------------------------------------------------
    def _best_first(self, layouts, incumbent: Candidate | None, seen: set) -> Candidate | None:
        """Best-first over ``layouts`` ((bound, name, stages)) and their configurations: pop the
        least bound; a layout is expanded into its configurations, a configuration simulated;
        stop once the least bound reaches the incumbent's score."""
        heap = []
        for k, (bound, name, stages) in enumerate(layouts):
            heapq.heappush(heap, (bound, 0, k, (name, stages)))
        tick = len(layouts)
        while heap and not self.out_of_time():
            bound, kind, _, item = heapq.heappop(heap)
            if bound >= self.score(incumbent):
                break
            if kind == 0:
                name, stages = item
                key = stages.tobytes() + bytes(str(stages.shape), "ascii")
                if key in seen:
                    continue
                seen.add(key)
                for entry in self.configs(name, stages):
                    if entry[0] < self.score(incumbent):
                        tick += 1
                        heapq.heappush(heap, (entry[0], 1, tick, entry))
                continue
            if not self.affordable(item[3]):
                self.skipped += 1
                continue
            c = self.simulate_entry(item)
            if self.score(c) < self.score(incumbent):
                incumbent = c
        return incumbent

    def affordable(self, stages: np.ndarray) -> bool:
        """Whether simulating a layout fits what is left of the phase: with a budget, its work
        (:meth:`work`) within the phase's share; without one, its predicted time before the
        phase's deadline (the simulator's data-parallel exchange moves pp·dp² messages, and
        the seconds per message are the most any simulation so far took,
        :data:`SECONDS_PER_MESSAGE` before the first). A layout that does not fit is skipped
        (``skipped``)."""
        if self.budget is not None:
            return self.spent + self.work(stages) <= self.phase_end
        pp, dp = stages.shape
        left = min(self.time_limit_s, self.deadline_s) - (time.perf_counter() - self.t0)
        return self.seconds_per_message * pp * dp * dp <= left

    def work(self, stages: np.ndarray) -> float:
        """One simulation's charge against the budget, device-simulations: its ``n = pp·dp``
        devices, plus its ``pp·dp²`` data-parallel messages at ``1 / MESSAGES_PER_DEVICE``
        each, plus ``n² / SUBSET_PAIRS_PER_DEVICE`` when its set of devices (not the whole
        fleet) is not among the subsets kept, whose link matrices it then copies."""
        pp, dp = stages.shape
        n = pp * dp
        charge = n + n * dp / MESSAGES_PER_DEVICE
        if n < self.cluster.num_devices and self._used(stages).tobytes() not in self._subsets:
            charge += n * n / SUBSET_PAIRS_PER_DEVICE
        return float(charge)

    @staticmethod
    def _used(stages: np.ndarray) -> np.ndarray:
        """The devices ``stages`` uses, sorted (its bytes key :meth:`_sub`'s subsets)."""
        return np.sort(stages, axis=None).astype(np.int64)

    def _scored(self, name: str, stages: np.ndarray | None):
        if stages is None:
            return None
        price = float(self.usd_per_s[stages].sum())
        return (self._bound_score(self.layout_bound(stages), price), name, stages)

    def run(self) -> PlanResult:
        """Plan (module docstring). The work budget (or, with none, the time limit) is shared
        out: 45% to the heuristics (a quarter each; one stopped at its share reports the best
        it found and is listed in ``heuristics_cut``), then the planner's layouts until 85%, the
        local search until 90%, the best plan our runtime runs until the end."""
        self.t0 = time.perf_counter()
        self.best_rate = np.max([self._rates[b] for b in self.micro_batch_sizes], axis=0)
        total = self.cluster.num_devices
        all_shapes = self.shapes(total)
        heuristics: dict[str, Candidate | None] = {}
        self.heuristics_cut = []
        for k, name in enumerate(HEURISTICS):
            self._phase(0.45 * (k + 1) / len(HEURISTICS))
            skipped = self.skipped
            layouts = []
            for pp, dp in all_shapes:
                if self.out_of_time():
                    break
                layouts.append(self._scored(name, self.heuristic(name, pp, dp)))
            heuristics[name] = self._best_first([x for x in layouts if x], None, set())
            if self.cut or self.skipped > skipped:  # stopped, or left entries out, at its share
                self.heuristics_cut.append(name)
        best = min(heuristics.values(), key=self.score, default=None)
        self._phase(0.85)
        layouts = []
        pools = self.pools()
        sizes = [len(pool) for _, pool in pools]
        for pool_name, pool in pools:
            for pp, dp in self.pool_shapes(len(pool), sizes):
                if self.out_of_time():
                    break
                if "typed" in self.layouts:
                    layouts.append(self._scored("typed", self.typed(pool, pp, dp, pool_name)))
                if "regional" in self.layouts:
                    layouts.append(self._scored("regional", self.regional(pool, pp, dp)))
                if "anchored" in self.layouts and not pool_name.startswith("top"):
                    for r in self.anchors():
                        got = self.anchored(pool, pp, dp, r, pool_name)
                        layouts.append(self._scored("anchored", got))
                if "stagewise" in self.layouts and not pool_name.startswith("top"):
                    for r in self.anchors():
                        got = self.stagewise(pool, pp, dp, r, pool_name)
                        layouts.append(self._scored("stagewise", got))
        best = self._best_first([x for x in layouts if x], best, set())
        self._phase(0.90)
        if self.local_search and best is not None:
            best = self._improve(best)
        self._phase(1.0)
        runtime = best if best is not None and best.runtime_supported else None
        if runtime is None and not self.runnable_only and best is not None:
            runtime = self._runtime_plan(best)
        return PlanResult(
            best=best,
            best_runtime=runtime,
            heuristics=heuristics,
            lower_bound_s=self.lower_bound_s(),
            search_time_s=time.perf_counter() - self.t0,
            simulations=self.simulations,
            layouts=self.layouts_tried,
            heuristics_cut=tuple(self.heuristics_cut),
            skipped=self.skipped,
            budget_device_sims=self.budget,
            spent_device_sims=self.spent,
            time_cut=self.time_cut,
        )

    def anchors(self) -> list[str]:
        """The regions the anchored layouts start from: the most compute first."""
        region = np.asarray(self.cluster.region_of)
        power = {r: float(self.rate1[region == r].sum()) for r in self.cluster.regions}
        ranked = sorted(self.cluster.regions, key=lambda r: (-power[r], self.region_index[r]))
        return ranked[: self.max_anchors]

    def _runtime_plan(self, best: Candidate) -> Candidate | None:
        """The best plan our runtime can run on the incumbent's layouts' shapes (a short search
        of its own; the time limit still holds)."""
        sub = Planner.__new__(Planner)
        sub.__dict__.update(self.__dict__)
        sub.schedules = ("gpipe",)
        sub.recompute = tuple(r for r in self.recompute if r in REPLAY)
        sub.runnable_only = True
        sub.even_only = True
        layouts = []
        for _pool_name, pool in self.pools()[:1]:
            for pp, dp in self.shapes(len(pool)):
                if self.model.num_layers % pp == 0:
                    layouts.append(sub._scored("typed", sub.typed(pool, pp, dp, "all")))
        for name in HEURISTICS:
            for pp, dp in self.shapes(self.cluster.num_devices):
                if self.model.num_layers % pp == 0:
                    layouts.append(sub._scored(name, sub.heuristic(name, pp, dp)))
        found = sub._best_first([x for x in layouts if x], None, set())
        self.simulations, self.spent, self.skipped = sub.simulations, sub.spent, sub.skipped
        self.time_cut = self.time_cut or sub.time_cut
        if found is not None and not found.runtime_supported:
            return None
        return found

    def _improve(self, best: Candidate) -> Candidate:
        """Local search on the incumbent's placement while time allows: first every swap of
        two whole stages (the order the pipeline visits its groups in), repeated while one
        improves; then random swaps of two devices of different stages and of a used device
        with an idle one, each kept when the simulator says the objective improves."""
        total = self.cluster.num_devices
        improved = True
        while improved and not self.out_of_time():
            improved = False
            pp = best.pp
            for i, j in itertools.combinations(range(pp), 2):
                st = best.stages.copy()
                st[[i, j]] = st[[j, i]]
                got = self._try(st, best)
                if got is not best:
                    best, improved = got, True
                    break
                if self.out_of_time():
                    break
        tries = 0
        while not self.out_of_time() and tries < 400:
            tries += 1
            st = best.stages.copy()
            pp, dp = st.shape
            used = set(int(d) for d in st.ravel())
            idle = [d for d in range(total) if d not in used]
            if idle and self.rng.random() < 0.3:
                s, r = int(self.rng.integers(pp)), int(self.rng.integers(dp))
                st[s, r] = idle[int(self.rng.integers(len(idle)))]
            else:
                if pp * dp < 2:
                    break
                i, j = self.rng.choice(pp * dp, 2, replace=False)
                a, b = np.unravel_index(i, st.shape), np.unravel_index(j, st.shape)
                if a[0] == b[0]:
                    continue  # same stage group: the same iteration
                st[a], st[b] = st[b], st[a]
            best = self._try(st, best)
        return best

    def _try(self, stages: np.ndarray, best: Candidate) -> Candidate:
        """``best``, or the best of ``stages``' three most promising configurations where one
        is better."""
        if not self.affordable(stages):
            return best
        name = best.layout if best.layout.endswith("+local") else f"{best.layout}+local"
        entries = sorted(
            (e for e in self.configs(name, stages) if e[0] < self.score(best)),
            key=lambda e: e[0],
        )
        for e in entries[:3]:
            if e[0] >= self.score(best) or self.out_of_time():
                break
            c = self.simulate_entry(e)
            if self.score(c) < self.score(best) - 1e-12:
                best = c
        return best

    # ---- lower bound -------------------------------------------------------------------------
    def lower_bound_s(self) -> float:
        """A lower bound on any plan's iteration time (module of :mod:`system.planner.bounds`)."""
        from system.planner.bounds import iteration_lower_bound_s

        return iteration_lower_bound_s(self)


def plan(cluster: Cluster, model: GPTConfig, batch: int, compute: ComputeModel, **kw) -> PlanResult:
    """Plan ``model`` at global batch ``batch`` on ``cluster`` (:class:`Planner`)."""
    return Planner(cluster, model, batch, compute, **kw).run()
