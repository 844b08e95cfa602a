"""The framework model on hand-made plans, checked against hand computations."""

from __future__ import annotations

import numpy as np
import pytest

import baselines.deepspeed.schedule  # noqa: F401  (registers the "deepspeed" op order)
from system.external.sailor.framework import predict_plan
from system.external.sailor.plan import load_plan
from system.external.sailor.predict import load_inputs, predict_plans
from tests.external._tiny import plan, write_data, write_plan


def _predict(tmp_path, stages, dp, dp_collective="auto", **kw):
    write_data(tmp_path)
    path = write_plan(tmp_path, "clariden/OPT-350/N1/plan_config_x.json", plan(stages, dp, **kw))
    inputs = load_inputs(tmp_path)
    return predict_plan(load_plan(path, "OPT-350", 4), inputs, dp_collective=dp_collective)


def test_two_stage_one_micro_batch_by_hand(tmp_path):
    # Stages [0,1] and [2,3], one replica, mbs 1, gbs 1: m = 1. Per stage: F0 = 0.01 + 0.1 =
    # 0.11, B0 = 0 + 0.2 = 0.2; F1 = 0.1 + 0.05 = 0.15, B1 = 0.2 + 0.1 = 0.3.
    # Boundary message: act_output 1e6 elements x 4 B (fp32) / tp 1 = 4e6 B at the flat 1 GB/s
    # fit -> 0.004 s, plus the meta tensor, charged at the fit's floor size 2^16 B -> 65.536 us:
    # link busy 0.0040655 s. 4 MiB of receive buffer >= 4e6 B, so the send returns after the
    # meta part (65.5 us); the receiver posted its receive at t = 0 (its program starts with it).
    # DeepSpeed order: stage 0 F at [0, 0.11], its send of act 0 leaves at 0.11 and lands at
    # 0.1140655; stage 1 F to 0.2640655, B to 0.5640655, sends the gradient, which lands at
    # 0.5681310; stage 0 B to 0.7681310 = the pipeline. Untied head, dp 1: no tied or DP part.
    # Optimizer: profiled model = layer 0 + 2 x layer 1 + layer 3 = 100e6 + 20e6 + 100e6 =
    # 220e6 parameters took 0.004 s; each stage has 110e6 -> 0.002 s.
    # dp 1: no all-reduce to speak of, but DeepSpeed still flattens each stage's 110e6 fp32
    # gradients (440e6 B) and copies them back: 4 x 440e6 B at the GH200's 4 TB/s = 0.00044 s,
    # which is also rank 0's logged reduction.
    # Iteration: 0.7681310 + 0.00044 + 0.002 = 0.7705710.
    p = _predict(tmp_path, [[0, 1], [2, 3]], 1)
    assert p.micro_batches == 1
    assert p.pipeline_s == pytest.approx(0.7681310, abs=1e-6)
    assert p.tied_s == 0 and p.dp_s == pytest.approx(0.00044)
    assert p.dp_algorithm == "none"
    assert p.red_grads_s == pytest.approx(0.00044) and p.red_grads_wait_s == 0
    assert p.optimizer_s == pytest.approx(0.002)
    assert p.iter_time_s == pytest.approx(0.7705710, abs=1e-6)


