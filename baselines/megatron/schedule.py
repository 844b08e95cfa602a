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
  Its programs are built as flat arrays by a compiled kernel (the function's ``flat``
  attribute, :class:`system.simulator.replay.FlatProgram`): a long pass's program runs to tens
  of thousands of ops, too many to build one Python object each.

Replayed by :func:`system.simulator.replay.replay`.
"""

from __future__ import annotations

import functools

import numpy as np

from baselines.space import interleaving_allowed
from system.compiled import kernel
from system.simulator.replay import (
    FlatProgram,
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


@kernel
def _interleaved_kernel(p, m, v, tab_i, tab_c):
    """Every stage's program of the interleaved schedule (module docstring) as the arrays of a
    :class:`~system.simulator.replay.FlatProgram`, then a status and a stage: status 0 built;
    1 the stage would run a chunk before its input arrived, 2 the stage receives more than its
    peer sent, 3 a message is sent but never received (checks of the transcription).

    Virtual id k of a stage runs micro-batch ``tab_i[k]`` of chunk ``tab_c[k]`` forward
    (:func:`_schedule_table`), and its backward the same micro-batch of chunk v − 1 −
    ``tab_c[k]``. Stage s: a receive of chunk 0's first input (s > 0); ``warm`` = min(2·(p − s −
    1) + (v − 1)·p, m·v) forwards, each then one call (its send, the next input's receive and,
    after the last, the first gradient's); ``rest`` = m·v − ``warm`` steady steps (a forward, a
    backward, one call of both sends and both receives); a lone gradient receive when ``rest``
    is 0 (s < p − 1); ``warm`` cool-down backwards, each then a call. Which steps receive follows
    ``recv_tensor_from_previous_stage``. A receive takes the next message its peer sent in that
    direction (p2p messages between two ranks match in order), and a stage sends in the order of
    its virtual ids: the j-th activation stage q sends is virtual id j's (j-th of those whose
    chunk is not the last, on stage p − 1), and so for the gradients (the first chunk's left
    out on stage 0)."""
    n = m * v
    kept = np.empty(n, np.int64)  # virtual ids whose forward chunk is not the last
    n_kept = 0
    for k in range(n):
        if tab_c[k] != v - 1:
            kept[n_kept] = k
            n_kept += 1
    ops = np.empty(p * (4 * n + 2), np.int64)
    op_start = np.zeros(p + 1, np.int64)
    call_start = np.empty(p * (2 * n + 2), np.int64)
    call_len = np.empty(p * (2 * n + 2), np.int64)
    size = p * (4 * n + 4)
    send, back = np.empty(size, np.int64), np.empty(size, np.int64)
    mb, link = np.empty(size, np.int64), np.empty(size, np.int64)
    links = p * v
    have = np.full(2 * m * links, -1, np.int64)  # per key: the stage that received it
    taken = np.zeros((2, p), np.int64)  # receives taken from each stage, per direction
    status = 0
    failed_at = -1
    n_ops = n_calls = n_msgs = 0
    for s in range(p):
        if status:
            break
        warm = min(2 * (p - s - 1) + (v - 1) * p, n)
        rest = n - warm
        pre = 1 if s > 0 else 0
        mid = 1 if rest == 0 and s != p - 1 else 0
        for t in range(pre + warm + rest + mid + warm):
            fk = bk = sf = sb = -1  # forward / backward virtual id, sent forward / backward
            rf = rb = False  # receives an activation / a gradient
            u = t - pre
            if u < 0:
                rf = True
            elif u < warm:  # warm-up
                fk = sf = u
                rf = (s != 0 or (u >= p - 1 and tab_c[u - (p - 1)] != v - 1)) and u != n - 1
                rb = u == warm - 1 and rest > 0 and s != p - 1
            elif u < warm + rest:  # steady 1F1B
                j = u - warm
                fk = sf = warm + j
                bk = sb = j
                g = warm + j
                rf = (s != 0 or (g >= p - 1 and tab_c[g - (p - 1)] != v - 1)) and j != rest - 1
                rb = s != p - 1 or (j >= p - 1 and tab_c[j - (p - 1)] != v - 1)
            elif mid and u == warm:  # every id in warm-up: recv_backward
                rb = True
            else:  # cool-down
                j = u - warm - mid
                bk = sb = j
                rb = (s != p - 1 or (j >= p - 1 and tab_c[j - (p - 1)] != v - 1)) and j != n - 1
            for kind in range(2):  # the step's computes, each once its input is here
                vk = fk if kind == 0 else bk
                if vk < 0:
                    continue
                c = tab_c[vk] if kind == 0 else v - 1 - tab_c[vk]
                vs = c * p + s
                need = -1
                if kind == 0 and vs != 0:
                    need = tab_i[vk] * links + vs - 1
                elif kind == 1 and vs != links - 1:
                    need = (m + tab_i[vk]) * links + vs
                if need >= 0 and have[need] != s:
                    status, failed_at = 1, s
                    break
                ops[n_ops] = kind
                n_ops += 1
            if status:
                break
            begin = n_msgs
            if sf >= 0 and not (tab_c[sf] == v - 1 and s == p - 1):
                send[n_msgs], back[n_msgs] = 1, 0
                mb[n_msgs], link[n_msgs] = tab_i[sf], tab_c[sf] * p + s
                n_msgs += 1
            if sb >= 0 and not (tab_c[sb] == v - 1 and s == 0):
                send[n_msgs], back[n_msgs] = 1, 1
                mb[n_msgs], link[n_msgs] = tab_i[sb], (v - 1 - tab_c[sb]) * p + s - 1
                n_msgs += 1
            for d in range(2):  # the receives: the next message the peer sent that way
                if (d == 0 and not rf) or (d == 1 and not rb):
                    continue
                q = (s - 1) % p if d == 0 else (s + 1) % p
                edge = q == p - 1 if d == 0 else q == 0  # a sender that leaves ids out
                j = taken[d, q]
                if j >= (n_kept if edge else n):
                    status, failed_at = 2, s
                    break
                taken[d, q] = j + 1
                vk = kept[j] if edge else j
                lk = tab_c[vk] * p + q if d == 0 else (v - 1 - tab_c[vk]) * p + q - 1
                send[n_msgs], back[n_msgs], mb[n_msgs], link[n_msgs] = 0, d, tab_i[vk], lk
                n_msgs += 1
                have[(d * m + tab_i[vk]) * links + lk] = s
            if status:
                break
            if n_msgs > begin:
                ops[n_ops] = 2 + n_calls
                n_ops += 1
                call_start[n_calls] = begin
                call_len[n_calls] = n_msgs - begin
                n_calls += 1
        op_start[s + 1] = n_ops
    for q in range(p):  # every message sent is received
        if status == 0 and (
            taken[0, q] != (n_kept if q == p - 1 else n) or taken[1, q] != (n_kept if q == 0 else n)
        ):
            status = 3
    return (
        ops[:n_ops],
        op_start,
        call_start[:n_calls],
        call_len[:n_calls],
        send[:n_msgs],
        back[:n_msgs],
        mb[:n_msgs],
        link[:n_msgs],
        status,
        failed_at,
    )


_FAILED = {
    1: "interleaved 1F1B: stage {} would run a chunk before its input arrived",
    2: "interleaved 1F1B: stage {} receives more than sent",
    3: "interleaved 1F1B: a message is sent but never received",
}


@functools.lru_cache(maxsize=64)
def _interleaved(p: int, m: int, v: int) -> FlatProgram:
    """Every stage's program of the interleaved schedule (:func:`_interleaved_kernel`),
    read-only. RuntimeError if a check of the transcription fails."""
    if not interleaving_allowed(p, m, v, p * v):
        raise ValueError(
            f"interleaved 1F1B: needs p > 1, v > 1 and micro-batches a positive multiple of p; "
            f"got p={p}, v={v}, m={m}"
        )
    tab_i, tab_c = np.array(_schedule_table(m, v, p), dtype=np.int64).reshape(-1, 2).T
    *arrays, status, stage = _interleaved_kernel(
        p, m, v, np.ascontiguousarray(tab_i), np.ascontiguousarray(tab_c)
    )
    if status:
        raise RuntimeError(_FAILED[int(status)].format(stage))
    for x in arrays:
        x.flags.writeable = False  # kept and shared
    return FlatProgram(*arrays)


def _interleaved_ops(p: int, m: int, v: int, stage: int) -> list[Op]:
    """Stage ``stage``'s program of :func:`_interleaved` as ops: its n-th forward (backward)
    is virtual id n's, of micro-batch ``_schedule_table(m, v, p)[n][0]``."""
    flat = _interleaved(p, m, v)
    table = _schedule_table(m, v, p)
    done = {0: 0, 1: 0}  # forwards, backwards so far
    out: list[Op] = []
    for o in flat.ops[flat.op_start[stage] : flat.op_start[stage + 1]].tolist():
        if o < 2:
            i = table[done[o]][0]
            done[o] += 1
            out.append(forward(i) if o == 0 else backward(i))
            continue
        first = int(flat.call_start[o - 2])
        msgs = [
            Msg(
                "send" if flat.send[j] else "recv",
                Key("b" if flat.back[j] else "f", int(flat.micro_batch[j]), int(flat.link[j])),
            )
            for j in range(first, first + int(flat.call_len[o - 2]))
        ]
        out.append(call(*msgs))
    return out


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
        return _interleaved_ops(p, m, v, stage)

    program.virtual_stages = v  # type: ignore[attr-defined]
    program.flat = lambda p, m: _interleaved(p, m, v)  # type: ignore[attr-defined]
    program.__name__ = program.__qualname__ = f"megatron_interleaved_v{v}"
    return program
