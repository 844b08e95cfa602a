"""Our system's iteration time on any (cluster, assignment, workload) (paper §3.5).

One iteration of the runtime:

1. GPipe over the assignment's pipelines (``stages[s][r]``): all forwards, then all backwards,
   micro-batches of ``micro_batch_size`` sequences; receive, compute and send on separate streams
   (:func:`system.simulator.gpipe_timeline.gpipe_timeline`). All pipelines run concurrently, so
   their boundary transfers share links and host NICs (:mod:`system.simulator.transfers`); a
   message leaves only after its receiver's posted receive has been announced across the link.
2. If a replica's micro-batches do not fit in memory at once, the pass is split into equal
   gradient-accumulation rounds, each a GPipe pass starting when the device is free.
3. Sharded-parameter-server data parallelism (§3.2) over each stage's group
   (:func:`system.simulator.collectives.sharded_ps_p2p_s`), each device entering when its own
   last backward ends; the payload is the stage's gradients (its layers, plus the embeddings on
   the first stage and the output head on the last: :func:`system.workload.stage_gradient_params`).
4. With fp16 loss scaling (``loss_scaling``, the paper's setting), a one-float all-reduce over
   all ranks of a finite-gradient flag, as the runtime does inside its timed iteration.
5. The optimizer step on each device after its exchange; the iteration ends with the last.

Beyond the paper's runtime (options the configuration search explores, labelled as such): a
1F1B order of the same overlapped streams (``schedule="1f1b"``) and selective or no activation
recomputation (``recompute``). Compute times come from the V100 model (default) or are given
(``compute=StageCompute(fwd_s=..., bwd_s=..., opt_s=...)``, e.g. measured).

``compression=`` (:mod:`system.compression`) predicts the same iteration with pipeline or
data-parallel compression or DiLoCo: the compressed message sizes, the modelled encode/decode
time, and for DiLoCo the mean over H iterations of which one ends with the outer exchange
(:mod:`system.simulator.compressed_traffic`; throughput only, not quality).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from system.assignment import Assignment
from system.cluster import Cluster
from system.compression import Compression
from system.cost.model import check_sizes
from system.simulator.collectives import nccl_tuned_end_s, ring_collective_s, sharded_ps_p2p_s
from system.simulator.compressed_traffic import codec_overhead_s
from system.simulator.gpipe_timeline import gpipe_timeline
from system.simulator.hardware import V100, Hardware, StageCompute, stage_compute
from system.simulator.memory import RECOMPUTE_MODES, training_memory
from system.simulator.replay import Key, Msg, Op, backward, call, forward, replay_end_s
from system.simulator.result import SimResult
from system.simulator.sharing import link_sharing_of
from system.simulator.transfers import flow_time_s
from system.workload import Workload, stage_gradient_params

log = logging.getLogger(__name__)

# GPipe's accumulation passes: once a pass moves every device's end time by the same amount (to
# this fraction of the iteration), the remaining passes are added in one step (simulate_ours)
UNIFORM_SHIFT_RTOL = 1e-12

__all__ = [
    "SCHEDULES",
    "simulate_ours",
    "ours_memory_bytes",
    "accumulation_rounds",
    "overlapped_1f1b_program",
]

SCHEDULES = ("gpipe", "1f1b")  # ours' pipeline schedules (the runtime runs GPipe)


def ours_memory_bytes(
    workload: Workload,
    pp: int,
    in_flight: int,
    *,
    recompute: str = "full",
    last_in_flight: int | None = None,
) -> float:
    """Peak device memory (bytes) of our runtime with ``in_flight`` micro-batches per pass on
    the first stage and ``last_in_flight`` (default the same; 1F1B: 1) on the last."""
    layers = workload.model.num_layers // pp
    kw = dict(layers=layers, micro_batch_size=workload.micro_batch_size, recompute=recompute)
    last_n = in_flight if last_in_flight is None else last_in_flight
    first = training_memory(
        workload.model, embedding=True, logits=pp == 1, in_flight=in_flight, **kw
    )
    last = training_memory(workload.model, embedding=True, logits=True, in_flight=last_n, **kw)
    return max(first.total_bytes, last.total_bytes)


def accumulation_rounds(
    workload: Workload, pp: int, dp: int, hardware: Hardware = V100, *, recompute: str = "full"
) -> int:
    """Fewest equal rounds whose micro-batches fit in memory; 0 if even one micro-batch does not."""
    m = workload.micro_batches(dp)
    for rounds in range(1, m + 1):
        if (
            m % rounds == 0
            and ours_memory_bytes(workload, pp, m // rounds, recompute=recompute)
            <= hardware.usable_memory_bytes
        ):
            return rounds
    return 0


def overlapped_1f1b_program(stage: int, p: int, m: int) -> list[Op]:
    """1F1B (PipeDream-flush: warm-up forwards, one forward one backward, cool-down backwards)
    as our runtime's separate streams would run it: every send goes out together with the
    receive the stage needs next (its receives are posted ahead, so no send waits for a
    partner's call). Replayed with unbounded send buffers: a send holds the stage only until the
    link has taken the previous message; a receive holds it until the data landed."""
    s = stage

    def recv_f(i: int) -> list[Msg]:
        return [Msg("recv", Key("f", i, s - 1))] if s > 0 and i < m else []

    def recv_b(i: int) -> list[Msg]:
        return [Msg("recv", Key("b", i, s))] if s < p - 1 and i < m else []

    def send_f(i: int) -> list[Msg]:
        return [Msg("send", Key("f", i, s))] if s < p - 1 else []

    def send_b(i: int) -> list[Msg]:
        return [Msg("send", Key("b", i, s - 1))] if s > 0 else []

    ops: list[Op] = []

    def calls(msgs: list[Msg]) -> None:
        if msgs:
            ops.append(call(*msgs))

    warm = min(p - s - 1, m)
    steady = m - warm
    calls(recv_f(0))
    for i in range(warm):
        ops.append(forward(i))
        calls(send_f(i) + (recv_f(i + 1) if i + 1 < warm or steady else []))
    for j in range(steady):
        ops.append(forward(warm + j))
        calls(send_f(warm + j) + recv_b(j))
        ops.append(backward(j))
        calls(send_b(j) + (recv_f(warm + j + 1) if j + 1 < steady else recv_b(steady)))
    for i in range(steady, m):
        if i > steady or steady == 0:  # the steady phase's last call posted recv_b(steady)
            calls(recv_b(i))
        ops.append(backward(i))
        calls(send_b(i))
    return ops


def _pipeline_links(
    cluster: Cluster, stages: np.ndarray, nbytes: float, nbytes_bwd: float | None = None
) -> dict[str, np.ndarray]:
    """Per boundary (p-1, r): message seconds (α + 8X/β, forward and backward; a backward
    message of ``nbytes_bwd``, default ``nbytes``), their propagation delays, and the
    receive-ready notices' delays (the opposite direction)."""
    nbytes_bwd = nbytes if nbytes_bwd is None else nbytes_bwd
    p, r = stages.shape
    if p == 1:
        return {k: np.zeros((0, r)) for k in ("fwd", "bwd", "lat_f", "lat_b")}
    src, dst = stages[:-1].ravel(), stages[1:].ravel()
    delay = cluster.delay_s
    return {
        "fwd": flow_time_s(cluster, src, dst, nbytes).reshape(p - 1, r),
        "bwd": flow_time_s(cluster, dst, src, nbytes_bwd).reshape(p - 1, r),
        "lat_f": delay[src, dst].reshape(p - 1, r),  # s -> s+1; also the backward notice
        "lat_b": delay[dst, src].reshape(p - 1, r),  # s+1 -> s; also the forward notice
    }


def _dp_exchange_end_s(
    cluster, stages, workload, options: Compression, dp_mode, entry_s, layers_per_stage=None
):
    """When each device's per-stage exchange ends (the DiLoCo outer exchange when local SGD is
    on): the sharded PS of ``gradient_bytes`` per value, or of the compressed messages; the
    compressed ring all-gather from the stage's last entry."""
    pp, dp = stages.shape
    params = np.asarray(
        stage_gradient_params(workload.model, pp, layers=layers_per_stage), dtype=float
    )
    shard = np.ceil(params / dp)
    if options.local.active:
        per_msg = np.array([options.local.message_nbytes(x) for x in shard], dtype=float)
    elif options.dp.active and dp_mode == "ring":
        whole = [options.dp.message_nbytes(x * dp) for x in shard]
        t = ring_collective_s(cluster, stages, dp * np.array(whole, float), kind="allgather")
        return np.broadcast_to(entry_s.max(axis=1) + t, (dp, pp)).T.copy()
    elif options.dp.active:
        per_msg = np.array([options.dp.message_nbytes(x) for x in shard], dtype=float)
    else:  # the paper's exchange as before: shards of exactly params / dp values
        per_msg = workload.gradient_bytes * params / dp
    return sharded_ps_p2p_s(cluster, stages, dp * per_msg, entry_s)  # (pp, dp)


def simulate_ours(
    cluster: Cluster,
    assignment: Assignment,
    workload: Workload,
    *,
    compute: StageCompute | None = None,
    hardware: Hardware = V100,
    rounds: int | None = None,
    system: str = "ours",
    compression: Compression | None = None,
    dp_mode: str = "sharded_ps",
    recompute: str = "full",
    schedule: str = "gpipe",
    loss_scaling: bool = False,
    layers_per_stage: Sequence[int] | None = None,
) -> SimResult:
    """Predict one training iteration of our runtime (see the module docstring).

    Args:
        cluster: devices and links, and the link-sharing model they run under (its
            ``link_sharing``, recorded in the result's breakdown).
        assignment: the layout; its pp × dp must equal the cluster's device count.
        workload: model, global batch, micro-batch size.
        compute: per-stage compute seconds per micro-batch; default: the V100 model.
        hardware: accelerator for the default compute model and the memory check.
        rounds: GPipe's gradient-accumulation rounds (default: fewest that fit in memory).
        system: name recorded in the result (``ours``, ``ours_random``).
        compression: communication-reducing options (module docstring); None: none.
        dp_mode: ``sharded_ps``, or ``ring`` (the compressed ring all-gather baseline).
        recompute: activation recomputation, ``full`` (the paper's runtime), ``selective`` or
            ``none`` (compute and memory; the runtime implements ``full`` and ``none``).
        schedule: ``gpipe`` (the paper's runtime) or ``1f1b`` (the same overlapped streams in
            1F1B order, :func:`overlapped_1f1b_program`; at most p micro-batches in flight; a
            design option the runtime does not implement).
        loss_scaling: fp16 with loss scaling, as the paper ran: before its optimizer step every
            device all-reduces a finite-gradient flag (one float) over all ranks, the runtime's
            ``all_reduce(flag, MAX)`` (the ring or tree NCCL's tuner picks,
            :func:`system.simulator.collectives.nccl_tuned_end_s`; ranks are devices). False for
            fp32 runs (the CPU runs), which skip it.
        layers_per_stage: an uneven layer split (one count per stage, summing to the model's
            layers) for the data-parallel payload; it needs ``compute`` (the stages' times)
            and ``rounds`` or 1F1B, and the memory check is then the caller's (``hardware``'s
            memory is compared with the even split's).

    Returns:
        A SimResult (status ``oom`` with ``iter_time_s`` NaN when nothing fits).

    Raises:
        ValueError: layout and cluster/workload disagree, or an unknown option.
    """
    pp, dp = assignment.pp, assignment.dp
    check_sizes(cluster, pp, dp)
    sharing = link_sharing_of(cluster)  # refuses a cluster without a link-sharing model
    if layers_per_stage is None:
        workload.check_layout(pp, dp)
    else:
        if compute is None:
            raise ValueError("simulate_ours: layers_per_stage needs compute (the stages' times)")
        replace(workload, model=workload.model.with_layers(pp)).check_layout(pp, dp)
    if recompute not in RECOMPUTE_MODES:
        raise ValueError(
            f"simulate_ours: recompute must be one of {RECOMPUTE_MODES}, got {recompute!r}"
        )
    if schedule not in SCHEDULES:
        raise ValueError(f"simulate_ours: schedule must be one of {SCHEDULES}, got {schedule!r}")
    model = workload.model
    m = workload.micro_batches(dp)
    flops = workload.model_flops(recompute=True)
    config = {
        "tp": 1,
        "pp": pp,
        "dp": dp,
        "micro_batch_size": workload.micro_batch_size,
        "zero": 0,
        "recompute": recompute,
        "schedule": schedule,
    }
    usable = hardware.usable_memory_bytes
    if schedule == "1f1b":
        if rounds not in (None, 1):
            raise ValueError("simulate_ours: 1F1B runs one pass (rounds must be None or 1)")
        in_flight = min(pp, m)
        memory = ours_memory_bytes(workload, pp, in_flight, recompute=recompute, last_in_flight=1)
        rounds = 1 if memory <= usable else 0
    else:
        if rounds is None:
            rounds = accumulation_rounds(workload, pp, dp, hardware, recompute=recompute)
        elif rounds < 1 or m % rounds:
            raise ValueError(
                f"rounds={rounds} must be >= 1 and divide the {m} micro-batches per replica"
            )
        in_flight = m // rounds if rounds else 1
        memory = ours_memory_bytes(workload, pp, in_flight, recompute=recompute)
    if rounds == 0:
        return SimResult(
            system=system,
            iter_time_s=float("nan"),
            compute_time_s=float("nan"),
            model_flops=flops,
            memory_bytes=memory,
            config=config,
            status="oom",
        )
    compute = compute or stage_compute(
        model, pp, workload.micro_batch_size, hardware=hardware, recompute=recompute
    )
    f, b, opt = compute.per_stage(pp)
    options = compression or Compression()
    options.check("simulate_ours", dp_mode=dp_mode)
    overhead = codec_overhead_s(workload, pp, dp, options, hardware)
    f, b = f + overhead["fwd_s"], b + overhead["bwd_s"]
    act = workload.micro_batch_size * model.seq_length * model.hidden_size
    act_f = options.pipe.forward_nbytes(act, workload.activation_bytes, first_visit=False)
    act_b = options.pipe.backward_nbytes(act, workload.activation_bytes)
    links = _pipeline_links(cluster, assignment.stages, act_f, act_b)
    link_f, link_b = links["fwd"], links["bwd"]
    if schedule == "1f1b":
        free = replay_end_s(
            np.broadcast_to(f[:, None], (pp, dp)),
            np.broadcast_to(b[:, None], (pp, dp)),
            link_f - links["lat_f"],
            link_b - links["lat_b"],
            links["lat_f"],
            links["lat_b"],
            micro_batches=m,
            schedule=overlapped_1f1b_program,
            buffer_fwd_s=np.inf,
            buffer_bwd_s=np.inf,
        )
    else:
        free = np.zeros((pp, dp))
        done_rounds = 0
        while done_rounds < rounds:
            times = gpipe_timeline(
                f,
                b,
                link_f,
                link_b,
                in_flight,
                start_s=free,
                notice_fwd_s=links["lat_b"],
                notice_bwd_s=links["lat_f"],
                latency_fwd_s=links["lat_f"],
                latency_bwd_s=links["lat_b"],
            )
            shift = times.bwd_end_s - free
            free = times.bwd_end_s  # (pp, dp): each device's last backward
            done_rounds += 1
            if done_rounds > 1 and np.ptp(shift) <= UNIFORM_SHIFT_RTOL * float(free.max()):
                # every device moved by the same time: a pass's times are maxima of start times
                # plus constants, so each later pass moves them by that time again
                free = free + (rounds - done_rounds) * shift
                break
    pipeline_s = free.max(axis=1)  # (pp,) when every replica of the stage is done

    done = _dp_exchange_end_s(
        cluster, assignment.stages, workload, options, dp_mode, free, layers_per_stage
    )
    done = done + overhead["dp_s"][:, None]
    flag_s, flag_algo = 0.0, "none"
    if loss_scaling and cluster.num_devices > 1:
        ranks = np.argsort(assignment.stages.ravel())  # device d's position in stages.ravel()
        entry = done.ravel()[ranks][None, :]  # per rank = device, in rank order
        flag_end, ran, _ = nccl_tuned_end_s(cluster, [list(range(cluster.num_devices))], 4.0, entry)
        flag_algo = ran[0]
        flag_s = float(flag_end.max() - done.max())
        done = flag_end[0][assignment.stages.ravel()].reshape(pp, dp)
    end = done + opt[:, None]
    iter_s = float(end.max())
    if options.local.active:  # H − 1 iterations without an exchange, one with the outer step
        h = options.local.inner_steps
        outer_end = float((end + overhead["outer_s"]).max())
        iter_s = ((h - 1) * float((free + opt[:, None]).max()) + outer_end) / h
    busy = float((m * (f + b) + opt).max())
    busy_f = link_f - links["lat_f"]  # a link's occupancy per message
    slot = np.maximum(np.maximum(f[:-1, None], busy_f), f[1:, None]) if pp > 1 else f[:, None]
    breakdown = {
        "pipeline_s": float(pipeline_s.max()),
        "dp_sync_s": float((done.max(axis=1) - pipeline_s).max()),  # past the stage's pipeline
        "dp_span_max_s": float((done - free).max()),  # longest exchange of one device
        "optimizer_s": float(opt.max()),
        "rounds": int(rounds),
        "micro_batches": int(m),
        "fwd_s": float(f.max()),
        "bwd_s": float(b.max()),
        "pp_link_max_s": float(max(link_f.max(initial=0.0), link_b.max(initial=0.0))),
        "fwd_slot_max_s": float(slot.max()),
        "flag_allreduce_s": flag_s,
        "flag_allreduce_algo": flag_algo,
        "dp_collective": dp_mode,
        "link_sharing": sharing,  # the model the links ran under
    }
    config["rounds"] = int(rounds)
    log.debug(
        "ours %s: iter %.2f s (pipeline %.2f s, dp %.2f s)",
        cluster.name,
        iter_s,
        breakdown["pipeline_s"],
        breakdown["dp_sync_s"],
    )
    return SimResult(
        system=system,
        iter_time_s=iter_s,
        compute_time_s=busy,
        model_flops=flops,
        memory_bytes=memory,
        config=config,
        breakdown=breakdown,
    )