def test_one_stage_two_replicas_by_hand(tmp_path):
    # One stage of all 4 layers, dp 2, mbs 1, gbs 4: m = 4 / (1 x 2) = 2 micro-batches of
    # F = 0.26, B = 0.5 -> pipeline 2 x 0.76 = 1.52. Data parallel: 220e6 fp32 gradients =
    # 880e6 B in one bucket (< 5e8 elements); NCCL ring of 2 ranks: 2 steps of 440e6 B at
    # 1 GB/s = 0.88 s, plus the bucket's flatten + unflatten copies, 4 x 880e6 B at the GH200's
    # 4 TB/s = 0.00088 s. Optimizer: 220e6 / 220e6 x 0.004 = 0.004.
    # Iteration: 1.52 + 0.88088 + 0.004 = 2.40488.
    p = _predict(tmp_path, [[0, 1, 2, 3]], 2, gbs=4)
    assert p.micro_batches == 2
    assert p.pipeline_s == pytest.approx(1.52)
    assert p.dp_s == pytest.approx(0.88088)
    assert p.dp_algorithm == "ring"
    assert p.red_grads_s == pytest.approx(0.88088) and p.red_grads_wait_s == 0
    assert p.iter_time_s == pytest.approx(2.40488)
    # memory: 16 B x 220e6 + max(activations 1 x 1 x 8e6 x 4 B, bucket 880e6 B) + 1 GiB
    assert p.peak_memory_bytes == pytest.approx(16 * 220e6 + 880e6 + 2**30)


def test_predict_plans_rows_and_excluded_plan(tmp_path):
    write_data(tmp_path)
    write_plan(
        tmp_path, "clariden/OPT-350/N2/plan_config_N2_D1.json", plan([[0, 1], [2, 3]], 1, real=0.8)
    )
    write_plan(tmp_path, "clariden/OPT-350/N1/plan_config_bad.json", plan([[0, 1, 2]], 1))
    rows = predict_plans(tmp_path / "plans")
    assert [r.plan for r in rows] == [
        "clariden/OPT-350/N1/plan_config_bad.json",
        "clariden/OPT-350/N2/plan_config_N2_D1.json",
    ]
    bad, good = rows
    assert bad.prediction is None and "does not match the model's 4 layers" in bad.excluded
    assert good.set == "clariden/OPT-350" and good.real_s == 0.8
    assert good.prediction.iter_time_s == pytest.approx(0.7705710, abs=1e-6)


def test_layer_rates_by_hand(tmp_path):
    from repro.studies.external.precision import efficiency_by_micro_batch, layer_rates

    # tiny model: s 128, h 64 -> one layer forward 24·128·64² + 4·128²·64 = 16,777,216 FLOPs;
    # profiled transformer layers: fwd 0.1 s, bwd 0.2 s -> 3 x 16.78e6 / 0.3 = 1.6777e8 FLOP/s
    write_data(tmp_path)
    r = layer_rates(load_inputs(tmp_path), gpu="GH-96", project_gpu="GH200")
    assert len(r) == 1
    assert r["tflops_per_gpu"].iloc[0] == pytest.approx(1.6777216e-4)
    assert r["fraction_of_fp32_peak"].iloc[0] == pytest.approx(1.6777216e8 / 67e12)
    e = efficiency_by_micro_batch(r)
    assert e["relative_to_mbs1"].tolist() == [1.0]


def test_rank_zero_reduction_is_stage_zero_s_all_reduce(tmp_path):
    # Stages [0] and [1, 2, 3], dp 2, mbs 1, gbs 2: m = 1. Stage 0 holds 100e6 parameters
    # (400e6 B fp32), stage 1 120e6 (480e6 B). Ring of 2 ranks at the flat 1 GB/s: 2 steps of
    # S/2 -> S / 1e9 s; copies 4 x S at 4 TB/s. Stage 0: 0.4 + 0.0004 = 0.4004 s (rank 0's
    # logged reduction; its peers leave the barrier with it: no wait); stage 1: 0.48 + 0.00048
    # = 0.48048 s, the iteration's data-parallel part (the slowest stage).
    p = _predict(tmp_path, [[0], [1, 2, 3]], 2, gbs=2)
    assert p.dp_s == pytest.approx(0.48048)
    assert p.red_grads_s == pytest.approx(0.4004)
    assert p.red_grads_collective_s == pytest.approx(0.4004) and p.red_grads_wait_s == 0
    # identical replicas: without the barrier rank 0 would not wait either
    assert p.red_grads_no_barrier_s == pytest.approx(0.4004)


