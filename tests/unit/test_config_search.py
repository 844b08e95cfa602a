"""Ours' configuration search (system/config_search.py) and the heuristic layouts it and the
scheduler's-worth study compete with (system/scheduler/heuristics.py)."""

from __future__ import annotations

import numpy as np
import pytest

from system.cases import get_case
from system.config_search import paper_config, paper_pp, search_ours
from system.scheduler.heuristics import HEURISTICS, heuristic_assignment
from system.simulator.sharing import with_link_sharing
from system.workload import MODELS, Workload

BUDGET = {"trials": 2, "population": 4, "time_limit_s": 1.0}


def test_paper_shape():
    assert paper_pp(64) == 8 and paper_pp(8) == 2 and paper_pp(48) == 6
    c = paper_config(64)
    assert (c.pp, c.dp, c.micro_batch_size, c.recompute, c.schedule) == (8, 8, 1, "full", "gpipe")
    assert c.runtime_supported


@pytest.mark.parametrize("sharing", ["pair", "nic"])
@pytest.mark.parametrize("layers,batch", [(4, 16), (8, 64)])
def test_joint_search_is_never_worse_than_the_fixed_shape(sharing, layers, batch):
    c = with_link_sharing(get_case("debug"), sharing)
    w = Workload(model=MODELS["gpt3_xl"].with_layers(layers), global_batch_size=batch)
    found = search_ours(c, w, budget=BUDGET)
    assert found.paper.status == "ok" and found.best.status == "ok"
    assert found.best.iter_time_s <= found.paper.iter_time_s + 1e-12
    assert found.best_supported.iter_time_s <= found.paper.iter_time_s + 1e-12
    assert found.best.iter_time_s <= found.best_supported.iter_time_s + 1e-12
    # the paper's configuration is labelled as such; every result records its configuration
    p = found.paper.config
    assert (p["pp"], p["micro_batch_size"], p["recompute"], p["schedule"], p["layout"]) == (
        2,
        1,
        "full",
        "gpipe",
        "scheduled",
    )
    for r in found.results:
        assert {"pp", "dp", "micro_batch_size", "recompute", "schedule", "layout"} <= set(r.config)
    ok = [r.iter_time_s for r in found.results if r.status == "ok"]
    assert found.best.iter_time_s == pytest.approx(min(ok))


def test_heuristic_layouts_on_case5():
    c = get_case("5")  # 8 regions x 8 devices, regions listed in blocks of 8
    one = heuristic_assignment(c, 8, 8, "one_pipeline_per_region")
    region = np.asarray(c.region_of)
    assert all(len(set(region[one.pipeline(r)])) == 1 for r in range(8))  # a pipeline per region
    assert all(len(set(region[one.group(s)])) == 8 for s in range(8))  # DP groups span them
    greedy = heuristic_assignment(c, 8, 8, "greedy_region_fill")
    assert all(len(set(region[greedy.pipeline(r)])) == 1 for r in range(8))
    assert heuristic_assignment(c, 8, 8, "launch_order").stages.tolist() == (
        np.arange(64).reshape(8, 8).tolist()
    )
    a, b = (heuristic_assignment(c, 8, 8, "random", rng=1) for _ in range(2))
    assert np.array_equal(a.stages, b.stages)  # seeded


def test_heuristics_on_uneven_regions():
    c = get_case("5").subset([d for d in range(64) if d not in (0, 1, 9, 17, 30, 44, 50, 63)])
    assert heuristic_assignment(c, 8, 7, "one_pipeline_per_region") is None  # 6-device regions
    g = heuristic_assignment(c, 8, 7, "greedy_region_fill")
    assert sorted(g.stages.ravel().tolist()) == list(range(56))
    with pytest.raises(ValueError, match="unknown heuristic"):
        heuristic_assignment(c, 8, 7, "alphabetical")
    assert set(HEURISTICS) == {
        "one_pipeline_per_region",
        "greedy_region_fill",
        "launch_order",
        "random",
    }


