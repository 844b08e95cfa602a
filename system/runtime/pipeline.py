"""GPipe schedule for one stage (paper §3.5): all forward micro-batches, then all backward.

Per stage, with M micro-batches of its replica's macro-batch:

* forward: receive the input of micro-batch i (posted ``recv_ahead`` ahead; by default all at the
  start of the pass), run the stage, post the send of its output; the last stage computes the
  loss instead. gloo and NCCL send a message only once the receiver has posted its receive, so a
  receive posted when the previous micro-batch arrives would cost its sender a notice crossing
  the link (α) per micro-batch on long links.
* backward, micro-batches in reverse order: receive the output gradient (posted ahead), run
  backward, post the send of the input gradient to the previous stage.
* drain: wait for all sends, so buffers live until the wire is done.

The last stage back-propagates ``loss_i · loss_scale / M``; summed over i that is the macro-batch
mean (scaled), and :mod:`system.runtime.data_parallel` averages over replicas, so the update is
the global-batch mean gradient whatever pp, dp and the layout are.

What crosses a boundary is the stage's :class:`~system.runtime.wire.StageWires`' business: by
default the tensors themselves (fp32, fp16 with amp); with pipeline compression quantized
activations and gradients, or AQ-SGD's per-sample changes (``samples``: each micro-batch's
dataset indices). Encoding and decoding are timed as ``codec`` spans.
"""

from __future__ import annotations

from contextlib import nullcontext

import torch

from system.compression import PipeCompression
from system.runtime.groups import RankPosition
from system.runtime.model import Stage, lm_loss
from system.runtime.p2p import P2P, Pending
from system.runtime.wire import StageWires, make_wires

__all__ = ["gpipe_iteration"]


def gpipe_iteration(
    stage: Stage,
    place: RankPosition,
    comm: P2P,
    micro: list[tuple[torch.Tensor, torch.Tensor]],
    *,
    hidden_size: int,
    loss_scale: float = 1.0,
    amp: bool = False,
    recv_ahead: int | None = None,
    wires: StageWires | None = None,
    samples: list[list[int]] | None = None,
    loss_divisor: int | None = None,
) -> list[float]:
    """Run forward and backward of all micro-batches on this stage; gradients accumulate in
    ``stage``'s parameters. Returns the per-micro-batch losses (last stage; else empty).

    ``recv_ahead`` receives are kept posted ahead of compute (None: all of the pass at once).
    ``wires``: what crosses the boundaries (default: the tensors in the wire dtype);
    ``samples``: per micro-batch, its samples' dataset indices (AQ-SGD's buffers need them).
    ``loss_divisor``: the M of ``loss_i · loss_scale / M`` (default: this pass's micro-batches;
    an iteration of several accumulation passes divides by all of its micro-batches)."""
    m = len(micro)
    divisor = m if loss_divisor is None else loss_divisor
    recv_ahead = m if recv_ahead is None else recv_ahead
    dev = comm.device
    tl = comm.timeline
    mb, seq = micro[0][0].shape
    act_shape = (mb, seq, hidden_size)
    wire = torch.float16 if amp else torch.float32
    wires = wires or make_wires(PipeCompression(), wire)
    samples = samples or [list(range(mb))] * m  # only AQ-SGD reads them
    autocast = torch.autocast(device_type="cuda", dtype=torch.float16) if amp else nullcontext()
    inputs: list[torch.Tensor | None] = [None] * m
    outputs: list[torch.Tensor | None] = [None] * m
    losses: list[torch.Tensor] = []
    sends: list[Pending] = []

    # ---- forward: all micro-batches ----
    recvs: dict[int, Pending] = {}

    def post_fwd(i: int) -> None:
        if i < m and not place.is_first:
            buf = wires.fwd_in.recv_buffer(act_shape, samples[i], dev)
            recvs[i] = comm.irecv_into(buf, place.prev_rank, tag=i, name=f"recv F{i}")

    for i in range(recv_ahead):
        post_fwd(i)
    for i in range(m):
        if place.is_first:
            x = micro[i][0].to(dev, non_blocking=True)
        else:
            msg = comm.wait(recvs.pop(i))
            with tl.span("codec", f"decode F{i}"):
                x = wires.fwd_in.decode(msg, act_shape, samples[i]).requires_grad_()
            post_fwd(i + recv_ahead)
        with tl.span("compute", f"F{i}"), autocast:
            y = stage(x)
            if place.is_last:
                loss = lm_loss(y, micro[i][1].to(dev, non_blocking=True))
                losses.append(loss.detach())
                y = loss * (loss_scale / divisor)
        if not place.is_last:
            with tl.span("codec", f"encode F{i}"):
                msg = wires.fwd_out.encode(y.detach(), samples[i])
            sends.append(comm.isend(msg, place.next_rank, tag=i, name=f"send F{i}"))
        inputs[i], outputs[i] = x, y

    # ---- backward: all micro-batches, reverse order ----
    order = list(reversed(range(m)))
    grecvs: dict[int, Pending] = {}

    def post_bwd(k: int) -> None:
        if k < m and not place.is_last:
            i = order[k]
            buf = wires.bwd_in.recv_buffer(act_shape, samples[i], dev)
            grecvs[i] = comm.irecv_into(buf, place.next_rank, tag=m + i, name=f"recv B{i}")

    for k in range(recv_ahead):
        post_bwd(k)
    for k, i in enumerate(order):
        if place.is_last:
            with tl.span("compute", f"B{i}"):
                outputs[i].backward()
        else:
            msg = comm.wait(grecvs.pop(i))
            with tl.span("codec", f"decode B{i}"):
                g = wires.bwd_in.decode(msg, act_shape, samples[i])
            post_bwd(k + recv_ahead)
            with tl.span("compute", f"B{i}"):
                outputs[i].backward(g.to(outputs[i].dtype))
        if not place.is_first:
            with tl.span("codec", f"encode B{i}"):
                gx = wires.bwd_out.encode(inputs[i].grad, samples[i])
            sends.append(comm.isend(gx, place.prev_rank, tag=m + i, name=f"send B{i}"))
        inputs[i] = outputs[i] = None  # free the graph and activations

    # ---- drain ----
    for p in sends:
        comm.wait(p)
    return [float(v) for v in losses]