@pytest.mark.parametrize("how", ["ring", "tree", "fastest"])
def test_forced_collectives_are_recorded(tmp_path, how):
    # two ranks: a tree of two is the ring, so every choice times the same 0.88088 s
    p = _predict(tmp_path, [[0, 1, 2, 3]], 2, gbs=4, dp_collective=how)
    assert p.dp_collective == how and p.dp_algorithm == "ring"
    assert p.dp_s == pytest.approx(0.88088)


def test_unknown_collective_is_one_clear_error(tmp_path):
    with pytest.raises(ValueError, match="dp_collective must be one of auto, fastest, ring, tree"):
        _predict(tmp_path, [[0, 1, 2, 3]], 2, gbs=4, dp_collective="oracle")


def test_auto_runs_what_nccl_s_tuner_picks(tmp_path):
    # dp 3, one GPU per node on 1 GB/s (8 Gbit/s) links, 880e6 B of gradients: NCCL's tuner
    # picks the ring (one GPU per node on a slow NIC: the ring from 1 MiB); the fastest on the
    # link model is the tree (each rank sends to parent and children at the full pair rate)
    from system.external.sailor.bandwidth import cluster_from_nodes
    from system.simulator.nccl_tuner import system_for_group, tune_allreduce

    auto = _predict(tmp_path, [[0, 1, 2, 3]], 3, gbs=3)
    fastest = _predict(tmp_path, [[0, 1, 2, 3]], 3, gbs=3, dp_collective="fastest")
    assert auto.dp_algorithm == "ring" and fastest.dp_algorithm == "tree"
    assert fastest.dp_s < auto.dp_s
    inputs = load_inputs(tmp_path)
    path = tmp_path / "plans" / "clariden/OPT-350/N1/plan_config_x.json"
    p = load_plan(path, "OPT-350", 4)
    cluster = cluster_from_nodes(p.nodes(), inputs.fits, inputs.intra)
    assert tune_allreduce(system_for_group(cluster, [0, 1, 2]), 880e6).algorithm == "ring"


def _committed_plan(rel: str, model: str):
    """(inputs, plan): ours' committed ``framework=sailor`` plan ``rel`` (under
    ``results/planner/sailor/ours_sailor_plans``) on Sailor's shared data; skips without it."""
    from pathlib import Path

    from tests.external.test_sailor_importers import SHARED

    if not SHARED.is_dir():
        pytest.skip("Sailor's shared data is not present")
    root = Path(__file__).resolve().parents[2] / "results/planner/sailor/ours_sailor_plans"
    inputs = load_inputs(SHARED)
    plan = load_plan(root / rel, model, inputs.shapes[model].num_all_layers, mixed_tp=True)
    return inputs, plan


def _flat_and_capped(plan, inputs):
    """The plan's cluster as built from Sailor's fits, and the same with 50 Gbit/s host NICs
    (the per-replica path of the batched timings)."""
    import dataclasses

    from system.external.sailor.bandwidth import cluster_from_nodes

    flat = cluster_from_nodes(plan.nodes(), inputs.fits, inputs.intra)
    return flat, dataclasses.replace(flat, host_nic_gbps=tuple([50.0] * flat.num_hosts))


