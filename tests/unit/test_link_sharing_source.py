"""One source for the link-sharing model: the cluster's ``link_sharing`` field.

A notebook call of the simulator on a named case runs the model the main job runs by default,
a cluster built without a model is refused, and a row records the model its result ran under.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hydra import compose, initialize_config_dir

from repro.run import run as run_job
from system.assignment import Assignment
from system.cases import get_case
from system.cluster import DEFAULT_LINK_SHARING, Cluster, LinkSharing, fingerprint
from system.simulator import simulate_1f1b_ring, simulate_ours
from system.simulator.sharing import shared_bandwidth_bps, with_link_sharing
from system.workload import Workload, get_model

ROOT = Path(__file__).resolve().parents[2]
LAYERS, BATCH = 8, 64  # GPT3-XL cut to 8 layers (one per stage): case 5 in seconds


def _main_job(tmp_path, *overrides) -> pd.DataFrame:
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose(
            "config",
            overrides=[
                "case=5",
                f"layers={LAYERS}",
                f"batch={BATCH}",
                f"results_dir={tmp_path}",
                *overrides,
            ],
        )
    run_job(cfg)
    return pd.read_parquet(tmp_path / "runs.parquet")


def _workload() -> Workload:
    return Workload(model=get_model("gpt3_xl", LAYERS), global_batch_size=BATCH)


@pytest.mark.slow
def test_a_notebook_call_on_case_5_gives_the_main_jobs_iteration_time(tmp_path):
    rows = _main_job(tmp_path, "system=ours_random")
    assert set(rows.link_sharing) == {DEFAULT_LINK_SHARING}
    discriminating = 0
    for row in rows.itertuples():
        layout = Assignment(np.array(json.loads(row.layout)))
        # what a notebook writes: the case as read, no link-sharing model named
        res = simulate_ours(get_case("5"), layout, _workload(), loss_scaling=True)
        assert res.iter_time_s == row.iter_time_s
        assert res.breakdown["link_sharing"] == row.link_sharing
        pair = with_link_sharing(get_case("5"), "pair")
        other = simulate_ours(pair, layout, _workload(), loss_scaling=True).iter_time_s
        discriminating += other != row.iter_time_s
    # random layouts put devices of one region in one DP group, where the models differ: a
    # notebook call that fell back to another model would fail the equality above
    assert discriminating > 0


@pytest.mark.slow
def test_the_row_records_the_model_the_simulator_ran_under(tmp_path):
    rows = _main_job(tmp_path, "system=all", "link_sharing=pair", "baseline_placements=[launch]")
    assert set(rows.link_sharing) == {"pair"}
    ours = rows[rows.system == "ours"].iloc[0]
    layout = Assignment(np.array(json.loads(ours.layout)))
    res = simulate_ours(
        with_link_sharing(get_case("5"), "pair"), layout, _workload(), loss_scaling=True
    )
    assert res.iter_time_s == ours.iter_time_s and res.breakdown["link_sharing"] == "pair"
    meg = rows[(rows.system == "megatron") & rows.is_best.eq(True)].iloc[0]
    assert meg.link_sharing == "pair"


def test_get_case_carries_the_default_and_derived_clusters_keep_it():
    c = get_case("5")
    assert c.link_sharing == LinkSharing(DEFAULT_LINK_SHARING)
    nic = with_link_sharing(c, "nic", nic_gbps=2.0)
    assert nic.subset([0, 1, 2]).link_sharing == nic.link_sharing
    assert nic.scaled(bandwidth_scale=2.0).link_sharing == nic.link_sharing
    assert nic.permuted(list(range(63, -1, -1))).link_sharing == nic.link_sharing
    # provenance is not where a model lives
    assert not {"link_sharing", "nic_gbps", "flow_streams"} & set(nic.meta)


def _bare(n: int = 3) -> Cluster:
    off = 1.0 - np.eye(n)
    return Cluster(
        name="bare",
        region_of=("a",) * n,
        host_of=tuple(range(n)),
        delay_ms=off * 5.0,
        bandwidth_gbps=off * 4.0,
    )


def test_a_cluster_without_a_model_is_refused_naming_it():
    c = _bare()
    w = Workload(model=get_model("debug", 2), global_batch_size=3)
    with pytest.raises(ValueError, match="cluster 'bare' has no link-sharing model"):
        shared_bandwidth_bps(c, [0], [0])  # even with nothing to share
    with pytest.raises(ValueError, match="cluster 'bare' has no link-sharing model"):
        simulate_ours(c, Assignment(np.array([[0, 1, 2]])), w)
    with pytest.raises(ValueError, match="cluster 'bare' has no link-sharing model"):
        simulate_1f1b_ring(c, w, tp=1, pp=1, dp=3)
    ok = simulate_ours(with_link_sharing(c, "pair"), Assignment(np.array([[0, 1, 2]])), w)
    assert ok.breakdown["link_sharing"] == "pair"


@pytest.mark.parametrize(
    "kw,match",
    [
        ({"model": "device_nic"}, "link sharing must be one of"),
        ({"model": "pair", "streams": 4}, "streams applies to flow only"),
        ({"model": "flow", "streams": 0}, "streams must be an integer >= 1"),
        ({"model": "flow", "streams": 2.5}, "streams must be an integer >= 1"),
        ({"model": "tc_class", "nic_gbps": 1.0}, "nic_gbps applies to nic only"),
        ({"model": "nic", "nic_gbps": 0.0}, "nic_gbps must be > 0"),
    ],
)
def test_a_setting_a_model_does_not_have_is_refused(kw, match):
    with pytest.raises(ValueError, match=match):
        LinkSharing(**kw)
    with pytest.raises(ValueError, match="link_sharing must be a LinkSharing or None"):
        Cluster(**{**_fields(_bare()), "link_sharing": "pair"})


def _fields(c: Cluster) -> dict:
    keys = ("name", "region_of", "host_of", "delay_ms", "bandwidth_gbps")
    return {k: getattr(c, k) for k in keys}


def test_the_model_is_part_of_the_clusters_identity():
    a, b = _bare(), _bare()  # built apart from the same data
    assert fingerprint(a) == fingerprint(b)
    pa, pb = with_link_sharing(a, "pair"), with_link_sharing(b, "pair")
    assert fingerprint(pa) == fingerprint(pb) != fingerprint(a)
    assert fingerprint(with_link_sharing(a, "flow", streams=4)) != fingerprint(
        with_link_sharing(a, "flow")
    )
    assert pa.link_sharing == pb.link_sharing != with_link_sharing(a, "nic").link_sharing


def test_the_models_caches_are_keyed_by_content_not_by_object():
    from system.simulator import sharing

    a = with_link_sharing(_bare(), "tc_class")
    sharing._derived(a, "fastest_bps")
    b = with_link_sharing(_bare(), "tc_class")  # another object, the same content
    assert sharing._derived(b, "fastest_bps") is sharing._derived(a, "fastest_bps")
    # a cluster of other content never gets another's entry, whatever its objects' ids
    c = with_link_sharing(
        replace_bandwidth(_bare(), 2.0),
        "tc_class",
    )
    assert sharing._derived(c, "fastest_bps") is not sharing._derived(a, "fastest_bps")
    assert sharing._derived(c, "fastest_bps").max() == pytest.approx(2e9)


def replace_bandwidth(c: Cluster, gbps: float) -> Cluster:
    from dataclasses import replace

    return replace(c, bandwidth_gbps=(1.0 - np.eye(c.num_devices)) * gbps)


def test_a_row_keyed_with_another_model_than_the_result_ran_is_refused():
    from repro.modes.simulate.run import _row
    from system.simulator import SimResult

    res = SimResult(
        system="ours",
        iter_time_s=1.0,
        compute_time_s=0.5,
        model_flops=1.0,
        memory_bytes=1.0,
        config={"pp": 1, "dp": 3},
        breakdown={"link_sharing": "tc_class"},
    )
    c = with_link_sharing(_bare(), "tc_class")
    key = {"mode": "simulate", "case": "debug", "system": "ours"}
    assert _row({**key, "link_sharing": "tc_class"}, res, c)["link_sharing"] == "tc_class"
    with pytest.raises(RuntimeError, match="simulated with link_sharing='tc_class', keyed 'pair'"):
        _row({**key, "link_sharing": "pair"}, res, c)


def test_a_pickled_cluster_keeps_its_model_and_leaves_its_memo_behind():
    import pickle

    c = with_link_sharing(get_case("5"), "flow", streams=4)
    size = len(pickle.dumps(c))
    fp = fingerprint(c)
    _ = c.bandwidth_bps, c.delay_s  # fill the memo
    assert len(pickle.dumps(c)) == size
    back = pickle.loads(pickle.dumps(c))
    assert back.link_sharing == c.link_sharing and fingerprint(back) == fp
    assert np.array_equal(back.bandwidth_bps, c.bandwidth_bps)
