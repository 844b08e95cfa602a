"""mode=sailor_planner's pieces: a trace point's fleet file (loads as a topology, links from
Sailor's fits) and ours' plan record turned into Sailor's plan format."""

from __future__ import annotations

import json

import pytest

from repro.studies.sailor_planner.run import fleet_devices, fleet_document, ours_plan_config
from system.cases import load_topology
from system.external.sailor.planner_import import StudyPoint
from tests.external._tiny import write_data


def _point(n: int) -> StudyPoint:
    return StudyPoint(0, 60.0, {("GH-96", "us-central1-a"): n}, 0.1, 0.0, None, None, None)


def test_fleet_file_from_a_trace_point_loads_with_hosts_and_fitted_links(tmp_path):
    data = write_data(tmp_path / "data")
    doc = fleet_document(_point(3), "t-p0", data, gpus_per_host=2)
    assert [d["host"] for d in doc["devices"]] == [
        "us-central1-a-GH-96-0",
        "us-central1-a-GH-96-0",
        "us-central1-a-GH-96-1",
    ]
    assert {d["gpu"] for d in doc["devices"]} == {"GH200"}
    # the tiny fits: 1e9 bytes/s peak, one flow between nodes, two inside a node of 2
    assert doc["pairs"] == [
        {
            "region_a": "us-central1-a",
            "region_b": "us-central1-a",
            "delay_ms": 0.0,
            "bandwidth_gbps": 8.0,
        }
    ]
    assert doc["intra_host_bandwidth_gbps"] == 4.0
    f = tmp_path / "fleet.json"
    f.write_text(json.dumps(doc))
    cluster = load_topology(f)
    assert (
        cluster.num_devices == 3 and cluster.host_of[0] == cluster.host_of[1] != cluster.host_of[2]
    )


def test_ours_record_becomes_a_sailor_plan_with_embedding_and_head_placed():
    devices = fleet_devices(_point(4), 4)
    rec = {
        "stages": [[0, 1], [2, 3]],
        "layers_per_stage": [1, 1],
        "config": {"micro_batch_size": 2},
    }
    doc = ours_plan_config(rec, devices, 8, "rec")
    pl = doc["pipeline_list"][0]
    assert pl["layers_per_stage"] == [[0, 1], [2, 3]]
    assert pl["dp"] == [2, 2] and doc["N"] == 4 and doc["mbs"] == 2 and doc["gbs"] == 8
    assert pl["tmp_per_stage"][1][0] == [[["GH-96", 1, "us-central1-a"]], 1]
    with pytest.raises(ValueError, match="outside the fleet"):
        ours_plan_config({**rec, "stages": [[0, 1], [2, 9]]}, devices, 8, "rec")
    with pytest.raises(ValueError, match="rec: not a plan record"):
        ours_plan_config({"stages": [[0]]}, devices, 8, "rec")


OURS = "ours (our runtime)"  # the table's row of ours planning for its own runtime


def test_mode_end_to_end_on_the_tiny_data(tmp_path):
    from types import SimpleNamespace

    import pandas as pd

    import baselines.deepspeed.schedule  # noqa: F401  (registers the "deepspeed" op order)
    from repro.studies.sailor_planner.run import run
    from tests.external._tiny import plan

    data = write_data(tmp_path / "data")
    out = tmp_path / "res"
    (out / "sailor_runs").mkdir(parents=True)
    (out / "ours").mkdir()
    (out / "sailor_judge").mkdir()
    doc = plan([[0, 1], [2, 3]], 1, mbs=1, gbs=2)
    sim = {"fits": True, "iter_time_s": 1.5, "compute_usd_per_iter": 0.0}
    sim |= {"comm_usd_per_iter": 0.0, "usd_per_iter": 0.0}
    point = {
        "point": 0,
        "duration_s": 60.0,
        "gpus": {"GH-96_us-central1-a": 2},
        "search_time_s": 0.25,
        "planner_init_s": 1.0,
        "chosen": {
            "plan": {"pipeline_list": doc["pipeline_list"], "mbs": 1, "gbs": 2},
            "planner_iter_time_s": 1.4,
            "sailor_sim": sim,
        },
    }
    study = {"model": "OPT-350", "trace": "t.csv", "points": [point]}
    (out / "sailor_runs" / "het_OPT-350.json").write_text(json.dumps(study))
    rec = {
        "stages": [[0], [1]],
        "layers_per_stage": [1, 1],
        "config": {"micro_batch_size": 1},
        "batch": 2,
        "iteration_time_s": 0.9,
        "search_time_s": 3.0,
    }
    (out / "ours" / "het_OPT-350_p0.json").write_text(json.dumps(rec))
    judged = {"points": [{"fits": False, "iter_time_s": 2.0, "usd_per_iter": 0.0}]}
    (out / "sailor_judge" / "het_OPT-350_ours.json").write_text(json.dumps(judged))
    run(SimpleNamespace(results_dir=str(out), data_dir=str(data), gpus_per_host=2))
    t = pd.read_csv(out / "table.csv").set_index("planner")
    assert (out / "fleets" / "het_p0.json").is_file() and (out / "table.md").is_file()
    assert (out / "ours_plans" / "het" / "OPT-350" / "plan_config_het_p0.json").is_file()
    # the same plan (both put stage s on one GH-96): the same time under ours' judge
    assert t.loc["sailor", "ours_judge_iter_time_s"] == pytest.approx(
        t.loc[OURS, "ours_judge_iter_time_s"]
    )
    assert t.loc["sailor", "sailor_judge_iter_time_s"] == 1.5
    assert t.loc[OURS, "sailor_judge_iter_time_s"] == 2.0
    assert not t.loc[OURS, "sailor_judge_fits"]
    assert t.loc[OURS, "planner_wall_s"] == 3.0 and t.loc["sailor", "planner_wall_s"] == 0.25
