"""The baselines' framework features in the simulator: Megatron's interleaved 1F1B (virtual
pipeline stages), its distributed optimizer with overlapped gradient reduce-scatter and parameter
all-gather, DeepSpeed ZeRO's overlap_comm; their grid points and row columns."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from baselines.deepspeed.perf import simulate_deepspeed
from baselines.megatron.perf import bucket_params, simulate_megatron
from baselines.megatron.schedule import megatron_1f1b_program, megatron_interleaved_program
from baselines.space import (
    MEGATRON_OVERLAP,
    BaselineConfig,
    config_memory_bytes,
    deepspeed_space,
    interleaving_allowed,
    megatron_space,
)
from system.cases import get_case
from system.cluster import Cluster, LinkSharing
from system.simulator.replay import replay
from system.workload import MODELS, Workload


def _compute(program, p: int) -> list[str]:
    """Stage p's compute ops as 'F<micro-batch>' / 'B<micro-batch>'."""
    return [f"{o.kind}{o.arg}" for o in program if o.kind != "C"]


def _calls(program) -> list[list[tuple]]:
    """Each call's messages as (role, direction, micro-batch, virtual link)."""
    return [
        [(x.role, x.key.direction, x.key.micro_batch, x.key.link) for x in o.arg]
        for o in program
        if o.kind == "C"
    ]


def test_interleaved_op_order_worked_by_hand():
    # p = 2, v = 2, m = 4. Schedule table (group size p = 2): virtual ids 0..7 run
    # (mb, chunk) = (0,0) (1,0) (0,1) (1,1) (2,0) (3,0) (2,1) (3,1); backwards the same
    # micro-batches with the chunks reversed. Warm-up: stage 0 2·(2−0−1) + (2−1)·2 = 4 chunk
    # forwards, stage 1 2·0 + 2 = 2; then one forward and one backward per step; then the rest
    # of the backwards.
    prog = megatron_interleaved_program(2)
    s0, s1 = prog(0, 2, 4), prog(1, 2, 4)
    assert _compute(s0, 0) == "F0 F1 F0 F1 F2 B0 F3 B1 F2 B0 F3 B1 B2 B3 B2 B3".split()
    assert _compute(s1, 1) == "F0 F1 F0 B0 F1 B1 F2 B0 F3 B1 F2 B2 F3 B3 B2 B3".split()
    # virtual stage c·p + s; an activation of virtual stage k rides virtual link k, a gradient
    # into virtual stage k virtual link k. Stage 0: its chunk-0 output of mb 0 to stage 1; then
    # mb 1's, with the wrap-around input of (mb 0, chunk 1) from stage 1's chunk 0 (link 1);
    # at the end of its warm-up the first gradient, of (mb 0, chunk 1) from the last virtual
    # stage (link 2).
    c0 = _calls(s0)
    assert c0[0] == [("send", "f", 0, 0)]
    assert c0[1] == [("send", "f", 1, 0), ("recv", "f", 0, 1)]
    assert c0[3] == [("send", "f", 1, 2), ("recv", "b", 0, 2)]
    # steady step 0 of stage 0: forward (2, chunk 0), backward (0, chunk 1): its input gradient
    # goes back over the wrap-around link to stage 1's chunk 0 (virtual link 1)
    assert c0[4] == [("send", "f", 2, 0), ("send", "b", 0, 1), ("recv", "b", 1, 2)]
    # stage 1 starts by receiving chunk 0's input of mb 0; its chunk 1 (the last virtual stage)
    # sends no activation
    c1 = _calls(s1)
    assert c1[0] == [("recv", "f", 0, 0)]
    assert all(not (r == "send" and d == "f" and k == 3) for call in c1 for r, d, _, k in call)
    # every message sent is received once
    sent = sorted(x[1:] for c in c0 + c1 for x in c if x[0] == "send")
    got = sorted(x[1:] for c in c0 + c1 for x in c if x[0] == "recv")
    assert sent == got and len(sent) == len(set(sent))


