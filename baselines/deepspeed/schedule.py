"""DeepSpeed's pipeline ``TrainSchedule`` op order, as a program for the simulator's event replay.

DeepSpeed's ``deepspeed/runtime/pipe/schedule.py``: 2·(m + p − 1) steps; even stages run forwards
on even steps and backwards on odd ones, odd stages the reverse. A forward step first sends the
previous step's input gradient back and receives this micro-batch's activation; a backward step
first receives this micro-batch's gradient and then sends the previous step's activation on —
each a blocking call of its own (``dist.send`` / ``dist.recv``), so an activation leaves only
after the next gradient came. Replayed by :func:`system.simulator.replay.replay`; registered
there as ``schedule="deepspeed"``.
"""

from __future__ import annotations

from system.simulator.replay import Key, Msg, Op, backward, call, forward, register_program

__all__ = ["deepspeed_train_program"]


def deepspeed_train_program(stage: int, p: int, m: int) -> list[Op]:
    """Stage ``stage``'s ops of one ``TrainSchedule`` over ``p`` stages, ``m`` micro-batches."""
    s = stage
    ops: list[Op] = []
    prev = -1
    for step in range(2 * (m + p - 1)):
        is_forward = step % 2 == s % 2
        if is_forward:
            mb = (step if step % 2 == 0 else step - 1) // 2 - s // 2
        elif step % 2 == 0:  # odd stage, even step
            mb = step // 2 - p + (s + 1) // 2
        else:  # even stage, odd step
            mb = (step - 1) // 2 - p + 1 + s // 2
        ok, ok_prev = 0 <= mb < m, 0 <= prev < m
        if is_forward and s > 0:
            if ok_prev:
                ops.append(call(Msg("send", Key("b", prev, s - 1))))
            if ok:
                ops.append(call(Msg("recv", Key("f", mb, s - 1))))
        elif not is_forward and s < p - 1:
            if ok:
                ops.append(call(Msg("recv", Key("b", mb, s))))
            if ok_prev:
                ops.append(call(Msg("send", Key("f", prev, s))))
        if ok:
            ops.append(forward(mb) if is_forward else backward(mb))
        prev = mb
    return ops


register_program("deepspeed", deepspeed_train_program)
