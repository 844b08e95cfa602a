"""The baselines' configuration grid: TP/PP/DP/micro-batch/ZeRO enumeration + memory check.

The paper grid-searched Megatron and DeepSpeed per setting (§4.1, appendix 10.2). A configuration
is valid when its shape divides the cluster and workload and (Megatron) every tensor-parallel group
sits inside one host in launch order (TP only over NVLink, as the paper and Megatron recommend);
it is *feasible* when its per-device memory fits the accelerator (16 B/param mixed-precision Adam,
sharded as ZeRO says, plus activations under its recomputation; :mod:`system.simulator.memory`).
The simulator's grid also varies recomputation (full / selective / none, ``RECOMPUTE_MODES``); the
real-launcher grid keeps full recomputation. The frameworks' further features are grid dimensions
where they change something (the ``virtual`` / ``overlap`` / ``overlap_comm`` arguments, all
offered by default; the plain grid is ``virtual=(1,)``, ``overlap=MEGATRON_OVERLAP[:1]``,
``overlap_comm=False``):

- Megatron: virtual pipeline stages v ∈ :data:`VIRTUAL_STAGES` (interleaved 1F1B; pp ≥ 2, layers
  divisible by pp·v, micro-batches a multiple of pp: ``interleaving_allowed``), and
  :data:`MEGATRON_OVERLAP`: the replicated optimizer with the all-reduce after the pipeline flush,
  or the distributed optimizer (``use_distributed_optimizer``: optimizer state sharded over DP,
  gradients reduce-scattered, parameters all-gathered) without or with ``overlap_grad_reduce`` +
  ``overlap_param_gather`` (megatron-core ``DistributedDataParallelConfig``);
- DeepSpeed: ZeRO's ``overlap_comm`` (reduce buckets as backward fills them), on and off, for
  ZeRO-1 without a pipeline. The pipeline engine reduces gradients at its ``ReduceGrads``
  instruction after the last backward (``pipe/engine.py``: ``is_gradient_accumulation_boundary``
  holds only while it runs), so the pipelines keep it off; ZeRO-3 runs with it on, DeepSpeed's
  default for stage 3 and what its model (gathers and reduce-scatters overlapped) assumes.

Where the ranks go (launch order or topology-aware) is :mod:`baselines.placement`. The
real-launcher grid driver imports :func:`megatron_space` / :func:`deepspeed_space` and
:func:`config_memory_bytes` from here, so the simulator and real runs search the same grid.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import NamedTuple

import numpy as np

from system.cluster import Cluster
from system.simulator.baseline_training import pipeline_memory_bytes
from system.simulator.hardware import V100, Hardware
from system.simulator.memory import RECOMPUTE_MODES, training_memory
from system.simulator.result import SimResult, features_label
from system.workload import Workload

__all__ = [
    "MEGATRON_OVERLAP",
    "VIRTUAL_STAGES",
    "interleaving_allowed",
    "GridPoint",
    "explain_pick",
    "BaselineConfig",
    "GridResult",
    "MICRO_BATCH_SIZES",
    "RECOMPUTE_MODES",
    "megatron_space",
    "deepspeed_space",
    "config_memory_bytes",
    "config_fits",
    "with_micro_batch",
    "pick_best",
]

MICRO_BATCH_SIZES = (1, 2, 4, 8)  # sequences per micro-batch tried by the grid
VIRTUAL_STAGES = (1, 2, 4)  # Megatron's model chunks per stage (1: non-interleaved 1F1B)
# Megatron's (distributed optimizer, overlap_grad_reduce, overlap_param_gather) tried by the grid
MEGATRON_OVERLAP = ((False, False, False), (True, False, False), (True, True, True))


@dataclass(frozen=True, slots=True, kw_only=True)
class BaselineConfig:
    """One point of a baseline's grid."""

    system: str  # megatron | deepspeed
    tp: int
    pp: int
    dp: int
    micro_batch_size: int
    zero: int = 0  # 0 Megatron; DeepSpeed 1 (with a pipeline) or 3 (pure data parallel)
    recompute: str = "full"  # activation recomputation: full | selective | none
    virtual_stages: int = 1  # Megatron: model chunks per stage (> 1: interleaved 1F1B)
    distributed_optimizer: bool = False  # Megatron: use_distributed_optimizer
    overlap_grad_reduce: bool = False  # Megatron: reduce-scatter buckets during backward
    overlap_param_gather: bool = False  # Megatron: all-gather buckets before their forward
    # DeepSpeed ZeRO: reduce buckets during backward; None: DeepSpeed's default (ZeRO-3 only)
    overlap_comm: bool | None = None

    def __post_init__(self) -> None:
        if self.overlap_comm is None:
            object.__setattr__(self, "overlap_comm", self.system == "deepspeed" and self.zero == 3)
        if self.recompute not in RECOMPUTE_MODES:
            raise ValueError(
                f"BaselineConfig: recompute must be one of {RECOMPUTE_MODES}, "
                f"got {self.recompute!r}"
            )
        megatron_only = (
            self.virtual_stages != 1,
            self.distributed_optimizer,
            self.overlap_grad_reduce,
            self.overlap_param_gather,
        )
        if self.virtual_stages < 1 or (self.system != "megatron" and any(megatron_only)):
            raise ValueError(
                f"BaselineConfig: virtual_stages >= 1, and virtual stages, the distributed "
                f"optimizer and its overlap are Megatron's; got {self}"
            )
        if self.overlap_comm and self.system != "deepspeed":
            raise ValueError(f"BaselineConfig: overlap_comm is DeepSpeed's; got {self}")
        if self.overlap_param_gather and not (
            self.overlap_grad_reduce and self.distributed_optimizer
        ):
            raise ValueError(
                "BaselineConfig: overlap_param_gather is modelled with the distributed optimizer "
                "and overlap_grad_reduce"
            )

    @property
    def schedule(self) -> str:
        """The pipeline schedule: 1f1b, interleaved-1f1b (with ``virtual_stages``), or none."""
        if self.pp == 1:
            return "none"
        return "interleaved-1f1b" if self.virtual_stages > 1 else "1f1b"

    @property
    def variant(self) -> str:
        if self.system == "megatron":
            return "megatron"
        if self.zero == 3:
            return "zero3"
        return "pp+zero1" if self.pp > 1 else "dp+zero1"

    def label(self) -> str:
        text = f"tp{self.tp}/pp{self.pp}/dp{self.dp} mbs{self.micro_batch_size}"
        text += f" zero{self.zero}" if self.zero else ""
        text += f" rc-{self.recompute}" if self.recompute != "full" else ""
        return text + features_label(self.to_dict())

    def to_dict(self) -> dict:
        return {
            "tp": self.tp,
            "pp": self.pp,
            "dp": self.dp,
            "micro_batch_size": self.micro_batch_size,
            "zero": self.zero,
            "recompute": self.recompute,
            "virtual_stages": self.virtual_stages,
            "distributed_optimizer": self.distributed_optimizer,
            "overlap_grad_reduce": self.overlap_grad_reduce,
            "overlap_param_gather": self.overlap_param_gather,
            "overlap_comm": self.overlap_comm,
        }