@pytest.mark.parametrize(
    "p,m,v", [(2, 4, 2), (4, 8, 2), (4, 8, 4), (8, 16, 2), (3, 6, 3), (4, 4, 2)]
)  # m = p: every micro-batch of stage 0 in its warm-up
def test_interleaved_bubble_shrinks_by_v(p, m, v):
    # uniform costs, free links: 1F1B takes (m + p − 1)·(f + b); interleaved 1F1B, each op a
    # chunk of 1/v of the stage, (m + (p − 1)/v)·(f + b): the bubble fraction (p − 1)/m
    # becomes (p − 1)/(v·m) (Narayanan et al., SC'21, §2.2)
    f, b = 1.0, 2.0
    one = np.ones((p, 1))
    plain = replay(f * one, b * one, 0, 0, 0, 0, m, schedule=megatron_1f1b_program).max()
    links = np.zeros((p, 1))  # p links: the wrap-around one last
    inter = replay(
        f / v * one,
        b / v * one,
        links,
        links,
        links,
        links,
        m,
        schedule=megatron_interleaved_program(v),
    ).max()
    assert plain == pytest.approx((m + p - 1) * (f + b))
    assert inter == pytest.approx((m + (p - 1) / v) * (f + b))
    bubble = lambda t: t / (m * (f + b)) - 1  # noqa: E731
    assert bubble(inter) == pytest.approx(bubble(plain) / v)


def test_interleaving_needs_its_shape():
    assert interleaving_allowed(2, 4, 2, 8)
    assert not interleaving_allowed(2, 3, 2, 8)  # micro-batches not a multiple of p
    assert not interleaving_allowed(2, 4, 2, 6)  # 3 layers per stage, 2 chunks
    assert not interleaving_allowed(1, 4, 2, 8)  # no pipeline
    with pytest.raises(ValueError, match="multiple of p"):
        megatron_interleaved_program(2)(0, 2, 3)
    with pytest.raises(ValueError, match="v must be"):
        megatron_interleaved_program(1)


GPT = Workload(model=MODELS["gpt3_xl"].with_layers(32), global_batch_size=1024)


def test_megatron_space_offers_virtual_stages_and_overlap():
    space = megatron_space(get_case("5"), GPT)
    for c in space:
        m = GPT.global_batch_size // (c.dp * c.micro_batch_size)
        if c.virtual_stages > 1:
            assert interleaving_allowed(c.pp, m, c.virtual_stages, 32)
        if c.dp == 1:
            assert not c.distributed_optimizer
    assert {c.virtual_stages for c in space} == {1, 2, 4}
    assert {(c.distributed_optimizer, c.overlap_grad_reduce, c.overlap_param_gather)
            for c in space} == set(MEGATRON_OVERLAP)  # fmt: skip
    # every (pp, m) that allows interleaving gets each v its layers allow
    v4 = {(c.pp, c.micro_batch_size) for c in space if c.virtual_stages == 4}
    assert (4, 1) in v4 and (8, 1) in v4  # 8 and 4 layers per stage
    plain = megatron_space(get_case("5"), GPT, virtual=(1,), overlap=MEGATRON_OVERLAP[:1])
    assert len(plain) * 3 < len(space)
    assert all(c.virtual_stages == 1 and not c.distributed_optimizer for c in plain)
    assert {c.schedule for c in space} == {"1f1b", "interleaved-1f1b", "none"}


def test_deepspeed_space_overlap_comm_where_it_applies():
    space = deepspeed_space(get_case("5"), GPT, pure_dp_zero1=True)
    assert all(c.overlap_comm for c in space if c.zero == 3)  # DeepSpeed's stage-3 default
    assert not any(c.overlap_comm for c in space if c.zero == 1 and c.pp > 1)
    dp_zero1 = [c for c in space if c.zero == 1 and c.pp == 1]
    assert {c.overlap_comm for c in dp_zero1} == {False, True}


def test_interleaving_costs_activation_memory():
    # stage 0 keeps L·(1 + (p − 1)/(p·v)) layers' inputs against L without interleaving
    # (Korthikanti et al. 2022, §4.2.3): more memory, never less
    base = BaselineConfig(system="megatron", tp=1, pp=4, dp=16, micro_batch_size=1)
    one, two = (config_memory_bytes(replace(base, virtual_stages=v), GPT) for v in (1, 2))
    assert two > one
    shard = replace(base, distributed_optimizer=True)
    assert config_memory_bytes(shard, GPT) < one  # optimizer state over 16 replicas


