"""One iteration of Sailor's training framework on a plan: the model of the runs' own framework.

The runs used Sailor's framework: Megatron-DeepSpeed with a modified DeepSpeed pipeline engine
(``deepspeed/runtime/pipe/engine.py`` of Sailor's repository) in FP32 (its ``ds_config`` has no
``fp16``/``bf16`` section and its launch scripts pass neither ``--fp16`` nor ``--bf16``). What one
iteration (``train_batch``) does, in order, timed on the profiles
(:mod:`~system.external.sailor.profile`) and the fitted links (:mod:`system.links`):

1. **Pipeline** — DeepSpeed's 1F1B ``TrainSchedule`` on every replica, replayed event by event
   (:func:`system.simulator.replay.replay_end_s` with the ``deepspeed`` program of
   ``baselines/deepspeed/schedule.py``, registered when ``baselines.deepspeed.schedule`` is
   imported, as the entry point and tests do); stage times :func:`_stage_times`, sends :func:`_p2p`.
2. **Tied gradients** — ``ReduceTiedGrads`` (:func:`_tied_grads_end_s`), then Sailor's engine's
   ``dist.barrier()``: every rank waits for the slowest pipeline.
3. **Data parallel** — ``ReduceGrads`` after the pipeline, nothing overlapped: fp32 buckets
   all-reduced over each stage's replicas (:func:`_data_parallel_s`, :func:`_allreduce_end_s`).
4. **Optimizer** — ``OptimizerStep``: AdamW, the profiled step scaled (:func:`_optimizer_s`).

Also rank 0's logged gradient reduction (:class:`PlanPrediction`) and the peak memory per GPU
(:func:`stage_memory_bytes`). Host-side overhead per micro-batch is taken as hidden: the
engine's Python issues asynchronous CUDA work and none of its per-micro-batch instructions waits
on the host, so the GPU timeline is the iteration; the engine's per-micro-batch GPU work (meta
tensors, partition and reconstruction) is charged. The loss's all-reduce and broadcast at the
end (one scalar each) are left out. No constant of this model is fitted to measured iterations.

Replicas of one stage with different TP degrees (plans of Sailor's planner, read with
``mixed_tp``) are an extension, not checked against a measured run: each at its own (GPU, tp)
profile, the all-reduce at the stage's narrowest TP degree as in Sailor's own simulator
(:func:`_p2p`, :func:`_data_parallel_s`), memory checked at every TP degree of the stage.
"""

from __future__ import annotations

import functools
import math
from collections import Counter, OrderedDict
from dataclasses import dataclass, field, replace

import numpy as np

from system.cluster import Cluster
from system.external.sailor.bandwidth import (
    BandwidthFits,
    cluster_from_nodes,
    node_pair_peak_gbps,
)
from system.external.sailor.errors import Finding
from system.external.sailor.gpus import project_gpu
from system.external.sailor.plan import SailorPlan, Stage
from system.external.sailor.profile import (
    PROFILED_TRANSFORMER_LAYERS,
    LayerSizes,
    LayerTimes,
    ModelShape,
    ModelSizes,
    Profiles,
)
from system.gpus import get_gpu
from system.links import BandwidthCurve
from system.simulator.collectives import allreduce_end_s, nccl_allreduce_end_s, ring_collective_s
from system.simulator.nccl_tuner import GPU_ARCH, NcclSystem, system_for_group, tune_allreduce
from system.simulator.replay import exact_range, replay_end_s
from system.simulator.sharing import sharing_of
from system.simulator.transfers import flow_time_s

__all__ = [
    "PlanPrediction",
    "SailorInputs",
    "predict_plan",
    "iteration_floor_s",
    "peak_memory_bytes",
    "stage_memory_bytes",
    "replicas_fit",
    "BYTES_PER_ELEMENT",
    "DP_COLLECTIVES",
]

BYTES_PER_ELEMENT = 4  # fp32 training (module docstring)
BUCKET_ELEMENTS = 500_000_000  # DeepSpeed MEMORY_OPT_ALLREDUCE_SIZE
RECV_BUFFER_BYTES = 4 * 2**20  # NCCL's default channel buffer (NCCL_BUFFSIZE)
META_BYTES = 256 * 4  # DeepSpeed's partition meta tensor (int32[<=256])
CONTEXT_BYTES = 2**30  # CUDA context + allocator slack per GPU (assumption, not fitted)
ADAM_STATE_BYTES_PER_PARAM = 16  # fp32 weight, gradient, exp_avg, exp_avg_sq
# how the data-parallel and tied-gradient all-reduces pick their algorithm (_allreduce_end_s)
DP_COLLECTIVES = ("auto", "fastest", "ring", "tree")
# iteration_floor_s's link times are computed another way than the cluster's: kept this much
# below them, so that rounding never lifts the floor above the prediction
FLOOR_ROUNDING = 1e-9


@dataclass(frozen=True, slots=True)
class SailorInputs:
    """Everything a prediction reads besides the plan."""

    profiles: Profiles
    sizes: ModelSizes
    shapes: dict[str, ModelShape]
    fits: BandwidthFits
    intra: dict[tuple[str, int], BandwidthCurve]