def test_dominance_pruning_keeps_the_best_of_a_layout():
    # on one layout, the pruned grid's best equals the best of every (mbs, rc, schedule)
    from system.config_search import OursConfig, _grid, _simulate
    from system.simulator import V100

    c = with_link_sharing(get_case("debug"), "pair")
    w = Workload(model=MODELS["gpt3_xl"].with_layers(8), global_batch_size=64)
    layout = heuristic_assignment(c, 2, 4, "one_pipeline_per_region")
    space = ((1, 2, 4, 8), ("none", "selective", "full"), ("gpipe", "1f1b"))
    got, _ = _grid(
        w,
        2,
        4,
        "x",
        lambda cfg: _simulate(c, w, cfg, layout, V100, True),
        hardware=V100,
        best_s=np.inf,
        space=space,
    )
    every = [
        _simulate(c, w, OursConfig(2, 4, mbs, rc, sch, "x"), layout, V100, True)
        for mbs in space[0]
        for rc in space[1]
        for sch in space[2]
    ]
    best = min(r.iter_time_s for r in every if r.status == "ok")
    assert min(r.iter_time_s for r in got if r.status == "ok") == pytest.approx(best)
    assert len(got) < len(every)


@pytest.mark.parametrize("layers,batch", [(4, 16), (8, 64)])
@pytest.mark.parametrize("sharing", ["pair", "nic"])
def test_every_runnable_result_is_accepted_by_the_runtime_spec(layers, batch, sharing):
    # under configs="runnable" every configuration the search can return (every one it
    # simulated, its best among them) builds a RunSpec the runtime validates
    from system.config_search import OursConfig, runtime_spec

    c = with_link_sharing(get_case("debug"), sharing)
    w = Workload(model=MODELS["gpt3_xl"].with_layers(layers), global_batch_size=batch)
    found = search_ours(c, w, budget=BUDGET, configs="runnable")
    assert found.results and found.best in found.results
    for r in found.results:
        k = r.config
        cfg = OursConfig(k["pp"], k["dp"], k["micro_batch_size"], k["recompute"], k["schedule"])
        rounds = r.breakdown["rounds"]  # the accumulation passes memory needs
        spec = runtime_spec(cfg, w, r.breakdown["layout_table"], rounds=rounds)
        assert spec.rounds == rounds
        assert spec.checkpointing == (k["recompute"] == "full") and k["runtime_supported"]
        shape = (spec.pp, spec.dp, spec.micro_batch_size)
        assert shape == (k["pp"], k["dp"], k["micro_batch_size"])
    assert found.best is found.best_supported


def test_runtime_spec_refuses_what_the_runtime_cannot_run():
    from system.config_search import OursConfig, runtime_spec

    w = Workload(model=MODELS["gpt3_xl"].with_layers(8), global_batch_size=64)
    runtime_spec(OursConfig(2, 4, 2, "none", "gpipe"), w)  # runnable: no error
    with pytest.raises(ValueError, match="schedule"):
        runtime_spec(OursConfig(2, 4, 2, "full", "1f1b"), w)
    with pytest.raises(ValueError, match="recomputation"):
        runtime_spec(OursConfig(2, 4, 2, "selective", "gpipe"), w)
    with pytest.raises(ValueError, match="layers"):
        runtime_spec(OursConfig(3, 4, 2, "full", "gpipe"), w)  # 8 layers over 3 stages


def test_all_configs_is_the_design_space_variant():
    # "all" may pick what the runtime cannot run; it is never slower than "runnable"
    c = with_link_sharing(get_case("debug"), "pair")
    w = Workload(model=MODELS["gpt3_xl"].with_layers(8), global_batch_size=64)
    every = search_ours(c, w, budget=BUDGET, configs="all")
    runnable = search_ours(c, w, budget=BUDGET, configs="runnable")
    assert every.best.iter_time_s <= runnable.best.iter_time_s + 1e-12
    assert any(not r.config["runtime_supported"] for r in every.results)
    assert all(r.config["runtime_supported"] for r in runnable.results)
    with pytest.raises(ValueError, match="configs"):
        search_ours(c, w, budget=BUDGET, configs="some")
