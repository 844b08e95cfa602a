"""The simulator's event replay (op-order programs) and the frameworks' programs it replays."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from baselines.deepspeed.schedule import deepspeed_train_program
from baselines.megatron.schedule import megatron_1f1b_program, megatron_interleaved_program
from system.simulator.replay import (
    Key,
    Msg,
    _programs,
    backward,
    call,
    forward,
    gpipe_blocking_program,
    program_for,
    register_program,
    replay,
    replay_end_s,
)

PROGRAMS = [megatron_1f1b_program, deepspeed_train_program, gpipe_blocking_program]


@pytest.mark.parametrize("fn", PROGRAMS)
@pytest.mark.parametrize("p,m", [(1, 3), (2, 1), (3, 5), (5, 2), (6, 9)])
def test_programs_are_well_formed(fn, p, m):
    # every stage computes each micro-batch's forward once before its backward, and every
    # message between neighbours is sent exactly once and received exactly once
    ends = Counter()
    for s in range(p):
        ops = fn(s, p, m)
        fwd = [op.arg for op in ops if op.kind == "F"]
        bwd = [op.arg for op in ops if op.kind == "B"]
        assert sorted(fwd) == list(range(m)) and sorted(bwd) == list(range(m))
        for i in range(m):
            assert fwd.index(i) < len(ops) and ops.index(forward(i)) < ops.index(backward(i))
        for op in ops:
            if op.kind == "C":
                for msg in op.arg:
                    ends[msg] += 1
    keys = {msg.key for msg in ends}
    assert len(keys) == 2 * m * (p - 1)
    for key in keys:
        assert ends[Msg("send", key)] == 1 and ends[Msg("recv", key)] == 1


def test_replay_of_a_hand_written_program():
    # 2 stages, 1 micro-batch: F0 on stage 0, activation over the link (busy X, delay L), F0 and
    # B0 on stage 1, gradient back, B0 on stage 0: stage 0 ends at 2f + 2b + 2X + 2L
    f, b, busy, lat = 0.1, 0.2, 0.03, 0.5
    act, grad = Key("f", 0, 0), Key("b", 0, 0)
    prog = {
        0: [forward(0), call(Msg("send", act)), call(Msg("recv", grad)), backward(0)],
        1: [call(Msg("recv", act)), forward(0), backward(0), call(Msg("send", grad))],
    }

    def two_stages(stage, p, m):
        return prog[stage]

    one = np.ones((1, 1))
    ends = replay(
        np.array([[f], [f]]),
        np.array([[b], [b]]),
        busy * one,
        busy * one,
        lat * one,
        lat * one,
        micro_batches=1,
        schedule=two_stages,
    )
    assert ends[0, 0] == pytest.approx(2 * f + 2 * b + 2 * busy + 2 * lat)
    # stage 1 (f + X + L + f + b + X) is done once the gradient has left (no send buffer)
    assert ends[1, 0] == pytest.approx(2 * f + b + 2 * busy + lat)


def test_a_deadlocked_program_is_an_error():
    def never_sent(stage, p, m):
        return [call(Msg("recv", Key("f", 0, 0)))] if stage == 1 else [forward(0)]

    z = np.zeros((1, 1))
    with pytest.raises(RuntimeError, match="deadlocked"):
        replay(np.zeros((2, 1)), np.zeros((2, 1)), z, z, z, z, 1, schedule=never_sent)


@pytest.mark.parametrize("link", [-1, 1, 5])
def test_a_message_on_a_link_the_pipeline_lacks_is_an_error(link):
    def stray(stage, p, m):
        return [forward(0), call(Msg("send" if stage == 0 else "recv", Key("f", 0, link)))]

    z = np.zeros((1, 1))
    with pytest.raises(ValueError, match="link 0..0"):
        replay(np.zeros((2, 1)), np.zeros((2, 1)), z, z, z, z, 1, schedule=stray)


@pytest.mark.parametrize("p, m, v", [(2, 4, 2), (4, 8, 2), (3, 12, 3), (4, 4, 4)])
def test_a_flat_program_compiles_as_its_ops_do(p, m, v):
    """A program function's ``flat`` arrays and its ops, read op by op, give the replay the
    same program (the interleaved schedule is built as arrays, its ops read back from them)."""
    fn = megatron_interleaved_program(v)

    def by_ops(stage, p, m):
        return fn(stage, p, m)

    by_ops.virtual_stages = v
    flat, ops = _programs(p, m, fn), _programs(p, m, by_ops)
    assert flat.keys == ops.keys > 0
    assert all(np.array_equal(a, b) for a, b in zip(flat[:-1], ops[:-1], strict=True))


def _with(array, at, value):
    out = np.array(array, dtype=np.int64)
    out[at] = value
    return out


@pytest.mark.parametrize(
    "field, change, problem",
    [
        ("op_start", lambda a: a[:-1], "op_start must run"),  # one stage short
        ("ops", lambda a: _with(a, 3, 2), "each call must be made once"),  # call 0 twice
        ("call_start", lambda a: _with(a, 1, 2), "must follow the previous call's"),
        ("send", lambda a: _with(a, 0, 2), "must be 0 or 1"),
    ],
)
def test_a_malformed_flat_program_is_one_error_naming_it(field, change, problem):
    """The replay kernel indexes a program's arrays unchecked: a program function's flat
    arrays are checked first, each fault named."""
    fn = megatron_interleaved_program(2)
    good = fn.flat(2, 2)

    def broken(stage, p, m):
        return fn(stage, p, m)

    broken.virtual_stages = 2
    broken.flat = lambda p, m: good._replace(**{field: change(getattr(good, field))})
    z = np.zeros((2, 1))
    with pytest.raises(ValueError, match=f"'broken' gives a malformed flat program: .*{problem}"):
        replay(np.ones((2, 1)), np.ones((2, 1)), z, z, z, z, 2, schedule=broken)


def test_program_names_and_registration():
    assert program_for("gpipe") is gpipe_blocking_program
    assert program_for("megatron") is megatron_1f1b_program  # registered by importing baselines
    assert program_for("deepspeed") is deepspeed_train_program
    assert register_program("megatron", megatron_1f1b_program) is megatron_1f1b_program
    with pytest.raises(ValueError, match="already registered"):
        register_program("megatron", deepspeed_train_program)
    with pytest.raises(ValueError, match="pipedream"):
        program_for("pipedream")


def test_gpipe_is_replayed_whole_and_1f1b_extrapolates_exactly():
    rng = np.random.default_rng(3)
    p, r, m = 4, 2, 90
    f = rng.uniform(0.01, 0.1, (p, r))
    links = [rng.uniform(0, 0.05, (p - 1, r)) for _ in range(4)]
    for fn in (megatron_1f1b_program, deepspeed_train_program, gpipe_blocking_program):
        exact = replay(f, 2 * f, *links, micro_batches=m, schedule=fn)
        fast = replay_end_s(f, 2 * f, *links, micro_batches=m, schedule=fn)
        assert fast == pytest.approx(exact, rel=1e-9)


@pytest.mark.parametrize("rendezvous", [False, True])
def test_up_to_the_exact_range_the_pass_is_replayed_whole(rendezvous, monkeypatch):
    # exact_range is the count replay_end_s replays whole; one more is extrapolated (the
    # module by importlib: the package's attribute ``replay`` is the function)
    import importlib

    rp = importlib.import_module("system.simulator.replay")

    rng = np.random.default_rng(5)
    p, r = 3, 2
    f = rng.uniform(0.01, 0.1, (p, r))
    links = [rng.uniform(0, 0.05, (p - 1, r)) for _ in range(2)] + [np.zeros((p - 1, r))] * 2
    top = rp.exact_range(p, schedule=deepspeed_train_program, rendezvous=rendezvous)
    assert top == (8 * p + 32 if rendezvous else 3 * p + 24)
    calls = []
    real = rp.replay
    monkeypatch.setattr(
        rp, "replay", lambda *a, **k: calls.append(k["micro_batches"]) or real(*a, **k)
    )
    kw = {"schedule": deepspeed_train_program, "rendezvous": rendezvous}
    rp.replay_end_s(f, 2 * f, *links, micro_batches=top, **kw)
    assert calls == [top]  # one whole replay
    calls.clear()
    rp.replay_end_s(f, 2 * f, *links, micro_batches=top + 1, **kw)
    assert calls[0] == top  # the first run is cut at the range: the rest is extrapolated
    assert rp.exact_range(p, schedule=gpipe_blocking_program) > 10**9  # replayed whole