# The clusters :func:`plan_cluster` built last, by nodes and name (a planner predicts many plans
# on the same nodes: other micro-batches and layer splits); a cluster is immutable
_CLUSTERS: OrderedDict[tuple, tuple[SailorInputs, Cluster]] = OrderedDict()
_CLUSTERS_KEPT = 16  # a cluster of 500 GPUs holds about 8 MB of matrices
# the data-parallel all-reduces' times of the last stages (:func:`_data_parallel_kept`), by what
# decides them: a planner asks again for the other micro-batch sizes of one layout, and for a
# stage placed as in a layout it timed before
_DATA_PARALLEL: OrderedDict[tuple, tuple[SailorInputs, tuple[float, tuple[str, ...], float]]]
_DATA_PARALLEL = OrderedDict()
_DATA_PARALLEL_KEPT = 16384
# their bounds without a cluster (:func:`_stage_floor_s`), by the same key, and what NCCL
# detects of a stage's group (:func:`_stage_nccl_system`), by its node kinds
_DATA_PARALLEL_FLOORS: OrderedDict[tuple, tuple[SailorInputs, float | None]] = OrderedDict()
_NCCL_SYSTEMS: OrderedDict[tuple, tuple[SailorInputs, NcclSystem]] = OrderedDict()
# the clusters of one stage's nodes (:func:`_stage_devices`), by nodes in sorted order
_STAGE_CLUSTERS: OrderedDict[tuple, tuple[SailorInputs, tuple[Cluster, dict]]] = OrderedDict()
_STAGE_CLUSTERS_KEPT = 64


@dataclass(frozen=True, slots=True)
class PlanPrediction:
    """One plan's predicted iteration and its parts (seconds; memory in bytes).

    ``iter_time_s = pipeline_s + tied_s + dp_s + optimizer_s``: the pipeline until the
    barrier, the tied-gradient all-reduce's share past the pipeline, the data-parallel
    all-reduce, the optimizer step. ``red_grads_s = red_grads_wait_s + red_grads_collective_s``:
    rank 0's logged reduction; ``red_grads_no_barrier_s`` the same without the barrier before
    it (a sensitivity).

    The logged gradient reduction (``red_grads`` of the plans) is global rank 0's (stage 0,
    replica 0, TP rank 0 in DeepSpeed's pipe/data/model rank order) from its ``ReduceGrads``
    call to its return: the time it waits for the slowest member of its data-parallel group
    to enter the all-reduce, plus the all-reduce of its stage's buckets and their copies.
    Every rank leaves ``ReduceTiedGrads``'s barrier at the same moment, so rank 0's group
    enters together and the wait is zero; ``red_grads_no_barrier_s`` is the same reduction
    had the barrier not held the ranks (each member entering when its own pipeline and
    tied-gradient all-reduce end), a sensitivity, not the prediction.
    """

    iter_time_s: float
    pipeline_s: float
    tied_s: float
    dp_s: float
    optimizer_s: float
    peak_memory_bytes: float
    micro_batches: int
    compute_s: float  # the busiest stage's compute per iteration, m·(fwd + bwd)
    dp_algorithm: str
    red_grads_s: float = 0.0
    red_grads_wait_s: float = 0.0
    red_grads_collective_s: float = 0.0
    red_grads_no_barrier_s: float = 0.0
    dp_collective: str = "auto"
    findings: tuple[Finding, ...] = field(default=())


def _ranges(plan: SailorPlan, cluster: Cluster) -> list[list[np.ndarray]]:
    """Devices of node (s, r): its first ``tp`` GPUs, as [stage][replica] -> device array."""
    host = cluster.host_ids
    order = np.argsort(host, kind="stable")  # devices by host, each host's in index order
    nodes = np.arange(plan.pp * plan.dp)
    first = np.searchsorted(host[order], nodes)
    after = np.searchsorted(host[order], nodes, side="right")
    out = []
    for s, st in enumerate(plan.stages):
        row = []
        for r, rep in enumerate(st.replicas):
            k = s * plan.dp + r
            row.append(order[first[k] : min(first[k] + rep.tp, after[k])])
        out.append(row)
    return out


def _layer_flops_fwd(shape: ModelShape, mbs: int, tp: int) -> float:
    """Forward FLOPs of one transformer layer per GPU: (24·s·h² + 4·s²·h)·mbs / tp."""
    s, h = shape.seq_length, shape.hidden_size
    return (24.0 * s * h * h + 4.0 * s * s * h) * mbs / tp


def head_is_tied(sizes_tp1: LayerSizes, shape: ModelShape) -> bool:
    """Whether the last layer holds no output projection (less than half of V·h parameters)."""
    return bool(sizes_tp1.params[-1] < 0.5 * shape.vocab_size * shape.hidden_size)


def tied_head_times_s(
    times: LayerTimes, sizes: LayerSizes, shape: ModelShape, mbs: int, tp: int
) -> tuple[float, float, float]:
    """(fwd_s, bwd_s, FLOPs per GPU) of the logit GEMM a tied-head profile leaves out.

    The padded vocabulary per GPU is the embedding's word rows: layer 0's parameters / h − s
    (position embeddings). Rate: the first transformer layer's profiled FLOP rate.
    """
    h, s = shape.hidden_size, shape.seq_length
    vocab_per_gpu = sizes.params[0] / h - s
    flops = 2.0 * s * h * vocab_per_gpu * mbs
    layer = _layer_flops_fwd(shape, mbs, tp)
    fwd_rate = layer / times.fwd_s[1]
    bwd_rate = 2.0 * layer / times.bwd_s[1]
    return flops / fwd_rate, 2.0 * flops / bwd_rate, flops


def _stage_times(plan, inputs, s, r, findings) -> tuple[float, float]:
    """(forward s, backward s) per micro-batch of stage ``s`` in replica ``r``: the sum of its
    layers' profiled times at (GPU, mbs, tp). A model whose last profiled layer holds no output
    projection (its head tied to the embedding) gets the logit GEMM, 2·s·h·V/tp FLOPs per
    sequence forward and twice that backward, at the FLOP rate its profiled transformer layer
    reaches on that GPU at that shape (:func:`tied_head_times_s`)."""
    st, rep = plan.stages[s], plan.stages[s].replicas[r]
    times = inputs.profiles.get(plan.model, rep.gpu, plan.mbs, rep.tp)
    if times.num_layers != inputs.shapes[plan.model].num_all_layers:
        raise ValueError(
            f"{inputs.profiles.source}: [{plan.model}][{rep.gpu}][{plan.mbs}][{rep.tp}]: "
            f"{times.num_layers} layers, the model has {inputs.shapes[plan.model].num_all_layers}"
        )
    idx = np.asarray(st.layers)
    f = float(times.fwd_s[idx].sum())
    b = float(times.bwd_s[idx].sum())
    shape = inputs.shapes[plan.model]
    last = shape.num_all_layers - 1
    if last in st.layers and head_is_tied(inputs.sizes.get(plan.model, 1), shape):
        hf, hb, flops = tied_head_times_s(
            times, inputs.sizes.get(plan.model, rep.tp), shape, plan.mbs, rep.tp
        )
        f, b = f + hf, b + hb
        findings.add(
            Finding(
                inputs.profiles.source,
                f"[{plan.model}][*][*][*][{last}]",
                "the last layer holds no output projection (tied to the embedding) and its "
                "profile leaves out the logit GEMM; added at the profiled transformer layer's "
                f"FLOP rate ({flops / 1e9:.0f} GFLOP per GPU per micro-batch forward here)",
            )
        )
    return f, b


