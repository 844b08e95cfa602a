"""Device compute model: V100 16 GB, FLOPs per stage and micro-batch, optimizer step (paper §4.1).

FLOP counts (Narayanan et al., SC'21, appendix): one transformer layer's forward pass costs
``24·s·h² + 4·s²·h`` FLOPs per sequence, its backward 2× that, and full activation recomputation
replays the forward once more, so one layer costs 4× its forward per micro-batch sequence;
selective recomputation (Korthikanti et al., 2022) replays only the attention score and value
products, ``4·s²·h``; none replays nothing. The
output layer costs ``2·s·h·V`` forward and 2× that backward (not recomputed). Summed over all
stages and micro-batches this is exactly :meth:`system.workload.Workload.model_flops` with
``recompute=True`` — the FLOP count every system's PFLOPS uses.

Achievable fraction of peak: 0.30, from Megatron-LM (Shoeybi et al., 2019): 39 TFLOPS sustained on
one V100 for a 1.2B-parameter GPT, i.e. 39/125 ≈ 30% of the fp16 tensor-core peak. It is the one
calibrated constant of the compute model and the same for every system; it is not fitted to the
paper's results.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from system.workload import GPTConfig

if TYPE_CHECKING:
    from system.assignment import Assignment
    from system.cluster import Cluster
    from system.workload import Workload

__all__ = [
    "Hardware",
    "V100",
    "StageCompute",
    "layer_forward_flops",
    "logits_forward_flops",
    "stage_compute",
    "stage_compute_for",
    "ADAM_BYTES_PER_PARAM",
    "hardware_from_profile",
]

# Bytes an Adam step moves per parameter in mixed precision: read fp16 grad (2), read+write fp32
# master weight, momentum, variance (3 × 8), write fp16 weight (2).
ADAM_BYTES_PER_PARAM = 28.0


@dataclass(frozen=True, slots=True, kw_only=True)
class Hardware:
    """One accelerator type."""

    name: str = "V100-16GB"
    peak_flops: float = 125e12  # fp16 tensor-core peak, FLOP/s (NVIDIA V100 datasheet)
    achievable_fraction: float = 0.30  # Megatron-LM: 39 TFLOPS / 125 on one V100 (see module doc)
    memory_bytes: float = 16 * 2**30  # HBM2 capacity
    reserved_bytes: float = 1 * 2**30  # CUDA context + allocator fragmentation (assumption)
    hbm_bandwidth_bps: float = 900e9 * 8  # 900 GB/s HBM2, in bit/s (optimizer step is memory-bound)

    def __post_init__(self) -> None:
        if not 0 < self.achievable_fraction <= 1:
            raise ValueError(f"hardware {self.name!r}: achievable_fraction must be in (0, 1]")
        if self.peak_flops <= 0 or self.memory_bytes <= self.reserved_bytes:
            raise ValueError(f"hardware {self.name!r}: needs peak_flops > 0, memory > reserved")

    @property
    def flops(self) -> float:
        """Sustained FLOP/s used for every compute time."""
        return self.peak_flops * self.achievable_fraction

    @property
    def usable_memory_bytes(self) -> float:
        return self.memory_bytes - self.reserved_bytes

    def optimizer_step_s(self, params: float) -> float:
        """Seconds for a mixed-precision Adam step over ``params`` parameters (memory-bound)."""
        return 8.0 * ADAM_BYTES_PER_PARAM * params / self.hbm_bandwidth_bps


V100 = Hardware()


def layer_forward_flops(model: GPTConfig, sequences: float) -> float:
    """Forward FLOPs of one transformer layer for ``sequences`` sequences: 24sh² + 4s²h each."""
    s, h = model.seq_length, model.hidden_size
    return sequences * (24.0 * s * h * h + 4.0 * s * s * h)


def logits_forward_flops(model: GPTConfig, sequences: float) -> float:
    """Forward FLOPs of the output (logit) layer: 2·s·h·V per sequence."""
    return sequences * 2.0 * model.seq_length * model.hidden_size * model.vocab_size


@dataclass(frozen=True, slots=True)
class StageCompute:
    """Per-stage compute seconds per micro-batch (forward; backward incl. recomputation) + step.

    Each field is a float (every stage alike) or one value per stage. This is what the emulation
    passes to :func:`system.simulator.simulate_ours` with *measured* times instead of the
    V100 model.
    """

    fwd_s: float | Sequence[float]
    bwd_s: float | Sequence[float]
    opt_s: float | Sequence[float] = 0.0

    def per_stage(self, pp: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(fwd, bwd, opt), each shape (pp,), checked non-negative and finite."""
        out = []
        for label in ("fwd_s", "bwd_s", "opt_s"):
            v = np.asarray(getattr(self, label), dtype=float)
            v = np.full(pp, float(v)) if v.ndim == 0 else v
            if v.shape != (pp,):
                raise ValueError(
                    f"StageCompute.{label}: expected a float or {pp} values, got {v.shape}"
                )
            if not np.all(np.isfinite(v)) or np.any(v < 0):
                raise ValueError(f"StageCompute.{label}: values must be finite and >= 0, got {v}")
            out.append(v)
        return out[0], out[1], out[2]


