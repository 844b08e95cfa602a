"""Registered-prediction validation: the settings file and the predictions made from it."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from repro.studies.validation.predict import baseline_kwargs, predict_setting, scaled_cluster
from repro.studies.validation.settings import Setting, load_settings
from tests.unit._validation import BASE
from tests.unit._validation import profile as _profile
from tests.unit._validation import setting as _setting

# ---------------------------------------------------------------- settings


def test_settings_file_roundtrip(tmp_path):
    p = tmp_path / "s.json"
    p.write_text(
        json.dumps(
            {"settings": [BASE, {**BASE, "name": "s2", "case": 4, "devices": [0, 16, 32, 48]}]}
        )
    )
    got = load_settings(p)
    assert [s.name for s in got] == ["s1", "s2"] and got[1].case == "4"
    assert Setting.from_dict(got[0].to_dict()) == got[0]


@pytest.mark.parametrize(
    "change, match",
    [
        ({"pp": 3}, "must equal the 4 devices"),
        ({"devices": [0, 0, 8, 8]}, "repeat a device"),
        ({"bandwidth_scale": 1.5}, "bandwidth_scale"),
        ({"iters": 2, "warmup_iters": 2}, "must exceed warmup_iters"),
        ({"systems": ["ours", "tutel"]}, "systems must be"),
        ({"colour": "red"}, "unknown field"),
        ({"global_batch_size": 3}, "batch|divis"),
    ],
)
def test_bad_setting_names_the_problem(change, match):
    with pytest.raises(ValueError, match=match):
        _setting(**change)


def test_duplicate_setting_names_rejected(tmp_path):
    p = tmp_path / "s.json"
    p.write_text(json.dumps({"settings": [BASE, BASE]}))
    with pytest.raises(ValueError, match="duplicate"):
        load_settings(p)


def test_settings_file_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_settings(tmp_path / "none.json")
    (tmp_path / "x.json").write_text("[1, 2]")
    with pytest.raises(ValueError, match="expected"):
        load_settings(tmp_path / "x.json")


def test_committed_settings_are_valid_and_span_the_required_range():
    settings = load_settings(
        Path(__file__).resolve().parents[2] / "results/validation/round1/settings.json"
    )
    assert len(settings) >= 12
    assert {s.case for s in settings} == {"4", "5"}
    assert any(s.num_devices == 8 for s in settings)
    assert max(s.bandwidth_scale for s in settings) == 1.0
    # pipelines inside a region (two devices per region) and one device per region
    from system.cases import get_case

    per_region = set()
    for s in settings:
        regions = [get_case(s.case).region_of[d] for d in s.devices]
        per_region.add(max(regions.count(r) for r in regions))
    assert per_region >= {1, 2}


# ---------------------------------------------------------------- predictions


def test_baseline_kwargs_match_the_baseline_models():
    """predict.py calls simulate_1f1b_ring directly (to pass a profile); without a profile it
    must equal baselines/*/perf.py's models exactly."""
    from baselines.deepspeed.perf import simulate_deepspeed
    from baselines.megatron.perf import simulate_megatron
    from baselines.space import BaselineConfig
    from system.simulator.baseline_training import simulate_1f1b_ring
    from system.simulator.transfers import GLOO

    s = _setting()
    cl, wl = scaled_cluster(s), s.workload
    for system, fn, zero in (
        ("megatron", simulate_megatron, 0),
        ("deepspeed", simulate_deepspeed, 1),
    ):
        cfg = BaselineConfig(system=system, tp=1, pp=2, dp=2, micro_batch_size=1, zero=zero)
        ref = fn(cl, wl, cfg, transport=GLOO).iter_time_s
        got = simulate_1f1b_ring(
            cl, wl, tp=1, pp=2, dp=2, transport=GLOO, **baseline_kwargs(system)
        ).iter_time_s
        assert got == pytest.approx(ref, rel=1e-12)
    with pytest.raises(ValueError, match="no baseline model"):
        baseline_kwargs("ours")


def test_1f1b_compute_profile_is_used():
    from system.simulator import StageCompute
    from system.simulator.baseline_training import simulate_1f1b_ring
    from system.simulator.transfers import GLOO

    s = _setting()
    cl, wl = scaled_cluster(s), s.workload
    kw = dict(tp=1, pp=2, dp=2, transport=GLOO, **baseline_kwargs("megatron"))
    fast = simulate_1f1b_ring(cl, wl, compute=StageCompute(0.01, 0.02, 0.0), **kw).iter_time_s
    slow = simulate_1f1b_ring(cl, wl, compute=StageCompute(0.51, 1.02, 0.0), **kw).iter_time_s
    # 2 micro-batches per replica: at least 2 x 1.5 s more compute on the critical path
    assert slow - fast >= 2 * 1.5 - 1e-9


def test_predict_setting_fixes_layouts_and_is_deterministic():
    s = _setting()
    a = predict_setting(s, _profile(s), schedule_trials=20)
    b = predict_setting(s, _profile(s), schedule_trials=20)
    assert a == b
    assert [p["system"] for p in a] == list(s.systems)
    by = {p["system"]: p for p in a}
    for name in ("ours", "ours_random"):
        st_ = np.asarray(by[name]["stages"])
        assert st_.shape == (2, 2) and sorted(st_.ravel()) == [0, 1, 2, 3]
    assert by["megatron"]["layout"] == by["deepspeed"]["layout"] == "launch"
    assert all(p["predicted_iter_time_s"] > 0 and 0 < p["predicted_compute_share"] <= 1 for p in a)


def test_prediction_grows_with_profiled_compute():
    s = _setting()
    lo = {
        p["system"]: p["predicted_iter_time_s"]
        for p in predict_setting(s, _profile(s), schedule_trials=20)
    }
    hi = {
        p["system"]: p["predicted_iter_time_s"]
        for p in predict_setting(s, _profile(s, fwd=0.2, bwd=0.4), schedule_trials=20)
    }
    assert all(hi[k] > lo[k] for k in lo)


def test_missing_profile_entry_is_one_clear_error():
    s = _setting()
    other = _setting(hidden_size=256)
    with pytest.raises(ValueError, match="no entry"):
        predict_setting(s, _profile(other))


def test_baseline_placement_names():
    from repro.studies.validation.settings import baseline_placement

    assert baseline_placement("megatron") == ("megatron", "launch")
    assert baseline_placement("deepspeed_topology") == ("deepspeed", "topology")
    for bad in ("ours", "ours_random", "megatron_tp", "torch"):
        with pytest.raises(ValueError, match="not a baseline system"):
            baseline_placement(bad)
    # a setting that names no systems keeps the four of the earlier rounds
    assert _setting().systems == ("ours", "ours_random", "megatron", "deepspeed")


def test_topology_prediction_is_the_searched_map_and_never_slower_than_launch():
    """Two devices in Oregon, then two in Virginia: launch order makes both pipelines cross the
    WAN link and keeps data parallelism inside a region, which at hidden 128 costs more than the
    other way round. The registered map must be the one the baselines' own search finds under
    the same simulator and profile, never slower than launch order, and here a different map."""
    from baselines.placement import search_placement
    from baselines.space import BaselineConfig
    from system.simulator.baseline_training import simulate_1f1b_ring
    from system.simulator.transfers import GLOO

    systems = ["megatron", "deepspeed", "megatron_topology", "deepspeed_topology"]
    s = _setting(devices=[0, 1, 8, 9], systems=systems)
    cluster = scaled_cluster(s)
    by = {p["system"]: p for p in predict_setting(s, _profile(s), schedule_trials=20)}
    for fw in ("megatron", "deepspeed"):
        topo, launch = by[f"{fw}_topology"], by[fw]
        assert topo["layout"] == "topology" and launch["layout"] == "launch"
        assert "rank_map" not in launch
        assert sorted(topo["rank_map"]) == [0, 1, 2, 3] and topo["placement_how"]
        assert topo["predicted_iter_time_s"] <= launch["predicted_iter_time_s"] + 1e-12
        assert topo["zero"] == launch["zero"] == (1 if fw == "deepspeed" else None)

        def sim(rank_map, fw=fw):
            from repro.studies.validation.predict import _compute
            from repro.studies.validation.profile import stage_times

            c = _compute(stage_times(_profile(s), s), 2, opt_shards=2 if fw == "deepspeed" else 1)
            return simulate_1f1b_ring(
                cluster, s.workload, tp=1, pp=2, dp=2, transport=GLOO, compute=c,
                rank_map=rank_map, **baseline_kwargs(fw),
            )  # fmt: skip

        cfg = BaselineConfig(
            system=fw, tp=1, pp=2, dp=2, micro_batch_size=1, zero=1 if fw == "deepspeed" else 0
        )
        res, rm = search_placement(cluster, s.workload, cfg, lambda c: sim(list(c.devices)))
        assert list(rm.devices) == topo["rank_map"]
        assert res.iter_time_s == pytest.approx(topo["predicted_iter_time_s"], rel=1e-12)
    assert by["megatron_topology"]["rank_map"] != [0, 1, 2, 3]
    assert (
        by["megatron_topology"]["predicted_iter_time_s"] < by["megatron"]["predicted_iter_time_s"]
    )
