"""DeepSpeed's iteration time in the simulator: ZeRO-3, and pipeline + ZeRO-1 (appendix 10.2).

- **ZeRO-3** (Rajbhandari et al., SC'20): pure data parallelism over all devices, ranks in launch
  order on one ring. Per micro-step, layer by layer: parameter all-gather in the forward pass,
  again in the backward pass, gradient reduce-scatter (≈ 1.5× the bytes of a DP all-reduce,
  Rajbhandari et al. §7), each a ring collective over every device, repeated for every
  micro-batch of the accumulation. Prefetching overlaps it with compute, so a micro-step costs
  max(compute, communication) — generous to ZeRO-3.
- **ZeRO-1 without a pipeline** (``dp+zero1``, the simulator's grid only): pp = 1, gradient
  accumulation, one gradient all-reduce (reduce-scatter + all-gather) per iteration, optimizer
  state sharded over all devices.
- **Pipeline + ZeRO-1**: PipelineModule (rank = pipe·DP + data), 1F1B in ``TrainSchedule``'s
  order with separate blocking sends and receives
  (:func:`baselines.deepspeed.schedule.deepspeed_train_program`), optimizer state sharded over DP
  (:func:`system.simulator.baseline_training.simulate_1f1b_ring` with ``zero=1``). Across
  replicas: gradient reduce-scatter + parameter all-gather (DeepSpeed's default; NCCL's pick
  under ``dp_collective=auto``), or with ZeRO's ``"reduce_scatter": false`` a gradient all-reduce
  (NCCL's double binary tree) + the all-gather (``dp_collective=tree``; ``fastest``: whichever the
  link model finds faster). Rows record ``ring`` or ``tree+allgather``.

The grid search tries both (``baselines.space.deepspeed_space``) and reports the faster feasible
configuration, as the paper did.

ZeRO's ``overlap_comm`` (``BaselineConfig.overlap_comm``): ZeRO-3 overlaps its collectives with
compute when on (DeepSpeed's default for stage 3; the model above) and serialises them when off;
ZeRO-1 without a pipeline reduce-scatters each ``reduce_bucket_size`` bucket (5e8 elements,
DeepSpeed's default, ``runtime/zero/config.py``) as the last micro-step's backward fills it
(``overlap_grad_reduce`` of ``simulate_1f1b_ring``); the pipeline engine reduces after its last
backward whatever the flag says (``baselines.space``), so the flag changes nothing there.
"""

from __future__ import annotations

from dataclasses import replace

from baselines.deepspeed.schedule import deepspeed_train_program
from baselines.placement import grid_search
from baselines.space import (
    BaselineConfig,
    GridResult,
    config_memory_bytes,
    deepspeed_space,
    with_micro_batch,
)
from system.cluster import Cluster
from system.simulator.baseline_training import simulate_1f1b_ring
from system.simulator.collectives import ring_collective_s
from system.simulator.hardware import V100, Hardware, stage_compute
from system.simulator.result import SimResult
from system.simulator.transfers import NCCL, Transport
from system.workload import Workload

__all__ = [
    "RING_KWARGS",
    "REDUCE_BUCKET_SIZE",
    "simulate_zero3",
    "simulate_deepspeed",
    "grid_search_deepspeed",
]

REDUCE_BUCKET_SIZE = 5e8  # ZeRO's reduce_bucket_size default, elements

# What makes simulate_1f1b_ring DeepSpeed's pipeline engine with ZeRO-1; every DeepSpeed pipeline
# prediction passes these, the grid's and the registered validation predictions alike.
RING_KWARGS = {
    "zero": 1,
    "system": "deepspeed",
    "schedule": deepspeed_train_program,  # TrainSchedule: separate blocking sends and receives
    "loss_broadcast": True,  # _aggregate_total_loss at the end of train_batch
    # ZeRO-1's gradient sync on NCCL: DeepSpeed's default reduce-scatter + all-gather (ring);
    # simulate_deepspeed's dp_collective forces "reduce_scatter": false's tree + all-gather
    "dp_collective": "auto",
}


