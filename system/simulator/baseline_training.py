"""The baselines' training simulated (Megatron-style 3D parallel, DeepSpeed pipe + ZeRO-1).

1F1B pipelines with blocking point-to-point calls, whose data-parallel replicas synchronise
with a collective after the pipeline flush (Narayanan et al., SC'21):

- ranks in launch order, ``rank = t + TP·(d + DP·s)`` (Megatron: tensor innermost, then data,
  then pipeline; DeepSpeed's PipeDataParallelTopology is the TP = 1 case), rank r on device
  ``rank_map[r]`` (default r; ``baselines.placement`` searches topology-aware maps). With TP=2,
  PP=2, DP=2 on 8 devices stage 0 holds devices 0–3 (replica 0: 0, 1; replica 1: 2, 3), stage 1
  devices 4–7, and the DP ring of (t=0, s=0) is devices [0, 2];
- tensor parallel, inside a host: 2 all-reduces of the activations (b·s·h fp16) per layer and
  micro-batch in the forward, the recomputed forward and the backward each (Shoeybi et al. 2019);
- pipeline: replayed event by event from the framework's op-order program (``schedule``,
  :func:`system.simulator.replay.replay_end_s`; the programs live in
  ``baselines/<framework>/schedule.py``), one activation and one gradient per micro-batch and
  neighbour (1/TP of it per tensor rank with Megatron's scatter/gather); the ``transport`` says
  whether a send waits for the receiver's posted receive (gloo) or goes eagerly (NCCL). Virtual
  stages (interleaved 1F1B, v > 1) run v chunks of 1/v of a stage's layers each, the last stage
  sending to the first over the wrap-around link (Korthikanti et al. 2022, §4.2.3);
- data parallel: each stage's gradients (:func:`system.workload.stage_gradient_params`, 1/TP per
  rank) reduced over its DP ranks, all groups at once, each starting when its stage's last
  replica leaves the pipeline: NCCL's pick or a forced algorithm (``dp_collective``,
  :mod:`system.simulator.collectives`), gloo's segmented ring on the CPU runs; ZeRO-1 runs a
  reduce-scatter + all-gather of the same volume and shards the optimizer state and step;
- then the tied word-embedding gradient between the first and the last stage (megatron-core's
  ``finalize_model_grads``) and Megatron's gradient-norm all-reduce (one fp32) per replica;
- overlap with a sharded optimizer on NCCL: gradient buckets reduce-scattered as the last
  backward fills them, parameters all-gathered bucket by bucket before their forward
  (:func:`_bucketed_reduce_end_s`, :func:`_gather_delay_s`).
"""

from __future__ import annotations

import functools
import math

import numpy as np

from system.cluster import Cluster
from system.simulator.collectives import (
    ALGORITHMS,
    allreduce_end_s,
    choose_allreduce,
    nccl_tuned_end_s,
    ring_allreduce_end_s,
    ring_allreduce_s,
    ring_collective_max_s,
    ring_collective_s,
    sharded_ps_p2p_s,
    two_level_block,
)
from system.simulator.hardware import V100, Hardware, StageCompute, stage_compute
from system.simulator.memory import training_memory
from system.simulator.replay import ProgramFn, program_for, replay_end_s
from system.simulator.result import SimResult
from system.simulator.sharing import link_sharing_of
from system.simulator.transfers import NCCL, Transport, flow_bandwidth_bps
from system.workload import Workload, stage_gradient_params

__all__ = [
    "DP_COLLECTIVES",
    "DP_REQUESTS",
    "dp_sync_end_s",
    "rank_grid",
    "device_grid",
    "simulate_1f1b_ring",
    "pipeline_memory_bytes",
]

# What simulate_1f1b_ring's dp_collective accepts: ``auto`` NCCL's own pick (its tuner,
# :mod:`system.simulator.nccl_tuner`), ``fastest`` the fastest under the link model (what a user
# forces with NCCL_ALGO after measuring; ``best`` is its older name), or one forced algorithm.
DP_REQUESTS = ("auto", "fastest", *ALGORITHMS)
DP_COLLECTIVES = (*DP_REQUESTS, "best")