def _uniform(n: int, gbps: float, ms: float) -> Cluster:
    off = ~np.eye(n, dtype=bool)
    return Cluster(
        name=f"uniform{n}",
        region_of=("r",) * n,
        host_of=tuple(range(n)),
        delay_ms=np.where(off, ms, 0.0),
        bandwidth_gbps=np.where(off, gbps, 0.0),
        link_sharing=LinkSharing("pair"),  # every pair its own rate: free, uniform links
    )


@pytest.mark.parametrize(
    "cluster",
    [pytest.param(get_case("1"), marks=pytest.mark.slow), _uniform(16, 10.0, 0.01)],
    ids=["case1", "u16"],
)
def test_megatron_overlap_between_compute_bound_and_no_overlap(cluster):
    # with the distributed optimizer, overlapping the reduce-scatter (and the all-gather) never
    # loses on data-center links, and no configuration beats its own compute
    n = cluster.num_devices
    checked = 0
    for c in megatron_space(cluster, GPT, ("full",)):
        if not c.overlap_grad_reduce:
            continue
        on = simulate_megatron(cluster, GPT, c)
        off = simulate_megatron(
            cluster, GPT, replace(c, overlap_grad_reduce=False, overlap_param_gather=False)
        )
        grad_only = simulate_megatron(cluster, GPT, replace(c, overlap_param_gather=False))
        assert on.compute_time_s <= on.iter_time_s <= off.iter_time_s + 1e-9
        assert grad_only.compute_time_s <= grad_only.iter_time_s <= off.iter_time_s + 1e-9
        assert on.config["overlap_grad_reduce"] and on.config["distributed_optimizer"]
        assert on.config["zero"] == 0  # Megatron's rows keep zero 0: the flag says it
        checked += 1
    assert checked >= (4 if n == 16 else 10)


def test_megatron_overlap_buckets_follow_megatron_core():
    assert bucket_params(2, 8) == [40e6, None] and bucket_params(1, 64) == [64e6]
    c = BaselineConfig(
        system="megatron",
        tp=1,
        pp=4,
        dp=16,
        micro_batch_size=1,
        distributed_optimizer=True,
        overlap_grad_reduce=True,
    )
    res = simulate_megatron(get_case("1"), GPT, c)
    # stage 0: its 8 layers and the embedding in 40M-parameter buckets; one bucket elsewhere
    params0 = 8 * GPT.model.params_per_layer + GPT.model.embedding_params
    assert res.breakdown["grad_buckets"] == int(np.ceil(params0 / 40e6)) + 3


@pytest.mark.parametrize("cluster", [get_case("1"), _uniform(8, 10.0, 0.01)], ids=["case1", "u8"])
def test_deepspeed_overlap_comm_between_compute_bound_and_no_overlap(cluster):
    w = Workload(model=MODELS["gpt3_xl"].with_layers(24), global_batch_size=256)
    n = cluster.num_devices
    for mbs in (1, 2):
        c = BaselineConfig(
            system="deepspeed", tp=1, pp=1, dp=n, micro_batch_size=mbs, zero=1, overlap_comm=True
        )
        on = simulate_deepspeed(cluster, w, c)
        off = simulate_deepspeed(cluster, w, replace(c, overlap_comm=False), dp_collective="ring")
        assert on.compute_time_s <= on.iter_time_s <= off.iter_time_s + 1e-9
        assert on.config["overlap_comm"] and on.breakdown["grad_buckets"] >= 1
    z3 = BaselineConfig(system="deepspeed", tp=1, pp=1, dp=n, micro_batch_size=1, zero=3)
    assert z3.overlap_comm  # DeepSpeed's default for stage 3
    on = simulate_deepspeed(cluster, w, z3)
    off = simulate_deepspeed(cluster, w, replace(z3, overlap_comm=False))
    assert on.compute_time_s <= on.iter_time_s < off.iter_time_s


