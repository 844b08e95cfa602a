"""One rank of a training run: ``python -m system.runtime.worker SPEC.json`` (paper §3.5).

Reads ``RANK``/``WORLD_SIZE``/``MASTER_ADDR``/``MASTER_PORT`` (and ``LOCAL_RANK`` for the GPU)
from the environment torchrun sets (:mod:`system.runtime.launch` starts it under torchrun, or
sets the same variables where each rank runs in its own network namespace); the scheduler's
assignment maps global rank ``i`` to device ``i`` (``spec.stages``). Per
iteration: zero the flat gradient buckets, post the DP exchange's first receives, start (a
barrier, or one wall-clock instant with ``spec.start == "clock"``; with ``"free"`` one instant
before the first iteration only), GPipe forward/backward over the replica's micro-batches,
per-stage data-parallel exchange, (loss-scale check), optimizer step. With DiLoCo
(``spec.compression.local``) the exchange is skipped and every H-th step ends with the outer
step.
Pipeline and data-parallel compression live in the wires and the exchange the spec's options
build (:mod:`system.runtime.wire`, :mod:`system.runtime.exchange`). Rank 0 gathers every rank's
timings and bytes sent and writes the metrics JSON (``spec.metrics_out``).
"""

from __future__ import annotations

import datetime
import json
import logging
import math
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from system.lifeline import die_with_parent, exit_now
from system.runtime.data import make_data, micro_batches, micro_samples
from system.runtime.data_parallel import GradBuckets
from system.runtime.diloco import DiLoCo
from system.runtime.exchange import make_exchange
from system.runtime.groups import RankPosition, make_stage_groups, rank_position
from system.runtime.model import build_stage
from system.runtime.p2p import P2P
from system.runtime.pipeline import gpipe_iteration
from system.runtime.spec import RunSpec
from system.runtime.store import bind_to_advertised_address
from system.runtime.timeline import Timeline, merge_traces
from system.runtime.wire import make_wires

log = logging.getLogger(__name__)

__all__ = ["run_worker", "main", "TIMING_FIELDS"]

# per rank, per iteration (seconds): gathered to rank 0; fwd_mb_s / bwd_mb_s are the mean
# forward / backward compute of one micro-batch in that iteration
# start_late_s: how late a rank started past the common instant (spec.start == "clock"; else 0)
# end_s: when the rank finished the iteration, seconds after the first iteration's start (with
# spec.start == "free" the training wall clock; snapshot saving left out)
# pipe_bytes / dp_bytes: payload bytes the rank sent to other stages / in data-parallel exchanges
# loss_sum / loss_count: the rank's micro-batch losses (last stages) and how many
TIMING_FIELDS = (
    "iter_time_s",
    "compute_s",
    "wait_s",
    "dp_s",
    "optim_s",
    "fwd_mb_s",
    "bwd_mb_s",
    "start_late_s",
    "end_s",
    "pipe_bytes",
    "dp_bytes",
    "loss_sum",
    "loss_count",
)


def _start_iteration(spec: RunSpec, device: torch.device) -> tuple[float, float]:
    """Barrier, then (spec.start == "clock") :func:`start_together`. Returns (t0, late)."""
    dist.barrier()
    if spec.start == "barrier":
        return time.perf_counter(), 0.0
    return start_together(device, spec.start_margin_s)


def start_together(device: torch.device, margin_s: float) -> tuple[float, float]:
    """Wait for one wall-clock instant chosen by rank 0 ``margin_s`` ahead (ranks on one host,
    e.g. an emulated network, share the clock). Returns (t0, late): this rank's start on
    ``time.perf_counter`` and how late (s) it was past the instant (rank 0's choice arrived
    after it). Every rank of the default group must call it."""
    at = torch.tensor([time.time() + margin_s], dtype=torch.float64).to(device)
    dist.broadcast(at, 0)
    t0 = time.perf_counter() + (float(at.item()) - time.time())
    while (left := t0 - time.perf_counter()) > 0:
        time.sleep(min(left, 0.05) if left > 0.002 else 0.0)
    now = time.perf_counter()
    return t0, max(0.0, now - t0 - 0.001)