@dataclass(frozen=True, slots=True)
class GridResult:
    """Every configuration simulated for one setting, and the fastest feasible one."""

    best: SimResult
    results: tuple[SimResult, ...] = field(default_factory=tuple)

    def why(self) -> str:
        """One line: the pick, its phases, and the runner-up it beat (:func:`explain_pick`)."""

        def point(r: SimResult) -> GridPoint:
            b = r.breakdown
            pipe, dp = b.get("pipeline_s", 0.0), b.get("dp_sync_s", 0.0)
            return GridPoint(r.label(), r.iter_time_s, pipe, dp, r.status)

        return explain_pick(point(self.best), [point(r) for r in self.results])


class GridPoint(NamedTuple):
    """What :func:`explain_pick` reads of one configuration of a grid."""

    label: str
    iter_time_s: float
    pipeline_s: float
    dp_sync_s: float
    status: str


def explain_pick(best: GridPoint, points: Sequence[GridPoint]) -> str:
    """One line: the pick of a grid, its phases, the runner-up it beat, how many fitted.

    >>> a = GridPoint("tp1/pp8/dp8 mbs1", 10.0, 8.0, 2.0, "ok")
    >>> b = GridPoint("tp2/pp4/dp8 mbs1", 12.0, 9.0, 3.0, "ok")
    >>> oom = GridPoint("tp1/pp1/dp64 mbs8", 0.0, 0.0, 0.0, "oom")
    >>> for part in explain_pick(a, [a, b, oom]).split("; "):
    ...     print(part)
    tp1/pp8/dp8 mbs1: 10.0 s (pipeline 8.0 s, DP 2.0 s)
    runner-up tp2/pp4/dp8 mbs1 12.0 s (pipeline 9.0 s, DP 3.0 s)
    2 feasible, 1 over memory
    """
    ok = sorted((p for p in points if p.status == "ok"), key=lambda p: p.iter_time_s)
    text = (
        f"{best.label}: {best.iter_time_s:.1f} s (pipeline {best.pipeline_s:.1f} s, "
        f"DP {best.dp_sync_s:.1f} s)"
    )
    if len(ok) > 1:
        r = ok[1]
        text += (
            f"; runner-up {r.label} {r.iter_time_s:.1f} s (pipeline {r.pipeline_s:.1f} s, "
            f"DP {r.dp_sync_s:.1f} s)"
        )
    oom = sum(p.status == "oom" for p in points)
    return text + f"; {len(ok)} feasible, {oom} over memory"