def _all_stage_times(plan, inputs, findings) -> tuple[np.ndarray, np.ndarray]:
    """(forward, backward) s per micro-batch of every (stage, replica), (p, dp) each
    (:func:`_stage_times`, asked once per (stage, GPU, tp): a stage's replicas of one kind
    take the same times)."""
    fwd = np.zeros((plan.pp, plan.dp))
    bwd = np.zeros((plan.pp, plan.dp))
    for s, st in enumerate(plan.stages):
        seen: dict[tuple[str, int], tuple[float, float]] = {}
        for r, rep in enumerate(st.replicas):
            kind = (rep.gpu, rep.tp)
            if kind not in seen:
                seen[kind] = _stage_times(plan, inputs, s, r, findings)
            fwd[s, r], bwd[s, r] = seen[kind]
    return fwd, bwd


def _pairs_apart(cluster: Cluster) -> bool:
    """Whether flows on different device pairs share nothing (``pair`` sharing and no host NIC
    caps: every cluster built from Sailor's fits), so that the transfers of replicas on disjoint
    devices may be timed in one call, with the numbers each replica's own call gives."""
    return sharing_of(cluster).model == "pair" and cluster.host_nic_gbps is None


def _boundary(plan, inputs, devs, s) -> tuple[list, np.ndarray, dict]:
    """The sends of boundary s -> s+1 as :func:`_p2p` describes them: per replica its flows
    (sending devices, receiving devices), the bytes each of its flows carries, and the
    receivers' all-gathers by width ((replica, devices, full bytes) each)."""
    dp = plan.dp
    flows, parts = [], np.zeros(dp)
    rings: dict[int, list[tuple[int, np.ndarray, float]]] = {}  # receivers' gathers, by width
    for r in range(dp):
        rep = plan.stages[s].replicas[r]
        nxt = plan.stages[s + 1].replicas[r]
        full = _activation_bytes(plan, inputs, s, r)
        parts[r] = full / rep.tp
        src, dst = devs[s][r], devs[s + 1][r]
        if src.size > dst.size:  # a wider TP group sends to a narrower one: every part is sent
            dst = dst[np.arange(src.size) % dst.size]
        if nxt.tp > 1:
            rings.setdefault(dst.size, []).append((r, dst, full))
        k = min(src.size, dst.size)
        flows.append((src[:k], dst[:k]))
    return flows, parts, rings


def _activation_bytes(plan, inputs, s, r) -> float:
    """Bytes of the activation replica r's stage s sends across boundary s -> s+1, all its TP
    ranks' parts together (:func:`_p2p`)."""
    tp = plan.stages[s].replicas[r].tp
    last = plan.stages[s].layers[-1]
    return inputs.sizes.get(plan.model, tp).act_output[last] * plan.mbs * BYTES_PER_ELEMENT


def _slowest_flow_s(cluster, flows, nbytes, apart: bool) -> np.ndarray:
    """Per replica, its slowest flow's seconds for ``nbytes`` (one value per replica, or one
    for all): each replica's flows as one concurrent set, or, where flows on different device
    pairs share nothing (``apart``), every replica's flows in one call (the same numbers)."""
    sizes = np.broadcast_to(np.asarray(nbytes, dtype=float), (len(flows),))
    if not apart:
        pairs = zip(flows, sizes, strict=True)
        return np.array([flow_time_s(cluster, a, b, n).max() for (a, b), n in pairs])
    src = np.concatenate([a for a, _ in flows])
    dst = np.concatenate([b for _, b in flows])
    counts = [a.size for a, _ in flows]
    times = flow_time_s(cluster, src, dst, np.repeat(sizes, counts))
    return np.array([t.max() for t in np.split(times, np.cumsum(counts)[:-1])])


