"""Megatron-LM's 1F1B op orders, as programs for the simulator's event replay.

- ``forward_backward_pipelining_without_interleaving`` (megatron-core ``pipeline_parallel/
  schedules.py``): warm-up forwards, then steady 1F1B, then cool-down backwards, every transfer
  a blocking batched p2p call (``batch_isend_irecv`` + wait) that pairs a send with the next
  receive (``send_forward_recv_backward``, ``send_backward_recv_forward``). Registered as
  ``schedule="megatron"``.
- ``forward_backward_pipelining_with_interleaving`` (the same file, megatron-core 0.16, default
  ``overlap_p2p_comm=False``): v model chunks per stage (virtual stage c·p + s on stage s,
  layers per stage divisible by v). Micro-batches go in groups of
  ``microbatch_group_size_per_vp_stage`` (default p): per group every chunk in turn runs the
  group's micro-batches (``get_schedule_table``), so the number of micro-batches must be a
  multiple of p. Stage s warms up with min(2·(p − s − 1) + (v − 1)·p, m·v) chunk forwards
  (``get_pp_rank_microbatches``), then runs one forward and one backward (chunks in reverse)
  per step, then the cool-down backwards; each step ends in one batched call
  (``send_forward_recv_forward``, ``send_forward_backward_recv_forward_backward``,
  ``send_backward_recv_backward``). Which steps receive follows
  ``recv_tensor_from_previous_stage``; a receive takes the next message its peer sent in that
  direction (p2p messages between two ranks match in order). :func:`megatron_interleaved_program`
  gives the program function of v chunks (its ``virtual_stages`` attribute tells the replay).

Replayed by :func:`system.simulator.replay.replay`.
"""

from __future__ import annotations

import functools

from baselines.space import interleaving_allowed
from system.simulator.replay import (
    Key,
    Msg,
    Op,
    ProgramFn,
    backward,
    call,
    forward,
    register_program,
)

__all__ = ["megatron_1f1b_program", "megatron_interleaved_program"]


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


def _schedule_table(m: int, v: int, group: int) -> list[tuple[int, int]]:
    """(micro-batch, chunk) of each forward virtual micro-batch id (``get_schedule_table``).

    >>> _schedule_table(4, 2, 2)
    [(0, 0), (1, 0), (0, 1), (1, 1), (2, 0), (3, 0), (2, 1), (3, 1)]
    """
    table = []
    for lo in range(0, m, group):
        hi = m if lo + group >= m else lo + group  # the last group takes the rest
        table += [(i, c) for c in range(v) for i in range(lo, hi)]
    return table