def interleaving_allowed(p: int, m: int, v: int, layers: int) -> bool:
    """Whether megatron-core runs the interleaved schedule with ``v`` chunks per stage: more than
    one stage and chunk, ``layers`` divisible by p·v, and m micro-batches a positive multiple of
    p (the default group size p: ``forward_backward_pipelining_with_interleaving`` refuses a group
    larger than m and a last group smaller than p).

    >>> interleaving_allowed(2, 4, 2, 8), interleaving_allowed(2, 3, 2, 8)
    (True, False)
    """
    return p > 1 and v > 1 and layers % (p * v) == 0 and m >= p and m % p == 0


def _divisors(n: int) -> list[int]:
    return [k for k in range(1, n + 1) if n % k == 0]


def _tp_inside_hosts(cluster: Cluster, tp: int) -> bool:
    """Launch order puts TP ranks on consecutive devices: each block of ``tp`` on one host?"""
    host = cluster.host_ids.reshape(-1, tp)
    return bool(np.all(host == host[:, :1]))


def _micro_batches(workload: Workload, dp: int) -> list[int]:
    per_replica = workload.global_batch_size // dp if workload.global_batch_size % dp == 0 else 0
    return [b for b in MICRO_BATCH_SIZES if per_replica and per_replica % b == 0]


