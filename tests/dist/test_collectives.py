"""The runtime's ring, double binary tree and two-level all-reduces over point-to-point equal
gloo's all-reduce (gloo on loopback; one launch per rank count)."""

from __future__ import annotations

import json

import pytest

from system.runtime.launch import run_ranks

pytestmark = [pytest.mark.dist, pytest.mark.slow]


@pytest.mark.parametrize("n", [3, 4, 5, 8])
def test_every_algorithm_equals_gloo_all_reduce(n, tmp_path):
    pytest.importorskip("torch")
    out = tmp_path / "worst.json"
    run_ranks(
        "tests.dist._collectives_ranks",
        [str(out)],
        world_size=n,
        timeout_s=300,
        log_dir=tmp_path,
    )
    worst = json.loads(out.read_text())
    # sizes 1 (empty ring segments), n + 2, 1000, one tree chunk exactly (one tree), one element
    # more (two trees), 4 chunks + 12345 (chunks not divisible)
    two_level = {4: 2, 8: 4}.get(n, 0)  # block 2 (and 4 at 8 ranks), inner ring and tree
    assert len(worst) == 6 * (2 + two_level), sorted(worst)
    bad = {k: v for k, v in worst.items() if not v <= 1e-6}
    assert not bad, bad
