"""The framework model on hand-made plans, checked against hand computations."""

from __future__ import annotations

import pytest

from system.external.sailor.framework import predict_plan
from system.external.sailor.plan import load_plan
from system.external.sailor.predict import load_inputs, predict_plans
from tests.external._tiny import plan, write_data, write_plan


def _predict(tmp_path, stages, dp, **kw):
    write_data(tmp_path)
    path = write_plan(tmp_path, "clariden/OPT-350/N1/plan_config_x.json", plan(stages, dp, **kw))
    inputs = load_inputs(tmp_path)
    return predict_plan(load_plan(path, "OPT-350", 4), inputs)


def test_two_stage_one_micro_batch_by_hand(tmp_path):
    # Stages [0,1] and [2,3], one replica, mbs 1, gbs 1: m = 1. Per stage: F0 = 0.01 + 0.1 =
    # 0.11, B0 = 0 + 0.2 = 0.2; F1 = 0.1 + 0.05 = 0.15, B1 = 0.2 + 0.1 = 0.3.
    # Boundary message: act_output 1e6 elements x 4 B (fp32) / tp 1 = 4e6 B at the flat 1 GB/s
    # fit -> 0.004 s, plus the meta tensor, charged at the fit's floor size 2^16 B -> 65.536 us:
    # link busy 0.0040655 s. 4 MiB of receive buffer >= 4e6 B, so the send returns after the
    # meta part (65.5 us); the receiver posted its receive at t = 0 (its program starts with it).
    # DeepSpeed order: stage 0 F at [0, 0.11], its send of act 0 leaves at 0.11 and lands at
    # 0.1140655; stage 1 F to 0.2640655, B to 0.5640655, sends the gradient, which lands at
    # 0.5681310; stage 0 B to 0.7681310 = the pipeline. Untied head, dp 1: no tied or DP part.
    # Optimizer: profiled model = layer 0 + 2 x layer 1 + layer 3 = 100e6 + 20e6 + 100e6 =
    # 220e6 parameters took 0.004 s; each stage has 110e6 -> 0.002 s.
    # Iteration: 0.7681310 + 0.002 = 0.7701310.
    p = _predict(tmp_path, [[0, 1], [2, 3]], 1)
    assert p.micro_batches == 1
    assert p.pipeline_s == pytest.approx(0.7681310, abs=1e-6)
    assert p.tied_s == 0 and p.dp_s == 0
    assert p.optimizer_s == pytest.approx(0.002)
    assert p.iter_time_s == pytest.approx(0.7701310, abs=1e-6)


def test_one_stage_two_replicas_by_hand(tmp_path):
    # One stage of all 4 layers, dp 2, mbs 1, gbs 4: m = 4 / (1 x 2) = 2 micro-batches of
    # F = 0.26, B = 0.5 -> pipeline 2 x 0.76 = 1.52. Data parallel: 220e6 fp32 gradients =
    # 880e6 B in one bucket (< 5e8 elements); NCCL ring of 2 ranks: 2 steps of 440e6 B at
    # 1 GB/s = 0.88 s, plus the bucket's flatten + unflatten copies, 4 x 880e6 B at the GH200's
    # 4 TB/s = 0.00088 s. Optimizer: 220e6 / 220e6 x 0.004 = 0.004.
    # Iteration: 1.52 + 0.88088 + 0.004 = 2.40488.
    p = _predict(tmp_path, [[0, 1, 2, 3]], 2, gbs=4)
    assert p.micro_batches == 2
    assert p.pipeline_s == pytest.approx(1.52)
    assert p.dp_s == pytest.approx(0.88088)
    assert p.dp_algorithm == "ring"
    assert p.iter_time_s == pytest.approx(2.40488)
    # memory: 16 B x 220e6 + max(activations 1 x 1 x 8e6 x 4 B, bucket 880e6 B) + 1 GiB
    assert p.peak_memory_bytes == pytest.approx(16 * 220e6 + 880e6 + 2**30)


def test_predict_plans_rows_and_excluded_plan(tmp_path):
    write_data(tmp_path)
    write_plan(
        tmp_path, "clariden/OPT-350/N2/plan_config_N2_D1.json", plan([[0, 1], [2, 3]], 1, real=0.8)
    )
    write_plan(tmp_path, "clariden/OPT-350/N1/plan_config_bad.json", plan([[0, 1, 2]], 1))
    rows = predict_plans(tmp_path / "plans")
    assert [r.plan for r in rows] == [
        "clariden/OPT-350/N1/plan_config_bad.json",
        "clariden/OPT-350/N2/plan_config_N2_D1.json",
    ]
    bad, good = rows
    assert bad.prediction is None and "does not match the model's 4 layers" in bad.excluded
    assert good.set == "clariden/OPT-350" and good.real_s == 0.8
    assert good.prediction.iter_time_s == pytest.approx(0.7701310, abs=1e-6)