def megatron_space(
    cluster: Cluster,
    workload: Workload,
    recompute: tuple[str, ...] = ("full",),
    *,
    virtual: tuple[int, ...] = VIRTUAL_STAGES,
    overlap: tuple[tuple[bool, bool, bool], ...] = MEGATRON_OVERLAP,
) -> list[BaselineConfig]:
    """All valid Megatron (tp, pp, dp, micro-batch, recompute) configurations on ``cluster``,
    each with every count of ``virtual`` stages the shape allows and every (distributed
    optimizer, overlap_grad_reduce, overlap_param_gather) of ``overlap`` (only the first
    without data parallelism) (module docstring)."""
    d, model = cluster.num_devices, workload.model
    out = []
    for tp in _divisors(d):
        if model.num_attention_heads % tp or not _tp_inside_hosts(cluster, tp):
            continue
        for pp in _divisors(d // tp):
            if model.num_layers % pp:
                continue
            dp = d // (tp * pp)
            for b in _micro_batches(workload, dp):
                m = workload.global_batch_size // (dp * b)
                chunks = [
                    v for v in virtual if v == 1 or interleaving_allowed(pp, m, v, model.num_layers)
                ]
                out += [
                    BaselineConfig(
                        system="megatron",
                        tp=tp,
                        pp=pp,
                        dp=dp,
                        micro_batch_size=b,
                        recompute=r,
                        virtual_stages=v,
                        distributed_optimizer=dist,
                        overlap_grad_reduce=grad,
                        overlap_param_gather=param,
                    )
                    for r in recompute
                    for v in chunks
                    for dist, grad, param in (overlap if dp > 1 else overlap[:1])
                ]
    return out


def deepspeed_space(
    cluster: Cluster,
    workload: Workload,
    recompute: tuple[str, ...] = ("full",),
    *,
    pure_dp_zero1: bool = False,
    overlap_comm: bool = True,
) -> list[BaselineConfig]:
    """DeepSpeed: ZeRO-3 over all devices, and pipeline (pp >= 2) + ZeRO-1, every micro-batch
    and recomputation mode given; with ``pure_dp_zero1`` also ZeRO-1 without a pipeline (pp = 1:
    one gradient all-reduce per iteration, optimizer state sharded; the simulator's grid);
    ``overlap_comm``: ZeRO-1 without a pipeline with ``overlap_comm`` off and on, ZeRO-3 with it
    on (module docstring); False: every configuration without it."""
    d, model = cluster.num_devices, workload.model
    out = [
        BaselineConfig(
            system="deepspeed",
            tp=1,
            pp=1,
            dp=d,
            micro_batch_size=b,
            zero=3,
            recompute=r,
            overlap_comm=overlap_comm,
        )
        for b in _micro_batches(workload, d)
        for r in recompute
    ]
    for pp in _divisors(d):
        if (pp < 2 and not pure_dp_zero1) or model.num_layers % pp:
            continue
        out += [
            BaselineConfig(
                system="deepspeed",
                tp=1,
                pp=pp,
                dp=d // pp,
                micro_batch_size=b,
                zero=1,
                recompute=r,
                overlap_comm=overlap,
            )
            for b in _micro_batches(workload, d // pp)
            for r in recompute
            for overlap in ((False, True) if overlap_comm and pp == 1 and d > 1 else (False,))
        ]
    return out


def with_micro_batch(workload: Workload, config: BaselineConfig) -> Workload:
    """``workload`` at ``config``'s micro-batch size."""
    return _at_micro_batch(workload, config.micro_batch_size)


@functools.lru_cache(maxsize=1024)  # a grid's configurations share a few sizes
def _at_micro_batch(workload: Workload, size: int) -> Workload:
    return replace(workload, micro_batch_size=size)


def config_memory_bytes(config: BaselineConfig, workload: Workload) -> float:
    """Peak per-device memory estimate of ``config`` (bytes)."""
    w = with_micro_batch(workload, config)
    if config.zero == 3:
        d = config.dp
        return training_memory(
            w.model,
            layers=w.model.num_layers,
            micro_batch_size=w.micro_batch_size,
            in_flight=1,
            embedding=True,
            logits=True,
            weight_shards=d,
            grad_shards=d,
            optimizer_shards=d,
            gathered_layers=2,
            recompute=config.recompute,
        ).total_bytes
    shards = config.dp if config.zero == 1 or config.distributed_optimizer else 1
    return pipeline_memory_bytes(
        w,
        config.tp,
        config.pp,
        config.dp,
        optimizer_shards=shards,
        recompute=config.recompute,
        virtual_stages=config.virtual_stages,
    )


def config_fits(config: BaselineConfig, workload: Workload, hardware: Hardware = V100) -> bool:
    return config_memory_bytes(config, workload) <= hardware.usable_memory_bytes


def pick_best(results: list[SimResult], what: str) -> GridResult:
    """The fastest feasible result; ValueError naming ``what`` when none fits in memory."""
    ok = [r for r in results if r.status == "ok"]
    if not ok:
        raise ValueError(
            f"{what}: no configuration fits in device memory "
            f"({len(results)} tried); use more devices or a smaller model/batch"
        )
    return GridResult(best=min(ok, key=lambda r: r.iter_time_s), results=tuple(results))