def rank_grid(tp: int, pp: int, dp: int) -> np.ndarray:
    """Device of (stage s, replica d, tensor rank t) as a (pp, dp, tp) array, launch order.

    >>> rank_grid(2, 2, 2)[0].tolist()   # stage 0: replica 0 on devices 0, 1; replica 1 on 2, 3
    [[0, 1], [2, 3]]
    """
    return np.arange(tp * pp * dp).reshape(pp, dp, tp)


def device_grid(tp: int, pp: int, dp: int, rank_map=None) -> np.ndarray:
    """Device of (stage, replica, tensor rank), shape (pp, dp, tp): launch rank r runs on device
    ``rank_map[r]`` (default r). ValueError unless ``rank_map`` is a permutation of the devices."""
    grid = rank_grid(tp, pp, dp)
    if rank_map is None:
        return grid
    perm = np.asarray(rank_map, dtype=int)
    if perm.shape != (grid.size,) or not np.array_equal(np.sort(perm), np.arange(grid.size)):
        raise ValueError(f"rank_map must be a permutation of 0..{grid.size - 1}, got {rank_map}")
    return perm[grid]


@functools.lru_cache(maxsize=1 << 14)  # a grid asks each configuration's memory again
def pipeline_memory_bytes(
    workload: Workload,
    tp: int,
    pp: int,
    dp: int,
    *,
    optimizer_shards: int = 1,
    recompute: str = "full",
    in_flight: int | None = None,
    virtual_stages: int = 1,
) -> float:
    """Peak device memory of a 1F1B stage: stage 0 holds up to ``pp`` micro-batches in flight
    (``in_flight``: a GPipe pass's count instead, on every stage); with ``virtual_stages`` v > 1
    (interleaved 1F1B) stage 0 holds 2·(p − 1) + (v − 1)·p + 1 chunks of 1/v of its layers and
    the last stage (v − 1)·p + 1, each at most the m·v chunks of its micro-batches. Kept per
    arguments (a pure function of them)."""
    model = workload.model
    kw = dict(
        layers=model.num_layers // pp,
        micro_batch_size=workload.micro_batch_size,
        tp=tp,
        optimizer_shards=optimizer_shards,
        recompute=recompute,
    )
    first_n, last_n = (pp, 1) if in_flight is None else (in_flight, in_flight)
    if virtual_stages > 1 and in_flight is None:  # chunks in flight, in stages' worth
        v, chunks = virtual_stages, workload.micro_batches(dp) * virtual_stages
        first_n = min(2 * (pp - 1) + (v - 1) * pp + 1, chunks) / v
        last_n = min((v - 1) * pp + 1, chunks) / v
    first = training_memory(model, in_flight=first_n, embedding=True, logits=pp == 1, **kw)
    last = training_memory(model, in_flight=last_n, embedding=True, logits=True, **kw)
    return max(first.total_bytes, last.total_bytes)


def _buckets(stage_params: np.ndarray, bucket_params) -> list[np.ndarray]:
    """Per stage, the parameters of each gradient bucket, in the order backward fills them
    (full buckets of ``bucket_params`` first, the rest last; None or inf: one bucket).

    >>> [b.tolist() for b in _buckets(np.array([10.0, 4.0]), [4.0, None])]
    [[4.0, 4.0, 2.0], [4.0]]
    """
    size = np.broadcast_to(
        np.asarray(np.inf if bucket_params is None else bucket_params, dtype=float),
        stage_params.shape,
    )
    return list(_bucket_split(tuple(stage_params.tolist()), tuple(size.tolist())))


