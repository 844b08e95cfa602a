"""Sailor's planner studies imported: a hand-made study file, its plans written as plan_config
documents that the plan loader and the predictor read back, and bad study files."""

from __future__ import annotations

import json

import pytest

import baselines.deepspeed.schedule  # noqa: F401  (registers the "deepspeed" op order)
from system.external.sailor.errors import SailorFormatError
from system.external.sailor.plan import load_plan
from system.external.sailor.planner_import import load_study, write_plans
from system.external.sailor.predict import predict_plans
from tests.external._tiny import BWD, FWD, plan, write_data


def _study(chosen_plan, **point):
    sim = {
        "fits": True,
        "iter_time_s": 1.5,
        "compute_usd_per_iter": 0.2,
        "comm_usd_per_iter": 0.0,
        "usd_per_iter": 0.2,
    }
    p = {
        "point": 0,
        "duration_s": 120.0,
        "gpus": {"GH-96_us-central1-a": 2},
        "search_time_s": 0.5,
        "planner_init_s": 3.0,
        "chosen": {"plan": chosen_plan, "planner_iter_time_s": 1.4, "sailor_sim": sim},
    }
    p.update(point)
    return {"model": "OPT-350", "trace": "gpu_trace_x.csv", "points": [p]}


def test_study_round_trips_into_plans_the_predictor_reads(tmp_path):
    data = write_data(tmp_path / "data")
    doc = plan([[0, 1], [2, 3]], 1, mbs=1, gbs=4)
    chosen = {"pipeline_list": doc["pipeline_list"], "mbs": 1, "gbs": 4}
    f = tmp_path / "het_OPT-350.json"
    f.write_text(json.dumps(_study(chosen)))
    study = load_study(f)
    (pt,) = study.points
    assert pt.gpus == {("GH-96", "us-central1-a"): 2} and pt.gpus_offered == 2
    assert pt.sailor_sim["iter_time_s"] == 1.5 and pt.planner_iter_time_s == 1.4
    (path,) = write_plans(study, tmp_path / "plans", "het")
    assert path.relative_to(tmp_path / "plans").as_posix() == "het/OPT-350/plan_config_het_p0.json"
    loaded = load_plan(path, "OPT-350", 4)
    assert (loaded.pp, loaded.dp, loaded.nodes_declared, loaded.micro_batches) == (2, 1, 2, 4)
    (row,) = predict_plans(tmp_path / "plans", data)
    assert row.prediction is not None and row.prediction.iter_time_s > 0


def test_point_without_a_plan_writes_nothing(tmp_path):
    f = tmp_path / "s.json"
    doc = _study(None)
    doc["points"][0]["chosen"] = None
    f.write_text(json.dumps(doc))
    study = load_study(f)
    assert study.points[0].plan is None
    assert write_plans(study, tmp_path / "plans", "geo") == []


@pytest.mark.parametrize(
    "mutate, field",
    [
        (lambda d: d.update(model="GPT-9"), "model"),
        (lambda d: d.update(trace="../x;rm"), "trace"),
        (lambda d: d["points"][0].update(gpus={"A100 40 zone": 4}), "points[0].gpus"),
        (lambda d: d["points"][0].update(search_time_s="fast"), "points[0].search_time_s"),
        (lambda d: d["points"][0]["chosen"]["sailor_sim"].pop("iter_time_s"), "sailor_sim"),
        (lambda d: d["points"][0].update(point=3), "points"),
    ],
)
def test_bad_study_one_error_naming_file_and_field(tmp_path, mutate, field):
    doc = _study({"pipeline_list": plan([[0, 1, 2, 3]], 1)["pipeline_list"], "mbs": 1, "gbs": 1})
    mutate(doc)
    f = tmp_path / "bad.json"
    f.write_text(json.dumps(doc))
    with pytest.raises(SailorFormatError) as e:
        load_study(f)
    assert str(f) in str(e.value) and field in str(e.value) and "\n" not in str(e.value)


