"""GPU calibration script: its CPU dry run, the hardware profile and the sensitivity rows."""

from __future__ import annotations

import dataclasses
import json

import pytest

from repro.run import run
from repro.studies.gpu_calibration.run import datasheet, hardware_profile, sensitivity
from system.simulator import V100
from system.simulator.hardware import hardware_from_profile


@pytest.mark.slow  # the whole dry run of the calibration script (2-3 s)
def test_dry_run_writes_the_calibration_schema(tmp_path, capsys):
    assert run({"mode": "gpu_check", "dry": True, "results_dir": str(tmp_path)})["dry"] is True
    cal = json.loads((tmp_path / "calibration.json").read_text())
    prof = json.loads((tmp_path / "hardware_profile.json").read_text())
    assert cal["dry"] and prof["dry"]
    shapes = {(s["head"], s["micro_batch_size"], s["dtype"]) for s in cal["stages"]}
    assert shapes == {(h, m, "bf16") for h in (False, True) for m in (1, 2, 4, 8)}
    assert all(s["fwd_s"] > 0 and s["bwd_s"] >= 0 and s["fwd_bwd_s"] > 0 for s in cal["stages"])
    assert [o["micro_batch_size"] for o in cal["overlap"]] == [1, 4]
    assert all(o["slowdown"] > 0 for o in cal["overlap"]) and cal["optimizer"]["step_s"] > 0
    # no datasheet peak for a CPU: no V100 equivalent and no sensitivity rows
    assert "achievable_fraction" not in prof["v100_equivalent"]
    assert not (tmp_path / "sensitivity.json").exists()
    with pytest.raises(ValueError, match="dry"):
        run({"mode": "gpu_check", "dry": "maybe", "results_dir": str(tmp_path / "x")})
    assert not (tmp_path / "x").exists()


def test_datasheet_lookup():
    assert datasheet("NVIDIA H200") == (989.4, 4800.0)
    assert datasheet("NVIDIA H100 PCIe")[0] == 756.0
    assert datasheet("Tesla V100-SXM2-16GB") == (125.0, 900.0)
    assert datasheet("some other accelerator") is None


def _cal(fraction: float, bw_bps: float = 2.0e12) -> dict:
    stage = {
        "head": False,
        "micro_batch_size": 1,
        "dtype": "bf16",
        "fraction_of_datasheet_peak": fraction,
    }
    return {
        "device": "NVIDIA H200",
        "dry": False,
        "datasheet_hbm_gbps": 4800.0,
        "stages": [stage, {**stage, "micro_batch_size": 2, "fraction_of_datasheet_peak": 0.9}],
        "overlap": [{"micro_batch_size": 1, "slowdown": 1.05}],
        "optimizer": {"implied_bandwidth_bps": bw_bps},
    }


def test_profile_carries_the_mb1_fraction_and_scales_bandwidth():
    prof = hardware_profile(_cal(0.42, 4.8e12))
    eq = prof["v100_equivalent"]
    assert eq["achievable_fraction"] == pytest.approx(0.42)
    assert eq["hbm_bandwidth_bps"] == pytest.approx(4.8e12 * 900 / 4800)
    hw = hardware_from_profile(prof)
    assert hw.flops == pytest.approx(V100.peak_flops * 0.42)
    with pytest.raises(ValueError, match="achievable_fraction"):
        hardware_from_profile({"device": "x"})


@pytest.mark.slow
def test_sensitivity_under_the_default_fraction_equals_the_v100_model():
    # the profile at V100's own fraction is the V100 model in every field but its name, so the
    # sensitivity rows under it are the V100 rows (the simulator is deterministic); one
    # sensitivity run then checks that a lower fraction slows every system down
    same = hardware_from_profile(
        {"device": "x", "v100_equivalent": {"achievable_fraction": V100.achievable_fraction}}
    )
    assert dataclasses.replace(same, name=V100.name) == V100
    v100, slow = sensitivity(
        {"device": "x", "v100_equivalent": {"achievable_fraction": 0.15}},
        trials=1,
        time_limit_s=3.0,
    )
    assert (
        v100["hardware"] == "V100 model" and v100["achievable_fraction"] == V100.achievable_fraction
    )
    for k in ("ours_s", "megatron_s", "deepspeed_s"):
        assert slow[k] > v100[k]
