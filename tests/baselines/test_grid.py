"""Baseline spec checks, metrics and grid bookkeeping (no torch processes; the launcher:
tests/multihost/test_launch.py)."""

from __future__ import annotations

import json
import sys

import pytest

from baselines.grid import (
    BaselineSpec,
    best_point,
    check_spec,
    grid_points,
    local_cluster,
    metrics_from,
    run_grid,
    run_point,
)


def test_import_is_light():
    import subprocess

    code = (
        "import baselines.grid, baselines.megatron, baselines.deepspeed, sys; "
        "print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "False", out.stderr


def test_spec_json_round_trip():
    spec = BaselineSpec(system="deepspeed", pp=2, dp=2, zero=1, iters=4, seed=3)
    assert BaselineSpec.from_json(spec.to_json()) == spec
    with pytest.raises(ValueError, match="unknown keys"):
        BaselineSpec.from_json(json.dumps({"system": "megatron", "bogus": 1}))


@pytest.mark.parametrize(
    "kw, match",
    [
        (dict(system="jax"), "system"),
        (dict(system="megatron", pp=3), "num_layers=4 is not divisible"),
        (dict(system="megatron", tp=3), "tp=3"),
        (dict(system="megatron", dp=3), "global_batch_size=8"),
        (dict(system="deepspeed", zero=None), "zero in 0..3"),
        (dict(system="deepspeed", zero=3, pp=2), "ZeRO stage 0 or 1"),
        (dict(system="deepspeed", zero=1, tp=2), "tp=1"),
        (dict(system="megatron", device="tpu"), "device"),
        (dict(system="megatron", start="now"), "start 'now' is not one of"),
        (dict(system="megatron", start="clock", start_margin_s=0.0), "start_margin_s"),
        (dict(system="megatron", dp_collective="tree+allgather"), "dp_collective must be one"),
        (dict(system="megatron", dp_collective="tree"), "needs device=cuda"),
        (dict(system="megatron", dp=4, global_batch_size=8, dp_collective="two_level"), "cuda"),
        (
            dict(system="megatron", dp=2, device="cuda", dp_collective="two_level"),
            "dist_opt_instances",
        ),
        (dict(system="megatron", dist_opt_instances=2), "two_level only"),
        (dict(system="deepspeed", zero=3, dp_collective="two_level"), "dp_collective must be"),
        (
            dict(system="deepspeed", zero=3, device="cuda", dp_collective="tree+allgather"),
            "ZeRO-1/2",
        ),
    ],
)
def test_check_spec_rejects(kw, match):
    with pytest.raises(ValueError, match=match):
        check_spec(BaselineSpec(**kw))


@pytest.mark.slow
def test_dp_collective_reaches_nccl_deepspeed_and_the_prediction():
    from baselines.deepspeed.train import ds_config
    from baselines.grid import predict_iter_time_s
    from baselines.spec import nccl_algo
    from system.cases import get_case

    tree = BaselineSpec(system="megatron", dp=2, device="cuda", dp_collective="tree")
    check_spec(tree)
    assert nccl_algo(tree) == "Tree"
    assert nccl_algo(BaselineSpec(system="megatron")) is None  # auto: NCCL's own choice
    forced = BaselineSpec(system="megatron", dp_collective="ring")
    check_spec(forced)  # a forced ring runs on CPU too (gloo's ring)
    assert nccl_algo(forced) == "Ring"
    two = BaselineSpec(
        system="megatron",
        dp=4,
        global_batch_size=8,
        device="cuda",
        dp_collective="two_level",
        dist_opt_instances=2,
    )
    check_spec(two)
    ds = BaselineSpec(
        system="deepspeed", zero=1, dp=2, device="cuda", dp_collective="tree+allgather"
    )
    check_spec(ds)
    assert ds_config(ds)["zero_optimization"]["reduce_scatter"] is False
    assert (
        "reduce_scatter"
        not in ds_config(BaselineSpec(system="deepspeed", zero=1))["zero_optimization"]
    )
    # the prediction follows the spec's collective: two regions, the tree and the ring differ
    c = get_case("debug").subset([0, 2, 4, 6])
    ring = predict_iter_time_s(
        BaselineSpec(system="megatron", dp=4, global_batch_size=8, dp_collective="ring"), c
    )
    via_tree = predict_iter_time_s(
        BaselineSpec(
            system="megatron", dp=4, global_batch_size=8, device="cuda", dp_collective="tree"
        ),
        c,
    )
    assert ring is not None and via_tree is not None and ring != via_tree


def test_invalid_point_is_a_row_not_a_process(tmp_path):
    res = run_point(BaselineSpec(system="deepspeed", zero=3, pp=2, dp=2), work_dir=tmp_path)
    assert res["status"] == "invalid" and "ZeRO" in res["error"]
    assert not (tmp_path / "rank0.log").exists()


def test_metrics_use_steady_iterations():
    spec = BaselineSpec(system="megatron", global_batch_size=8)
    m = metrics_from(spec, [6.0, 5.0, 4.0], [9.0, 1.0, 3.0])
    assert m["iter_time_s"] == 2.0  # median of the iterations after the first
    w = spec.workload()
    assert m["tokens_per_s"] == pytest.approx(w.tokens_per_iteration / 2.0)
    assert m["tflops"] == pytest.approx(w.model_flops(recompute=True) / 2.0 / 1e12)
    assert (m["loss_first"], m["loss_last"]) == (6.0, 4.0)


def test_grid_keeps_infeasible_points():
    base = BaselineSpec(system="deepspeed")
    points = grid_points(
        "deepspeed", local_cluster(4), base.workload(), base=base, micro_batch_sizes=(1, 2)
    )
    shapes = {(s.tp, s.pp, s.dp, s.micro_batch_size, s.zero): r for s, r in points}
    assert shapes[(1, 1, 4, 1, 3)] is None and shapes[(1, 2, 2, 2, 1)] is None
    assert "tp=1" in shapes[(2, 1, 2, 1, 3)]  # recorded, with the reason
    calls = []

    def fake_run(spec, **kw):
        calls.append(spec)
        return {"status": "ok", "iter_time_s": 1.0 / spec.dp + 0.01 * spec.micro_batch_size}

    results = run_grid(points, run=fake_run)
    assert len(results) == len(points)
    assert len(calls) == sum(r is None for _, r in points)
    assert {r["status"] for _, r in results} == {"ok", "invalid"}
    best, _ = best_point(results)
    assert (best.dp, best.micro_batch_size) == (4, 1)


def test_grid_memory_limit_marks_oom():
    base = BaselineSpec(system="megatron")
    points = grid_points(
        "megatron",
        local_cluster(2),
        base.workload(),
        base=base,
        micro_batch_sizes=(1,),
        memory_limit_bytes=1.0,
    )
    runnable = [r for _, r in points if r is not None and r.startswith("oom")]
    assert runnable and all(r is not None for _, r in points)
    assert {st["status"] for _, st in run_grid(points, run=None)} <= {"oom", "invalid"}


def test_emulation_kwargs_per_rank():
    from baselines.grid import emulation_kwargs

    class FakeEmu:
        class plan:  # noqa: N801 - mimics Emulation.plan
            num_devices = 2

            @staticmethod
            def ip(i):
                return f"198.18.0.{i + 1}"

        master_addr = "198.18.0.1"

        def exec_prefix(self, i):
            return ["ip", "netns", "exec", f"dtfm-x-d{i}"]

        def rank_env(self, i):
            return {"GLOO_SOCKET_IFNAME": "eth0"}

    kw = emulation_kwargs(FakeEmu())
    assert kw["rank_prefix"][1] == ["ip", "netns", "exec", "dtfm-x-d1"]
    assert kw["rank_env"] == [{"GLOO_SOCKET_IFNAME": "eth0"}] * 2
    assert kw["master_addr"] == "198.18.0.1"
    assert kw["device_addrs"] == ["198.18.0.1", "198.18.0.2"]


def test_prediction_grows_with_link_delay():
    import numpy as np

    from baselines.grid import predict_iter_time_s
    from system.cluster import Cluster, LinkSharing

    def cluster(delay_ms):
        off = 1.0 - np.eye(4)
        return Cluster(
            name="t",
            region_of=("a",) * 4,
            host_of=(0, 1, 2, 3),
            delay_ms=off * delay_ms,
            bandwidth_gbps=off * 1.0,
            link_sharing=LinkSharing("pair"),
        )

    for spec in (
        BaselineSpec(system="megatron", pp=2, dp=2),
        BaselineSpec(system="deepspeed", zero=3, dp=4),
        BaselineSpec(system="deepspeed", zero=1, pp=2, dp=2),
    ):
        fast, slow = (predict_iter_time_s(spec, cluster(d)) for d in (1.0, 100.0))
        assert fast is not None and slow > fast > 0, spec.label()
    assert predict_iter_time_s(BaselineSpec(system="megatron", tp=2, pp=2), cluster(1.0)) is None


# ---------------------------------------------------------------- rank maps


def _mapped_run(tmp_path, rank_map, *, prefix=True):
    """run_ranks with a shell prefix per device that records (rank, device, env, master)."""
    from system.runtime.launch import run_ranks

    n = 4
    out = tmp_path / "seen"
    out.mkdir(exist_ok=True)
    script = f'echo "$RANK {{d}} $DEV_ENV $MASTER_ADDR" > {out}/rank$RANK'
    rank_prefix = [["sh", "-c", script.format(d=d), "sh"] for d in range(n)] if prefix else None
    run_ranks(
        "json.tool",
        [],
        world_size=n,
        rank_prefix=rank_prefix,
        rank_env=[{"DEV_ENV": f"env{d}"} for d in range(n)] if prefix else None,
        device_addrs=[f"198.18.0.{d + 1}" for d in range(n)] if prefix else None,
        timeout_s=30,
        log_dir=tmp_path / "logs",
        rank_map=rank_map,
    )
    return [(out / f"rank{r}").read_text().split() for r in range(n)]


def test_launcher_puts_rank_r_on_device_rank_map_r(tmp_path):
    """Global rank r starts with device rank_map[r]'s prefix and env; rank 0's device hosts
    the rendezvous (MASTER_ADDR)."""
    rank_map = [2, 0, 3, 1]
    seen = _mapped_run(tmp_path, rank_map)
    for r, (rank, dev, env, master) in enumerate(seen):
        assert (int(rank), int(dev), env) == (r, rank_map[r], f"env{rank_map[r]}")
        assert master == "198.18.0.3"  # device 2's address
    identity = _mapped_run(tmp_path, None)
    assert [int(x[1]) for x in identity] == [0, 1, 2, 3]


@pytest.mark.parametrize(
    "rank_map, match",
    [
        ([0, 1, 1, 3], "not a permutation"),
        ([0, 1, 2], "not a permutation"),
        (["a", 1, 2, 3], "list of device ids"),
    ],
)
def test_launcher_rejects_a_bad_rank_map(tmp_path, rank_map, match):
    with pytest.raises(ValueError, match=match):
        _mapped_run(tmp_path, rank_map)


def test_launcher_refuses_a_moved_map_under_torchrun(tmp_path):
    with pytest.raises(ValueError, match="needs rank_prefix"):
        _mapped_run(tmp_path, [1, 0, 2, 3], prefix=False)


def test_run_grid_runs_each_point_under_its_map():
    from baselines.grid import grid_points, local_cluster, run_grid
    from baselines.placement import RankMap

    base = BaselineSpec(system="megatron", model="debug")
    points = [
        p
        for p in grid_points(
            "megatron", local_cluster(2), base.workload(), base=base, micro_batch_sizes=(1,)
        )
    ]
    points += [(points[0][0], "skipped: same map")]
    maps = [RankMap("topology", (1, 0), "test")] * len(points)
    seen = []

    def run(spec, **kw):
        seen.append(kw["rank_map"])
        return {"status": "ok", "iter_time_s": 1.0}

    results = run_grid(points, run=run, rank_maps=maps)
    ran = [r for _, r in results if r["status"] == "ok"]
    assert ran and seen == [[1, 0]] * len(ran)
    assert all(r["rank_map"] == [1, 0] and r["placement"] == "topology" for r in ran)
    assert results[-1][1]["status"] == "skipped"
    with pytest.raises(ValueError, match="rank maps"):
        run_grid(points, run=run, rank_maps=maps[:1])


def _two_region_cluster():
    """Devices 0, 2 in region a and 1, 3 in region b, 100 ms apart: in launch order a pp=4
    pipeline crosses the slow link at every boundary, region by region only once."""
    import numpy as np

    from system.cluster import Cluster, LinkSharing

    region = np.array([0, 1, 0, 1])
    same = region[:, None] == region[None, :]
    off = 1.0 - np.eye(4)
    return Cluster(
        name="t",
        region_of=tuple("ab"[r] for r in region),
        host_of=(0, 1, 2, 3),
        delay_ms=off * np.where(same, 1.0, 100.0),
        bandwidth_gbps=off * np.where(same, 1.0, 0.05),
        link_sharing=LinkSharing("pair"),
    )


def test_place_spec_launch_and_topology():
    from baselines.grid import place_spec, predict_iter_time_s

    cluster = _two_region_cluster()
    for spec in (
        BaselineSpec(system="megatron", pp=4),
        BaselineSpec(system="deepspeed", zero=1, pp=4),
    ):
        assert place_spec(spec, cluster, "launch").devices == (0, 1, 2, 3)
        rm = place_spec(spec, cluster, "topology")
        assert rm.placement == "topology" and sorted(rm.devices) == [0, 1, 2, 3]
        launch = predict_iter_time_s(spec, cluster)
        topo = predict_iter_time_s(spec, cluster, rank_map=rm.devices)
        assert rm.devices != (0, 1, 2, 3) and topo < launch, (spec.label(), rm, topo, launch)
    with pytest.raises(ValueError, match="placement must be one of"):
        place_spec(spec, cluster, "random")


def test_a_diverged_baseline_run_is_a_failure_and_its_folder_goes(monkeypatch, tmp_path):
    """A result whose losses are not finite is not a time (status failed, the loss named), and
    a run without a work folder leaves no temporary folder behind."""
    import baselines.grid as grid

    seen = []

    def fake_ranks(module, args, **kw):
        spec = json.loads(open(args[0]).read())
        seen.append(kw["log_dir"])
        with open(spec["result_path"], "w") as f:
            json.dump({"losses": [6.2, float("nan")], "iter_times_s": [0.1, 0.1]}, f)

    monkeypatch.setattr(grid, "run_ranks", fake_ranks)
    res = run_point(BaselineSpec(system="megatron", pp=1, dp=1))
    assert res["status"] == "failed"
    assert "training diverged: loss nan at iteration 1" in res["error"]
    assert seen and not seen[0].exists()


def test_framework_features_reach_the_launchers_configs():
    # each flag of the spec lands in what the worker hands the framework
    pytest.importorskip("torch", reason="the workers import torch")
    from baselines.deepspeed.train import ds_config
    from baselines.megatron.train import megatron_options

    plain = megatron_options(BaselineSpec(system="megatron", pp=2, dp=2))
    assert plain["ddp"]["overlap_grad_reduce"] is False
    assert plain["ddp"]["overlap_param_gather"] is False
    assert plain["use_distributed_optimizer"] is False
    assert plain["virtual_pipeline_model_parallel_size"] is None
    spec = BaselineSpec(
        system="megatron",
        pp=2,
        dp=2,
        global_batch_size=8,
        device="cuda",
        virtual_stages=2,
        distributed_optimizer=True,
        overlap_grad_reduce=True,
        overlap_param_gather=True,
    )
    check_spec(spec)
    got = megatron_options(spec)
    assert got["ddp"]["overlap_grad_reduce"] is True and got["ddp"]["overlap_param_gather"]
    assert got["ddp"]["use_distributed_optimizer"] and got["use_distributed_optimizer"]
    assert got["virtual_pipeline_model_parallel_size"] == 2
    for overlap in (True, False):
        ds = BaselineSpec(system="deepspeed", zero=1, dp=4, overlap_comm=overlap)
        check_spec(ds)
        assert ds_config(ds)["zero_optimization"]["overlap_comm"] is overlap
    # unset: DeepSpeed's own default (on for ZeRO-3), so the key is left out
    assert (
        "overlap_comm"
        not in ds_config(BaselineSpec(system="deepspeed", zero=3))["zero_optimization"]
    )


@pytest.mark.parametrize(
    "kw,match",
    [
        (dict(system="deepspeed", zero=1, virtual_stages=2), "megatron's"),
        (dict(system="megatron", overlap_comm=True), "deepspeed's"),
        (dict(system="megatron", pp=2, global_batch_size=3, virtual_stages=2), "multiple"),
        (dict(system="megatron", pp=4, virtual_stages=2), "divisible"),  # 4 layers, 8 chunks
        (dict(system="megatron", dp=2, distributed_optimizer=True), "device=cuda"),
        (dict(system="megatron", dp=2, overlap_param_gather=True), "overlap_param_gather"),
    ],
)
def test_framework_features_refused_where_the_framework_refuses(kw, match):
    with pytest.raises(ValueError, match=match):
        check_spec(BaselineSpec(**kw))


def test_the_prediction_of_a_spec_carries_its_features():
    from baselines.grid import _baseline_config

    spec = BaselineSpec(system="megatron", pp=2, dp=2, global_batch_size=8, virtual_stages=2)
    c = _baseline_config(spec)
    assert c.virtual_stages == 2 and c.schedule == "interleaved-1f1b"
    ds = _baseline_config(BaselineSpec(system="deepspeed", zero=1, dp=4, overlap_comm=True))
    assert ds.overlap_comm
