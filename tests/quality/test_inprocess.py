"""The in-process trainer runs the runtime's arithmetic: the same spec trained under the
launcher (gloo on loopback) gives the same loss at every iteration, uncompressed, compressed
and with DiLoCo; and the learning-rate schedule is the one the runtime steps."""

from __future__ import annotations

import pytest

from system.compression import Compression, DPCompression, LocalSGD, PipeCompression
from system.runtime.inprocess import train_in_process
from system.runtime.launch import launch
from system.runtime.spec import RunSpec

BASE = dict(
    model="debug",
    seq_length=32,
    vocab_size=64,
    pp=2,
    dp=2,
    global_batch_size=8,
    micro_batch_size=2,
    iters=6,
    seed=3,
    lr=3e-3,
    data="kjv",
    train_sequences=16,  # samples repeat from the third iteration: AQ-SGD sends changes
    lr_schedule="cosine",
    lr_warmup_iters=2,
)


def _rel(a, b) -> float:
    return max(abs(x - y) / abs(y) for x, y in zip(a, b, strict=True))


@pytest.mark.dist
@pytest.mark.slow
@pytest.mark.parametrize(
    "options",
    [
        {},
        dict(dp_mode="allreduce"),
        dict(compression=Compression(dp=DPCompression(method="topk", ratio=0.1, bits=8))),
        dict(
            compression=Compression(dp=DPCompression(method="topk", ratio=0.1, bits=4)),
            dp_mode="ring",
        ),
        dict(compression=Compression(pipe=PipeCompression(method="aq_sgd", fwd_bits=4))),
        dict(
            compression=Compression(pipe=PipeCompression(method="quantize", fwd_bits=4, bwd_bits=4))
        ),
        dict(compression=Compression(local=LocalSGD(method="diloco", inner_steps=2))),
        dict(compression=Compression(local=LocalSGD(method="diloco", inner_steps=2, outer_bits=8))),
    ],
    ids=lambda o: (
        "-".join(v.label() if k == "compression" else f"{k}={v}" for k, v in o.items()) or "plain"
    ),
)
def test_in_process_losses_equal_the_launched_runtime(options):
    spec = RunSpec(**BASE, **options)
    ran = launch(spec, timeout_s=300)
    here = train_in_process(spec, eval_every=2)
    assert _rel(here.train_loss, ran["losses"]) < 1e-4, (here.train_loss, ran["losses"])
    c = spec.compression
    assert here.dp_bytes == sum(ran["dp_bytes"]) or not (
        c.dp.active or (c.local.active and c.local.outer_bits == 8)
    ), (here.dp_bytes, ran["dp_bytes"])


def test_a_broken_option_differs():  # the comparison above can fail
    a = train_in_process(RunSpec(**BASE), eval_every=2)
    q4 = Compression(pipe=PipeCompression(method="quantize", fwd_bits=4))
    b = train_in_process(RunSpec(**BASE, compression=q4), eval_every=2)
    assert _rel(a.train_loss[2:], b.train_loss[2:]) > 1e-4


def test_cosine_schedule_warms_up_then_decays_to_its_floor():
    spec = RunSpec(**{**BASE, "iters": 11, "lr_warmup_iters": 2, "lr_min_ratio": 0.1})
    f = [spec.lr_factor(i) for i in range(spec.iters)]
    assert f[:2] == [0.5, 1.0]
    assert f[2] == pytest.approx(1.0) and f[-1] == pytest.approx(0.1)
    assert all(x >= y for x, y in zip(f[2:], f[3:], strict=False))
    assert RunSpec(**{**BASE, "lr_schedule": "constant"}).lr_factor(5) == 1.0


@pytest.mark.parametrize(
    "field, value",
    [("lr_schedule", "linear"), ("lr_warmup_iters", 6), ("lr_min_ratio", 1.5)],
)
def test_bad_schedule_is_refused_naming_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        RunSpec(**{**BASE, field: value}).validate()


def test_same_seed_same_curve_and_split_halves_differ():
    a = train_in_process(RunSpec(**BASE), eval_every=3, eval_sequences=8)
    b = train_in_process(RunSpec(**BASE), eval_every=3, eval_sequences=8)
    assert a.train_loss == b.train_loss and a.eval_loss == b.eval_loss
    c = train_in_process(RunSpec(**BASE), eval_every=3, eval_sequences=8, eval_split="test")
    assert c.train_loss == a.train_loss and c.eval_loss[1:] != a.eval_loss[1:]


def test_diloco_eval_must_fall_on_outer_steps():
    spec = RunSpec(**BASE, compression=Compression(local=LocalSGD(method="diloco", inner_steps=4)))
    with pytest.raises(ValueError, match="eval_every=6 must be a multiple"):
        train_in_process(spec, eval_every=6)
