"""The baselines' DP collective request (auto | fastest | ring | tree | two_level): what runs, what
rows record, and the rank-map search's ranking by it (baseline_training.py, placement.py,
perf.py)."""

from __future__ import annotations

import numpy as np
import pytest

from baselines.deepspeed.perf import simulate_deepspeed
from baselines.megatron.perf import simulate_megatron
from baselines.placement import candidate_maps, proxy_cost_s
from baselines.space import BaselineConfig
from system.cases import get_case
from system.simulator.collectives import allreduce_end_s, nccl_tuned_end_s
from system.simulator.nccl_tuner import system_for_group, tune_allreduce
from system.simulator.transfers import NCCL
from system.workload import MODELS, Workload, get_model

CASE5 = get_case("5")
GPT = Workload(model=get_model("gpt3_xl", 8), global_batch_size=64)
MEGATRON = BaselineConfig(system="megatron", tp=1, pp=8, dp=8, micro_batch_size=1)


def _megatron(request: str):
    return simulate_megatron(CASE5, GPT, MEGATRON, dp_collective=request)


def test_auto_runs_nccl_s_pick_and_records_it():
    res = _megatron("auto")
    b = res.breakdown
    assert b["dp_collective_request"] == "auto"
    # launch order: stage s's DP group is devices 8s..8s+7, one region; NCCL sees one GPU per
    # host and the region's links as its NIC
    grads = 4.0 * 1e9  # at least a stage's fp16 gradients are ~100s of MB: the ring
    pick = tune_allreduce(system_for_group(CASE5, range(8)), grads)
    assert pick.algorithm == "ring"
    assert b["dp_collective"] == "ring" and b["dp_nccl_choice"].startswith("ring/")
    forced = _megatron("ring")
    assert forced.breakdown["dp_nccl_choice"] is None
    assert forced.breakdown["dp_collective_request"] == "ring"
    assert b["dp_sync_s"] == pytest.approx(forced.breakdown["dp_sync_s"])  # the same one ran
    # NCCL_ALGO=Ring also holds for the 4-byte gradient-norm all-reduce over the 8 stages (8
    # regions), where NCCL itself takes the tree: forcing the ring costs there
    assert (b["grad_norm_algo"], forced.breakdown["grad_norm_algo"]) == ("tree", "ring")
    assert forced.breakdown["grad_norm_s"] > b["grad_norm_s"]


def test_fastest_is_the_link_model_s_best_and_best_is_its_old_name():
    times = {r: _megatron(r).iter_time_s for r in ("ring", "tree", "fastest")}
    assert times["fastest"] <= min(times["ring"], times["tree"]) + 1e-9
    old = _megatron("best")
    assert old.breakdown["dp_collective_request"] == "fastest"
    assert old.iter_time_s == pytest.approx(times["fastest"])


def test_two_level_where_the_map_allows_none_runs_nccl_s_pick():
    res = _megatron("two_level")  # each DP group inside one region: no blocks across regions
    assert res.breakdown["dp_collective_request"] == "two_level"
    assert res.breakdown["dp_collective"] == "ring"
    assert res.iter_time_s == pytest.approx(_megatron("auto").iter_time_s)


def test_deepspeed_zero1_auto_runs_its_reduce_scatter_and_records_nccl_s_pick():
    cfg = BaselineConfig(system="deepspeed", tp=1, pp=8, dp=8, micro_batch_size=1, zero=1)
    auto = simulate_deepspeed(CASE5, GPT, cfg)
    assert auto.breakdown["dp_collective"] == "ring"
    assert auto.breakdown["dp_nccl_choice"].split("/")[0] in ("ring", "pat")
    tree = simulate_deepspeed(CASE5, GPT, cfg, dp_collective="tree")
    assert tree.breakdown["dp_collective"] == "tree+allgather"


def test_tuned_groups_run_their_own_picks():
    # 4 B per group over 3 hosts: NCCL takes the tree (latency), and the simulation is the
    # tree's; 1 GB over the same hosts: the ring
    c = get_case("5")
    groups = [[0, 8, 16]]
    small, ran, tuned = nccl_tuned_end_s(c, groups, 4.0, np.zeros((1, 3)))
    assert ran == ["tree"] and tuned[0].startswith("tree/")
    tree, _ = allreduce_end_s(c, groups, 4.0, np.zeros((1, 3)), "tree")
    assert np.allclose(small, tree)
    _, ran, _ = nccl_tuned_end_s(c, groups, 1e9, np.zeros((1, 3)))
    assert ran == ["ring"]


def test_rank_map_ranking_uses_the_row_s_collective():
    w = Workload(model=MODELS["gpt3_xl"], global_batch_size=1024)
    cfg = BaselineConfig(system="megatron", tp=1, pp=4, dp=16, micro_batch_size=1)
    cands = candidate_maps(CASE5, w, cfg)
    ring = [proxy_cost_s(CASE5, w, cfg, c.devices, dp_collective="ring") for c in cands]
    tree = [proxy_cost_s(CASE5, w, cfg, c.devices, dp_collective="tree") for c in cands]
    auto = [proxy_cost_s(CASE5, w, cfg, c.devices, dp_collective="auto") for c in cands]
    assert ring != tree  # the tree's cost is its own, not the ring's
    # the DP part of the cost is the forced collective's time from a common start
    grid = np.asarray(cands[0].devices).reshape(4, 16, 1)
    rings = grid.transpose(0, 2, 1).reshape(-1, 16)
    from system.workload import stage_gradient_params

    grads = np.asarray(stage_gradient_params(w.model, 4)) * w.gradient_bytes
    zero = np.zeros(rings.shape)
    t_ring = allreduce_end_s(CASE5, rings, grads, zero, "ring")[0].max()
    t_tree = allreduce_end_s(CASE5, rings, grads, zero, "tree")[0].max()
    assert tree[0] - ring[0] == pytest.approx(t_tree - t_ring)
    # auto ranks by NCCL's picks: the ring for these gradient sizes on one GPU per host
    assert auto == pytest.approx(ring)
    assert proxy_cost_s(CASE5, w, cfg, cands[0].devices, transport=NCCL) == auto[0]
