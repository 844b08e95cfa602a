"""A :class:`~system.runtime.spec.RunSpec` trained in one process: the runtime's arithmetic
without its sockets or clocks.

Loss per token does not depend on links or timing, only on what the ranks compute. This module
runs exactly that, for every replica and stage of the spec, with the runtime's own parts: the
stages (:func:`~system.runtime.model.build_stage`), each replica's micro-batches and sample ids
(:mod:`system.runtime.data`), the boundary wires (:func:`~system.runtime.wire.make_wires`: an
activation is encoded by its sender's wire and decoded by its receiver's, its gradient the other
way), flat gradient buckets per stage and replica (:class:`~system.runtime.data_parallel.
GradBuckets`), the exchange the runtime would run (:func:`~system.runtime.exchange.make_exchange`,
its messages carried by an in-memory mailbox between one thread per replica), DiLoCo's outer
step (:class:`~system.runtime.diloco.DiLoCo`), AdamW and the learning-rate schedule
(:meth:`RunSpec.lr_factor`). A plain (uncompressed) exchange is the average of the replicas'
buckets, which is what the sharded parameter server and an all-reduce compute.

It runs every replica's stages one after another on one core, with no emulated links, no root
and no waiting on messages, so loss-against-tokens curves can be long (``results/quality``). A
test trains the same spec here and under the launcher and compares the losses.

Held-out loss is measured every ``eval_every`` iterations (and before the first) on the
corpus's held-out windows, split in two halves that never mix: ``validation`` (for choosing
hyperparameters) and ``test`` (for scoring) — :meth:`system.runtime.corpus.CorpusData.heldout`.
With DiLoCo the evaluated model is the replicas' shared one, so ``eval_every`` must be a
multiple of H.
"""

from __future__ import annotations

import math
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from system.runtime.data import make_data, micro_batches, micro_samples
from system.runtime.data_parallel import GradBuckets
from system.runtime.diloco import DiLoCo
from system.runtime.exchange import PlainExchange, make_exchange
from system.runtime.model import build_stage, lm_loss
from system.runtime.spec import RunSpec
from system.runtime.wire import StageWires, make_wires

__all__ = ["Curve", "train_in_process", "EVAL_SPLITS"]

EVAL_SPLITS = ("validation", "test")
MAX_WAIT_S = 60.0  # a message that never comes is a bug here: fail instead of hanging


@dataclass(frozen=True)
class Curve:
    """One run: mean training loss per iteration, held-out loss at ``eval_iters`` (iterations
    done), bytes the replicas' exchanges sent, and the wall time of the run."""

    train_loss: list[float]
    eval_iters: list[int]
    eval_loss: list[float]
    dp_bytes: int
    wall_s: float


class _Mailbox:
    """Messages between the replica threads of one stage, by (source, destination, tag)."""

    def __init__(self) -> None:
        self._slots: dict[tuple[int, int, int], queue.Queue] = {}
        self._lock = threading.Lock()

    def slot(self, key: tuple[int, int, int]) -> queue.Queue:
        with self._lock:
            return self._slots.setdefault(key, queue.Queue())


class _Done:
    def wait(self) -> None:
        return None


class _Arrival:
    def __init__(self, box: queue.Queue, buf: torch.Tensor) -> None:
        self.box, self.buf = box, buf

    def wait(self) -> None:
        try:
            msg = self.box.get(timeout=MAX_WAIT_S)
        except queue.Empty:
            raise RuntimeError("in-process exchange: a message never arrived") from None
        self.buf.copy_(msg)


def _in_process(exchange, box: _Mailbox, me: int):
    """Route a compressed exchange's sends and receives through ``box`` (rank = replica)."""

    def send(payload: torch.Tensor, dst: int, tag: int):
        exchange.bytes_sent += payload.numel()
        box.slot((me, dst, tag)).put(payload.clone())
        return _Done()

    def recv(numel: int, src: int, tag: int):
        buf = torch.empty(exchange.codec.nbytes(numel), dtype=torch.uint8)
        return buf, _Arrival(box.slot((src, me, tag)), buf)

    exchange._send, exchange._recv = send, recv
    return exchange


class _Boundary(torch.autograd.Function):
    """Activations across a pipeline boundary and their gradients back, through the wires."""

    @staticmethod
    def forward(ctx, x, out_wires: StageWires, in_wires: StageWires, samples):
        ctx.wires, ctx.samples = (out_wires, in_wires), samples
        msg = out_wires.fwd_out.encode(x, samples)
        return in_wires.fwd_in.decode(msg, x.shape, samples)

    @staticmethod
    def backward(ctx, grad):
        out_wires, in_wires = ctx.wires
        msg = in_wires.bwd_out.encode(grad.contiguous(), ctx.samples)
        return out_wires.bwd_in.decode(msg, grad.shape, ctx.samples), None, None, None