def test_boundary_sends_timed_together_equal_one_replica_at_a_time():
    # a two-stage plan of 64 tp-4 replicas over four zones (ours' geo OPT-350 point 2): the
    # one call for every replica's flows gives each replica's own call's times, and so does
    # the per-replica path that a cluster with host NIC caps takes
    from system.external.sailor import framework
    from system.simulator.transfers import flow_time_s

    inputs, plan = _committed_plan("geo/OPT-350/plan_config_geo_p2.json", "OPT-350")
    flat, capped = _flat_and_capped(plan, inputs)
    tp = plan.stages[0].replicas[0].tp
    full = inputs.sizes.get(plan.model, tp).act_output[plan.stages[0].layers[-1]] * plan.mbs * 4
    part = full / tp
    for cluster in (flat, capped):
        devs = framework._ranges(plan, cluster)
        busy, buffer, _ = framework._p2p(plan, inputs, cluster, devs, 0)
        assert busy.shape == buffer.shape == (plan.dp,)
        for r in range(plan.dp):
            src, dst = devs[0][r], devs[1][r]
            data = flow_time_s(cluster, src, dst, part).max()
            meta = flow_time_s(cluster, src, dst, framework.META_BYTES).max()
            assert busy[r] == float(data + meta)
            assert buffer[r] == float(data * min(framework.RECV_BUFFER_BYTES / part, 1.0))
    assert plan.dp == 64 and len({r.zone for r in plan.stages[0].replicas}) > 1


def test_gathers_and_tied_grads_timed_together_equal_one_replica_at_a_time():
    # ours' het GPT-Neo point 1 plan: tp 4 -> tp 2 at one boundary (every part sent, the
    # receiver's all-gather over the parts) and a tied head; the receivers' all-gathers and
    # the replicas' tied-gradient all-reduces timed in one call give each replica's own
    # call's times, and so does the per-replica path a cluster with host NIC caps takes
    from system.external.sailor import framework
    from system.simulator.collectives import ring_collective_s

    model = "GPT-Neo-2.7"
    inputs, plan = _committed_plan("het/GPT-NEO/plan_config_het_p1.json", model)
    flat, capped = _flat_and_capped(plan, inputs)
    narrowing = [
        s
        for s in range(plan.pp - 1)
        if plan.stages[s].replicas[0].tp > plan.stages[s + 1].replicas[0].tp > 1
    ]
    assert narrowing, "the plan no longer narrows its TP groups: pick another"
    shape = inputs.shapes[model]
    assert framework.head_is_tied(inputs.sizes.get(model, 1), shape)
    rng = np.random.default_rng(0)
    ends = rng.uniform(1.0, 2.0, size=(plan.pp, plan.dp))
    for cluster in (flat, capped):
        devs = framework._ranges(plan, cluster)
        s = narrowing[0]
        _, _, gather = framework._p2p(plan, inputs, cluster, devs, s)
        last = plan.stages[s].layers[-1]
        for r in range(plan.dp):
            tp = plan.stages[s].replicas[r].tp
            full = inputs.sizes.get(model, tp).act_output[last] * plan.mbs * 4
            dst = devs[s + 1][r][np.arange(tp) % devs[s + 1][r].size]
            alone = ring_collective_s(cluster, [dst], full, kind="allgather")[0]
            assert gather[r] == alone
        tied = framework._tied_grads_end_s(plan, inputs, cluster, devs, ends, "auto")
        for r in range(plan.dp):
            a, b = devs[0][r], devs[-1][r]
            k = min(a.size, b.size)
            tp = plan.stages[0].replicas[r].tp
            words = inputs.sizes.get(model, tp).params[0] / shape.hidden_size - shape.seq_length
            groups = np.stack([a[:k], b[:k]], axis=1)
            entry = np.tile([ends[0, r], ends[-1, r]], (k, 1))
            done, _ = framework._allreduce_end_s(
                cluster, groups, words * shape.hidden_size * 4, entry, "auto"
            )
            assert tied[r] == float(done.max())


def test_a_plan_s_cluster_is_kept_for_the_same_nodes_and_inputs():
    from system.cluster import fingerprint
    from system.external.sailor import framework
    from system.external.sailor.bandwidth import cluster_from_nodes
    from tests.external.test_sailor_importers import SHARED

    inputs, plan = _committed_plan("geo/OPT-350/plan_config_geo_p2.json", "OPT-350")
    first = framework.plan_cluster(plan, inputs)
    assert framework.plan_cluster(plan, inputs) is first
    assert fingerprint(first) == fingerprint(
        cluster_from_nodes(plan.nodes(), inputs.fits, inputs.intra)
    )
    other = load_inputs(SHARED)  # the same data read again: another inputs, another cluster
    assert framework.plan_cluster(plan, other) is not first


