"""Single-process tests of the runtime's parts: GPT stages, data, buckets, GPipe on one stage,
RunSpec checks and the launcher's refusal of bad input (paper §3.5)."""

from __future__ import annotations

import json

import pytest
import torch

from system.assignment import Assignment
from system.runtime.data import SyntheticData, entropy_floor, micro_batches
from system.runtime.data_parallel import GradBuckets
from system.runtime.groups import rank_position
from system.runtime.model import build_model, build_stage, layer_list, lm_loss, stage_layers
from system.runtime.spec import RunSpec
from system.workload import MODELS

CFG = MODELS["debug"]


def _data(batch: int = 8, seed: int = 0) -> SyntheticData:
    return SyntheticData(
        vocab_size=CFG.vocab_size, seq_length=CFG.seq_length, global_batch_size=batch, seed=seed
    )


@pytest.mark.parametrize("pp", [1, 2, 4])
def test_stages_compose_to_the_full_model(pp):
    full = build_model(CFG, seed=3)
    stages = [build_stage(CFG, pp, s, seed=3) for s in range(pp)]
    x = _data().batch(0)[:, :-1]
    y = x
    for st in stages:
        y = st(y)
    torch.testing.assert_close(y, full(x), rtol=0, atol=0)
    n_full = sum(p.numel() for p in full.parameters())
    assert sum(p.numel() for st in stages for p in st.parameters()) == n_full


def test_seed_changes_weights_and_layer_list_matches():
    a, b = build_model(CFG, seed=0), build_model(CFG, seed=1)
    assert not torch.equal(a.blocks[0].qkv.weight, b.blocks[0].qkv.weight)
    layers = layer_list(CFG, seed=0)
    assert len(layers) == CFG.num_layers + 2
    x = _data().batch(1)[:, :-1]
    y = x
    for layer in layers:
        y = layer(y)
    torch.testing.assert_close(y, a(x), rtol=0, atol=0)


def test_blocks_preserve_shape_and_are_causal():
    blk = build_model(CFG).blocks[0]
    x = torch.randn(2, CFG.seq_length, CFG.hidden_size)
    y = blk(x)
    assert y.shape == x.shape
    x2 = x.clone()
    x2[:, -1] += 1.0  # changing the last position must not change earlier outputs
    torch.testing.assert_close(blk(x2)[:, :-1], y[:, :-1])


def test_checkpointing_gives_the_same_gradients():
    b = _data().batch(0)
    grads = []
    for ckpt in (False, True):
        m = build_model(CFG, seed=0)
        m.checkpoint = ckpt
        lm_loss(m(b[:, :-1]), b[:, 1:]).backward()
        grads.append(torch.cat([p.grad.flatten() for p in m.parameters()]))
    torch.testing.assert_close(grads[0], grads[1])


def test_bad_stage_requests():
    with pytest.raises(ValueError, match="not divisible"):
        stage_layers(4, 3, 0)
    with pytest.raises(ValueError, match="not in 0..pp-1"):
        build_stage(CFG, 2, 2)
    with pytest.raises(ValueError, match="tie_embeddings"):
        build_stage(CFG, 2, 0, tie_embeddings=True)
    tied = build_model(CFG, tie_embeddings=True)
    assert tied.head.lm_head.weight is tied.embed.wte.weight


def test_data_is_deterministic_and_learnable():
    d = _data(seed=5)
    assert torch.equal(d.batch(2), _data(seed=5).batch(2))
    assert not torch.equal(d.batch(2), d.batch(3))
    assert not torch.equal(d.batch(2), _data(seed=6).batch(2))
    b = d.batch(0)
    assert b.dtype == torch.int64 and b.shape == (8, CFG.seq_length + 1)
    assert int(b.min()) >= 0 and int(b.max()) < CFG.vocab_size
    m = build_model(CFG, seed=0)
    opt = torch.optim.AdamW(m.parameters(), lr=3e-3)
    first = None
    for i in range(15):
        b = d.batch(i)
        loss = lm_loss(m(b[:, :-1]), b[:, 1:])
        first = first if first is not None else loss.item()
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert loss.item() < first - 1.0 and loss.item() > entropy_floor() - 0.1