def stage_compute(
    model: GPTConfig,
    pp: int,
    micro_batch_size: int,
    *,
    tp: int = 1,
    hardware: Hardware = V100,
    params_per_device: Sequence[float] | None = None,
    recompute: str = "full",
) -> StageCompute:
    """V100-model compute times for ``pp`` equal stages (layers split evenly, logits on the last).

    Tensor parallelism divides each stage's FLOPs by ``tp`` (perfect split; its all-reduces are
    charged by the caller). ``params_per_device`` (one per stage) sets the optimizer step time;
    default: the stage's layer parameters / tp. ``recompute``: ``full`` (default), ``selective``
    or ``none`` (module docstring).
    """
    replay = {"full": 1.0, "selective": None, "none": 0.0}
    if recompute not in replay:
        raise ValueError(
            f"stage_compute: recompute must be one of {tuple(replay)}, got {recompute!r}"
        )
    if model.num_layers % pp:
        raise ValueError(f"num_layers={model.num_layers} is not divisible into pp={pp} stages")
    layers = model.num_layers // pp
    f_layer = layer_forward_flops(model, micro_batch_size)
    f_logit = logits_forward_flops(model, micro_batch_size)
    fwd = np.full(pp, layers * f_layer)
    if recompute == "selective":  # the attention products 4·s²·h per sequence, again
        again = 4.0 * model.seq_length**2 * model.hidden_size * micro_batch_size
    else:
        again = replay[recompute] * f_layer
    bwd = np.full(pp, layers * (2.0 * f_layer + again))  # backward 2× + recomputation
    fwd[-1] += f_logit
    bwd[-1] += 2.0 * f_logit
    if params_per_device is None:
        params_per_device = [layers * model.params_per_layer / tp] * pp
    opt = np.array([hardware.optimizer_step_s(p) for p in params_per_device])
    scale = 1.0 / (tp * hardware.flops)
    return StageCompute(fwd_s=tuple(fwd * scale), bwd_s=tuple(bwd * scale), opt_s=tuple(opt))


def hardware_from_profile(profile: dict, base: Hardware = V100) -> Hardware:
    """``base`` with the compute fraction (and optimizer bandwidth, if given) of a measured
    hardware profile: the ``v100_equivalent`` block that ``mode=gpu_check`` writes to
    ``results/gpu/hardware_profile.json`` (GPU measurements carried to the V100 by datasheet
    peak ratios). Optional: the default V100 model needs no profile."""
    try:
        eq = profile["v100_equivalent"]
        fraction = float(eq["achievable_fraction"])
    except (KeyError, TypeError, ValueError):
        raise ValueError("hardware profile: needs v100_equivalent.achievable_fraction") from None
    bw = eq.get("hbm_bandwidth_bps")
    return Hardware(
        name=f"{base.name} (profile: {profile.get('device', '?')})",
        peak_flops=base.peak_flops,
        achievable_fraction=fraction,
        memory_bytes=base.memory_bytes,
        reserved_bytes=base.reserved_bytes,
        hbm_bandwidth_bps=float(bw) if bw else base.hbm_bandwidth_bps,
    )


def stage_compute_for(
    cluster: Cluster, a: Assignment, work: Workload, layers: Sequence[int]
) -> StageCompute:
    """Per-stage micro-batch times of a mixed fleet: each stage at its slowest GPU (peak ×
    :data:`system.cost.iteration.ACHIEVABLE`, the scheduler's surrogate's speed), ``layers[s]``
    layers, the logits on the last stage, the optimizer step at the stage's slowest memory."""
    from system.cost.iteration import ACHIEVABLE
    from system.gpus import get_gpu

    m = work.model
    speed = cluster.peak_flops() * ACHIEVABLE
    f_layer = layer_forward_flops(m, work.micro_batch_size)
    f_logit = logits_forward_flops(m, work.micro_batch_size)
    fwd, bwd, opt = [], [], []
    for s in range(a.pp):
        devs = a.group(s)
        v = float(speed[devs].min())
        hbm = min(get_gpu(cluster.gpus[d]).hbm_bandwidth_bps for d in devs)
        f = layers[s] * f_layer + (f_logit if s == a.pp - 1 else 0.0)
        b = 3.0 * layers[s] * f_layer + (2.0 * f_logit if s == a.pp - 1 else 0.0)
        fwd.append(f / v)
        bwd.append(b / v)
        opt.append(8.0 * ADAM_BYTES_PER_PARAM * layers[s] * m.params_per_layer / hbm)
    return StageCompute(fwd_s=tuple(fwd), bwd_s=tuple(bwd), opt_s=tuple(opt))
