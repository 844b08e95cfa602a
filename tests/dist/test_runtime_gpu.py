"""The runtime's CUDA path (NCCL, streams, fp16 + loss scaling): runs only where CUDA is present."""

from __future__ import annotations

import pytest
import torch

from system.runtime.launch import launch
from system.runtime.spec import RunSpec

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.dist,
    pytest.mark.skipif(
        not torch.cuda.is_available(),
        reason="needs a CUDA device (this machine has none); "
        "mode=gpu_check is the full GPU check",
    ),
]

BASE = dict(model="debug", global_batch_size=8, iters=3, seed=0)


def test_cuda_fp32_matches_cpu():
    cpu = launch(RunSpec(**BASE), timeout_s=300)["losses"]
    gpu = launch(RunSpec(**BASE, device="cuda"), timeout_s=300)["losses"]
    assert max(abs(a - b) / abs(b) for a, b in zip(gpu, cpu, strict=True)) < 1e-3


def test_amp_with_loss_scaling_trains():
    m = launch(RunSpec(**dict(BASE, iters=8), device="cuda", amp=True), timeout_s=300)
    assert all(v == v for v in m["losses"]) and m["losses"][-1] < m["losses"][0]
    assert m["loss_scale"][0] == 2.0**16
