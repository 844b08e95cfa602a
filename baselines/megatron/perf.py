"""Megatron-LM's iteration time in the simulator, and its grid search (paper §4.1, app. 10.2).

Megatron = 1F1B pipelines with blocking p2p, tensor-parallel all-reduces per layer, the data-
parallel all-reduce after the flush (by default the ring or double binary tree NCCL's tuner
picks, megatron-core's default being one flat all-reduce; ``dp_collective`` forces the ring, the
tree, megatron-core's two-level partial distributed optimizer where the rank map puts k >= 2
consecutive DP ranks in one region, or the fastest of those under the link model — what a user
forces after measuring; rows record what ran as ``dp_collective``; the memory check keeps the
replicated optimizer, which the two-level variant would shard k ways — conservative),
the tied word embedding's gradient all-reduced
between the first and last stage, the gradient-norm all-reduce; ranks
``rank = tp + TP·(dp + DP·pp)`` placed on devices in launch order or by a topology-aware rank
map (:mod:`baselines.placement`); the shared model is
:func:`system.simulator.baseline_training.simulate_1f1b_ring`. The grid (``baselines.space``) varies
TP (inside a host), PP, DP, the micro-batch size and activation recomputation; the fastest
configuration that fits in 16 GB is Megatron's number for a setting, as the paper's grid search
did. The pipeline's op order is :func:`baselines.megatron.schedule.megatron_1f1b_program`, or
with virtual stages (interleaved 1F1B)
:func:`baselines.megatron.schedule.megatron_interleaved_program`. The grid also tries
megatron-core's distributed optimizer (optimizer state sharded over DP: reduce-scatter of the
gradients, all-gather of the updated parameters), alone and with ``overlap_grad_reduce`` +
``overlap_param_gather`` (:data:`baselines.space.MEGATRON_OVERLAP`), simulated as
:func:`~system.simulator.baseline_training.simulate_1f1b_ring` with ``zero=1`` and its overlap; the
gradient buckets are megatron-core's: ``max(40M, 1M·dp)`` parameters on the first pipeline stage
and one bucket on every other stage (``DistributedDataParallel`` turns bucketing off past pipeline
rank 0, where the reduction is off the critical path). With gloo (the CPU runs) the grid keeps the
replicated optimizer: megatron-core's distributed optimizer runs on CUDA tensors only.
"""

from __future__ import annotations

from dataclasses import replace
from functools import partial

from baselines.megatron.schedule import megatron_1f1b_program, megatron_interleaved_program
from baselines.placement import grid_search
from baselines.space import (
    MEGATRON_OVERLAP,
    BaselineConfig,
    GridResult,
    config_memory_bytes,
    megatron_space,
    with_micro_batch,
)
from system.cluster import Cluster
from system.simulator.baseline_training import simulate_1f1b_ring
from system.simulator.hardware import V100, Hardware
from system.simulator.result import SimResult
from system.simulator.transfers import NCCL, Transport
from system.workload import Workload

__all__ = [
    "RING_KWARGS",
    "bucket_params",
    "ring_kwargs",
    "simulate_megatron",
    "grid_search_megatron",
]

# What makes simulate_1f1b_ring Megatron (replicated optimizer); every Megatron prediction passes
# these, the grid's and the registered validation predictions alike.
RING_KWARGS = {
    "zero": 0,
    "system": "megatron",
    "grad_norm": True,  # megatron-core's optimizer step all-reduces the gradient norm
    "schedule": megatron_1f1b_program,  # batched blocking send + receive calls
    # the DP all-reduce: NCCL's own pick (megatron-core's default, num_distributed_optimizer_
    # instances=1: no two-level); simulate_megatron's dp_collective forces another
    "dp_collective": "auto",
}


def bucket_params(pp: int, dp: int) -> list[float | None]:
    """Parameters per gradient bucket on each pipeline stage: megatron-core's default
    ``max(40_000_000, 1_000_000·dp)`` on the first stage, one bucket (None) on the others
    (``distributed/distributed_data_parallel.py``).

    >>> bucket_params(3, 64)
    [64000000.0, None, None]
    """
    return [float(max(40_000_000, 1_000_000 * dp))] + [None] * (pp - 1)