def test_interleaved_megatron_in_the_simulator():
    # pp = 4, v = 2 on data-center links: the replay uses the wrap-around link; every iteration
    # is bounded by compute; the label and config say what ran
    c = BaselineConfig(system="megatron", tp=1, pp=4, dp=16, micro_batch_size=1, virtual_stages=2)
    res = simulate_megatron(get_case("1"), GPT, c)
    plain = simulate_megatron(get_case("1"), GPT, replace(c, virtual_stages=1))
    assert res.iter_time_s >= res.compute_time_s and res.breakdown["virtual_stages"] == 2
    assert res.config["virtual_stages"] == 2 and " v2" in res.label()
    assert res.memory_bytes > plain.memory_bytes
    # free links: interleaving shrinks the bubble, so the pipeline ends sooner
    free = _uniform(64, 1e6, 0.0)
    fast = simulate_megatron(free, GPT, c).breakdown["pipeline_s"]
    slow = simulate_megatron(free, GPT, replace(c, virtual_stages=1)).breakdown["pipeline_s"]
    assert fast < slow


def test_baseline_rows_record_schedule_and_overlap():
    from repro.modes.simulate.run import _row

    cluster = get_case("1")
    c = BaselineConfig(
        system="megatron",
        tp=1,
        pp=4,
        dp=16,
        micro_batch_size=1,
        virtual_stages=2,
        distributed_optimizer=True,
        overlap_grad_reduce=True,
        overlap_param_gather=True,
    )
    res = simulate_megatron(cluster, GPT, c)
    row = _row({"mode": "simulate", "system": "megatron", **res.config}, res, cluster)
    assert row["schedule"] == "interleaved-1f1b" and row["virtual_stages"] == 2
    assert row["distributed_optimizer"] and row["overlap_grad_reduce"]
    assert row["overlap_param_gather"] and row["dp_collective"] == "ring"


@pytest.mark.parametrize("p,v,rendezvous", [(4, 2, False), (8, 4, False), (4, 4, True)])
def test_interleaved_long_passes_extrapolate_exactly(p, v, rendezvous):
    # replay_end_s extrapolates an interleaved pass per group of p micro-batches; against the
    # exact replay on random links it agrees to rounding
    from system.simulator.replay import replay_end_s

    rng = np.random.default_rng(p * 10 + v)
    m, r = 60 * p, 2
    f = rng.uniform(0.5, 2.0, (p, r))
    links = [rng.uniform(0, 1, (p, r)) for _ in range(2)] + [
        rng.uniform(0, 0.5, (p, r)) for _ in range(2)
    ]
    kw = dict(schedule=megatron_interleaved_program(v), rendezvous=rendezvous)
    exact = replay(f / v, 2 * f / v, *links, m, **kw)
    fast = replay_end_s(f / v, 2 * f / v, *links, micro_batches=m, **kw)
    np.testing.assert_allclose(fast, exact, rtol=1e-9)


def test_features_off_gives_the_plain_grids():
    from baselines.deepspeed.perf import grid_search_deepspeed
    from baselines.megatron.perf import grid_search_megatron

    c, w = get_case("debug"), Workload(model=MODELS["gpt3_xl"].with_layers(8), global_batch_size=64)
    on = grid_search_megatron(c, w, recompute=("full",))
    off = grid_search_megatron(c, w, recompute=("full",), features=False)
    assert len(off.results) < len(on.results)
    assert not any(r.config["virtual_stages"] > 1 for r in off.results)
    assert not any(r.config["distributed_optimizer"] for r in off.results)
    assert on.best.iter_time_s <= off.best.iter_time_s + 1e-12  # more choices, never slower
    ds_on = grid_search_deepspeed(c, w, recompute=("full",))
    ds_off = grid_search_deepspeed(c, w, recompute=("full",), features=False)
    assert not any(r.config["overlap_comm"] for r in ds_off.results if r.config["zero"] == 1)
    assert ds_on.best.iter_time_s <= ds_off.best.iter_time_s + 1e-12