def test_micro_batches_partition_the_global_batch():
    b = _data().batch(0)
    rows = [mb[0] for r in range(2) for mb in micro_batches(b, dp=2, replica=r, micro_batch_size=2)]
    torch.testing.assert_close(torch.cat(rows), b[:, :-1])
    with pytest.raises(ValueError, match="divisible"):
        micro_batches(b, dp=3, replica=0, micro_batch_size=1)


def test_grad_buckets_are_views_and_padded():
    m = build_model(CFG)
    gb = GradBuckets(list(m.parameters()), dp=3, bucket_mb=0.05, device=torch.device("cpu"))
    assert len(gb.buffers) > 1 and all(b.numel() % 3 == 0 for b in gb.buffers)
    b = _data().batch(0)
    lm_loss(m(b[:, :-1]), b[:, 1:]).backward()
    assert gb.buffers[0].abs().sum() > 0  # backward wrote into the flat buffers
    gb.check_views()
    gb.zero()
    assert all(float(x.abs().sum()) == 0.0 for x in gb.buffers)


def test_gpipe_single_stage_equals_full_batch_gradient():
    from system.runtime.p2p import P2P
    from system.runtime.pipeline import gpipe_iteration
    from system.runtime.timeline import Timeline

    b = _data().batch(0)
    ref = build_model(CFG, seed=0)
    lm_loss(ref(b[:, :-1]), b[:, 1:]).backward()
    m = build_model(CFG, seed=0)
    place = rank_position(Assignment.from_stages([[0]]), 0)
    comm = P2P(torch.device("cpu"), Timeline(0))
    losses = gpipe_iteration(
        m,
        place,
        comm,
        micro_batches(b, dp=1, replica=0, micro_batch_size=2),
        hidden_size=CFG.hidden_size,
    )
    assert len(losses) == 4
    for p, q in zip(m.parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-5, atol=1e-7)


def test_gpipe_accumulation_passes_equal_one_pass():
    # two passes of half the micro-batches, each loss divided by all of them, accumulate the
    # gradient of one pass over all of them
    from system.runtime.p2p import P2P
    from system.runtime.pipeline import gpipe_iteration
    from system.runtime.timeline import Timeline

    b = _data().batch(0)
    micro = micro_batches(b, dp=1, replica=0, micro_batch_size=2)
    place = rank_position(Assignment.from_stages([[0]]), 0)
    one, two = build_model(CFG, seed=0), build_model(CFG, seed=0)
    gpipe_iteration(
        one, place, P2P(torch.device("cpu"), Timeline(0)), micro, hidden_size=CFG.hidden_size
    )
    comm = P2P(torch.device("cpu"), Timeline(0))
    losses = []
    for k in (0, 2):
        losses += gpipe_iteration(
            two, place, comm, micro[k : k + 2], hidden_size=CFG.hidden_size, loss_divisor=4
        )
    assert len(losses) == 4
    for p, q in zip(two.parameters(), one.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-5, atol=1e-7)


def test_runspec_rejects_bad_input():
    with pytest.raises(ValueError, match="rounds"):
        RunSpec(model="debug", global_batch_size=8, micro_batch_size=1, rounds=3).validate()
    with pytest.raises(ValueError, match="world_size"):
        RunSpec(pp=2, dp=2).validate(3)
    with pytest.raises(ValueError, match="not divisible into pp=3"):
        RunSpec(pp=3, dp=1, global_batch_size=3).validate(3)
    with pytest.raises(ValueError, match="exactly once"):
        RunSpec(pp=2, dp=2, stages=[[0, 1], [2, 5]]).validate(4)
    with pytest.raises(ValueError, match="shape"):
        RunSpec(pp=1, dp=4, stages=[[0, 1], [2, 3]]).validate(4)
    with pytest.raises(ValueError, match="global_batch_size"):
        RunSpec(pp=1, dp=3, global_batch_size=8).validate(3)
    with pytest.raises(ValueError, match="dp_mode"):
        RunSpec(dp_mode="ring").validate()
    with pytest.raises(ValueError, match="amp"):
        RunSpec(amp=True).validate()
    with pytest.raises(ValueError, match="unknown field"):
        RunSpec.from_dict({"pp": 1, "stagez": 2})