def ring_kwargs(config: BaselineConfig | dict) -> dict:
    """:data:`RING_KWARGS` with ``config``'s framework features: the interleaved program for
    virtual stages, and the distributed optimizer (``zero=1``) with its overlap and buckets.
    ``config`` is a :class:`~baselines.space.BaselineConfig` or its ``to_dict`` (a result's
    ``config``)."""
    c = config.to_dict() if isinstance(config, BaselineConfig) else config
    kwargs = dict(RING_KWARGS)
    if c.get("virtual_stages", 1) > 1:
        kwargs["schedule"] = megatron_interleaved_program(c["virtual_stages"])
    if c.get("distributed_optimizer"):
        kwargs["zero"] = 1
        kwargs["overlap_grad_reduce"] = bool(c.get("overlap_grad_reduce"))
        kwargs["overlap_param_gather"] = bool(c.get("overlap_param_gather"))
        kwargs["bucket_params"] = bucket_params(c["pp"], c["dp"])
    return kwargs


def simulate_megatron(
    cluster: Cluster,
    workload: Workload,
    config: BaselineConfig,
    hardware: Hardware = V100,
    transport: Transport = NCCL,
    *,
    rank_map=None,
    tied_embedding: bool | None = None,
    dp_collective: str | None = None,
) -> SimResult:
    """One Megatron iteration in ``config`` (its micro-batch size replaces the workload's).

    ``transport``: NCCL (GPUs, the paper) or GLOO (the CPU runs on emulated links).
    ``rank_map``: device of each launch rank (default launch order). ``tied_embedding``: default
    True with NCCL (Megatron-LM's GPT ties its input and output embeddings unless
    ``--untie-embeddings-and-output-weights``) and False otherwise (the project's emulated runs
    build megatron-core's GPTModel untied, ``baselines/megatron/train.py``). ``dp_collective``:
    the DP all-reduce (default ``auto``, NCCL's pick; :data:`RING_KWARGS`), one of
    :data:`system.simulator.baseline_training.DP_REQUESTS`; with the distributed optimizer
    reduce-scatter + all-gather (``tree``: all-reduce + all-gather), and with its overlap the
    bucketed ring reduce-scatter.
    """
    if tied_embedding is None:
        tied_embedding = transport.name.startswith("nccl")
    if config.system != "megatron" or config.zero:
        raise ValueError(f"simulate_megatron: not a Megatron configuration: {config}")
    w = with_micro_batch(workload, config)
    kwargs = {**ring_kwargs(config), **({"dp_collective": dp_collective} if dp_collective else {})}
    res = simulate_1f1b_ring(
        cluster,
        w,
        tp=config.tp,
        pp=config.pp,
        dp=config.dp,
        hardware=hardware,
        transport=transport,
        rank_map=rank_map,
        **kwargs,
        recompute=config.recompute,
        tied_embedding=tied_embedding,
    )
    assert abs(res.memory_bytes - config_memory_bytes(config, workload)) < 1.0
    # Megatron's own flags (the distributed optimizer, not ``zero``)
    return replace(res, config=config.to_dict())


def grid_search_megatron(
    cluster: Cluster, workload: Workload, hardware: Hardware = V100, **options
) -> GridResult:
    """Megatron's grid search: :func:`baselines.placement.grid_search` over
    :func:`baselines.space.megatron_space` with :func:`simulate_megatron`; ``options``:
    ``placement``, ``recompute``, ``transport``, ``cache`` as documented there, and
    ``features`` (default True; False: no virtual stages, no distributed optimizer). On gloo
    (``transport`` with rendezvous) the distributed optimizer is left out (module docstring)."""
    transport = options.get("transport", NCCL)
    nccl = not transport.rendezvous and transport.ring_segment_bytes is None
    if not options.pop("features", True):  # the plain grid
        space = partial(megatron_space, virtual=(1,), overlap=MEGATRON_OVERLAP[:1])
    elif nccl:
        space = megatron_space
    else:
        space = partial(megatron_space, overlap=MEGATRON_OVERLAP[:1])
    return grid_search(
        "megatron",
        space,
        simulate_megatron,
        cluster,
        workload,
        hardware,
        layout="(tp, pp, dp, micro-batch) layout",
        **options,
    )