class _Replica:
    """One replica: its stages, wires, buckets, optimizers and DiLoCo state."""

    def __init__(self, spec: RunSpec, replica: int) -> None:
        cfg = spec.gpt_config()
        options = spec.compression
        self.stages = [build_stage(cfg, spec.pp, s, spec.seed) for s in range(spec.pp)]
        self.wires = [make_wires(options.pipe) for _ in range(spec.pp)]
        self.buckets = [
            GradBuckets(
                list(st.parameters()),
                dp=spec.dp,
                bucket_mb=spec.bucket_mb,
                device=torch.device("cpu"),
                ranks=tuple(range(spec.dp)),
                rank=replica,
            )
            for st in self.stages
        ]
        self.opts = [
            torch.optim.AdamW(st.parameters(), lr=spec.lr, weight_decay=0.0)
            if spec.optimizer == "adamw"
            else torch.optim.SGD(st.parameters(), lr=spec.lr)
            for st in self.stages
        ]
        self.scheds = [torch.optim.lr_scheduler.LambdaLR(o, spec.lr_factor) for o in self.opts]
        self.diloco = (
            [DiLoCo(list(st.parameters()), options.local) for st in self.stages]
            if options.local.active
            else None
        )

    def forward_backward(self, micro, samples, divisor: int) -> float:
        """GPipe's arithmetic for this replica: every micro-batch forward and backward."""
        total = 0.0
        for (x, y), ids in zip(micro, samples, strict=True):
            h = x
            for s, st in enumerate(self.stages):
                if s:
                    h = _Boundary.apply(h, self.wires[s - 1], self.wires[s], ids)
                h = st(h)
            loss = lm_loss(h, y)
            (loss / divisor).backward()
            total += float(loss.detach())
        return total

    @torch.no_grad()
    def evaluate(self, tokens: torch.Tensor, batch: int = 32) -> float:
        for st in self.stages:
            st.eval()
        total, n = 0.0, 0
        for i in range(0, tokens.shape[0], batch):
            rows = tokens[i : i + batch]
            h = rows[:, :-1]
            for st in self.stages:
                h = st(h)
            total += float(lm_loss(h, rows[:, 1:])) * rows.shape[0]
            n += rows.shape[0]
        for st in self.stages:
            st.train()
        return total / n


def _run_threads(fns: list[Callable[[], None]]) -> None:
    """Run one function per replica in its own thread; re-raise the first failure."""
    errors: list[BaseException] = []

    def guarded(fn):
        try:
            fn()
        except BaseException as e:  # noqa: BLE001 - re-raised in the caller below
            errors.append(e)

    threads = [threading.Thread(target=guarded, args=(f,), daemon=True) for f in fns]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=10 * MAX_WAIT_S)
    if any(t.is_alive() for t in threads):
        raise RuntimeError("in-process exchange: a replica thread did not finish")
    if errors:
        raise errors[0]


def _average(bufs: list[list[torch.Tensor]]) -> None:
    """Every replica's buckets := their mean over replicas (in replica order)."""
    for i in range(len(bufs[0])):
        mean = torch.stack([b[i] for b in bufs]).mean(dim=0)
        for b in bufs:
            b[i].copy_(mean)


