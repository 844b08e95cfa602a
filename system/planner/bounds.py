"""Lower bounds on the iteration time of any plan the planner can make.

Per sequence, a forward and backward pass through every layer and the output layer costs at
least ``w = 3 ×`` its forward FLOPs (no recomputation; Narayanan et al., SC'21). For a shape
(``pp`` stages, ``dp`` replicas, micro-batches of ``b`` sequences, ``m = B / (dp·b)`` of them
per replica) on any ``pp·dp`` devices of the fleet, each at its best sustained rate:

- compute: the replicas' summed rate is at most ``S``, the summed rate of the fleet's
  ``pp·dp`` fastest devices, so the slowest replica's rate ``R`` is at most ``S / dp``, and it
  computes ``m·b·w`` FLOPs: ``T >= m·b·w·dp / S``;
- pipeline fill and drain: a replica's stages take ``t_s`` per micro-batch; its last
  micro-batch cannot finish before ``(m − 1)·max_s t_s + Σ_s t_s`` (GPipe and 1F1B alike), with
  ``max_s t_s >= b·w / R`` and ``Σ_s t_s >= b·w / r_max`` (``r_max`` the fastest device's
  rate): ``T >= (m − 1)·b·w·dp / S + b·w / r_max``.

- pipeline messages: with more stages than the most GPUs on one machine (``H``), some
  boundary of every replica crosses machines, and its link streams the replica's ``B / dp``
  sequences' activations (``seq·hidden`` values of 2 bytes each) one way at no more than
  ``β_off``, the fastest link between two machines: ``T >= (B / dp)·seq·hidden·2·8 / β_off``
  (every link-sharing model caps a pair at its β);
- data-parallel exchange, under the ``tc_class`` link-sharing model only
  (:mod:`system.simulator.sharing`: a sender's flows to destinations of one (delay, bandwidth)
  setting share that setting's rate): some stage holds ``⌈L / pp⌉`` layers, so its devices'
  gradients ``P`` are at least that many layers' parameters; in the sharded parameter server
  (paper §3.2, :func:`system.simulator.comm.sharded_ps_p2p_s`) each of its devices sends a
  shard of ``P / dp`` values to every other member once its own backward pass is done, at least
  ``dp − H`` of them off its machine (``H`` the most GPUs on one machine), through classes
  whose rates sum to at most ``C`` (the most, over devices, of the summed rates of the distinct
  settings of its off-machine destinations): ``T >= (B / dp)·⌈L / pp⌉·w_layer / r_max +
  (dp − H)·(P / dp)·g·8 / C``, ``g`` the gradient bytes per value. Under the other models
  flows of different pairs do not share, and this term is left out.

The bound is the least over every shape and micro-batch size the planner searches of the larger
of the two, leaving out the shapes whose stages cannot fit on the fleet's largest GPU even with
one micro-batch in flight and full recomputation (some stage holds ``⌈L / pp⌉`` layers).
Communication (the pipeline's messages, the data-parallel exchange) and the optimizer step
are left out, so the bound holds for every placement, link-sharing model and schedule; the
gap it leaves is what those cost, and what no shape can avoid.
"""

from __future__ import annotations

import numpy as np

from system.simulator.hardware import layer_forward_flops, logits_forward_flops

__all__ = ["iteration_lower_bound_s"]


def iteration_lower_bound_s(planner) -> float:
    """The bound (module docstring) of ``planner``'s problem, seconds."""
    model = planner.model
    w = 3.0 * (model.num_layers * layer_forward_flops(model, 1) + logits_forward_flops(model, 1))
    rates = np.sort(np.asarray(planner.best_rate, dtype=float))[::-1]
    top = np.cumsum(rates)  # top[n-1]: the n fastest devices' summed rate
    r_max = float(rates[0])
    best = np.inf
    most = float(np.max(planner.usable))
    exchange = _exchange_terms(planner)
    host = np.asarray(planner.cluster.host_of)
    host_gpus_all = int(np.bincount(host).max())
    off_bw_bps = _fastest_off_host_bps(planner.cluster)
    for pp, dp in planner.shapes(len(rates)):
        layers = -(-model.num_layers // pp)
        if planner.stage_memory(pp // 2 if pp > 2 else 0, pp, layers, 1, 1, "full") > most:
            continue  # a middle stage (the first when pp <= 2) cannot hold its layers
        s = float(top[pp * dp - 1])
        for b in planner.micro_batch_sizes:
            if planner.batch % (dp * b):
                continue
            m = planner.batch // (dp * b)
            compute = m * b * w * dp / s
            fill = (m - 1) * b * w * dp / s + b * w / r_max
            dp_term = 0.0
            if exchange is not None:
                host_gpus, off_bps = exchange
                params = layers * model.params_per_layer
                per_seq_layers = 3.0 * layers * layer_forward_flops(model, 1)
                off = max(0, dp - host_gpus)
                dp_term = (planner.batch / dp) * per_seq_layers / r_max
                dp_term += off * (params / dp) * GRADIENT_BYTES * 8.0 / off_bps
            pipe_term = 0.0
            if pp > host_gpus_all and off_bw_bps > 0:
                act = model.seq_length * model.hidden_size * ACTIVATION_BYTES * 8.0
                pipe_term = (planner.batch / dp) * act / off_bw_bps
            best = min(best, max(compute, fill, dp_term, pipe_term))
    return float(best)


GRADIENT_BYTES = 2  # fp16 gradients on the wire (system/workload.py Workload.gradient_bytes)
ACTIVATION_BYTES = 2  # fp16 activations on the wire (Workload.activation_bytes)


def _fastest_off_host_bps(cluster) -> float:
    """The fastest link between devices of two machines, bit/s (0 when there is one machine)."""
    host = np.asarray(cluster.host_of)
    best = 0.0
    bw = cluster.bandwidth_bps
    for h in np.unique(host):
        rows = np.flatnonzero(host == h)
        off = host != h
        if off.any():
            best = max(best, float(bw[np.ix_(rows, np.flatnonzero(off))].max()))
    return best


def _exchange_terms(planner) -> tuple[int, float] | None:
    """(most GPUs on one machine, the most summed off-machine class rate of any device, bit/s)
    under ``tc_class``; None under the other link-sharing models."""
    from system.simulator.sharing import link_sharing_of

    cluster = planner.cluster
    if link_sharing_of(cluster) != "tc_class" or cluster.links is not None:
        return None
    host = np.asarray(cluster.host_of)
    host_gpus = int(np.bincount(host).max())
    delay, bw = cluster.delay_ms, cluster.bandwidth_bps
    best = 0.0
    for h in np.unique(host):
        rows = np.flatnonzero(host == h)
        off = np.flatnonzero(host != h)
        if off.size == 0:
            continue
        d_rows, b_rows = delay[np.ix_(rows, off)], bw[np.ix_(rows, off)]
        # devices of one machine whose off-machine links are alike share one computation
        alike = (d_rows == d_rows[0]).all() and (b_rows == b_rows[0]).all()
        for k in range(1 if alike else len(rows)):
            pairs = np.unique(np.stack([d_rows[k], b_rows[k]], axis=1), axis=0)
            best = max(best, float(pairs[:, 1].sum()))
    return (host_gpus, best) if best > 0 else None
