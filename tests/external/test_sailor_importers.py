"""Sailor importers: on hand-made files, on every shipped file, and one error per kind of bad
file (each naming the file and the field)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import baselines.deepspeed.schedule  # noqa: F401  (registers the "deepspeed" op order)
from system.external.sailor.bandwidth import (
    NodeSpec,
    cluster_from_nodes,
    load_bandwidth_fits,
    load_intra_node_fits,
)
from system.external.sailor.errors import SailorFormatError
from system.external.sailor.plan import load_plan, plan_files
from system.external.sailor.predict import load_inputs, model_of, predict_plans, set_of
from system.external.sailor.profile import load_llm_info, load_profiles, load_training_config
from system.simulator.transfers import flow_time_s
from tests.external._tiny import BWD, FWD, plan, write_data, write_plan

SHARED = Path(__file__).resolve().parents[3] / "shared" / "reference" / "external" / "sailor"
if not SHARED.is_dir():  # a worktree under <root>/wt/<name>: the shared folder is two up
    SHARED = Path(__file__).resolve().parents[4] / "shared" / "reference" / "external" / "sailor"
shipped = pytest.mark.skipif(not SHARED.is_dir(), reason="Sailor's shared data is not present")


# ---- hand-made files -------------------------------------------------------------------------
def test_hand_made_files_import(tmp_path):
    write_data(tmp_path)
    prof = load_profiles(tmp_path / "profiles_tmp.json")
    row = prof.get("OPT-350", "GH-96", 1, 1)
    assert row.fwd_s.tolist() == FWD and row.bwd_s.tolist() == BWD and row.profiled_opt_s == 0.004
    sizes = load_llm_info(tmp_path / "llm_info.json").get("OPT-350", 1)
    assert sizes.params.tolist() == [100e6, 10e6, 10e6, 100e6]
    shape = load_training_config(tmp_path / "training_config_opt_350.json")
    assert (shape.name, shape.num_all_layers, shape.hidden_size) == ("OPT-350", 4, 64)
    fits = load_bandwidth_fits(tmp_path / "multizone_bandwidths_het.json")
    node = NodeSpec("us-central1-a", "GH-96", 1)
    assert fits.curve(node, node).time_s(1e9) == pytest.approx(1.0)  # flat 1 GB/s
    intra = load_intra_node_fits(tmp_path / "intra_node_bandwidths.json")
    assert set(intra) == {("GH-96", 2)}
    path = write_plan(
        tmp_path,
        "clariden/OPT-350/N4/plan_config_N4_D2.json",
        plan([[0, 1], [2, 3]], 2, gbs=8, real=1.5),
    )
    p = load_plan(path, "OPT-350", 4)
    assert (p.pp, p.dp, p.micro_batches, p.real_s) == (2, 2, 4, 1.5)
    assert p.assignment().stages.tolist() == [[0, 1], [2, 3]]
    assert [s.layers for s in p.stages] == [(0, 1), (2, 3)]
    assert p.stages[1].replicas[0].gpu == "GH-96" and p.stages[1].replicas[0].tp == 1


def test_cluster_from_nodes_links_are_size_dependent(tmp_path):
    write_data(tmp_path)
    fits = load_bandwidth_fits(tmp_path / "multizone_bandwidths_het.json")
    node = NodeSpec("us-central1-a", "GH-96", 1)
    c = cluster_from_nodes([node, node], fits)
    assert c.gpus == ("GH200", "GH200") and c.host_of == (0, 1)
    # the flat fit: 1e9 B/s at every size above the floor; below it, the floor's time
    assert flow_time_s(c, [0], [1], 4e6)[0] == pytest.approx(0.004)
    assert flow_time_s(c, [0], [1], 10)[0] == pytest.approx(2**16 / 1e9)


@shipped
def test_cluster_from_nodes_links_are_every_pair_of_nodes_fit():
    inputs = load_inputs(SHARED)
    z = ("us-central1-a", "us-central1-b", "us-west1-b")
    nodes = [NodeSpec(z[k % 3], "A100-40", 4) for k in range(5)]
    nodes += [NodeSpec(z[0], "V100-16", 4), NodeSpec(z[1], "A100-40", 2)]
    c = cluster_from_nodes(nodes, inputs.fits, inputs.intra)
    expect = {
        (i, j): inputs.fits.curve(a, b)
        for i, a in enumerate(nodes)
        for j, b in enumerate(nodes)
        if i != j
    }
    assert dict(c.links.between.items()) == expect
    for i, a in enumerate(nodes):
        for j, b in enumerate(nodes):
            cu = inputs.fits.curve(a, b) if i != j else inputs.intra.get((a.gpu, a.gpus))
            per_flow = 1e4 if cu is None else cu.peak_bps / cu.flows / 1e9
            back = inputs.fits.curve(b, a) if i != j else cu
            per_flow_back = 1e4 if back is None else back.peak_bps / back.flows / 1e9
            last_of_j = len(c.host_of) - 1 - c.host_of[::-1].index(j)  # two devices if i == j
            bw = c.bandwidth_gbps[c.host_of.index(i), last_of_j]
            assert bw == min(per_flow, per_flow_back)


@shipped
def test_a_node_cluster_s_fingerprint_is_its_recipe_s():
    # a cluster of nodes is fingerprinted by its nodes and links, not by hashing its matrices:
    # the same nodes give the same fingerprint, anything that changes the content another
    import dataclasses

    from system.cluster import fingerprint, fingerprint_from_recipe
    from system.simulator.collectives import ring_collective_s

    inputs = load_inputs(SHARED)
    z = ("us-central1-a", "us-central1-b")
    nodes = [NodeSpec(z[k % 2], "A100-40", 4) for k in range(3)] + [NodeSpec(z[0], "V100-16", 4)]
    a = cluster_from_nodes(nodes, inputs.fits, inputs.intra)
    b = cluster_from_nodes(list(nodes), inputs.fits, inputs.intra)
    assert a is not b and fingerprint(a) == fingerprint(b)
    others = [
        cluster_from_nodes(nodes[::-1], inputs.fits, inputs.intra),  # other hosts' order
        cluster_from_nodes(nodes, inputs.fits),  # no intra-node fits: other links
        cluster_from_nodes(nodes[:3] + [NodeSpec(z[1], "V100-16", 4)], inputs.fits, inputs.intra),
    ]
    assert len({fingerprint(c) for c in [a, *others]}) == 4
    # the same content built another way hashes its matrices: another fingerprint, the same
    # numbers from work keyed by either
    copy = dataclasses.replace(a)
    assert fingerprint(copy) != fingerprint(a)
    ring = np.arange(a.num_devices)[None, :]
    assert ring_collective_s(copy, ring, 4e8).tolist() == ring_collective_s(a, ring, 4e8).tolist()
    with pytest.raises(ValueError, match="already has a fingerprint"):
        fingerprint_from_recipe(a, "again")


def test_model_and_set_of_a_plan_path():
    assert model_of("clariden/GPT-NEO/N4/plan_config_N4_D1.json") == "GPT-Neo-2.7"
    assert model_of("mit/N2/plan_config_N2_D1.json") == "OPT-350"
    assert set_of("clariden/OPT-350/N1/plan_config_x.json") == "clariden/OPT-350"
    assert set_of("mit/N6/plan_config_N6_D6.json") == "mit"
    with pytest.raises(ValueError, match="no folder on the path names the model"):
        model_of("elsewhere/plan_config_x.json")


# ---- every shipped file ----------------------------------------------------------------------
@shipped
def test_every_shipped_file_imports_and_every_plan_is_predicted_or_excluded_with_reason():
    inputs = load_inputs(SHARED)
    assert {"OPT-350", "GPT-Neo-2.7"} <= set(inputs.shapes)
    assert inputs.profiles.get("OPT-350", "GH-96", 8, 4).num_layers == 26
    assert inputs.sizes.get("GPT-Neo-2.7", 4).num_layers == 34
    files = plan_files(SHARED / "plans")
    assert len(files) == 36
    rows = predict_plans(SHARED / "plans")
    assert len(rows) == 36
    excluded = [r for r in rows if r.prediction is None]
    assert [r.plan for r in excluded] == ["clariden/GPT-NEO/N4/plan_config_N4_D4.json"]
    assert "does not match the model's 34 layers" in excluded[0].excluded
    swapped = [r for r in rows if any("listed twice" in f.message for f in r.findings)]
    assert len(swapped) == 5  # the five 4-stage GPT-Neo plans: layer 29 twice, 19 missing
    rounds = {f.field for r in rows for f in r.findings if "round numbers" in f.message}
    assert rounds == {"[OPT-350][GH-96][1][4]", "[OPT-350][GH-96][2][4]", "[OPT-350][GH-96][4][4]"}
    for r in rows:
        if r.prediction is not None:
            p = r.prediction
            parts = p.pipeline_s + p.tied_s + p.dp_s + p.optimizer_s
            assert p.iter_time_s == pytest.approx(parts) and p.iter_time_s > 0
    mit = [r for r in rows if r.set == "mit"]
    assert len(mit) == 9 and all(r.real_s is None for r in mit)


# ---- bad files: one clear error each -----------------------------------------------------------
def _bad_plan(tmp_path, mutate) -> Path:
    write_data(tmp_path)
    d = plan([[0, 1], [2, 3]], 1)
    mutate(d)
    return write_plan(tmp_path, "clariden/OPT-350/N2/plan_config_bad.json", d)


@pytest.mark.parametrize(
    "mutate, field, problem",
    [
        (
            lambda d: d["pipeline_list"][0].update(layers_per_stage=[[0, 1], [1, 3]]),
            "layers_per_stage",
            r"layers listed twice: \[1\], missing: \[2\]",
        ),
        (
            lambda d: d["pipeline_list"][0].update(layers_per_stage=[[0, 1], [2]]),
            "layers_per_stage",
            "does not match the model's 4 layers",
        ),
        (
            lambda d: d["pipeline_list"][0].update(layers_per_stage=[[0, 1], [2, 3, 4, 5]]),
            "layers_per_stage",
            "does not match the model's 4 layers",
        ),
        (
            lambda d: d["pipeline_list"][0]["tmp_per_stage"][1][0][0][0].__setitem__(0, "H900"),
            r"tmp_per_stage\[1\]\[0\]\[0\]\[0\]\[0\]",
            "unknown GPU type 'H900'",
        ),
        (lambda d: d.update(mbs="two"), "mbs", "expected a number, got 'two'"),
        (lambda d: d.update(real=float("nan")), "real", "expected a finite number"),
        (lambda d: d.update(N=3), "N", "3 nodes declared, the stages use 2"),
        (lambda d: d["pipeline_list"][0].update(dp=[1]), r"dp", "expected 2 entries"),
    ],
)
def test_bad_plan_one_error_naming_file_and_field(tmp_path, mutate, field, problem):
    path = _bad_plan(tmp_path, mutate)
    with pytest.raises(SailorFormatError, match=problem) as e:
        load_plan(path, "OPT-350", 4, lambda a, b: False)
    assert str(path) in str(e.value) and e.value.file == str(path)
    assert __import__("re").search(field, e.value.field)


def test_layer_twice_with_identical_missing_one_is_a_warning(tmp_path):
    path = _bad_plan(
        tmp_path, lambda d: d["pipeline_list"][0].update(layers_per_stage=[[0, 1], [1, 3]])
    )
    p = load_plan(path, "OPT-350", 4, lambda a, b: {a, b} == {1, 2})
    assert [f.field for f in p.findings] == ["pipeline_list[0].layers_per_stage"]
    assert "layer 1 is listed twice and layer 2 is missing" in p.findings[0].message


@pytest.mark.parametrize(
    "which, mutate, problem",
    [
        (
            "profiles",
            lambda d: d["OPT-350"]["GH-96"]["1"]["1"]["2"].__setitem__(0, "fast"),
            r"\[OPT-350\]\[GH-96\]\[1\]\[1\]\[2\]\[0\] \(fwd_s\): expected a number",
        ),
        (
            "profiles",
            lambda d: d["OPT-350"]["GH-96"]["1"]["1"].pop("2"),
            r"layer ids must be 0..2; missing \[2\]",
        ),
        (
            "profiles",
            lambda d: d["OPT-350"].__setitem__("H900", d["OPT-350"].pop("GH-96")),
            "unknown GPU type 'H900'",
        ),
        (
            "profiles",
            lambda d: d["OPT-350"]["GH-96"]["1"]["1"]["1"].__setitem__(1, -1.0),
            r"\(bwd_s\): expected a number >= 0",
        ),
        (
            "llm",
            lambda d: d["OPT-350"]["1"]["3"].pop("params_floats"),
            r"\[OPT-350\]\[1\]\[3\].params_floats: missing",
        ),
        (
            "fits",
            lambda d: d["us-central1-a"]["GH-96"]["1"]["us-central1-a"]["GH-96"]["1"][
                0
            ].__setitem__(2, None),
            r"\[0\]\[2\]: expected a number, got None",
        ),
        (
            "fits",
            lambda d: d["us-central1-a"]["GH-96"]["1"]["us-central1-a"]["GH-96"].__setitem__(
                "1", [[0.0, 0.0, -1.0], 1e9]
            ),
            "not positive at any measured message size",
        ),
    ],
)
def test_bad_data_file_one_error(tmp_path, which, mutate, problem):
    write_data(tmp_path)
    name = {
        "profiles": "profiles_tmp.json",
        "llm": "llm_info.json",
        "fits": "multizone_bandwidths_het.json",
    }[which]
    d = json.loads((tmp_path / name).read_text())
    mutate(d)
    (tmp_path / name).write_text(json.dumps(d))
    loader = {"profiles": load_profiles, "llm": load_llm_info, "fits": load_bandwidth_fits}[which]
    with pytest.raises(SailorFormatError, match=problem) as e:
        loader(tmp_path / name)
    assert e.value.file == str(tmp_path / name)


def test_not_json_and_missing_fit(tmp_path):
    (tmp_path / "profiles_tmp.json").write_text("{not json")
    with pytest.raises(SailorFormatError, match=r"\(file\): not readable JSON"):
        load_profiles(tmp_path / "profiles_tmp.json")
    write_data(tmp_path)
    fits = load_bandwidth_fits(tmp_path / "multizone_bandwidths_het.json")
    other = NodeSpec("us-central1-a", "GH-96", 4)
    with pytest.raises(SailorFormatError, match="no bandwidth fit for this pair of nodes"):
        cluster_from_nodes([other, other], fits)
    assert np.isfinite(
        fits.curve(
            NodeSpec("us-central1-a", "GH-96", 1), NodeSpec("us-central1-a", "GH-96", 1)
        ).peak_bps
    )