def test_bad_study_name_refused(tmp_path):
    f = tmp_path / "s.json"
    f.write_text(
        json.dumps(
            _study({"pipeline_list": plan([[0, 1, 2, 3]], 1)["pipeline_list"], "mbs": 1, "gbs": 1})
        )
    )
    with pytest.raises(ValueError, match="study name"):
        write_plans(load_study(f), tmp_path, "../up")


def _two_tp_data(root):
    """The tiny data set with a tp = 2 profile (half the times), sizes and count-2 links."""
    from tests.external._tiny import ACT_OUT, BWD, FWD, OPT_S, PARAMS

    z, flat = "us-central1-a", [[0.0, 0.0, 1.0], 1e9]
    prof = {
        "OPT-350": {
            "GH-96": {
                "1": {
                    str(tp): {str(i): [FWD[i] / tp, BWD[i] / tp, OPT_S] for i in range(4)}
                    for tp in (1, 2)
                }
            }
        }
    }
    sizes = {
        "OPT-350": {
            str(tp): {
                str(i): {
                    "params_floats": PARAMS[i] / tp,
                    "act_output_floats": ACT_OUT,
                    "act_mem_floats": 2e6 / tp,
                }
                for i in range(4)
            }
            for tp in (1, 2)
        }
    }
    counts = {c: {z: {"GH-96": {"1": flat, "2": flat}}} for c in ("1", "2")}
    fits = {z: {"GH-96": counts}}
    return write_data(root, profiles=prof, llm=sizes, fits=fits)


def test_mixed_tp_stage_is_an_error_unless_asked_and_then_timed(tmp_path):
    data = _two_tp_data(tmp_path / "data")
    doc = plan([[0, 1, 2, 3]], 2, mbs=1, gbs=4)
    doc["pipeline_list"][0]["tmp_per_stage"][0][1] = [[["GH-96", 2, "us-central1-a"]], 2]
    f = tmp_path / "plans" / "het" / "OPT-350" / "plan_config_het_p0.json"
    f.parent.mkdir(parents=True)
    f.write_text(json.dumps(doc))
    with pytest.raises(SailorFormatError, match="replicas differ in tp"):
        load_plan(f, "OPT-350", 4)
    (row,) = predict_plans(tmp_path / "plans", data, mixed_tp=True)
    pred = row.prediction
    # the tp = 1 replica computes the whole stage: m·(f + b) of the tp = 1 profile
    assert pred.compute_s == pytest.approx(2 * (sum(FWD) + sum(BWD)))
    assert pred.dp_s > 0 and pred.iter_time_s > pred.compute_s
    uniform = plan([[0, 1, 2, 3]], 2, mbs=1, gbs=4)
    g = tmp_path / "u" / "het" / "OPT-350" / "plan_config_u_p0.json"
    g.parent.mkdir(parents=True)
    g.write_text(json.dumps(uniform))
    (u,) = predict_plans(tmp_path / "u", data, mixed_tp=True)
    # the all-reduce runs at the narrowest TP degree: the whole stage through the tp = 1 GPU's
    # link, as two tp = 1 replicas do
    assert pred.dp_s == pytest.approx(u.prediction.dp_s)


def test_replicas_fit_checks_each_gpu_against_its_own_memory(tmp_path):
    from system.external.sailor.framework import replicas_fit
    from system.external.sailor.predict import load_inputs

    data = write_data(tmp_path / "data")
    f = tmp_path / "plan_config_x.json"
    f.write_text(json.dumps(plan([[0, 1], [2, 3]], 1, mbs=1, gbs=1)))
    assert replicas_fit(load_plan(f, "OPT-350", 4), load_inputs(data))
    big = {
        "OPT-350": {
            "1": {
                str(i): {"params_floats": 1e10, "act_output_floats": 1e6, "act_mem_floats": 2e6}
                for i in range(4)
            }
        }
    }
    data2 = write_data(tmp_path / "data2", llm=big)  # 16 B x 2e10 per stage > a GH200's 96 GB
    assert not replicas_fit(load_plan(f, "OPT-350", 4), load_inputs(data2))
