"""Compressed training's traffic in the simulator: bytes on the wire and codec overhead.

Throughput only: how many bytes an iteration of our runtime sends and how long encoding them
takes with the options of :mod:`system.compression`, nothing about the loss (the quality studies
measure that). :func:`system.simulator.simulate_ours` uses them when given ``compression=``.

Bytes per iteration (all devices; one bucket per stage, padded to a multiple of dp as the
runtime pads it):

* pipeline: per replica and boundary, M forward and M backward messages
  (:meth:`PipeCompression.forward_nbytes` / :meth:`~PipeCompression.backward_nbytes`); AQ-SGD in
  its steady state (every sample known at every boundary) unless the caller passes the messages'
  new-row counts (:func:`aq_sgd_new_rows`, the first epochs);
* data parallel, per stage of P parameters and n replicas, shard X = ⌈P/n⌉: the sharded PS sends
  2·(n−1) shards per device (compressed: 2·(n−1) compressed shards); the compressed ring sends
  (n−1) compressed whole buckets per device; an all-reduce 2·(n−1)/n·P values;
* DiLoCo: no per-step exchange; every H-th iteration the sharded PS of the parameter change
  (fp32, or int8), so 1/H of it per iteration on average.

Uncompressed values travel as the workload says (``activation_bytes``, ``gradient_bytes``:
fp16 at paper scale, fp32 in the CPU runtime); compressed ones as their codec packs them from
fp32, and DiLoCo's fp32 outer exchange sends fp32 parameter changes.

Compute overhead (a model, not a measurement): encoding and decoding are memory-bound passes over
fp32 data at the hardware's memory bandwidth (``Hardware.hbm_bandwidth_bps``):
:data:`QUANTIZE_PASSES` for quantize + dequantize, :data:`TOPK_PASSES` for a top-k selection
(radix select reads the data several times), :data:`EF_PASSES` for error feedback (add the
residual, keep the new one), :data:`DILOCO_PASSES` for an outer step (pseudo-gradient, momentum,
Nesterov update, copy back).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

from system.compression import Compression, PipeCompression
from system.simulator.hardware import Hardware
from system.workload import Workload, stage_gradient_params

__all__ = [
    "QUANTIZE_PASSES",
    "TOPK_PASSES",
    "EF_PASSES",
    "DILOCO_PASSES",
    "aq_sgd_new_rows",
    "pipeline_message_bytes",
    "iteration_bytes",
    "codec_overhead_s",
]

QUANTIZE_PASSES = 4.0  # max-abs pass, scale-and-round pass, write; the receiver's decode pass
TOPK_PASSES = 8.0  # selection of the k largest magnitudes (several passes of a radix select)
EF_PASSES = 3.0  # x + residual, decode, residual = x − decoded
DILOCO_PASSES = 6.0  # Δ = θ_outer − θ, momentum, Nesterov update, copy into the replica


def aq_sgd_new_rows(
    micro_samples: Iterable[Sequence[Sequence[int]]],
) -> list[list[int]]:
    """Per iteration, per micro-batch: how many rows are samples new to the boundary.

    ``micro_samples`` yields, per iteration, one replica's micro-batches as sample-id lists (the
    same order the runtime sends them); a sample is new the first time it is listed.

    >>> aq_sgd_new_rows([[[1, 2], [3, 4]], [[2, 5], [1, 3]]])
    [[2, 2], [1, 0]]
    """
    seen: set[int] = set()
    out = []
    for micro in micro_samples:
        row = []
        for samples in micro:
            ids = [int(s) for s in samples]
            row.append(sum(s not in seen for s in ids))
            seen.update(ids)
        out.append(row)
    return out


def pipeline_message_bytes(
    pipe: PipeCompression,
    row_numel: int,
    rows: int,
    element_bytes: int,
    *,
    new_rows: int = 0,
) -> tuple[int, int]:
    """(forward, backward) bytes of one micro-batch message of ``rows`` samples of
    ``row_numel`` values each; ``new_rows`` of them new to AQ-SGD's buffers (sent in full)."""
    numel = row_numel * rows
    if pipe.method == "aq_sgd":
        known = rows - new_rows
        fwd = new_rows * row_numel * element_bytes
        fwd += (
            pipe.forward_nbytes(known * row_numel, element_bytes, first_visit=False) if known else 0
        )
    else:
        fwd = pipe.forward_nbytes(numel, element_bytes, first_visit=False)
    return fwd, pipe.backward_nbytes(numel, element_bytes)


