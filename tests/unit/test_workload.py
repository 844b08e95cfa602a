"""Tasklet sizes and FLOPs from the model and batch (paper §3; Narayanan et al., SC'21)."""

from __future__ import annotations

import pytest

from system.workload import DTFM_REFERENCE, MODELS, Workload, get_model, tasklet_sizes


def test_gpt3_xl_has_about_1_3b_parameters():
    assert 1.2e9 < MODELS["gpt3_xl"].num_params < 1.45e9
    assert MODELS["gpt3_xl"].params_per_layer == 12 * 2048**2 + 13 * 2048


def test_sizes_follow_model_and_batch():
    w = Workload(model=get_model("gpt3_xl", 24), global_batch_size=1024)
    s = tasklet_sizes(w, pp=8, dp=8)
    assert s.c_pp_bytes == 128 * 2048 * 2048 * 2  # 128 sequences per macro-batch, fp16
    assert s.c_dp_bytes == 3 * MODELS["gpt3_xl"].params_per_layer * 2
    # the authors' constant is 1.3e9 params x 4 B x 3/24: same order as fp32 derived sizes
    w32 = Workload(model=get_model("gpt3_xl", 24), gradient_bytes=4)
    assert tasklet_sizes(w32, 8, 8).c_dp_bytes == pytest.approx(DTFM_REFERENCE.c_dp_bytes, rel=0.15)
    # doubling the batch doubles activations, leaves gradients
    s2 = tasklet_sizes(Workload(model=w.model, global_batch_size=2048), 8, 8)
    assert s2.c_pp_bytes == 2 * s.c_pp_bytes and s2.c_dp_bytes == s.c_dp_bytes


def test_megatron_flops_match_modeling_md():
    w = Workload(model=get_model("gpt3_xl", 24), global_batch_size=1024)
    assert w.model_flops() == pytest.approx(2.49e16, rel=0.01)
    w = Workload(model=get_model("gpt3_xl", 40), global_batch_size=4096)
    assert w.model_flops() == pytest.approx(1.63e17, rel=0.01)
    assert w.model_flops(recompute=False) < w.model_flops()


@pytest.mark.parametrize(
    "pp, dp, msg",
    [(5, 8, "not divisible into pp=5"), (8, 3, "not divisible by dp=3"), (0, 8, ">= 1")],
)
def test_bad_layouts(pp, dp, msg):
    with pytest.raises(ValueError, match=msg):
        tasklet_sizes(Workload(model=get_model("gpt3_xl", 24)), pp, dp)


def test_bad_model():
    with pytest.raises(ValueError, match="not divisible by num_attention_heads"):
        get_model("gpt3_xl").__class__(hidden_size=100, num_attention_heads=16)
    with pytest.raises(ValueError, match="unknown model"):
        get_model("gpt9")