def _probe_links(
    comm: P2P, place: RankPosition, shape: tuple[int, ...], dtype: torch.dtype, repeats: int = 5
) -> float | None:
    """Median one-way time (s) of one activation message to the next stage (sender's view:
    send + zero-byte ack). Every rank calls it; stage s probes the link s -> s+1 in two phases
    (even stages send first) so each link is measured alone."""
    result = None
    buf = torch.zeros(shape, dtype=dtype, device=comm.device)
    ack = torch.zeros(1, device=comm.device)
    for phase in (0, 1):
        dist.barrier()
        sender = place.next_rank is not None and place.stage % 2 == phase
        receiver = place.prev_rank is not None and (place.stage - 1) % 2 == phase
        times = []
        for _ in range(repeats):
            if sender:
                t = time.perf_counter()
                dist.send(buf, place.next_rank)
                dist.recv(ack, place.next_rank)
                times.append(time.perf_counter() - t)
            if receiver:
                dist.recv(buf, place.prev_rank)
                dist.send(ack, place.prev_rank)
        if times:
            result = statistics.median(times)
    dist.barrier()
    return result


def run_worker(spec: RunSpec, rank: int, world_size: int) -> dict | None:
    """Train per ``spec`` as ``rank``; return the metrics on rank 0 (None elsewhere)."""
    spec.validate(world_size)
    use_cuda = spec.device == "cuda"
    if use_cuda:
        if not torch.cuda.is_available():
            raise RuntimeError("RunSpec device='cuda' but CUDA is not available on this machine")
        device = torch.device(
            "cuda", int(os.environ.get("LOCAL_RANK", rank)) % torch.cuda.device_count()
        )
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    bind_to_advertised_address()  # rank 0's store: MASTER_ADDR only, never every interface
    dist.init_process_group(
        "nccl" if use_cuda else "gloo",
        rank=rank,
        world_size=world_size,
        timeout=datetime.timedelta(seconds=spec.pg_timeout_s),
    )
    try:
        return _train(spec, rank, world_size, device)
    finally:
        dist.destroy_process_group()