def _p2p(plan, inputs, cluster, devs, s) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per replica r of boundary s -> s+1: (link busy s, sender-side buffer s, receiver
    all-gather s), each (dp,).

    The engine partitions each activation (and each input gradient) over the sending stage's
    TP group (DeepSpeed's ``PartitionedTensor``), every TP rank sends its part and a small meta
    tensor to its peer, and the receiving node all-gathers the parts (``reconstruct_tensor``)
    before using them: fp32, ``act_output`` elements of the stage's last layer per sequence.
    The sends are NCCL point-to-point over the fitted links, which moves data only into receive
    buffers the receiver has posted (``rendezvous`` in the replay; 4 MiB may leave early). A
    wider TP group sending to a narrower one (``mixed_tp``) sends every part, rank ``t`` to
    rank ``t mod tp`` of the receiver (whose all-gather then runs over the parts, rank ``t``
    receiving for part ``t``). Each replica's sends, and each receiver's all-gather, are timed as
    one set of concurrent flows; the replicas use disjoint devices, so where flows on different
    device pairs share nothing (:func:`_pairs_apart`) all replicas are timed in one call (the
    all-gathers: one per width), with the same numbers.
    """
    apart = _pairs_apart(cluster)
    flows, parts, rings = _boundary(plan, inputs, devs, s)
    gather = np.zeros(plan.dp)
    for same in rings.values():  # each receiver's all-gather alone, or all of a width at once
        for part in [same] if apart else [[x] for x in same]:
            rs = [r for r, _, _ in part]
            ring = np.stack([d for _, d, _ in part])
            sizes = np.array([f for _, _, f in part])
            gather[rs] = ring_collective_s(cluster, ring, sizes, kind="allgather")
    data = _slowest_flow_s(cluster, flows, parts, apart)
    meta = _slowest_flow_s(cluster, flows, META_BYTES, apart)
    busy = data + meta
    buffer = data * np.minimum(RECV_BUFFER_BYTES / parts, 1.0)
    return busy, buffer, gather


def plan_cluster(plan: SailorPlan, inputs: SailorInputs) -> Cluster:
    """The cluster of ``plan``'s nodes on ``inputs``' link fits
    (:func:`~system.external.sailor.bandwidth.cluster_from_nodes`), kept for the next plans on
    the same nodes."""
    key = (tuple(plan.nodes()), plan.file)
    hit = _CLUSTERS.get(key)
    if hit is not None and hit[0] is inputs:
        _CLUSTERS.move_to_end(key)
        return hit[1]
    cluster = cluster_from_nodes(list(key[0]), inputs.fits, inputs.intra, name=plan.file)
    _CLUSTERS[key] = (inputs, cluster)
    while len(_CLUSTERS) > _CLUSTERS_KEPT:
        _CLUSTERS.popitem(last=False)
    return cluster


def predict_plan(
    plan: SailorPlan, inputs: SailorInputs, *, dp_collective: str = "auto"
) -> PlanPrediction:
    """One iteration of ``plan`` (module docstring); ``dp_collective`` one of
    :data:`DP_COLLECTIVES`."""
    if dp_collective not in DP_COLLECTIVES:
        raise ValueError(
            f"dp_collective must be one of {', '.join(DP_COLLECTIVES)}, got {dp_collective!r}"
        )
    cluster = plan_cluster(plan, inputs)
    devs = _ranges(plan, cluster)
    p, dp, m = plan.pp, plan.dp, plan.micro_batches
    findings: set[Finding] = set(plan.findings)
    fwd, bwd = _all_stage_times(plan, inputs, findings)
    compute_s = float((m * (fwd + bwd)).max())
    busy = np.zeros((max(p - 1, 0), dp))
    buf = np.zeros((max(p - 1, 0), dp))
    for s in range(p - 1):
        busy[s], buf[s], gather = _p2p(plan, inputs, cluster, devs, s)
        fwd[s + 1] += gather  # the receiver rebuilds the activation before its forward
        bwd[s] += gather  # and the input gradient before its backward
    ends = replay_end_s(
        fwd,
        bwd,
        busy,
        busy,
        np.zeros_like(busy),
        np.zeros_like(busy),
        micro_batches=m,
        schedule="deepspeed",
        rendezvous=True,
        buffer_fwd_s=buf,
        buffer_bwd_s=buf,
    )
    pipeline_s = float(ends.max())
    tied_end = _tied_grads_end_s(plan, inputs, cluster, devs, ends, dp_collective)
    barrier_s = max(pipeline_s, float(tied_end.max()))
    dp_s, algo, rank0_s = _data_parallel_kept(plan, inputs, dp_collective)
    opt_s = _optimizer_s(plan, inputs)
    # rank 0's group (stage 0, TP rank 0) without the barrier: member r enters when replica r's
    # stage 0 is past its pipeline and its tied-gradient all-reduce
    entered = np.maximum(ends[0], tied_end)
    no_barrier_wait = float(entered.max() - entered[0])
    return PlanPrediction(
        iter_time_s=barrier_s + dp_s + opt_s,
        pipeline_s=pipeline_s,
        tied_s=barrier_s - pipeline_s,
        dp_s=dp_s,
        optimizer_s=opt_s,
        peak_memory_bytes=peak_memory_bytes(plan, inputs),
        micro_batches=m,
        compute_s=compute_s,
        dp_algorithm=algo,
        red_grads_s=rank0_s,
        red_grads_wait_s=0.0,  # every rank leaves ReduceTiedGrads's barrier together
        red_grads_collective_s=rank0_s,
        red_grads_no_barrier_s=no_barrier_wait + rank0_s,
        dp_collective=dp_collective,
        findings=tuple(sorted(findings, key=str)),
    )


def iteration_floor_s(
    plan: SailorPlan, inputs: SailorInputs, *, dp_collective: str = "auto", above: float = math.inf
) -> float:
    """A lower bound on ``predict_plan(plan, inputs, dp_collective=...).iter_time_s`` that
    skips the pipeline's replay, its meta sends, all-gathers and tied gradients: the
    data-parallel all-reduce and the optimizer step as :func:`predict_plan` times them, after a
    bound on the pipeline.

    The pipeline bound reads the replay's rules (:mod:`system.simulator.replay`): a stage runs
    its program's ops one at a time; with ``rendezvous`` a message starts no earlier than its
    receiver posted the receive, so a receive lasts at least the message's link time ``d``
    (its data, without the meta tensor), and a send lasts at least ``d − buffer``. ``d`` is
    read off the sending node's fit to the receiving node (:meth:`BandwidthCurve.time_s`, one
    flow's time when each of its GPUs sends at once), without building the plan's cluster: a
    flow there runs at most at that fit's per-flow bandwidth (its pair's peak is the smaller of
    the two directions', its rate never above its pair's), so it takes at least that long.
    Per replica, stage ``s`` receives and sends once per micro-batch on each of its boundaries,
    so its ops take at least ``occ_s = m·(f_s + b_s) + m·Σ_(its boundaries) (2d − buffer)``. Its
    first op is the receive of micro-batch 0, which lands no earlier than ``Σ_(k<s) (f_k +
    d_k)``: the first op's own ``d`` counted in ``occ_s``, its last backward ends at ``E_s >=
    Σ_(k<s) f_k + Σ_(k<s−1) d_k + occ_s − (d_(s−1) − buffer_(s−1))`` (its last send may come
    after it). That backward's gradient then goes down to stage 0, at least ``Σ_(k<s) (d_k +
    b_k)`` more, so stage 0 ends no earlier than the largest of these, and the pipeline (the
    latest stage end) with it. The all-gathers a receiver adds to its compute only lengthen
    ``f`` and ``b``; they are left out. Past :func:`replay_end_s`'s exact range
    (:func:`~system.simulator.replay.exact_range`) the replay is extrapolated (within 1% of
    the exact one), so there only the busiest stage's compute ``m·(f + b)`` is charged.

    Where the pipeline and the optimizer step alone reach ``above``, their sum is returned
    without building the plan's cluster or timing the all-reduce (still a lower bound, and a
    caller's answer already); so is their sum with the all-reduce's bound built without a
    cluster (:func:`_data_parallel_floor_s`) where that reaches ``above``. Otherwise the
    all-reduce is timed, each stage's cluster built only where the all-reduce of its nodes,
    layers and TP degrees has not been timed before (:func:`_data_parallel_kept`)."""
    p, m = plan.pp, plan.micro_batches
    f, b = _all_stage_times(plan, inputs, set())
    pipeline = float((m * (f + b)).max())
    if p > 1 and m <= exact_range(p, schedule="deepspeed", rendezvous=True):
        d = np.zeros((p - 1, plan.dp))
        parts = np.zeros((p - 1, plan.dp))
        for s in range(p - 1):
            # a boundary's replicas repeat a few (sender, receiver) kinds: each timed once
            pairs = list(zip(plan.stages[s].replicas, plan.stages[s + 1].replicas, strict=True))
            kinds: dict[tuple, int] = {}
            codes = [kinds.setdefault(k, len(kinds)) for k in pairs]
            values = np.empty((len(kinds), 2))
            for (here, there), k in kinds.items():
                part = _activation_bytes(plan, inputs, s, pairs.index((here, there))) / here.tp
                curve = inputs.fits.curve(here.node, there.node)
                values[k] = part, _curve_time_s(curve, part)
            parts[s], d[s] = values[codes].T
        d *= 1.0 - FLOOR_ROUNDING
        x = d * (1.0 - np.minimum(RECV_BUFFER_BYTES / parts, 1.0))
        comm = d + x  # per boundary and micro-batch: a receive and a send
        occ = m * (f + b)
        occ[:-1] += m * comm
        occ[1:] += m * comm
        zero = np.zeros((1, plan.dp))
        head = np.cumsum(np.vstack([zero, f[:-1]]), axis=0)
        head[2:] += np.cumsum(d[:-1], axis=0)
        tail = np.cumsum(np.vstack([zero, d + b[:-1]]), axis=0)
        last = np.vstack([zero, x])  # the last send of a stage may come after its backward
        pipeline = max(pipeline, float((head + occ - last + tail).max()))
    floor = pipeline + _optimizer_s(plan, inputs)
    if floor >= above:
        return floor
    cheap = _data_parallel_floor_s(plan, inputs, dp_collective)
    if cheap is not None and floor + cheap >= above:
        return floor + cheap
    return floor + _data_parallel_kept(plan, inputs, dp_collective)[0]


def nccl_tuner_algorithms(cluster: Cluster, groups: np.ndarray, nbytes: float) -> list[str]:
    """The all-reduce algorithm NCCL's tuner picks for each communicator (a row of ``groups``)
    from what NCCL sees of it — its ranks, nodes (hosts), GPUs and NICs
    (:func:`system.simulator.nccl_tuner.system_for_group`) — and the message size."""
    return [tune_allreduce(system_for_group(cluster, g), float(nbytes)).algorithm for g in groups]


def _allreduce_end_s(cluster, groups, nbytes, entry, dp_collective) -> tuple[np.ndarray, list]:
    """(G, n) end times of G concurrent all-reduces, each group one communicator, and each
    group's algorithm, as ``dp_collective`` picks it: ``auto``, the one NCCL's tuner picks from
    its own constants for the group's ranks, nodes and message size
    (:mod:`system.simulator.nccl_tuner`; every group here has one rank per node); ``fastest``,
    ring or tree, whichever ends first on the fitted links
    (:func:`system.simulator.collectives.nccl_allreduce_end_s`); ``ring`` or ``tree`` forced."""
    g = np.asarray(groups, dtype=int)
    if dp_collective == "fastest":
        return nccl_allreduce_end_s(cluster, g, nbytes, entry)
    picks = _picks(
        g.shape[1], g.shape[0], dp_collective, lambda: nccl_tuner_algorithms(cluster, g, nbytes)
    )
    unknown = sorted(set(picks) - {"ring", "tree"})
    if unknown:
        raise ValueError(f"all-reduce: no timing for NCCL's {', '.join(unknown)} algorithm")
    # each algorithm timed for all groups at once (their flows share the links), then each
    # group keeps its own algorithm's times
    ends = {a: allreduce_end_s(cluster, g, nbytes, entry, a)[0] for a in sorted(set(picks))}
    end = np.stack([ends[a][i] for i, a in enumerate(picks)])
    return end, picks


def _picks(ranks: int, groups: int, dp_collective: str, tuned) -> list[str]:
    """The algorithm each of ``groups`` groups of ``ranks`` runs under ``dp_collective`` (not
    ``fastest``): the ring for fewer than three ranks (a tree of two ranks is the ring,
    :mod:`system.simulator.collectives`), NCCL's tuner's picks (``tuned()``) under ``auto``,
    else the one named."""
    if ranks < 3:
        return ["ring"] * groups
    if dp_collective == "auto":
        return list(tuned())
    return [dp_collective] * groups


def _tied_grads_end_s(plan, inputs, cluster, devs, ends, dp_collective) -> np.ndarray:
    """Per replica, when its first/last stage pair has all-reduced the tied word-embedding
    gradient (``ReduceTiedGrads``; zeros where the model has no tied head or the pipeline one
    stage). Sailor's engine then calls ``dist.barrier()`` ("for measurements"), so every rank
    waits for the slowest replica (:func:`predict_plan`)."""
    shape = inputs.shapes[plan.model]
    out = np.zeros(plan.dp)
    if plan.pp == 1 or not head_is_tied(inputs.sizes.get(plan.model, 1), shape):
        return out
    apart = _pairs_apart(cluster)
    calls: dict[tuple, list[tuple[int, np.ndarray, np.ndarray]]] = {}  # by message bytes
    for r in range(plan.dp):
        a, b = devs[0][r], devs[-1][r]
        k = min(a.size, b.size)
        tp = plan.stages[0].replicas[r].tp
        words = inputs.sizes.get(plan.model, tp).params[0] / shape.hidden_size - shape.seq_length
        nbytes = words * shape.hidden_size * BYTES_PER_ELEMENT
        groups = np.stack([a[:k], b[:k]], axis=1)
        entry = np.tile([ends[0, r], ends[-1, r]], (k, 1))
        calls.setdefault((nbytes, None if apart else r), []).append((r, groups, entry))
    # each replica's all-reduces alone, or, where flows on different device pairs share
    # nothing (:func:`_pairs_apart`), every replica's of one size at once: the same numbers
    for (nbytes, _), same in calls.items():
        groups = np.concatenate([g for _, g, _ in same])
        entry = np.concatenate([e for _, _, e in same])
        done, _ = _allreduce_end_s(cluster, groups, nbytes, entry, dp_collective)
        rows = np.cumsum([g.shape[0] for _, g, _ in same])[:-1]
        for (r, _, _), d in zip(same, np.split(done, rows), strict=True):
            out[r] = float(d.max())
    return out


def _stage_params(plan: SailorPlan, inputs: SailorInputs, s: int) -> float:
    """Parameters per GPU of stage ``s`` at its narrowest TP degree (one all-reduce group per
    TP rank of the narrowest replica, as Sailor's own simulator reduces a stage)."""
    tp = min(rep.tp for rep in plan.stages[s].replicas)
    return float(inputs.sizes.get(plan.model, tp).params[list(plan.stages[s].layers)].sum())


def _stage_buckets(plan: SailorPlan, inputs: SailorInputs, s: int) -> tuple[int, float, float]:
    """Stage ``s``'s gradient buckets (:func:`_data_parallel_s`): (how many, bytes each, the
    seconds of one bucket's flatten and unflatten copies, each a read and a write at the
    slowest replica's memory bandwidth)."""
    params = _stage_params(plan, inputs, s)
    buckets = max(1, math.ceil(params / BUCKET_ELEMENTS))
    nbytes = params * BYTES_PER_ELEMENT / buckets
    hbm = min(
        get_gpu(project_gpu(gpu, plan.file, "gpu")).hbm_bandwidth_bps
        for gpu in {rep.gpu for rep in plan.stages[s].replicas}
    )
    return buckets, nbytes, 2 * 2 * 8.0 * nbytes / hbm


def _data_parallel_s(plan, inputs, cluster, devs, s, dp_collective) -> tuple[float, list, float]:
    """Stage ``s``'s all-reduce (fp32 buckets of 5e8 elements, one after the other), every
    member entering at once: (its seconds, the algorithms used, its TP rank 0's seconds).

    ``ReduceGrads`` flattens each stage's gradients into buckets of DeepSpeed's
    ``MEMORY_OPT_ALLREDUCE_SIZE`` elements and all-reduces them over the stage's replicas, one
    NCCL all-reduce per TP rank index, all at once, after the pipeline: the pipeline engine
    turns DeepSpeed's backward-overlapped reduction off, so nothing overlaps. Each bucket also
    pays its flatten and unflatten copies at the GPU's memory bandwidth; a stage without
    replicas still flattens, all-reduces over its one rank and copies back (DeepSpeed's
    ``buffered_allreduce_fallback`` makes no exception for dp = 1), so it pays the copies.
    With mixed TP degrees (``mixed_tp``) one group runs per TP rank of the narrowest replica,
    over the stage's parameters at that width: a tp = 1 replica's GPU sends the whole stage's
    gradients, its link the bottleneck; a wider replica's first ranks stand for it, the gather
    inside its node left out."""
    st = plan.stages[s]
    buckets, nbytes, copies = _stage_buckets(plan, inputs, s)
    tp = min(rep.tp for rep in st.replicas)  # uniform TP: the stage's
    groups = np.array([[devs[s][r][t] for r in range(plan.dp)] for t in range(tp)])
    used: list = []
    if plan.dp > 1:
        done, used = _allreduce_end_s(
            cluster, groups, nbytes, np.zeros(groups.shape), dp_collective
        )
    else:
        done = np.zeros(groups.shape)
    return buckets * (float(done.max()) + copies), used, buckets * (float(done[0, 0]) + copies)


def _data_parallel_floor_s(plan: SailorPlan, inputs: SailorInputs, dp_collective: str):
    """A lower bound on :func:`_data_parallel_kept`'s seconds that builds no cluster: the
    longest stage's kept seconds where it was timed, else its :func:`_stage_floor_s`; None
    where a stage has no such bound."""
    worst = 0.0
    for s in range(plan.pp):
        key = _data_parallel_key(plan, inputs, s, dp_collective)
        hit = _DATA_PARALLEL.get(key)
        if hit is not None and hit[0] is inputs:
            worst = max(worst, hit[1][0])
            continue
        hit = _DATA_PARALLEL_FLOORS.get(key)
        if hit is not None and hit[0] is inputs:
            got = hit[1]
        else:
            got = _stage_floor_s(plan, inputs, s, dp_collective)
            _DATA_PARALLEL_FLOORS[key] = (inputs, got)
            while len(_DATA_PARALLEL_FLOORS) > _DATA_PARALLEL_KEPT:
                _DATA_PARALLEL_FLOORS.popitem(last=False)
        if got is None:
            return None
        worst = max(worst, got)
    return worst


def _stage_floor_s(plan: SailorPlan, inputs: SailorInputs, s: int, dp_collective: str):
    """A lower bound on stage ``s``'s all-reduce (:func:`_data_parallel_s`) read off its nodes'
    fits, no cluster built; None where its groups would run the tree or ``dp_collective`` is
    ``fastest`` (no cheap bound: the caller times the all-reduce).

    The groups' algorithm is picked as :func:`_allreduce_end_s` picks it (:func:`_picks`;
    NCCL's tuner from :func:`_stage_nccl_system`). The ring's 2·(n − 1) steps each last as
    long as its slowest flow of ``nbytes / n`` from a replica's node to the next one's
    (:func:`~system.simulator.collectives.ring_collective_s`), and a flow between two nodes
    takes at least its fit's :meth:`~system.links.BandwidthCurve.time_s` (as
    :func:`iteration_floor_s` argues for the pipeline's messages), so the stage takes at least
    ``buckets·(2·(n − 1)·max_r t_r + copies)``; a stage without replicas pays its copies
    alone, as timed."""
    stage = plan.stages[s]
    buckets, nbytes, copies = _stage_buckets(plan, inputs, s)
    n = plan.dp
    if n == 1:
        return buckets * copies
    if dp_collective == "fastest":
        return None
    node_of = {rep: rep.node for rep in dict.fromkeys(stage.replicas)}  # a few kinds
    nodes = [node_of[rep] for rep in stage.replicas]
    tuned = lambda: [_tuned_algorithm(_stage_nccl_system(nodes, inputs), nbytes)]  # noqa: E731
    if _picks(n, 1, dp_collective, tuned)[0] != "ring":
        return None
    edges = dict.fromkeys(zip(nodes, nodes[1:] + nodes[:1], strict=True))
    step = max(_curve_time_s(inputs.fits.curve(a, b), nbytes / n) for a, b in edges)
    return buckets * (2 * (n - 1) * step * (1.0 - FLOOR_ROUNDING) + copies)


@functools.lru_cache(maxsize=1 << 14)
def _tuned_algorithm(system, nbytes: float) -> str:
    """NCCL's tuner's all-reduce algorithm for ``system`` and ``nbytes``, kept."""
    return tune_allreduce(system, nbytes).algorithm


@functools.lru_cache(maxsize=1 << 16)
def _curve_time_s(curve: BandwidthCurve, nbytes: float) -> float:
    """``curve.time_s(nbytes)``, kept per (curve, size)."""
    return float(curve.time_s(nbytes))


def _stage_nccl_system(nodes: list, inputs: SailorInputs):
    """What :func:`~system.simulator.nccl_tuner.system_for_group` detects for a data-parallel
    group of a stage on ``nodes`` (one replica each) on the cluster of those nodes
    (:func:`_stage_devices`), read off the nodes without building that cluster: one rank on
    each node (PCIe between a node's GPUs, none of them in the group twice), the slowest GPU
    arch, and as the NIC the least over the nodes of the fastest link from one to another of
    them (:func:`~system.external.sailor.bandwidth.node_pair_peak_gbps`, the cluster's pair
    peak). Kept per (node kinds, the kinds on more than one node, nodes)."""
    count = Counter(nodes)
    kinds = tuple(sorted(count, key=_node_order))
    key = (kinds, tuple(k for k in kinds if count[k] > 1), len(nodes))
    hit = _NCCL_SYSTEMS.get(key)
    if hit is not None and hit[0] is inputs:
        return hit[1]
    fits = inputs.fits
    egress = []
    for a in kinds:
        others = (node_pair_peak_gbps(fits, a, b) for b in kinds if b != a or count[a] > 1)
        out = max(others, default=0.0)
        if out > 0:
            egress.append(out)
    types = [project_gpu(k.gpu, fits.source, "gpu") for k in kinds]
    unknown = sorted(set(types) - set(GPU_ARCH))
    if unknown:
        raise ValueError(f"NCCL communicator: no compute capability known for GPU {unknown[0]!r}")
    system = NcclSystem(
        len(nodes),
        len(nodes),
        arch=min(GPU_ARCH[t] for t in types),
        intra="pci",
        net_gbps=min(egress) if egress else 100.0,
        nvlinks=1,
        gpu_nic_path="PHB",
        uniform_arch=len({GPU_ARCH[t] for t in types}) == 1,
    )
    _NCCL_SYSTEMS[key] = (inputs, system)
    while len(_NCCL_SYSTEMS) > _DATA_PARALLEL_KEPT:
        _NCCL_SYSTEMS.popitem(last=False)
    return system


def _stage_devices(stage: Stage, plan: SailorPlan, inputs: SailorInputs):
    """(a cluster holding one stage's nodes, the devices of each of its replicas there: the
    first ``tp`` GPUs of its node). The cluster (:func:`~system.external.sailor.bandwidth.
    cluster_from_nodes`) holds the nodes in sorted order, so the stages on the same nodes in
    any order share it (kept for the next ones); a replica takes the next node of its kind."""
    nodes = tuple(r.node for r in stage.replicas)
    key = (tuple(sorted(nodes, key=_node_order)), plan.file)
    hit = _STAGE_CLUSTERS.get(key)
    if hit is not None and hit[0] is inputs:
        _STAGE_CLUSTERS.move_to_end(key)
        cluster, first = hit[1]
    else:
        cluster = cluster_from_nodes(list(key[0]), inputs.fits, inputs.intra, name=plan.file)
        first = {}  # per node kind: its first device in the sorted order
        offset = 0
        for node in key[0]:
            first.setdefault(node, offset)
            offset += node.gpus
        _STAGE_CLUSTERS[key] = (inputs, (cluster, first))
        while len(_STAGE_CLUSTERS) > _STAGE_CLUSTERS_KEPT:
            _STAGE_CLUSTERS.popitem(last=False)
    taken: dict = {}
    devs = []
    for rep, node in zip(stage.replicas, nodes, strict=True):
        k = taken.get(node, 0)
        taken[node] = k + 1
        start = first[node] + k * node.gpus
        devs.append(np.arange(start, start + min(rep.tp, node.gpus)))
    return cluster, [devs]


def _node_order(node) -> tuple:
    return (node.zone, node.gpu, node.gpus)


def _data_parallel_key(plan: SailorPlan, inputs: SailorInputs, s: int, dp_collective: str):
    """What :func:`_data_parallel_s` reads of stage ``s``: its replicas' nodes (they decide the
    devices, their links and memory bandwidth) and TP degrees, its parameters per GPU (the
    buckets: stages of other layers but as many parameters are timed once) and the
    collective."""
    return (plan.stages[s].replicas, _stage_params(plan, inputs, s), dp_collective)


def _data_parallel_kept(plan, inputs, dp_collective) -> tuple[float, str, float]:
    """The data-parallel all-reduce after the pipeline: (the longest stage's seconds, the
    algorithms used, rank 0's own seconds: stage 0, TP rank 0). Each stage's all-reduce
    (:func:`_data_parallel_s`) is timed on the cluster of that stage's nodes alone: its groups
    hold only those nodes' devices and their flows share only those nodes' pairs' curves
    (``cluster_from_nodes`` gives each pair its kinds' curve whatever the other nodes), so it
    is the same on the plan's whole cluster. It is kept per :func:`_data_parallel_key`, so the
    same stage gives the same numbers in every plan that holds it."""
    worst, algos, rank0 = 0.0, set(), 0.0
    for s, stage in enumerate(plan.stages):
        key = _data_parallel_key(plan, inputs, s, dp_collective)
        hit = _DATA_PARALLEL.get(key)
        if hit is not None and hit[0] is inputs:
            _DATA_PARALLEL.move_to_end(key)
            seconds, used, own = hit[1]
        else:
            cluster, devs = _stage_devices(stage, plan, inputs)
            one = replace(plan, stages=(stage,))
            seconds, got, own = _data_parallel_s(one, inputs, cluster, devs, 0, dp_collective)
            used = tuple(got)
            _DATA_PARALLEL[key] = (inputs, (seconds, used, own))
            while len(_DATA_PARALLEL) > _DATA_PARALLEL_KEPT:
                _DATA_PARALLEL.popitem(last=False)
        worst = max(worst, seconds)
        algos.update(used)
        if s == 0:
            rank0 = own
    return worst, "+".join(sorted(algos)) or "none", rank0


def _optimizer_s(plan: SailorPlan, inputs: SailorInputs) -> float:
    """Slowest stage's AdamW step: the profiled model's step scaled by parameters. The
    profile's optimizer time is that of the profiled model (embedding, two transformer layers
    and the last layer, Sailor's ``profile.sh``); Adam is memory-bound, linear in the
    parameters it updates."""
    worst = 0.0
    n = PROFILED_TRANSFORMER_LAYERS
    for s, st in enumerate(plan.stages):
        params = _stage_params(plan, inputs, s)
        for gpu, tp in dict.fromkeys((rep.gpu, rep.tp) for rep in st.replicas):
            times = inputs.profiles.get(plan.model, gpu, plan.mbs, tp)
            sz = inputs.sizes.get(plan.model, tp).params
            profiled = sz[0] + n * sz[1] + sz[-1]
            worst = max(worst, times.profiled_opt_s * params / profiled)
    return worst


def stage_memory_bytes(plan: SailorPlan, inputs: SailorInputs, s: int, tp: int) -> float:
    """Peak bytes on one GPU of stage ``s`` in a replica of TP degree ``tp``: fp32 weights,
    gradients and Adam's two moments (16 bytes per parameter), the activations of
    ``min(p − s, m)`` micro-batches in flight (DeepSpeed's ``num_pipe_buffers``; ``act_mem``
    elements per sequence) or, if larger, the flattened gradient bucket during the all-reduce,
    and 1 GiB for the CUDA context and allocator (assumed)."""
    sizes = inputs.sizes.get(plan.model, tp)
    idx = list(plan.stages[s].layers)
    params = float(sizes.params[idx].sum())
    in_flight = min(plan.pp - s, plan.micro_batches)
    acts = in_flight * plan.mbs * float(sizes.act_mem[idx].sum()) * BYTES_PER_ELEMENT
    state = ADAM_STATE_BYTES_PER_PARAM * params
    bucket = BYTES_PER_ELEMENT * min(params, BUCKET_ELEMENTS) if plan.dp > 1 else 0.0
    return state + max(acts, bucket) + CONTEXT_BYTES


def peak_memory_bytes(plan: SailorPlan, inputs: SailorInputs) -> float:
    """Peak bytes on the fullest GPU (:func:`stage_memory_bytes`), every TP degree of a stage."""
    return max(
        stage_memory_bytes(plan, inputs, s, tp)
        for s, st in enumerate(plan.stages)
        for tp in {rep.tp for rep in st.replicas}
    )


def replicas_fit(plan: SailorPlan, inputs: SailorInputs) -> bool:
    """Whether every stage replica's GPUs hold its peak bytes (each GPU type its own memory).
    A stage's replicas of one (tp, GPU) hold the same bytes: each such kind is checked once,
    in the replicas' order."""
    for s, st in enumerate(plan.stages):
        for tp, gpu in dict.fromkeys((rep.tp, rep.gpu) for rep in st.replicas):
            limit = get_gpu(project_gpu(gpu, plan.file, "gpu")).memory_bytes
            if stage_memory_bytes(plan, inputs, s, tp) > limit:
                return False
    return True