def _stage_dp_bytes(
    params: float, dp: int, options: Compression, dp_mode: str, value_bytes: int
) -> float:
    """Bytes one device sends in one exchange of a stage of ``params`` gradients (the DiLoCo
    outer exchange when local SGD is on); ``value_bytes`` per value when uncompressed."""
    if dp == 1:
        return 0.0
    padded = -(-int(params) // dp) * dp
    shard = padded // dp
    if options.local.active:
        return 2 * (dp - 1) * options.local.message_nbytes(shard)
    if options.dp.active:
        if dp_mode == "ring":
            return (dp - 1) * options.dp.message_nbytes(padded)
        return 2 * (dp - 1) * options.dp.message_nbytes(shard)
    return 2 * (dp - 1) * shard * value_bytes  # sharded PS, or a ring all-reduce: the same


def iteration_bytes(
    workload: Workload,
    pp: int,
    dp: int,
    options: Compression,
    *,
    dp_mode: str = "sharded_ps",
    new_rows: Sequence[Sequence[int]] | None = None,
    outer_step: bool | None = None,
) -> dict[str, float]:
    """Payload bytes all devices send in one iteration: ``pipe_bytes``, ``dp_bytes``.

    ``new_rows`` (per replica, per micro-batch: AQ-SGD's new rows this iteration, as
    :func:`aq_sgd_new_rows` gives them) defaults to the steady state (none new). With DiLoCo,
    ``outer_step`` says whether this iteration ends with the outer exchange; ``None`` gives the
    average over H iterations.
    """
    model = workload.model
    m = workload.micro_batches(dp)
    row = model.seq_length * model.hidden_size
    mbs = workload.micro_batch_size
    act = workload.activation_bytes
    pipe = 0.0
    for r in range(dp):
        for i in range(m):
            k = 0 if new_rows is None else int(new_rows[r][i])
            f, b = pipeline_message_bytes(options.pipe, row, mbs, act, new_rows=k)
            pipe += (pp - 1) * (f + b)
    per_device = [
        _stage_dp_bytes(p, dp, options, dp_mode, workload.gradient_bytes)
        for p in stage_gradient_params(model, pp)
    ]
    dp_bytes = dp * float(sum(per_device))
    if options.local.active:
        h = options.local.inner_steps
        dp_bytes = dp_bytes / h if outer_step is None else (dp_bytes if outer_step else 0.0)
    return {"pipe_bytes": pipe, "dp_bytes": dp_bytes}


def codec_overhead_s(
    workload: Workload, pp: int, dp: int, options: Compression, hardware: Hardware
) -> dict[str, np.ndarray | float]:
    """Modelled seconds of encoding/decoding (module docstring): per stage, added to each
    micro-batch's forward (``fwd_s``) and backward (``bwd_s``), to the per-step exchange
    (``dp_s``); and DiLoCo's outer step (``outer_s``, per outer step)."""
    model = workload.model
    act = workload.micro_batch_size * model.seq_length * model.hidden_size
    rate = hardware.hbm_bandwidth_bps / 8.0  # bytes/s
    fwd = np.zeros(pp)
    bwd = np.zeros(pp)
    if options.pipe.active and pp > 1:
        one = QUANTIZE_PASSES * 4.0 * act / rate  # one message, sender + receiver
        fwd[:-1] += one  # every stage but the last sends activations
        fwd[1:] += one  # every stage but the first receives them
        bwd[1:] += one
        bwd[:-1] += one
    active = (options.dp.active and dp > 1) or options.local.active
    params = np.asarray(stage_gradient_params(model, pp), dtype=float) if active else None
    dp_s = np.zeros(pp)
    if options.dp.active and dp > 1:
        passes = QUANTIZE_PASSES + (TOPK_PASSES if options.dp.method == "topk" else 1.0)
        passes += EF_PASSES if options.dp.error_feedback else 0.0
        dp_s = 2.0 * passes * 4.0 * params / rate  # both halves (or every ring payload)
    outer = 0.0
    if options.local.active:
        passes = DILOCO_PASSES + (QUANTIZE_PASSES if options.local.outer_bits != 32 else 0.0)
        outer = float((passes * 4.0 * params / rate).max())
    return {"fwd_s": fwd, "bwd_s": bwd, "dp_s": dp_s, "outer_s": outer}