# four of ours' committed plans (geo and het, both models, under ``ours_sailor_plans``)
FOUR_COMMITTED_PLANS = [
    ("geo/OPT-350/plan_config_geo_p2.json", "OPT-350"),
    ("geo/GPT-NEO/plan_config_geo_p1.json", "GPT-Neo-2.7"),
    ("het/GPT-NEO/plan_config_het_p1.json", "GPT-Neo-2.7"),
    ("het/OPT-350/plan_config_het_p0.json", "OPT-350"),
]


@pytest.mark.parametrize("rel,model", FOUR_COMMITTED_PLANS)
def test_a_stage_s_all_reduce_on_its_own_nodes_equals_it_on_the_plan_s_cluster(rel, model):
    # each stage's all-reduce is timed on the cluster of its own nodes and kept per stage: the
    # same floats as on the whole plan's cluster, under every collective, as the plan's maximum
    from system.external.sailor import framework

    inputs, plan = _committed_plan(rel, model)
    whole = framework.plan_cluster(plan, inputs)
    devs = framework._ranges(plan, whole)
    assert plan.pp > 1 or plan.dp > 1
    for collective in ("auto", "ring", "tree", "fastest"):
        framework._DATA_PARALLEL.clear()
        per_stage = [
            framework._data_parallel_s(plan, inputs, whole, devs, s, collective)
            for s in range(plan.pp)
        ]
        seconds, algos, rank0 = framework._data_parallel_kept(plan, inputs, collective)
        assert seconds == max(x[0] for x in per_stage)
        assert rank0 == per_stage[0][2]
        used = sorted({a for x in per_stage for a in x[1]})
        assert algos == ("+".join(used) or "none")
        keys = [framework._data_parallel_key(plan, inputs, s, collective) for s in range(plan.pp)]
        assert len(framework._DATA_PARALLEL) == len(set(keys))
        for s in range(plan.pp):  # each stage kept with its own numbers
            kept = framework._DATA_PARALLEL[keys[s]][1]
            assert kept[0] == per_stage[s][0] and kept[2] == per_stage[s][2]


@pytest.mark.parametrize("rel,model", FOUR_COMMITTED_PLANS)
def test_the_all_reduce_bound_without_a_cluster_is_below_its_timing(rel, model):
    # what NCCL detects of a stage's group, read off its nodes, equals what it detects on the
    # stage's cluster; the bound built without that cluster is below the all-reduce's timing
    # under every collective (none under fastest), and reads the kept timing where there is one
    from system.external.sailor import framework
    from system.simulator.nccl_tuner import system_for_group

    inputs, plan = _committed_plan(rel, model)
    for stage in plan.stages:
        cluster, devs = framework._stage_devices(stage, plan, inputs)
        group = [int(d[0]) for d in devs[0]]
        nodes = [rep.node for rep in stage.replicas]
        assert framework._stage_nccl_system(nodes, inputs) == system_for_group(cluster, group)
    for collective in ("auto", "ring", "tree", "fastest"):
        framework._DATA_PARALLEL.clear()
        framework._DATA_PARALLEL_FLOORS.clear()
        cheap = framework._data_parallel_floor_s(plan, inputs, collective)
        seconds = framework._data_parallel_kept(plan, inputs, collective)[0]
        if collective == "fastest" or (collective == "tree" and plan.dp > 2):
            assert cheap is None
            continue
        assert 0.0 < cheap <= seconds
        if collective == "ring":  # the ring's steps read off the fits: close to its timing
            assert cheap >= 0.5 * seconds
        assert framework._data_parallel_floor_s(plan, inputs, collective) == seconds  # kept
