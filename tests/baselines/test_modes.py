"""repro/modes/train/baselines.py without processes: config mapping, rows, the emulate path."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
from hydra import compose, initialize_config_dir

ROOT = Path(__file__).resolve().parents[2]


def _cfg(*overrides):
    from repro.config import validate

    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        return validate(compose("config", overrides=list(overrides)))


def _fake_result(spec, **kw):
    return {
        "status": "ok",
        "losses": [6.0, 5.0],
        "iter_times_s": [2.0, 1.0],
        "iter_time_s": 1.0,
        "tokens_per_s": 1.0,
        "tflops": 1.0,
        "pflops": 1e-3,
        "seen": kw,
    }


def _spec(*overrides):
    from repro.modes.train.baselines import _base_spec

    cfg = _cfg("mode=train", *overrides)
    return _base_spec(cfg, cfg.runtime)


def test_deepspeed_zero_defaults_follow_the_pipeline():
    assert _spec("system=deepspeed", "model=debug", "dp=4").zero == 3
    spec = _spec("system=deepspeed", "model=debug", "pp=2", "dp=2")
    assert (spec.zero, spec.pp, spec.dp, spec.global_batch_size) == (1, 2, 2, 8)
    assert _spec("system=megatron", "model=debug").zero is None
    from repro.config import ConfigError

    with pytest.raises(ConfigError, match="zero=1: applies to system=deepspeed only"):
        _spec("system=megatron", "model=debug", "zero=1")


def test_bad_layout_is_one_value_error(tmp_path):
    from repro.modes.train.baselines import run_local

    with pytest.raises(ValueError, match="not divisible into pp=3"):
        run_local(
            _cfg("mode=train", "system=megatron", "model=debug", "pp=3", f"results_dir={tmp_path}")
        )
    assert not (tmp_path / "runs.csv").exists()


class FakeEmulation:
    def __init__(self, plan, backend="auto"):
        self.plan, self.backend, self.master_addr = plan, "fake", "198.18.0.1"

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        pass

    def exec_prefix(self, i):
        return ["ns", str(i)]

    def rank_env(self, i):
        return {}


@pytest.mark.slow
def test_emulate_path_rows_carry_scales_and_prediction(tmp_path, monkeypatch):
    import system.emulation.netns as netns
    from baselines import worker
    from repro.modes.train import baselines

    monkeypatch.setattr(netns, "Emulation", FakeEmulation)
    monkeypatch.setattr(worker, "calibrated_cpu_hardware", lambda spec: None)  # V100 model
    monkeypatch.setattr(baselines, "run_point", _fake_result)
    out = baselines.run_emulated(
        _cfg(
            "mode=emulate",
            "system=megatron",
            "model=debug",
            "case=5",
            "devices=[0,8,24,40]",
            "pp=2",
            "dp=2",
            f"results_dir={tmp_path}",
        )
    )
    assert out["seen"]["rank_prefix"][3] == ["ns", "3"]
    row = pd.read_csv(tmp_path / "runs.csv").iloc[0]
    assert (row["case"], row.hidden_size, row.global_batch_size, row.emu_bandwidth_scale) == (
        5,
        256,
        8,
        0.1,
    )
    assert row.predicted_iter_time_s > 0
    # the row says what Megatron ran: its schedule, overlap flags and DP collective
    assert (row.schedule, row.virtual_stages, row.dp_collective) == ("1f1b", 1, "ring")
    assert not row.overlap_grad_reduce and not row.distributed_optimizer


def test_emulate_mode_dispatches_the_baselines(monkeypatch):
    """``repro/run.py mode=emulate system=megatron|deepspeed`` runs the baseline, not ours."""
    from hydra.errors import ConfigCompositionException

    from repro.modes.emulate import run as emulate
    from repro.modes.train import baselines

    seen = []
    monkeypatch.setattr(baselines, "run_emulated", lambda cfg: seen.append(str(cfg.system)) or {})
    for system in ("megatron", "deepspeed"):
        emulate.run(_cfg("mode=emulate", f"system={system}", "model=debug", "case=5"))
    assert seen == ["megatron", "deepspeed"]
    with pytest.raises(ConfigCompositionException):
        _cfg("mode=emulate", "system=gpipe", "model=debug", "case=5")


@pytest.mark.parametrize("system", ["megatron", "deepspeed"])
def test_emulated_topology_grid_runs_and_predicts_under_one_map(tmp_path, monkeypatch, system):
    """baseline_placements=[topology]: each grid point runs under place_spec's map (the
    launcher gets it), the row records it, and the row's prediction is the simulator's with that
    same map; points whose map is launch order are recorded as skipped, not run."""
    import json

    import system.emulation.netns as netns
    from baselines import worker as common
    from baselines.grid import BaselineSpec, place_spec, predict_iter_time_s
    from repro.modes.train import baselines
    from system.cases import get_case
    from system.emulation.plan import make_plan
    from system.simulator.transfers import GLOO

    monkeypatch.setattr(netns, "Emulation", FakeEmulation)
    monkeypatch.setattr(common, "calibrated_cpu_hardware", lambda spec: None)  # V100 model
    seen = []

    def fake(spec, **kw):
        seen.append((spec.label(), kw["rank_map"], kw["device_addrs"]))
        return _fake_result(spec, **kw)

    monkeypatch.setattr(baselines, "run_point", fake)
    baselines.run_emulated(
        _cfg(
            "mode=emulate",
            f"system={system}",
            "model=debug",
            "case=5",
            "devices=[0,8,24,40]",
            "grid=true",
            "batch=8",
            "grid_micro_batch_sizes=[2]",
            "baseline_placements=[topology]",
            f"results_dir={tmp_path}",
        )
    )
    rows = pd.read_csv(tmp_path / "runs.csv")
    assert set(rows.placement) == {"topology"}
    ran = rows[rows.status == "ok"]
    assert len(ran) == len(seen) > 0
    scaled = make_plan(
        get_case("5").subset([0, 8, 24, 40]), bandwidth_scale=0.1, delay_scale=1.0
    ).scaled_cluster()
    for r in ran.itertuples():
        spec = BaselineSpec(
            system=system,
            model="debug",
            hidden_size=256,
            seq_length=64,
            vocab_size=128,
            tp=int(r.tp),
            pp=int(r.pp),
            dp=int(r.dp),
            zero=None if pd.isna(getattr(r, "zero", None)) else int(r.zero),
            global_batch_size=8,
            micro_batch_size=2,
        )
        rm = place_spec(spec, scaled, "topology", None, GLOO)
        assert json.loads(r.rank_map) == list(rm.devices) != [0, 1, 2, 3]
        assert (spec.label(), list(rm.devices)) in [(s[0], s[1]) for s in seen]
        assert r.predicted_iter_time_s == pytest.approx(
            predict_iter_time_s(spec, scaled, None, GLOO, rank_map=rm.devices)
        )
    skipped = rows[rows.status == "skipped"]
    assert all(json.loads(m) == [0, 1, 2, 3] for m in skipped.rank_map)
    from hydra.errors import ConfigCompositionException

    with pytest.raises(ConfigCompositionException):
        _cfg("mode=emulate", "system=megatron", "baseline_placements=[random]")