def train_in_process(
    spec: RunSpec,
    *,
    eval_every: int,
    eval_split: str = "validation",
    eval_sequences: int = 128,
    on_eval: Callable[[int, float], None] | None = None,
) -> Curve:
    """Train ``spec`` in this process (module docstring); ``on_eval(iteration, loss)`` is called
    at every held-out evaluation (progress)."""
    spec.validate()
    if spec.data != "kjv":
        raise ValueError(f"train_in_process: data={spec.data!r}; held-out loss needs 'kjv'")
    if eval_split not in EVAL_SPLITS:
        raise ValueError(f"train_in_process: eval_split {eval_split!r} is not one of {EVAL_SPLITS}")
    if eval_every < 1:
        raise ValueError(f"train_in_process: eval_every must be >= 1, got {eval_every}")
    options = spec.compression
    if options.local.active and eval_every % options.local.inner_steps:
        raise ValueError(
            f"train_in_process: eval_every={eval_every} must be a multiple of "
            f"compression.local.inner_steps={options.local.inner_steps}"
        )
    t_start = time.perf_counter()
    data = make_data(spec)
    heldout = data.heldout(eval_split, eval_sequences)
    reps = [_Replica(spec, r) for r in range(spec.dp)]
    boxes = [_Mailbox() for _ in range(spec.pp)]
    plain = not options.dp.active and (not options.local.active or options.local.outer_bits == 32)
    exchanges = None
    if not plain:
        exchanges = [
            [
                _in_process(
                    make_exchange(options, rep.buckets[s], None, mode=spec.dp_mode, seed=spec.seed),
                    boxes[s],
                    r,
                )
                for s in range(spec.pp)
            ]
            for r, rep in enumerate(reps)
        ]
        assert not any(isinstance(x, PlainExchange) for row in exchanges for x in row)
    plain_bytes = 0

    def exchange(step: int, stage: int) -> None:
        """Average stage ``stage``'s buckets over the replicas as the runtime's exchange does."""
        nonlocal plain_bytes
        if spec.dp == 1:
            return
        if plain:  # each replica sends 2·(dp−1)/dp of the buckets (sharded PS or ring)
            _average([rep.buckets[stage].buffers for rep in reps])
            plain_bytes += 2 * (spec.dp - 1) * reps[0].buckets[stage].numel * 4
            return
        _run_threads(
            [(lambda r=r: exchanges[r][stage].sync(step, _NO_TIMELINE)) for r in range(spec.dp)]
        )

    train_loss, eval_iters, eval_loss = [], [0], [reps[0].evaluate(heldout)]
    if on_eval:
        on_eval(0, eval_loss[0])
    m = spec.workload().micro_batches(spec.dp)
    for it in range(spec.iters):
        batch, ids = data.batch(it), data.sample_ids(it)
        total = 0.0
        for r, rep in enumerate(reps):
            for b in rep.buckets:
                b.zero()
            micro = micro_batches(
                batch, dp=spec.dp, replica=r, micro_batch_size=spec.micro_batch_size
            )
            samples = micro_samples(
                ids, dp=spec.dp, replica=r, micro_batch_size=spec.micro_batch_size
            )
            total += rep.forward_backward(micro, samples, m)
        loss = total / (m * spec.dp)
        if not math.isfinite(loss):
            raise RuntimeError(f"train_in_process: loss is {loss} at iteration {it}")
        train_loss.append(loss)
        if reps[0].diloco is None:
            for st in range(spec.pp):
                exchange(it, st)
            for rep in reps:
                for o, sch in zip(rep.opts, rep.scheds, strict=True):
                    o.step()
                    sch.step()
        else:
            for rep in reps:
                for o, sch in zip(rep.opts, rep.scheds, strict=True):
                    o.step()
                    sch.step()
            if reps[0].diloco[0].is_outer_step(it):
                _outer_step(reps, exchange, it)
        if (it + 1) % eval_every == 0 or it + 1 == spec.iters:
            eval_iters.append(it + 1)
            eval_loss.append(reps[0].evaluate(heldout))
            if on_eval:
                on_eval(it + 1, eval_loss[-1])
    dp_bytes = plain_bytes
    if exchanges is not None:
        dp_bytes = sum(x.bytes_sent for row in exchanges for x in row)
    return Curve(
        train_loss=train_loss,
        eval_iters=eval_iters,
        eval_loss=eval_loss,
        dp_bytes=int(dp_bytes),
        wall_s=time.perf_counter() - t_start,
    )


def _outer_step(reps: list[_Replica], exchange, it: int) -> None:
    """DiLoCo's outer step on every replica, stage by stage: each replica's
    :meth:`DiLoCo.outer_step` writes Δ into its buckets and waits at the stage's barrier, whose
    action (run once, when every replica has arrived) is the stage's exchange; then each steps
    its θ_outer. One thread per replica."""
    barriers = [
        threading.Barrier(len(reps), action=lambda s=s: exchange(it, s), timeout=MAX_WAIT_S)
        for s in range(len(reps[0].stages))
    ]

    def one(rep: _Replica) -> None:
        for d, barrier in zip(rep.diloco, barriers, strict=True):
            d.outer_step(barrier.wait)

    _run_threads([lambda rep=rep: one(rep) for rep in reps])


class _NoTimeline:
    """The exchanges time themselves through a timeline; nothing is timed here."""

    class _Span:
        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

    def span(self, *args, **kwargs):
        return self._Span()


_NO_TIMELINE = _NoTimeline()