def _train(spec: RunSpec, rank: int, world: int, device: torch.device) -> dict | None:
    assign = spec.assignment()
    place = rank_position(assign, rank)
    dp_group = make_stage_groups(assign, rank)
    cfg = spec.gpt_config()
    wl = spec.workload()
    stage = build_stage(cfg, spec.pp, place.stage, spec.seed).to(device)
    stage.checkpoint = spec.checkpointing
    buckets = GradBuckets(
        list(stage.parameters()),
        dp=spec.dp,
        bucket_mb=spec.bucket_mb,
        device=device,
        ranks=place.dp_ranks,
        rank=rank,
    )
    if spec.optimizer == "adamw":
        opt = torch.optim.AdamW(stage.parameters(), lr=spec.lr, weight_decay=0.0)
    else:
        opt = torch.optim.SGD(stage.parameters(), lr=spec.lr)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, spec.lr_factor)
    data = make_data(spec)
    tl = Timeline(rank, use_cuda_events=device.type == "cuda", keep_events=bool(spec.trace_path))
    comm = P2P(device, tl)
    options = spec.compression
    wires = make_wires(options.pipe, torch.float16 if spec.amp else torch.float32)
    exchange = make_exchange(options, buckets, dp_group, mode=spec.dp_mode, seed=spec.seed)
    diloco = DiLoCo(list(stage.parameters()), options.local) if options.local.active else None
    snapshots: list[tuple[int, dict]] = []
    scaling = spec.amp or spec.loss_scale is not None
    scale = float(
        spec.loss_scale if spec.loss_scale is not None else (2.0**16 if spec.amp else 1.0)
    )
    clean_steps, skipped = 0, 0

    link_s = None
    if spec.probe_links:
        link_s = _probe_links(
            comm,
            place,
            (spec.micro_batch_size, cfg.seq_length, cfg.hidden_size),
            torch.float16 if spec.amp else torch.float32,
        )

    free = spec.start == "free"
    if free:  # one common instant, then iterations back to back
        dist.barrier()
        t_prev, late = start_together(device, spec.start_margin_s)
    losses, scales, rows = [], [], []
    t_first, excluded = None, 0.0  # first iteration's start; snapshot time left out of end_s
    for it in range(spec.iters):
        micro = micro_batches(
            data.batch(it),
            dp=spec.dp,
            replica=place.replica,
            micro_batch_size=spec.micro_batch_size,
        )
        samples = micro_samples(
            data.sample_ids(it),
            dp=spec.dp,
            replica=place.replica,
            micro_batch_size=spec.micro_batch_size,
        )
        buckets.zero()
        exchanges = diloco is None or diloco.is_outer_step(it)
        if exchanges:
            exchange.post_receives()  # peers may send shards while we compute
        tl.reset_totals()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        if free:
            t0, late = t_prev, (late if it == 0 else 0.0)
        else:
            t0, late = _start_iteration(spec, device)
        t_first = t0 if t_first is None else t_first
        sent0 = (comm.bytes_sent, exchange.bytes_sent)
        mb_losses = []
        per_pass = len(micro) // spec.rounds
        for k in range(0, len(micro), per_pass):  # accumulation passes, one after another
            mb_losses += gpipe_iteration(
                stage,
                place,
                comm,
                micro[k : k + per_pass],
                hidden_size=cfg.hidden_size,
                loss_scale=scale,
                amp=spec.amp,
                recv_ahead=spec.recv_ahead,
                wires=wires,
                samples=samples[k : k + per_pass],
                loss_divisor=len(micro),
            )
        buckets.check_views()
        if diloco is None:
            exchange.sync(it, tl)
        with tl.span("optim", "step"):
            ok = True
            if scaling:
                buckets.scale_(1.0 / scale)
                flag = torch.tensor([0.0 if buckets.all_finite() else 1.0], device=device)
                dist.all_reduce(flag, op=dist.ReduceOp.MAX)  # every stage skips together
                ok = flag.item() == 0.0
            if ok:
                opt.step()
            sched.step()
        if diloco is not None and exchanges:
            diloco.outer_step(lambda it=it: exchange.sync(it, tl))
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t1 = time.perf_counter()
        t_prev = t1
        if spec.snapshot_every and place.replica == 0 and (it + 1) % spec.snapshot_every == 0:
            state = {k: v.detach().cpu().clone() for k, v in stage.state_dict().items()}
            snapshots.append((it + 1, state))
            t_prev = time.perf_counter()
            excluded += t_prev - t1
        tl.flush()
        tl.record("iter", f"iteration {it}", t0, t1 - t0)
        scales.append(scale)
        if scaling and spec.dynamic_loss_scale:
            if not ok:
                scale, clean_steps, skipped = scale / 2, 0, skipped + 1
            else:
                clean_steps += 1
                if clean_steps % 1000 == 0:
                    scale *= 2
        fwd, bwd = tl.spans.get("F", []), tl.spans.get("B", [])
        rows.append(
            [
                t1 - t0,
                tl.totals["compute"],
                tl.totals["wait"],
                tl.totals["dp"],
                tl.totals["optim"],
                statistics.fmean(fwd) if fwd else 0.0,
                statistics.fmean(bwd) if bwd else 0.0,
                late,
                t1 - t_first - excluded,
                comm.bytes_sent - sent0[0],
                exchange.bytes_sent - sent0[1],
                sum(mb_losses),
                len(mb_losses),
            ]
        )
        if free:  # no per-step reduction: rank 0 sums the gathered loss fields at the end
            if rank == 0 and it % 10 == 0:
                log.info("step %d | iter %.3f s (rank 0)", it, t1 - t0)
            continue
        # global mean loss: the last stages hold per-micro-batch losses
        lsum = torch.tensor([sum(mb_losses), float(len(mb_losses))], dtype=torch.float64)
        lsum_d = lsum.to(device)
        dist.all_reduce(lsum_d)
        lsum = lsum_d.cpu()
        losses.append(float(lsum[0] / lsum[1]))
        if rank == 0:
            log.info("step %d | loss %.4f | iter %.3f s", it, losses[-1], t1 - t0)
        if not math.isfinite(losses[-1]):  # every rank holds the reduced loss: all stop here
            raise FloatingPointError(
                f"training diverged: the mean loss of iteration {it} is {losses[-1]} "
                f"(lr={spec.lr:g}); a result with this loss would be meaningless"
            )

    # gather (world, iters, fields) timings and link probes to rank 0
    mine = torch.tensor(rows, dtype=torch.float64).to(device)
    allt = [torch.empty_like(mine) for _ in range(world)]
    dist.all_gather(allt, mine)
    probe = torch.tensor([link_s if link_s is not None else -1.0], dtype=torch.float64).to(device)
    allp = [torch.empty_like(probe) for _ in range(world)]
    dist.all_gather(allp, probe)
    if spec.trace_path:
        tl.write(f"{spec.trace_path}.rank{rank}")
    if snapshots:
        _save_snapshots(spec, place, stage, snapshots)
    dist.barrier()
    if rank != 0:
        return None
    timings = torch.stack([t.cpu() for t in allt]).numpy()  # (world, iters, fields)
    if free:
        k = TIMING_FIELDS.index
        counts = timings[:, :, k("loss_count")].sum(axis=0)
        losses = (timings[:, :, k("loss_sum")].sum(axis=0) / counts).tolist()
    if spec.trace_path:
        parts = [Path(f"{spec.trace_path}.rank{r}") for r in range(world)]
        merge_traces(parts, spec.trace_path)
        for p in parts:
            p.unlink(missing_ok=True)
    return _metrics(
        spec, assign, wl, losses, scales, skipped, timings, [float(p.item()) for p in allp]
    )


