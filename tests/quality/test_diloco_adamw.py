"""DiLoCo with H = 1 against data parallelism, AdamW inner steps, in one process.

With one inner step, an outer SGD of rate 1 and no momentum, DiLoCo's outer step sets the
shared model to the mean of the replicas' models after their own inner step. With SGD that
mean is exactly a data-parallel step (θ − η·mean g). With AdamW it is the mean of the
replicas' *AdamW updates*, each from its own moment estimates of its own gradients — not AdamW
applied to the mean gradient (Adam's update is not linear in the gradient), so DiLoCo H = 1
equals data-parallel AdamW only with one replica. The tests pin down all three statements:
one replica — equal to AdamW step for step; two replicas — equal to the mean of two AdamW
replicas written out here by hand, and measurably not data-parallel AdamW."""

from __future__ import annotations

import copy

import pytest
import torch

from system.compression import Compression, LocalSGD
from system.runtime.data import make_data, micro_batches
from system.runtime.inprocess import train_in_process
from system.runtime.model import build_stage, lm_loss
from system.runtime.spec import RunSpec

BASE = dict(
    model="debug",
    seq_length=32,
    vocab_size=64,
    pp=1,
    global_batch_size=8,
    micro_batch_size=2,
    iters=8,
    seed=1,
    lr=3e-3,
    data="kjv",
    train_sequences=64,
)
H1 = dict(
    compression=Compression(
        local=LocalSGD(
            method="diloco", inner_steps=1, outer_lr=1.0, outer_momentum=0.0, nesterov=False
        )
    )
)


def _rel(a, b) -> float:
    return max(abs(x - y) / abs(y) for x, y in zip(a, b, strict=True))


def _losses(**kw) -> list[float]:
    return train_in_process(RunSpec(**{**BASE, **kw}), eval_every=1, eval_sequences=4).train_loss


@pytest.mark.slow
def test_one_replica_diloco_h1_is_adamw_step_for_step():
    assert _rel(_losses(dp=1, **H1), _losses(dp=1)) < 1e-6


@pytest.mark.slow
def test_two_replicas_diloco_h1_sgd_is_data_parallel_sgd():
    sgd = dict(dp=2, optimizer="sgd", lr=0.3)
    assert _rel(_losses(**sgd, **H1), _losses(**sgd)) < 1e-6


def _mean_of_adamw_replicas(spec: RunSpec) -> list[float]:
    """Each replica an AdamW step on its own half of the batch, then the models averaged."""
    cfg = spec.gpt_config()
    models = [build_stage(cfg, 1, 0, spec.seed) for _ in range(spec.dp)]
    opts = [torch.optim.AdamW(m.parameters(), lr=spec.lr, weight_decay=0.0) for m in models]
    data = make_data(spec)
    m_per = spec.workload().micro_batches(spec.dp)
    out = []
    for it in range(spec.iters):
        total = 0.0
        for r, (model, opt) in enumerate(zip(models, opts, strict=True)):
            opt.zero_grad()
            for x, y in micro_batches(data.batch(it), dp=spec.dp, replica=r, micro_batch_size=2):
                loss = lm_loss(model(x), y)
                (loss / m_per).backward()
                total += float(loss.detach())
            opt.step()
        out.append(total / (m_per * spec.dp))
        with torch.no_grad():
            mean = copy.deepcopy(models[0].state_dict())
            for k in mean:
                mean[k] = torch.stack([m.state_dict()[k] for m in models]).mean(dim=0)
            for m in models:
                m.load_state_dict(mean)
    return out


@pytest.mark.slow
def test_two_replicas_diloco_h1_adamw_is_the_mean_of_adamw_replicas_not_dp_adamw():
    diloco = _losses(dp=2, **H1)
    assert _rel(diloco, _mean_of_adamw_replicas(RunSpec(**BASE, dp=2))) < 1e-5
    assert _rel(diloco[1:], _losses(dp=2)[1:]) > 1e-3  # Adam is not linear in the gradient
