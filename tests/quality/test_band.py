"""Convergence checks in MLPerf's spirit: runtime variants without compression stay inside the
reference's band of training-loss curves across seeds, and a deliberately broken variant (the
gradient buffer never cleared between iterations, a bug of the paper authors' runtime) does not.
The band is :func:`repro.studies.quality_curves.report.reference_band`, the study's own."""

from __future__ import annotations

import numpy as np
import pytest

from repro.studies.quality_curves.report import outside_band, reference_band
from system.runtime.inprocess import train_in_process
from system.runtime.spec import RunSpec

BASE = dict(
    model="debug",
    seq_length=32,
    vocab_size=64,
    pp=2,
    dp=2,
    global_batch_size=8,
    micro_batch_size=2,
    iters=192,
    lr=3e-3,
    data="kjv",
    train_sequences=256,
)
WINDOW = 16  # training loss averaged over windows of this many iterations


def _windows(losses) -> list[float]:
    return list(np.asarray(losses, dtype=float).reshape(-1, WINDOW).mean(axis=1))


@pytest.fixture(scope="module")
def band() -> np.ndarray:
    curves = [
        _windows(train_in_process(RunSpec(**BASE, seed=s), eval_every=BASE["iters"]).train_loss)
        for s in range(3)
    ]
    return reference_band(curves)


def _scheduled_stages() -> list[list[int]]:
    from system.cases import get_case
    from system.scheduler import schedule
    from system.workload import tasklet_sizes

    spec = RunSpec(**BASE)
    cluster = get_case("5").subset([0, 9, 18, 27])
    out = schedule(
        cluster,
        tasklet_sizes(spec.workload(), 2, 2),
        pp=2,
        dp=2,
        method="genetic",
        seed=0,
        trials=50,
        time_limit_s=10,
    )
    return out.assignment.stages.tolist()


@pytest.mark.dist
@pytest.mark.slow
@pytest.mark.parametrize(
    "options",
    [
        "scheduled",
        dict(dp_mode="allreduce", layout="random"),
        dict(checkpointing=True, rounds=2),
    ],
    ids=["scheduled-layout", "allreduce-random-layout", "recompute-two-passes"],
)
def test_runtime_variants_stay_inside_the_reference_band(band, options):
    from system.runtime.launch import launch

    if options == "scheduled":
        options = dict(stages=_scheduled_stages())
    m = launch(RunSpec(**BASE, seed=0, start="free", **options), timeout_s=600)
    curve = _windows(m["losses"])
    assert outside_band(curve, band) == [], (curve, band.tolist())


@pytest.mark.slow
def test_stale_gradient_buffer_leaves_the_band(band, monkeypatch):
    from system.runtime.data_parallel import GradBuckets

    monkeypatch.setattr(GradBuckets, "zero", lambda self: None)
    curve = _windows(train_in_process(RunSpec(**BASE, seed=0), eval_every=BASE["iters"]).train_loss)
    assert len(outside_band(curve, band)) >= len(curve) // 2, (curve, band.tolist())


def test_band_needs_two_curves_and_matching_lengths():
    with pytest.raises(ValueError, match="two or more"):
        reference_band([[1.0, 2.0]])
    with pytest.raises(ValueError, match="3 points against a band of 2"):
        outside_band([1.0, 2.0, 3.0], reference_band([[1.0, 2.0], [1.5, 2.5]]))


@pytest.mark.dist
@pytest.mark.slow
@pytest.mark.baseline
@pytest.mark.parametrize("system", ["megatron", "deepspeed"])
def test_the_real_baselines_converge_no_slower_than_the_reference(band, system):
    """Megatron (megatron-core) and DeepSpeed (ZeRO-1) on the same data and model shape: their
    training-loss windows never above the band, so crediting them with the reference's
    iterations to a target does not flatter ours (their own initialisation may put them a
    little below it: megatron-core scales its output layers' init by depth)."""
    pytest.importorskip("megatron.core" if system == "megatron" else "deepspeed")
    from baselines.grid import BaselineSpec, run_point

    spec = BaselineSpec(
        system=system,
        **{k: v for k, v in BASE.items()},
        seed=0,
        zero=1 if system == "deepspeed" else None,
    )
    r = run_point(spec, timeout_s=900)
    assert r.get("status") == "ok", str(r.get("error"))[-2000:]
    curve = np.asarray(_windows(r["losses"]))
    above = [int(i) for i in np.nonzero(curve > band[1])[0] if i >= 1]
    assert above == [], (curve.tolist(), band.tolist())