def _save_snapshots(spec: RunSpec, place: RankPosition, stage, snapshots) -> None:
    """Replica 0's stage ``s`` parameters at each snapshot step -> ``stage<s>.pt``."""
    from system.results import atomic_write

    out = Path(spec.snapshot_dir) / f"stage{place.stage}.pt"
    record = {
        "stage": place.stage,
        "pp": spec.pp,
        "first_layer": stage.first_layer,
        "steps": [s for s, _ in snapshots],
        "states": [st for _, st in snapshots],
    }
    atomic_write(out, lambda f: torch.save(record, f))


def _steady_median(x, warmup: int = 1) -> float:
    """Median over iterations (after ``warmup`` of them, while any remain) of the max over ranks."""
    per_iter = x.max(axis=0).tolist()
    return float(statistics.median(per_iter[warmup:] if len(per_iter) > warmup else per_iter[-1:]))


def _metrics(spec, assign, wl, losses, scales, skipped, timings, probes) -> dict:
    """Rank 0's summary: losses, per-iteration times (max over ranks), rates, per-rank detail."""
    w = spec.warmup_iters
    # training wall clock: when the last rank finished each iteration
    elapsed = timings[:, :, TIMING_FIELDS.index("end_s")].max(axis=0)
    if spec.start == "free":  # an iteration lasts from the previous one's end to its own
        per_iter = np.diff(elapsed, prepend=0.0)
        iter_times = per_iter.tolist()
        med = float(statistics.median(iter_times[w:] if len(iter_times) > w else iter_times[-1:]))
    else:
        iter_times = timings[:, :, 0].max(axis=0).tolist()
        med = _steady_median(timings[:, :, 0], w)
    sent = {
        f: timings[:, :, TIMING_FIELDS.index(f)].sum(axis=0) for f in ("pipe_bytes", "dp_bytes")
    }
    flops = wl.model_flops(recompute=True)
    stage_of = assign.stage_of
    per_rank = {f: timings[:, :, k].tolist() for k, f in enumerate(TIMING_FIELDS)}
    return {
        "status": "ok",
        "losses": losses,
        "iter_time_s": iter_times,
        "iter_time_median_s": med,  # median over iterations after the warm-up ones
        "elapsed_s": elapsed.tolist(),  # per iteration, since the first one's start
        # payload bytes all ranks sent per iteration: between stages / in DP exchanges
        "pipe_bytes": sent["pipe_bytes"].tolist(),
        "dp_bytes": sent["dp_bytes"].tolist(),
        "compression": spec.compression.label(),
        "warmup_iters": w,
        "tokens_per_s": wl.tokens_per_iteration / med,
        "tflops": flops / med / 1e12,  # Megatron's recompute FLOP count, the project's convention
        "tflops_per_device": flops / med / 1e12 / spec.world_size,
        "model_flops": flops,
        "compute_s_median": _steady_median(timings[:, :, 1], w),  # max over ranks
        "wait_s_median": _steady_median(timings[:, :, 2], w),
        "dp_s_median": _steady_median(timings[:, :, 3], w),
        "start": spec.start,
        "start_late_max_s": float(timings[:, :, TIMING_FIELDS.index("start_late_s")].max()),
        "per_rank": per_rank,  # field -> [rank][iteration] seconds
        "stage_of_rank": stage_of.tolist(),
        "link_probe_s": probes,  # per rank: its link to the next stage (-1: none)
        "loss_scale": scales,
        "skipped_steps": skipped,
        "world_size": spec.world_size,
        "pp": spec.pp,
        "dp": spec.dp,
        "micro_batches": wl.micro_batches(spec.dp),
        "stages": assign.stages.tolist(),
        "spec": spec.to_dict(),
    }


def main(argv: list[str] | None = None) -> int:
    die_with_parent()  # the launcher or torchrun agent gone: so is this rank
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        sys.stderr.write("usage: python -m system.runtime.worker SPEC.json\n")
        return 2
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    logging.basicConfig(
        level=logging.INFO if rank == 0 else logging.WARNING, format=f"[rank {rank}] %(message)s"
    )
    spec = RunSpec.load(argv[0])
    metrics = run_worker(spec, rank, world)
    if metrics is not None and spec.metrics_out:
        from system.results import atomic_write_text

        atomic_write_text(spec.metrics_out, json.dumps(metrics, indent=1))
    return 0


if __name__ == "__main__":
    # without finalization: with gloo's threads alive it aborted about one torchrun run in ten
    exit_now(main())