@functools.lru_cache(maxsize=64)
def _interleaved(p: int, m: int, v: int) -> tuple[tuple[Op, ...], ...]:
    """Every stage's program of the interleaved schedule (module docstring). RuntimeError if a
    chunk would run before its input arrived (a check of the transcription)."""
    if not interleaving_allowed(p, m, v, p * v):
        raise ValueError(
            f"interleaved 1F1B: needs p > 1, v > 1 and micro-batches a positive multiple of p; "
            f"got p={p}, v={v}, m={m}"
        )
    table = _schedule_table(m, v, p)
    n = m * v  # virtual micro-batches per stage

    def fwd(k: int) -> tuple[int, int]:
        return table[k]

    def bwd(k: int) -> tuple[int, int]:
        i, c = table[k]
        return i, v - 1 - c

    def receives(s: int, k: int, forward_: bool) -> bool:
        """``recv_tensor_from_previous_stage``: does stage s receive after virtual id k?"""
        if s != (0 if forward_ else p - 1):  # not the leading stage of this direction
            return True
        if k < p - 1:  # the ending stage has produced nothing yet
            return False
        c = table[k - (p - 1)][1]  # the aligned id's chunk on the ending stage
        return (c if forward_ else v - 1 - c) != (v - 1 if forward_ else 0)

    # per stage: ("F"|"B", micro-batch, chunk) and calls as lists of sends and "f"/"b" receives
    progs: list[list] = []
    for s in range(p):
        warm = min(2 * (p - s - 1) + (v - 1) * p, n)
        rest = n - warm

        def send_f(k: int, s: int = s) -> list:
            i, c = fwd(k)
            return [] if (c == v - 1 and s == p - 1) else [Msg("send", Key("f", i, c * p + s))]

        def send_b(k: int, s: int = s) -> list:
            i, c = bwd(k)
            return [] if (c == 0 and s == 0) else [Msg("send", Key("b", i, c * p + s - 1))]

        ops: list = [["f"]] if s > 0 else []  # recv_forward of chunk 0's first input
        for k in range(warm):  # warm-up
            ops.append(("F", *fwd(k)))
            msgs = send_f(k) + (["f"] if receives(s, k, True) and k != n - 1 else [])
            if k == warm - 1 and rest > 0 and s != p - 1:  # the first backward's gradient
                msgs.append("b")
            ops.append(msgs)
        for k in range(rest):  # steady 1F1B
            ops += [("F", *fwd(warm + k)), ("B", *bwd(k))]
            msgs = send_f(warm + k) + send_b(k)
            msgs += ["f"] if receives(s, warm + k, True) and k != rest - 1 else []
            msgs += ["b"] if receives(s, k, False) else []
            ops.append(msgs)
        if rest == 0 and s != p - 1:  # every micro-batch in warm-up: recv_backward
            ops.append(["b"])
        for k in range(rest, n):  # cool-down
            ops.append(("B", *bwd(k)))
            ops.append(send_b(k) + (["b"] if receives(s, k, False) and k != n - 1 else []))
        progs.append(ops)
    # a receive takes the next message its peer sent in that direction
    sent = {(s, d): [] for s in range(p) for d in ("f", "b")}
    for s in range(p):
        for o in progs[s]:
            for x in o if isinstance(o, list) else ():
                if isinstance(x, Msg):
                    sent[s, x.key.direction].append(x.key)
    taken = dict.fromkeys(sent, 0)
    out = []
    for s in range(p):
        ops, have = [], set()
        for o in progs[s]:
            if isinstance(o, tuple):  # a chunk's compute needs its input (or gradient) first
                kind, i, c = o
                v_stage = c * p + s
                need = Key("f", i, v_stage - 1) if kind == "F" else Key("b", i, v_stage)
                first = v_stage == 0 if kind == "F" else v_stage == p * v - 1
                if not first and need not in have:
                    raise RuntimeError(f"interleaved 1F1B: stage {s} runs {o} before {need}")
                ops.append(forward(i) if kind == "F" else backward(i))
                continue
            msgs = []
            for x in o:
                if isinstance(x, Msg):
                    msgs.append(x)
                    continue
                peer = ((s - 1) % p, "f") if x == "f" else ((s + 1) % p, "b")
                if taken[peer] >= len(sent[peer]):
                    raise RuntimeError(f"interleaved 1F1B: stage {s} receives more than sent")
                key = sent[peer][taken[peer]]
                taken[peer] += 1
                have.add(key)
                msgs.append(Msg("recv", key))
            if msgs:
                ops.append(call(*msgs))
        out.append(tuple(ops))
    if any(taken[k] != len(sent[k]) for k in sent):
        raise RuntimeError("interleaved 1F1B: a message is sent but never received")
    return tuple(out)


@functools.cache
def megatron_interleaved_program(v: int) -> ProgramFn:
    """The program function of Megatron's interleaved 1F1B with ``v`` chunks per stage (one
    function object per v, so the replay's caches key on it). Its messages name virtual links
    (``virtual_stages`` = v); long passes are extrapolated per group of p micro-batches
    (:func:`system.simulator.replay.replay_end_s`).

    >>> prog = megatron_interleaved_program(2)
    >>> [o.kind + str(o.arg) for o in prog(1, 2, 2) if o.kind != "C"]
    ['F0', 'F1', 'F0', 'B0', 'F1', 'B1', 'B0', 'B1']
    """
    if v < 2:
        raise ValueError(f"interleaved 1F1B: v must be >= 2, got {v}")

    def program(stage: int, p: int, m: int) -> list[Op]:
        return list(_interleaved(p, m, v)[stage])

    program.virtual_stages = v  # type: ignore[attr-defined]
    program.__name__ = program.__qualname__ = f"megatron_interleaved_v{v}"
    return program
