"""One real Megatron / DeepSpeed configuration, as the workers read it (a JSON spec file).

:class:`BaselineSpec` is shared by the launcher and grid (:mod:`baselines.grid`) and by
the workers (``baselines/<system>/train.py``), which import this module and not the grid.
Importing it does not import torch.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from dataclasses import dataclass

from system.results import BASELINE_SYSTEMS
from system.runtime.spec import SpecBase  # torch-free
from system.workload import Workload

__all__ = ["SYSTEMS", "DP_COLLECTIVES", "BaselineSpec", "check_spec", "metrics_from", "nccl_algo"]

SYSTEMS = BASELINE_SYSTEMS  # the systems this package launches
# The DP gradient collective each framework can be told to use (the simulator's dp_collective):
# ``auto``, the frameworks' defaults with NCCL's own pick (no NCCL_ALGO). Megatron: NCCL's ring
# or double binary tree forced (NCCL_ALGO), or megatron-core's partial distributed optimizer
# (reduce-scatter inside blocks of consecutive DP ranks, all-reduce across them, all-gather
# inside; ``num_distributed_optimizer_instances``). DeepSpeed ZeRO-1/2: reduce-scatter +
# all-gather (its default; ``ring`` forces NCCL's ring) or, with ``"reduce_scatter": false``,
# an all-reduce on NCCL's tree + all-gather.
DP_COLLECTIVES = {
    "megatron": ("auto", "ring", "tree", "two_level"),
    "deepspeed": ("auto", "ring", "tree+allgather"),
}


@dataclass(frozen=True, kw_only=True)
class BaselineSpec(SpecBase):
    """One baseline configuration on ``tp·pp·dp`` ranks (a JSON file for the workers).

    The model, layout, batch, seed, rate, device and start fields are :class:`SpecBase`'s,
    shared with our runtime's RunSpec; these are the baselines' own.

    DeepSpeed variants: ``pp == 1`` trains the whole model under ZeRO stage ``zero`` (0..3);
    ``pp > 1`` is ``PipelineModule`` over our GPT's layers with ZeRO stage 0 or 1 (DeepSpeed's
    pipeline engine refuses stages 2/3). Megatron ignores ``zero`` (plain DDP all-reduce).
    """

    system: str  # megatron | deepspeed
    tp: int = 1
    zero: int | None = None
    recompute: bool = False
    dp_collective: str = "auto"  # one of DP_COLLECTIVES[system]
    dist_opt_instances: int = 1  # Megatron two_level: DP ranks in this many blocks
    # Megatron's framework features (megatron-core): model chunks per stage (> 1: the
    # interleaved 1F1B schedule), use_distributed_optimizer, and the DDP overlap flags
    virtual_stages: int = 1
    distributed_optimizer: bool = False
    overlap_grad_reduce: bool = False
    overlap_param_gather: bool = False
    # DeepSpeed ZeRO's overlap_comm; None leaves DeepSpeed's default (on for stage 3 only)
    overlap_comm: bool | None = None
    timeout_s: float = 120.0  # collective timeout inside the workers
    result_path: str | None = None  # rank 0 writes its metrics here (set by run_point)

    @property
    def world_size(self) -> int:
        return self.tp * self.pp * self.dp

    def workload(self) -> Workload:
        """The workload; the baselines train in fp32, so activations and gradients are 4 B."""
        return Workload(
            model=self.gpt_config(),
            global_batch_size=self.global_batch_size,
            micro_batch_size=self.micro_batch_size,
            activation_bytes=4,
            gradient_bytes=4,
        )

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> BaselineSpec:
        data = json.loads(text)
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"baseline spec: unknown keys {sorted(unknown)}")
        return cls(**data)

    def label(self) -> str:
        z = f" zero{self.zero}" if self.system == "deepspeed" else ""
        z += f" v{self.virtual_stages}" if self.virtual_stages > 1 else ""
        z += " distopt" if self.distributed_optimizer else ""
        z += " ovl-grad" if self.overlap_grad_reduce else ""
        z += " ovl-param" if self.overlap_param_gather else ""
        z += f" overlap_comm={self.overlap_comm}" if self.overlap_comm is not None else ""
        return f"{self.system} tp{self.tp} pp{self.pp} dp{self.dp} mb{self.micro_batch_size}{z}"


def check_spec(spec: BaselineSpec) -> None:
    """Raise one ValueError naming what makes ``spec`` impossible to run (before any process)."""
    if spec.system not in SYSTEMS:
        raise ValueError(f"baseline spec: system {spec.system!r} is not one of {SYSTEMS}")
    if spec.tp < 1:
        raise ValueError(f"baseline spec: tp must be >= 1, got {spec.tp}")
    spec.check_shared("baseline spec")
    m = spec.gpt_config()
    spec.workload().check_layout(spec.pp, spec.dp)
    if m.num_attention_heads % spec.tp or m.hidden_size % spec.tp:
        raise ValueError(
            f"baseline spec: tp={spec.tp} does not divide num_attention_heads="
            f"{m.num_attention_heads} and hidden_size={m.hidden_size}"
        )
    allowed = DP_COLLECTIVES[spec.system]
    if spec.dp_collective not in allowed:
        raise ValueError(
            f"baseline spec: {spec.system} dp_collective must be one of {allowed}, "
            f"got {spec.dp_collective!r}"
        )
    if spec.dp_collective not in ("auto", "ring") and spec.device != "cuda":
        raise ValueError(
            f"baseline spec: dp_collective={spec.dp_collective} needs device=cuda (gloo runs "
            "its own ring all-reduce and exposes no choice; megatron-core's distributed "
            "optimizer, the two-level path, accepts CUDA tensors only)"
        )
    blocks = spec.dist_opt_instances
    if spec.dp_collective == "two_level":
        if blocks < 2 or spec.dp % blocks or spec.dp // blocks < 2:
            raise ValueError(
                f"baseline spec: two_level needs dist_opt_instances >= 2 dividing dp={spec.dp} "
                f"into blocks of >= 2 ranks, got {blocks}"
            )
    elif blocks != 1:
        raise ValueError("baseline spec: dist_opt_instances is for dp_collective=two_level only")
    _check_features(spec)
    if spec.system == "deepspeed":
        if spec.dp_collective == "tree+allgather" and spec.zero not in (1, 2):
            raise ValueError("baseline spec: tree+allgather is ZeRO-1/2's all-reduce path")
        if spec.tp != 1:
            raise ValueError("baseline spec: deepspeed runs with tp=1 (no tensor parallelism)")
        if spec.zero is None or spec.zero not in (0, 1, 2, 3):
            raise ValueError(f"baseline spec: deepspeed needs zero in 0..3, got {spec.zero!r}")
        if spec.pp > 1 and spec.zero > 1:
            raise ValueError(
                f"baseline spec: deepspeed pipeline (pp={spec.pp}) supports ZeRO "
                f"stage 0 or 1 only, got zero={spec.zero}"
            )


def nccl_algo(spec: BaselineSpec) -> str | None:
    """The ``NCCL_ALGO`` a worker sets for ``spec`` (NCCL environment-variable documentation):
    ``Ring`` or ``Tree`` where the row forces one; None (NCCL's own per-call choice, its tuner)
    for ``auto`` and for ``two_level``, a framework's choice that leaves NCCL's alone."""
    if spec.dp_collective == "ring":
        return "Ring"
    return "Tree" if spec.dp_collective.startswith("tree") else None


def metrics_from(
    spec: BaselineSpec, losses: Sequence[float], iter_times_s: Sequence[float]
) -> dict:
    """Per-run metrics the same way as our runtime: median iteration time after the first."""
    import statistics

    times = list(iter_times_s)
    steady = times[1:] if len(times) > 1 else times  # the first iteration warms up
    iter_time_s = statistics.median(steady)
    w = spec.workload()
    return {
        "losses": [float(x) for x in losses],
        "iter_times_s": times,
        "iter_time_s": iter_time_s,
        "tokens_per_s": w.tokens_per_iteration / iter_time_s,
        "tflops": w.model_flops(recompute=True) / iter_time_s / 1e12,
        "pflops": w.model_flops(recompute=True) / iter_time_s / 1e15,
        "loss_first": float(losses[0]),
        "loss_last": float(losses[-1]),
    }


def _check_features(spec: BaselineSpec) -> None:
    """The frameworks' features: each on its framework, in the shapes the framework runs."""
    megatron = (
        spec.virtual_stages != 1,
        spec.distributed_optimizer,
        spec.overlap_grad_reduce,
        spec.overlap_param_gather,
    )
    if spec.system != "megatron" and any(megatron):
        raise ValueError(
            "baseline spec: virtual_stages, distributed_optimizer, overlap_grad_reduce and "
            "overlap_param_gather are megatron's"
        )
    if spec.system != "deepspeed" and spec.overlap_comm is not None:
        raise ValueError("baseline spec: overlap_comm is deepspeed's (ZeRO)")
    if spec.virtual_stages < 1:
        raise ValueError(f"baseline spec: virtual_stages must be >= 1, got {spec.virtual_stages}")
    if spec.virtual_stages > 1:
        from baselines.space import interleaving_allowed

        m = spec.global_batch_size // (spec.dp * spec.micro_batch_size)
        if not interleaving_allowed(spec.pp, m, spec.virtual_stages, spec.gpt_config().num_layers):
            raise ValueError(
                f"baseline spec: virtual_stages={spec.virtual_stages} needs pp >= 2, layers "
                f"divisible by pp·virtual_stages and micro-batches ({m}) a multiple of "
                f"pp={spec.pp} (megatron-core's interleaved schedule)"
            )
    if spec.overlap_param_gather and not (spec.distributed_optimizer and spec.overlap_grad_reduce):
        raise ValueError(
            "baseline spec: overlap_param_gather needs distributed_optimizer and "
            "overlap_grad_reduce"
        )
    if spec.distributed_optimizer and spec.device != "cuda":
        raise ValueError(
            "baseline spec: distributed_optimizer=True needs device=cuda (megatron-core's "
            "distributed optimizer accepts CUDA tensors only)"
        )