def simulate_zero3(
    cluster: Cluster,
    workload: Workload,
    config: BaselineConfig,
    hardware: Hardware = V100,
    *,
    rank_map=None,
) -> SimResult:
    """One ZeRO-3 iteration (see the module docstring); the ring follows ``rank_map`` (device of
    each rank, default launch order)."""
    if config.zero != 3 or config.pp != 1 or config.tp != 1 or config.dp != cluster.num_devices:
        raise ValueError(
            f"simulate_zero3: needs tp=1, pp=1, dp={cluster.num_devices}, zero=3; got {config}"
        )
    w = with_micro_batch(workload, config)
    model, d = w.model, config.dp
    steps = w.micro_batches(d)
    params = model.num_layers * model.params_per_layer
    comp = stage_compute(
        model,
        1,
        w.micro_batch_size,
        hardware=hardware,
        params_per_device=[params / d],
        recompute=config.recompute,
    )
    f, b, opt = (float(x[0]) for x in comp.per_stage(1))
    ring = [list(range(d)) if rank_map is None else [int(x) for x in rank_map]]
    layer_bytes = 2.0 * model.params_per_layer  # fp16 parameters / gradients of one layer
    t_gather = float(ring_collective_s(cluster, ring, layer_bytes, kind="allgather")[0])
    t_scatter = float(ring_collective_s(cluster, ring, layer_bytes, kind="reducescatter")[0])
    comm = model.num_layers * (2.0 * t_gather + t_scatter)
    step = max(f + b, comm) if config.overlap_comm else f + b + comm
    iter_s = steps * step + opt
    memory = config_memory_bytes(config, workload)
    return SimResult(
        system="deepspeed",
        iter_time_s=iter_s,
        compute_time_s=steps * (f + b) + opt,
        model_flops=w.model_flops(recompute=True),
        memory_bytes=memory,
        config=config.to_dict(),
        breakdown={
            "pipeline_s": 0.0,
            "dp_sync_s": steps * comm,
            "optimizer_s": opt,
            "micro_steps": int(steps),
            "zero3_comm_per_step_s": comm,
            "variant": "zero3",
            "dp_collective": "ring",  # NCCL runs all-gather and reduce-scatter as rings only
        },
        status="ok" if memory <= hardware.usable_memory_bytes else "oom",
    )


def simulate_deepspeed(
    cluster: Cluster,
    workload: Workload,
    config: BaselineConfig,
    hardware: Hardware = V100,
    transport: Transport = NCCL,
    *,
    rank_map=None,
    dp_collective: str | None = None,
) -> SimResult:
    """One DeepSpeed iteration in ``config`` (ZeRO-3, or pipeline + ZeRO-1).

    ``transport`` (NCCL or GLOO) applies to the pipeline + ZeRO-1 variant; ZeRO-3's collectives
    are the textbook rings either way (see the module docstring). ``rank_map``: device of each
    rank (default launch order). The output head is untied (a ``PipelineModule`` of
    ``[Embedding, Block…, Head]``, as the project's DeepSpeed runs build it), so no tied-weight
    all-reduce; its gradients join the last stage's DP all-reduce. ``dp_collective``: ZeRO-1's
    gradient sync, ``auto`` (default: reduce-scatter + all-gather), ``ring``, ``tree`` (tree
    all-reduce + all-gather) or ``fastest`` (the faster of those two under the link model).
    """
    if config.system != "deepspeed":
        raise ValueError(f"simulate_deepspeed: not a DeepSpeed configuration: {config}")
    if config.zero == 3:
        return simulate_zero3(cluster, workload, config, hardware, rank_map=rank_map)
    if config.zero != 1 or config.tp != 1:
        raise ValueError(
            f"simulate_deepspeed: pipeline configurations need tp=1, zero=1; got {config}"
        )
    res = simulate_1f1b_ring(
        cluster,
        with_micro_batch(workload, config),
        tp=1,
        pp=config.pp,
        dp=config.dp,
        hardware=hardware,
        transport=transport,
        rank_map=rank_map,
        **{**RING_KWARGS, **({"dp_collective": dp_collective} if dp_collective else {})},
        recompute=config.recompute,
        **(
            {"overlap_grad_reduce": True, "bucket_params": REDUCE_BUCKET_SIZE}
            if config.overlap_comm and config.pp == 1 and config.dp > 1
            else {}
        ),
    )
    res.breakdown["variant"] = config.variant
    return replace(res, config=config.to_dict())


def _space(cluster: Cluster, workload: Workload, recompute: tuple[str, ...]):
    return deepspeed_space(cluster, workload, recompute, pure_dp_zero1=True)


def _space_plain(cluster: Cluster, workload: Workload, recompute: tuple[str, ...]):
    """Without ``overlap_comm`` on ZeRO-1 (its overlap is modelled on NCCL only)."""
    return [c for c in _space(cluster, workload, recompute) if c.zero == 3 or not c.overlap_comm]


def grid_search_deepspeed(
    cluster: Cluster, workload: Workload, hardware: Hardware = V100, **options
) -> GridResult:
    """DeepSpeed's grid search: :func:`baselines.placement.grid_search` over every variant
    (:func:`baselines.space.deepspeed_space`, ZeRO-1 without a pipeline included) with
    :func:`simulate_deepspeed`; ``options``: ``placement``, ``recompute``, ``transport``,
    ``cache`` as documented there, and ``features`` (default True; False: ZeRO-1 without
    ``overlap_comm``)."""
    transport = options.get("transport", NCCL)
    nccl = not transport.rendezvous and transport.ring_segment_bytes is None
    space = _space if nccl and options.pop("features", True) else _space_plain
    options.pop("features", None)
    return grid_search(
        "deepspeed", space, simulate_deepspeed, cluster, workload, hardware, **options
    )