@functools.lru_cache(maxsize=4096)  # a grid asks the same few splits again and again
def _bucket_split(params: tuple[float, ...], sizes: tuple[float, ...]) -> tuple[np.ndarray, ...]:
    """:func:`_buckets` of plain floats (NaN size: one bucket); read-only arrays, shared."""
    out = []
    for n, b in zip(params, sizes, strict=True):
        b = math.inf if math.isnan(b) else b
        full = int(n // b) if math.isfinite(b) and b < n else 0
        rest = n - full * b if full else n
        split = np.array([b] * full + ([rest] if rest > 0 or not full else []), dtype=float)
        split.flags.writeable = False
        out.append(split)
    return tuple(out)


def _per_size(
    cluster: Cluster, ring: np.ndarray, sizes: np.ndarray, bytes_per: float, kind: str
) -> dict[float, float]:
    """Seconds of the ``kind`` ring collective over ``ring`` (the rings of a stage's tensor
    ranks, at once) of ``bytes_per``·n bytes, for each distinct bucket size n in ``sizes`` (a
    stage's buckets are all of one size but the last: each is timed once)."""
    distinct = tuple(dict.fromkeys(sizes.tolist()))
    took = ring_collective_max_s(cluster, ring, [bytes_per * n for n in distinct], kind=kind)
    return dict(zip(distinct, took, strict=True))


def _gather_delay_s(
    cluster: Cluster, rings: np.ndarray, buckets: list[np.ndarray], f: np.ndarray, tp: int
) -> np.ndarray:
    """Per stage, how long its first forward is held by the parameter all-gathers of
    ``overlap_param_gather`` (fp16 parameters, bucket by bucket from the iteration's start, each
    before the forward of its layers: megatron-core's forward pre-hook ``finish_param_sync``):
    the end of that forward with the gathers, less its end without. A stage starts its first op
    once the gathers its first forward waits for are done, as that forward would have finished
    without them (its later chunks' gathers counted there too, for an interleaved stage)."""
    pp = len(buckets)
    out = np.zeros(pp)
    for s in range(pp):
        ring = rings[s * tp : (s + 1) * tp]  # the stage's tensor ranks' rings, at once
        took = _per_size(cluster, ring, buckets[s], 2.0, "allgather")
        total = buckets[s].sum()
        gathered = done = 0.0
        for n in buckets[s]:
            gathered += took[n]
            done = max(done, gathered) + f[s] * n / total
        out[s] = done - f[s]
    return out


def _bucketed_reduce_end_s(
    cluster: Cluster,
    rings: np.ndarray,
    buckets: list[np.ndarray],
    last_bwd_end_s: np.ndarray,
    last_bwd_s: np.ndarray,
    tp: int,
    workload: Workload,
) -> np.ndarray:
    """(pp·tp, dp) end times of ``overlap_grad_reduce``'s bucketed gradient reduce-scatter: on
    each stage's rings the buckets one after another, bucket k once its gradients exist on every
    member (``last_bwd_end_s`` (pp, dp): when each member's last backward, ``last_bwd_s`` (pp,)
    long, ends).

    The frameworks hook each parameter's gradient accumulation and launch a bucket's collective
    when its last gradient is ready, in the last micro-batch only (megatron-core
    ``distributed/param_and_grad_buffer.py``, ``register_grad_ready``; DeepSpeed ZeRO's
    ``overlap_comm``, ``runtime/zero/stage_1_and_2.py``). The backward is spread evenly over the
    stage's parameters, so bucket k is ready once the fraction of them up to it has its
    gradients; the caller takes the last backward to end when its pass ends less the shortest
    time its final gradient send can take, which places buckets no earlier than they are ready.
    """
    pp, dp = last_bwd_end_s.shape
    done = np.zeros((pp * tp, dp))
    for s in range(pp):
        ring = rings[s * tp : (s + 1) * tp]
        took = _per_size(cluster, ring, buckets[s], workload.gradient_bytes, "reducescatter")
        total = buckets[s].sum()
        last = last_bwd_end_s[s].max()  # the stage's last member: a bucket waits for it
        end = -np.inf
        filled = 0.0
        for n in buckets[s]:
            filled += n
            ready = float(last - last_bwd_s[s] * (1.0 - filled / total))
            end = max(end, ready) + took[n]
        done[s * tp : (s + 1) * tp] = end
    return done


def dp_sync_end_s(
    cluster: Cluster,
    rings: np.ndarray,
    grad_bytes: np.ndarray,
    entry: np.ndarray,
    transport: Transport,
    *,
    zero: int,
    dp_collective: str,
) -> tuple[np.ndarray, str, str | None]:
    """End times (G, dp) of the DP gradient synchronisation, the collective that ran and, under
    ``auto``, NCCL's picks (``algorithm/protocol``, distinct ones joined by ``+``; None
    otherwise); see :func:`simulate_1f1b_ring`'s ``dp_collective``."""
    if dp_collective == "best":
        dp_collective = "fastest"
    if dp_collective == "two_level" and (zero == 1 or not two_level_block(cluster, rings)):
        dp_collective = "auto"  # no two-level here: the framework's default runs (recorded)
    if transport.rendezvous or transport.ring_segment_bytes is not None:  # gloo: its own ring,
        # starting when the ring's last member is done (each size timed apart)
        took = ring_allreduce_s(cluster, rings, grad_bytes, transport)
        end = np.broadcast_to((entry.max(axis=1) + took)[:, None], rings.shape).copy()
        return end, "ring", None
    if zero == 1:  # reduce-scatter + all-gather (ring volume), or all-reduce + all-gather
        ring, _ = allreduce_end_s(cluster, rings, grad_bytes, entry, "ring")
        if dp_collective == "auto":  # DeepSpeed's default reduce_scatter: NCCL's reduce-scatter
            _, _, tuned = nccl_tuned_end_s(cluster, rings, grad_bytes, entry, "reducescatter")
            return ring, "ring", _joined(tuned)
        if dp_collective == "ring" or (dp_collective == "fastest" and rings.shape[1] < 3):
            return ring, "ring", None
        if dp_collective not in ("tree", "fastest"):
            raise ValueError(f"ZeRO-1: dp_collective {dp_collective!r} is not offered")
        tree, _ = allreduce_end_s(cluster, rings, grad_bytes, entry, "tree")
        gather = ring_collective_s(cluster, rings, grad_bytes, kind="allgather")
        tree = tree + gather[:, None]
        if dp_collective == "tree" or tree.max() < ring.max() - 1e-12:
            return tree, "tree+allgather", None
        return ring, "ring", None
    if dp_collective == "auto":  # megatron-core's default: one flat all-reduce, NCCL's pick
        end, ran, tuned = nccl_tuned_end_s(cluster, rings, grad_bytes, entry)
        return end, _joined(ran), _joined(tuned)
    if dp_collective == "fastest":
        return (*choose_allreduce(cluster, rings, grad_bytes, entry), None)
    return (*allreduce_end_s(cluster, rings, grad_bytes, entry, dp_collective), None)


def _joined(names: list[str]) -> str:
    """Distinct names in first-seen order, joined by ``+``."""
    return "+".join(dict.fromkeys(names))


def simulate_1f1b_ring(
    cluster: Cluster,
    workload: Workload,
    *,
    tp: int,
    pp: int,
    dp: int,
    zero: int = 0,
    system: str = "megatron",
    hardware: Hardware = V100,
    p2p_scatter: bool = True,
    transport: Transport = NCCL,
    grad_norm: bool = False,
    schedule: str | ProgramFn = "megatron",
    loss_broadcast: bool = False,
    rank_map=None,
    recompute: str = "full",
    tied_embedding: bool = False,
    dp_protocol: str = "ring",
    dp_collective: str = "auto",
    compute: StageCompute | None = None,
    rounds: int = 1,
    overlap_grad_reduce: bool = False,
    overlap_param_gather: bool = False,
    bucket_params=None,
) -> SimResult:
    """One iteration of 1F1B pipelines + ring all-reduce DP in launch order (module docstring).

    ``transport``: :data:`~system.simulator.transfers.NCCL` (GPU runs, the paper) or
    :data:`~system.simulator.transfers.GLOO` (the CPU baselines on emulated links). ``zero`` 0
    (Megatron, replicated optimizer) or 1 (DeepSpeed ZeRO-1: optimizer sharded). ``grad_norm``:
    before the optimizer step every replica's model-parallel group (its tp·pp ranks) all-reduces
    the squared gradient norm, one fp32 (Megatron-core's optimizer always does). ``schedule``:
    the pipeline's op-order program, a function or a name registered with
    :func:`system.simulator.replay.register_program` (importing ``baselines`` registers
    "megatron", the default, and "deepspeed").
    ``loss_broadcast``: after the step the last stages all-reduce the loss over DP and broadcast
    it to their pipeline (DeepSpeed's ``_aggregate_total_loss``). With a rendezvous transport
    ZeRO-1 pays an all-reduce and then the all-gather of the updated shards (DeepSpeed on gloo).
    ``rank_map``: device of each launch rank (default: rank r on device r). ``recompute``:
    ``full``, ``selective`` or ``none`` activation recomputation. ``tied_embedding``: the first
    and last stages all-reduce the shared word-embedding gradient after the DP all-reduce.
    ``dp_protocol``: ``ring`` (the frameworks' all-reduce) or ``sharded_ps`` (the paper's
    sharded parameter server, :func:`system.simulator.collectives.sharded_ps_p2p_s`, each member
    entering when its own pass ends; for the speed-up attribution). ``schedule`` may also be
    ``gpipe`` (all forwards, then all backwards, with the same blocking p2p calls).
    ``dp_collective`` (with ``dp_protocol="ring"``): the DP gradients' collective on NCCL, one
    of :data:`DP_REQUESTS` — ``auto`` (default) NCCL's own pick per DP group from its tuner
    (:func:`system.simulator.collectives.nccl_tuned_end_s`: ring or tree, then simulated under
    the link model; the frameworks' defaults, so no two-level), ``ring``, ``tree``,
    ``two_level`` (Megatron, where the rank map allows it; elsewhere ``auto`` runs) forced,
    or ``fastest`` (``best``: its older name) the fastest of those under the link model
    (:func:`choose_allreduce`), what a user forces with ``NCCL_ALGO`` after measuring. With
    ZeRO-1 the candidates are reduce-scatter + all-gather (``ring``; DeepSpeed's default, so
    ``auto`` runs it and records NCCL's
    reduce-scatter pick) and a tree all-reduce + all-gather (``tree+allgather``, DeepSpeed's
    ``reduce_scatter: false``). A forced ring or tree also sets the gradient-norm all-reduce
    (``NCCL_ALGO`` holds for every call); under ``auto`` and ``two_level`` NCCL picks it. A
    rendezvous transport (gloo) runs its own ring only. The result records the request as
    ``dp_collective_request``, what ran as ``dp_collective`` and, under ``auto``, NCCL's
    ``algorithm/protocol`` as ``dp_nccl_choice``.
    ``compute``: per-stage compute seconds (e.g. profiled on the machine that runs the
    baseline) used instead of ``hardware``'s FLOP model; ``hardware`` still sets the memory check.
    ``rounds`` (``schedule="gpipe"`` only): gradient-accumulation passes of m/rounds micro-batches,
    back to back — each pass starts when stage 0, the last to finish the previous one, is free,
    so the passes are identical and shifted by one pass time; memory holds one pass's.
    ``overlap_grad_reduce`` / ``overlap_param_gather`` (``zero=1`` on NCCL; the second needs the
    first): the bucketed overlap (:func:`_bucketed_reduce_end_s`, :func:`_gather_delay_s`),
    ``bucket_params`` the bucket size in
    parameters per stage (a float, or one per stage; None or inf: one bucket per stage).
    Raises ValueError for layouts the cluster or workload cannot hold (sizes, TP across hosts).
    """
    model = workload.model
    if tp * pp * dp != cluster.num_devices:
        raise ValueError(
            f"tp={tp} x pp={pp} x dp={dp} != {cluster.num_devices} devices of {cluster.name!r}"
        )
    if zero not in (0, 1):
        raise ValueError(f"simulate_1f1b_ring: zero must be 0 or 1, got {zero}")
    if dp_protocol not in ("ring", "sharded_ps"):
        raise ValueError(f"dp_protocol must be ring or sharded_ps, got {dp_protocol!r}")
    if dp_collective not in DP_COLLECTIVES:
        raise ValueError(f"dp_collective must be one of {DP_COLLECTIVES}, got {dp_collective!r}")
    if model.num_attention_heads % tp or model.hidden_size % tp:
        raise ValueError(f"tp={tp} does not divide the model's heads/hidden size")
    workload.check_layout(pp, dp)
    v = int(getattr(program_for(schedule), "virtual_stages", 1)) if schedule != "gpipe" else 1
    if v > 1 and model.num_layers % (pp * v):
        raise ValueError(f"{v} virtual stages per stage do not divide {model.num_layers} layers")
    if overlap_param_gather and not overlap_grad_reduce:
        raise ValueError("overlap_param_gather is modelled with overlap_grad_reduce only")
    if overlap_grad_reduce and (
        zero != 1
        or transport.rendezvous
        or transport.ring_segment_bytes is not None
        or dp_protocol != "ring"
    ):
        raise ValueError(
            "overlap_grad_reduce: modelled for a sharded optimizer (zero=1) with the ring DP "
            "protocol on NCCL only"
        )
    m_all = workload.micro_batches(dp)
    if rounds < 1 or m_all % rounds or (rounds > 1 and schedule != "gpipe"):
        raise ValueError(
            f"rounds={rounds}: accumulation passes are for schedule='gpipe' and must divide the "
            f"{m_all} micro-batches per replica"
        )
    grid = device_grid(tp, pp, dp, rank_map)
    host = cluster.host_ids
    if np.any(host[grid] != host[grid[..., :1]]):
        raise ValueError(f"tp={tp}: a tensor-parallel group would span hosts of {cluster.name!r}")
    mbs = workload.micro_batch_size
    m = workload.micro_batches(dp)
    layers = model.num_layers // pp
    shards = dp if zero == 1 else 1
    stage_params = np.asarray(stage_gradient_params(model, pp, tied=tied_embedding)) / tp
    if compute is None:
        compute = stage_compute(
            model,
            pp,
            mbs,
            tp=tp,
            hardware=hardware,
            params_per_device=list(stage_params / shards),
            recompute=recompute,
        )
    f, b, opt = compute.per_stage(pp)
    busy = float((m * (f + b) + opt).max())  # pure compute of the busiest device
    grid_rings = grid.transpose(0, 2, 1).reshape(-1, dp)  # (pp·tp, dp): one DP ring per (s, t)
    buckets = _buckets(stage_params, bucket_params)  # per stage: parameters per bucket
    start = np.zeros((pp, dp))
    if overlap_param_gather and dp > 1:  # the first forward waits for its gathers
        start[:] = _gather_delay_s(cluster, grid_rings, buckets, f, tp)[:, None]

    act = mbs * model.seq_length * model.hidden_size * workload.activation_bytes
    if tp > 1:  # 6 all-reduces per layer and micro-batch, all TP groups at once
        t_ar = ring_collective_s(cluster, grid.reshape(-1, tp), act).max()
        f = f + 2 * layers * t_ar
        b = b + 4 * layers * t_ar
    else:
        t_ar = 0.0
    fwd = np.broadcast_to(f[:, None] / v, (pp, dp))  # one chunk of v per op
    bwd = np.broadcast_to(b[:, None] / v, (pp, dp))
    links = pp if v > 1 else max(pp - 1, 0)  # interleaved: the wrap-around link last
    occupy = np.zeros((2, links, dp))
    delay = np.zeros((2, links, dp))
    buffer_s = np.zeros((2, links, dp))
    if pp > 1:  # activations forward, gradients backward: each direction's flows at once
        send = act / tp if p2p_scatter else act
        src, dst = grid[:links].ravel(), np.roll(grid, -1, axis=0)[:links].ravel()
        bw = np.stack(
            [flow_bandwidth_bps(cluster, src, dst), flow_bandwidth_bps(cluster, dst, src)]
        ).reshape(2, links, dp, tp)
        lat = np.stack([cluster.delay_s[src, dst], cluster.delay_s[dst, src]])
        lat = lat.reshape(2, links, dp, tp)
        occupy = (8.0 * send / bw).max(axis=3)  # the slowest tensor rank's copy
        delay = lat.max(axis=3)
        buffer_s = (8.0 * transport.send_buffer_bytes / bw).min(axis=3)
    ends = replay_end_s(
        fwd,
        bwd,
        occupy[0],
        occupy[1],
        delay[0],
        delay[1],
        micro_batches=m // rounds,
        rendezvous=transport.rendezvous,
        schedule=schedule,
        buffer_fwd_s=buffer_s[0],
        buffer_bwd_s=buffer_s[1],
        **({"start_s": start} if start.any() else {}),
    )  # (pp, dp): when each stage of each replica leaves the pipeline
    ends = ends + (rounds - 1) * ends.max(axis=0, keepdims=True)  # passes back to back
    pipeline_s = float(ends.max())
    grad_bytes = np.repeat(workload.gradient_bytes * stage_params, tp)  # one per ring (s, t)
    rings = grid.transpose(0, 2, 1).reshape(-1, dp)  # (pp·tp, dp): one DP ring per (s, t)
    entry = np.repeat(ends, tp, axis=0)  # rows (s, t) like ``rings``: each member's pass end
    collective, nccl_pick = "none", None
    if dp > 1 and dp_protocol == "sharded_ps":  # each member enters when its own pass ends
        done = sharded_ps_p2p_s(cluster, rings, grad_bytes, entry)
        collective = "sharded_ps"
    elif dp > 1 and overlap_grad_reduce:  # buckets during the last backward
        last_b = ends.copy()
        if pp > 1:  # less the least its final gradient send to the stage before takes
            last_b[1:] -= np.maximum(occupy[1][: pp - 1] - buffer_s[1][: pp - 1], 0.0)
        done = _bucketed_reduce_end_s(cluster, rings, buckets, last_b, b / v, tp, workload)
        collective = "ring"  # NCCL's reduce-scatter is a ring
        if dp_collective == "auto" and not (transport.rendezvous or transport.ring_segment_bytes):
            # recorded as for the unbucketed reduce-scatter: NCCL's pick for the stage's gradients
            _, _, tuned = nccl_tuned_end_s(cluster, rings, grad_bytes, entry, "reducescatter")
            nccl_pick = _joined(tuned)
    elif dp > 1:
        done, collective, nccl_pick = dp_sync_end_s(
            cluster, rings, grad_bytes, entry, transport, zero=zero, dp_collective=dp_collective
        )
    else:
        done = entry.copy()
    step_at = done.reshape(pp, tp, dp).transpose(0, 2, 1).copy()  # (pp, dp, tp)
    stage_done = step_at.max(axis=(1, 2))
    dp_each = stage_done - ends.max(axis=1)
    dp_s = float(dp_each.max())
    tied_s = 0.0
    if tied_embedding and pp > 1:  # first and last stage of each (replica, tensor rank)
        pairs = np.stack([grid[0].ravel(), grid[-1].ravel()], axis=1)
        entry = np.stack([step_at[0].ravel(), step_at[-1].ravel()], axis=1)
        emb = workload.gradient_bytes * model.vocab_size * model.hidden_size / tp
        end = ring_allreduce_end_s(cluster, pairs, emb, entry, transport)
        tied_s = float(end.max() - stage_done[[0, -1]].max())
        step_at[0] = end[:, 0].reshape(dp, tp)
        step_at[-1] = end[:, 1].reshape(dp, tp)
    before_norm = float(step_at.max())
    norm_algo = "none"
    if grad_norm and pp * tp > 1:  # one fp32 all-reduce per replica's model-parallel group
        groups = grid.transpose(1, 0, 2).reshape(dp, pp * tp)  # rank order: stage, then tensor
        entry = step_at.transpose(1, 0, 2).reshape(dp, pp * tp)
        if transport.ring_segment_bytes is None and not transport.rendezvous:
            # NCCL_ALGO, when a row forces ring or tree, holds for every collective
            if dp_collective in ("ring", "tree"):
                norm_end, norm_algo = allreduce_end_s(cluster, groups, 4.0, entry, dp_collective)
            elif dp_collective in ("fastest", "best"):
                norm_end, norm_algo = choose_allreduce(
                    cluster, groups, 4.0, entry, ("ring", "tree")
                )
            else:  # auto, two_level: NCCL's own pick
                norm_end, ran, _ = nccl_tuned_end_s(cluster, groups, 4.0, entry)
                norm_algo = _joined(ran)
        else:
            norm_end = ring_allreduce_end_s(cluster, groups, 4.0, entry, transport)
            norm_algo = "ring"
        step_at = norm_end.reshape(dp, pp, tp).transpose(1, 0, 2)
    norm_s = float(step_at.max() - before_norm)
    step_at = step_at + opt[:, None, None]
    gather = np.zeros(pp)
    if overlap_grad_reduce and dp > 1 and not overlap_param_gather:  # after the step
        gather = ring_collective_s(cluster, rings, 2.0 * stage_params.repeat(tp), kind="allgather")
        gather = gather.reshape(pp, tp).max(axis=1)
        step_at = step_at + gather[:, None, None]
    if zero == 1 and dp > 1 and transport.rendezvous:
        # DeepSpeed on gloo (no reduce-scatter there): the all-reduce above, then the optimizer
        # step's all-gather of the updated shards, (dp−1) ring steps of S/dp, each behind its
        # receiver's notice
        gather = ring_collective_s(cluster, rings, grad_bytes, kind="allgather").reshape(pp, tp)
        src, dst = rings, np.roll(rings, -1, axis=1)
        notice = cluster.delay_s[dst, src].max(axis=1).reshape(pp, tp)
        gather = (gather + (dp - 1) * notice).max(axis=1)
        step_at = step_at + gather[:, None, None]
    if loss_broadcast:  # the last stages all-reduce the loss over DP, then broadcast it back
        last = grid[-1, :, 0]
        if dp > 1:
            entry = step_at[-1, :, 0][None, :]
            agg = ring_allreduce_end_s(cluster, [last], 4.0, entry, transport)[0]
        else:
            agg = step_at[-1, :, 0]
        wait = transport.rendezvous  # gloo: the data also waits for the receiver's notice
        for d in range(dp):
            for s_ in range(pp - 1):
                dst = grid[s_, d, 0]
                lands = agg[d] + cluster.delay_s[last[d], dst]
                if wait:
                    lands = max(
                        lands,
                        step_at[s_, d, 0]
                        + cluster.delay_s[dst, last[d]]
                        + cluster.delay_s[last[d], dst],
                    )
                step_at[s_, d, :] = np.maximum(step_at[s_, d, :], lands)
            step_at[-1, d, :] = agg[d]
    iter_s = float(step_at.max())
    memory = pipeline_memory_bytes(
        workload,
        tp,
        pp,
        dp,
        optimizer_shards=shards,
        recompute=recompute,
        in_flight=m // rounds if schedule == "gpipe" else None,
        virtual_stages=v,
    )
    return SimResult(
        system=system,
        iter_time_s=iter_s,
        compute_time_s=busy,
        model_flops=workload.model_flops(recompute=True),
        memory_bytes=memory,
        config={
            "tp": tp,
            "pp": pp,
            "dp": dp,
            "micro_batch_size": mbs,
            "zero": zero,
            "recompute": recompute,
        },
        breakdown={
            "pipeline_s": pipeline_s,
            "dp_sync_s": dp_s,
            "optimizer_s": float(opt.max()),
            "tp_allreduce_s": float(t_ar),
            "dp_span_s": float(stage_done.max() - pipeline_s),
            "grad_norm_s": norm_s,
            "grad_norm_algo": norm_algo,
            "dp_collective": collective,
            "dp_collective_request": "fastest" if dp_collective == "best" else dp_collective,
            "dp_nccl_choice": nccl_pick,
            "link_sharing": link_sharing_of(cluster),  # the model the links ran under
            "tied_embedding_s": tied_s,
            "zero1_gather_s": float(gather.max()),
            "micro_batches": int(m),
            "rounds": int(rounds),
            "virtual_stages": v,
            "param_gather_wait_s": float(start.max()),
            "grad_buckets": int(sum(len(x) for x in buckets)),
        },
        status="ok" if memory <= hardware.usable_memory_bytes else "oom",
    )
