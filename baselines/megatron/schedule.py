"""Megatron-LM's non-interleaved 1F1B op order, as a program for the simulator's event replay.

Megatron-LM's ``forward_backward_pipelining_without_interleaving`` (``schedules.py``): warm-up
forwards, then steady 1F1B, then cool-down backwards, every transfer a blocking batched p2p call
(``batch_isend_irecv`` + wait) that pairs a send with the next receive
(``send_forward_recv_backward``, ``send_backward_recv_forward``). Replayed by
:func:`system.simulator.replay.replay`; registered there as ``schedule="megatron"``.
"""

from __future__ import annotations

from system.simulator.replay import Key, Msg, Op, backward, call, forward, register_program

__all__ = ["megatron_1f1b_program"]


def megatron_1f1b_program(stage: int, p: int, m: int) -> list[Op]:
    """Stage ``stage``'s ops of one 1F1B pass over ``p`` stages and ``m`` micro-batches."""
    s = stage

    def recv_f(i):
        return [Msg("recv", Key("f", i, s - 1))] if s > 0 else []

    def send_f(i):
        return [Msg("send", Key("f", i, s))] if s < p - 1 else []

    def recv_b(i):
        return [Msg("recv", Key("b", i, s))] if s < p - 1 else []

    def send_b(i):
        return [Msg("send", Key("b", i, s - 1))] if s > 0 else []

    ops: list[Op] = []

    def blocking(msgs):
        if msgs:
            ops.append(call(*msgs))

    # warm-up: the forwards that fill the pipeline below this stage
    warm = min(p - s - 1, m)
    rest = m - warm
    for i in range(warm):
        blocking(recv_f(i))
        ops.append(forward(i))
        blocking(send_f(i))
    if rest > 0:
        blocking(recv_f(warm))
    # steady 1F1B
    for j in range(rest):
        ops.append(forward(warm + j))
        blocking(send_f(warm + j) + recv_b(j))  # send_forward_recv_backward
        ops.append(backward(j))
        blocking(send_b(j) if j == rest - 1 else send_b(j) + recv_f(warm + j + 1))
    # cool-down
    for i in range(rest, m):
        blocking(recv_b(i))
        ops.append(backward(i))
        blocking(send_b(i))
    return ops


register_program("megatron", megatron_1f1b_program)