def test_runspec_json_round_trip_and_layouts():
    s = RunSpec(pp=2, dp=2, layout="random", seed=4)
    assert RunSpec.from_dict(json.loads(s.to_json())) == s
    r = s.resolved()
    assert r.stages == s.assignment().stages.tolist()
    assert RunSpec(pp=2, dp=2).resolved().stages == [[0, 1], [2, 3]]


def test_launch_refuses_bad_input_before_starting_anything(monkeypatch):
    import subprocess

    from system.runtime import launch as L

    def no_popen(*a, **k):
        raise AssertionError("a process was started for bad input")

    monkeypatch.setattr(subprocess, "Popen", no_popen)
    with pytest.raises(ValueError, match="world_size"):
        L.launch(RunSpec(pp=2, dp=2), world_size=3)
    with pytest.raises(ValueError, match="not divisible"):
        L.launch(RunSpec(pp=3, dp=1, global_batch_size=3))
    with pytest.raises(ValueError, match="exactly once"):
        L.launch(RunSpec(pp=2, dp=2, stages=[[0, 1], [2, 7]]))
    with pytest.raises(ValueError, match="rank_prefix"):
        L.launch(RunSpec(pp=2, dp=1), rank_prefix=[["env"]])


def test_train_mode_maps_its_config_to_a_run_spec(tmp_path):
    from repro.config import validate
    from repro.modes.train.run import run_spec

    (tmp_path / "a.json").write_text(json.dumps({"stages": [[3, 1], [0, 2]]}))
    cfg = validate(
        {
            "mode": "train",
            "model": "debug",
            "runtime": {"assignment": str(tmp_path / "a.json"), "checkpointing": True, "lr": 0.01},
            "batch": 4,
            "timeout_s": 30,
            "results_dir": str(tmp_path),
        }
    )
    spec = run_spec(cfg)
    assert (spec.pp, spec.dp, spec.global_batch_size, spec.checkpointing, spec.lr) == (
        2,
        2,
        4,
        True,
        0.01,
    )
    assert spec.stages == [[3, 1], [0, 2]] and cfg.timeout_s == 30.0
    with pytest.raises(ValueError, match="ppp"):
        validate({"mode": "train", "ppp": 2})
    with pytest.raises(ValueError, match="pp"):
        validate({"mode": "train", "pp": "two"})


def test_gpipe_ideal_time_bounds():
    from system.runtime.ideal import gpipe_ideal_s

    f, b, link, m = [1.0, 2.0, 1.5], [2.0, 3.0, 2.5], [0.2, 0.4], 6
    t = gpipe_ideal_s(f, b, link, m, tail_s=[0.1, 0.1, 0.1])
    # the slowest stage does all its work
    assert t >= m * max(x + y for x, y in zip(f, b, strict=True))
    assert t <= sum(f) + sum(b) + 2 * sum(link) + (m - 1) * (max(f) + max(b)) + 0.1 + 1e-9
    assert gpipe_ideal_s([1.0], [2.0], [], 3) == 9.0
    with pytest.raises(ValueError, match="link"):
        gpipe_ideal_s([1.0, 1.0], [1.0, 1.0], [], 2)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU message only")
def test_gpu_check_explains_itself_without_cuda(capsys, tmp_path):
    from repro.run import run

    assert run({"mode": "gpu_check", "results_dir": str(tmp_path)})["cuda"] is False
    assert "CUDA is not available" in capsys.readouterr().out
    with pytest.raises(ValueError, match="bogus"):
        run({"mode": "gpu_check", "bogus": 1})
