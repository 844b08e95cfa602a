"""Simulator: closed forms (GPipe, one link, ring all-reduce), 1F1B and gloo events,
cost-model agreement, FLOPs, memory, monotonicity.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

# the frameworks' op orders (importing the baselines also registers their names)
from baselines.deepspeed.schedule import deepspeed_train_program
from baselines.megatron.schedule import megatron_1f1b_program
from system.assignment import Assignment, identity_assignment, random_assignment
from system.cases import get_case
from system.cluster import Cluster, LinkSharing
from system.cost.model import assignment_cost, dp_cost_matrix_s, dp_group_cost_s
from system.simulator import Hardware, StageCompute, simulate_1f1b_ring, simulate_ours
from system.simulator.collectives import (
    ring_allreduce_end_s,
    ring_allreduce_s,
    ring_collective_s,
    sharded_ps_p2p_s,
)
from system.simulator.gpipe_timeline import gpipe_timeline
from system.simulator.hardware import V100, stage_compute
from system.simulator.memory import training_memory
from system.simulator.replay import replay, replay_end_s
from system.simulator.transfers import GLOO, NCCL, flow_bandwidth_bps, flow_time_s
from system.workload import MODELS, Workload, tasklet_sizes

_PROGRAMS = {"megatron": megatron_1f1b_program, "deepspeed": deepspeed_train_program}


def one_f_one_b_events(*args, schedule="megatron", **kw):
    """The event replay of a framework's 1F1B program (Megatron's unless named)."""
    return replay(*args, schedule=_PROGRAMS.get(schedule, schedule), **kw)


def one_f_one_b_end_s(*args, schedule="megatron", **kw):
    return replay_end_s(*args, schedule=_PROGRAMS.get(schedule, schedule), **kw)


def uniform(n: int, delay_ms: float = 0.0, bw_gbps: float = 1e9, hosts=None, nic=None) -> Cluster:
    off = ~np.eye(n, dtype=bool)
    return Cluster(
        name=f"uniform{n}",
        region_of=("r",) * n,
        host_of=tuple(range(n)) if hosts is None else tuple(hosts),
        delay_ms=np.where(off, delay_ms, 0.0),
        bandwidth_gbps=np.where(off, bw_gbps, 0.0),
        link_sharing=LinkSharing("pair"),
        host_nic_gbps=nic,
    )


@pytest.mark.parametrize("p,m,r", [(1, 5, 1), (2, 3, 2), (4, 16, 3), (8, 128, 8)])
def test_gpipe_free_links_is_m_plus_p_minus_1_slots(p, m, r):
    f, b = 0.01, 0.025
    t = gpipe_timeline(np.full(p, f), np.full(p, b), np.zeros((p - 1, r)), np.zeros((p - 1, r)), m)
    assert np.allclose(t.bwd_end_s[0], (m + p - 1) * (f + b))
    assert np.allclose(t.fwd_end_s[-1], (m + p - 1) * f)


def test_gpipe_link_bound_two_stages():
    f, b, link, m = 0.01, 0.02, 0.1, 7  # the link is the slowest of recv/compute/send
    t = gpipe_timeline(
        np.full(2, f), np.full(2, b), np.full((1, 1), link), np.full((1, 1), link), m
    )
    assert t.bwd_end_s[0, 0] == pytest.approx(2 * f + 2 * b + 2 * m * link)


def test_gpipe_streamed_link_pays_its_latency_once_per_pass():
    f, b, d, x, m = 0.01, 0.02, 0.2, 0.05, 6  # link: 200 ms away, 50 ms per message on the wire
    one = np.full((1, 1), d + x)
    lat = np.full((1, 1), d)
    t = gpipe_timeline(
        np.full(2, f), np.full(2, b), one, one, m, latency_fwd_s=lat, latency_bwd_s=lat
    )
    assert t.bwd_end_s[0, 0] == pytest.approx(2 * f + 2 * b + 2 * m * x + 2 * d)
    serial = gpipe_timeline(np.full(2, f), np.full(2, b), one, one, m)
    assert serial.bwd_end_s[0, 0] == pytest.approx(2 * f + 2 * b + 2 * m * (x + d))


def test_gpipe_waits_for_the_receivers_notice():
    """Forward messages leave no earlier than the next stage's receive notice (its start + d)."""
    f, b, d, x, m = 0.01, 0.02, 0.2, 0.05, 6
    one, lat = np.full((1, 1), d + x), np.full((1, 1), d)
    kw = dict(latency_fwd_s=lat, latency_bwd_s=lat)
    t = gpipe_timeline(np.full(2, f), np.full(2, b), one, one, m, notice_fwd_s=lat, **kw)
    assert t.fwd_end_s[1, 0] == pytest.approx(d + m * x + d + f)  # first send at d, not at f
    late = gpipe_timeline(
        np.full(2, f), np.full(2, b), one, one, m, notice_bwd_s=np.full((1, 1), 5.0), **kw
    )
    # gradients cannot leave before stage 0's forward end + 5 s
    assert late.bwd_end_s[0, 0] == pytest.approx(m * f + 5.0 + m * x + d + b)


def test_gpipe_overlap_hides_fast_links():
    """A link faster than compute adds only its one-time fill, not a per-micro-batch cost."""
    p, m, f, b, link = 4, 50, 0.02, 0.04, 0.005
    t = gpipe_timeline(
        np.full(p, f), np.full(p, b), np.full((p - 1, 1), link), np.full((p - 1, 1), link), m
    )
    assert t.bwd_end_s[0, 0] == pytest.approx((m + p - 1) * (f + b) + 2 * (p - 1) * link)


def test_simulate_ours_free_links_matches_closed_form():
    c = uniform(8)
    w = Workload(model=MODELS["debug"], global_batch_size=32)
    res = simulate_ours(
        c, identity_assignment(4, 2), w, compute=StageCompute(fwd_s=0.01, bwd_s=0.03)
    )
    m = w.micro_batches(2)
    assert res.iter_time_s == pytest.approx((m + 4 - 1) * 0.04, rel=1e-6)
    assert res.compute_time_s == pytest.approx(m * 0.04)


def test_single_link_transfer():
    c = uniform(2, delay_ms=10.0, bw_gbps=1.0)
    assert flow_time_s(c, [0], [1], 1e9 / 8)[0] == pytest.approx(0.010 + 1.0)


def test_concurrent_flows_share_a_link_and_a_nic():
    c = uniform(2, bw_gbps=8.0)
    assert flow_bandwidth_bps(c, [0, 0], [1, 1]).tolist() == [4e9, 4e9]
    c = uniform(4, bw_gbps=100.0, hosts=(0, 0, 1, 1), nic=(10.0, 10.0))
    bw = flow_bandwidth_bps(c, [0, 1, 0], [2, 3, 1])
    assert bw.tolist() == [5e9, 5e9, 100e9]  # two flows out of host 0, one inside it


@pytest.mark.parametrize("n", [2, 4, 8])
def test_ring_allreduce_uniform_closed_form(n):
    alpha, beta, size = 0.005, 2e9, 3e8
    c = uniform(n, delay_ms=alpha * 1e3, bw_gbps=beta / 1e9)
    t = ring_collective_s(c, [list(range(n))], size)[0]
    assert t == pytest.approx(2 * (n - 1) / n * size * 8 / beta + 2 * (n - 1) * alpha)
    half = ring_collective_s(c, [list(range(n))], size, kind="allgather")[0]
    assert half == pytest.approx(t / 2)


def test_ring_is_set_by_its_slowest_link():
    c = get_case("5")
    fast = ring_collective_s(c, [list(range(8))], 1e8)[0]  # one region
    slow = ring_collective_s(c, [[0, 8, 16, 24, 32, 40, 48, 56]], 1e8)[0]  # across all
    assert slow > 5 * fast


@pytest.mark.parametrize("n", [2, 4, 8])
def test_sharded_ps_uniform_closed_forms(n):
    alpha, beta, size, e = 0.05, 1e9, 4e8, 2.0
    c = uniform(n, delay_ms=alpha * 1e3, bw_gbps=beta / 1e9)
    x = 8 * size / n / beta
    entry = np.full((1, n), e)
    early = sharded_ps_p2p_s(c, [list(range(n))], size, entry)  # receives posted at 0
    assert np.allclose(early, e + 2 * alpha + 2 * x)
    at_entry = sharded_ps_p2p_s(c, [list(range(n))], size, entry, posted_s=entry)
    assert np.allclose(at_entry, e + 3 * alpha + 2 * x)


def test_sharded_ps_two_replicas_equals_the_cost_model():
    """dp=2, synchronised entry: the paper's serial charge 2(α + X/β) is exact (one peer)."""
    c = get_case("5")
    w = Workload(model=MODELS["gpt3_xl"].with_layers(32), global_batch_size=1024)
    a = random_assignment(32, 2, seed=3)
    sizes = tasklet_sizes(w, 32, 2)
    done = sharded_ps_p2p_s(c, a.stages, sizes.c_dp_bytes, np.full((32, 2), 10.0)) - 10.0
    pair = dp_cost_matrix_s(c, sizes.c_dp_bytes, 2)
    assert np.allclose(done.max(axis=1), [dp_group_cost_s(pair, a.group(s)) for s in range(32)])
    assert done.max() == pytest.approx(assignment_cost(c, a, sizes).dp_cost_s)


def test_sharded_ps_concurrent_is_below_the_serial_charge():
    c = get_case("5")
    w = Workload(model=MODELS["gpt3_xl"], global_batch_size=1024)
    a = random_assignment(8, 8, seed=3)
    sizes = tasklet_sizes(w, 8, 8)
    done = sharded_ps_p2p_s(c, a.stages, sizes.c_dp_bytes, np.full((8, 8), 10.0)) - 10.0
    serial = assignment_cost(c, a, sizes).dp_cost_s
    assert done.max() < serial / 2  # 7 peers at once instead of one after another


def test_sharded_ps_late_replica_matches_the_emulated_measurement():
    """dp=2 on one emulated link (96 ms, 52.3 Mbit/s, 3.26 MB shards), replica B entering
    0.3 s after A, receives posted at entry (a one-link benchmark kept in the git history,
    repro/bench_gloo_wan.py at commit fad66a7): measured A 1.579 s,
    B 1.489 s after A's entry."""
    c = uniform(2, delay_ms=96.0, bw_gbps=0.0523)
    entry = np.array([[0.0, 0.3]])
    done = sharded_ps_p2p_s(c, [[0, 1]], 2 * 3.26e6, entry, posted_s=entry)[0]
    assert done == pytest.approx([1.579, 1.489], rel=0.01)


def test_sharded_ps_shares_a_host_nic():
    # 4 devices on 4 hosts with a 1 Gbit/s NIC each, 100 Gbit/s links: 3 flows share the NIC
    c = uniform(4, bw_gbps=100.0, nic=(1.0,) * 4)
    done = sharded_ps_p2p_s(c, [[0, 1, 2, 3]], 4e8, np.zeros((1, 4)))
    assert np.allclose(done, 2 * 8 * 1e8 / (1e9 / 3))


@pytest.mark.parametrize("schedule", ["megatron", "deepspeed"])
@pytest.mark.parametrize("p,m", [(1, 5), (2, 1), (4, 3), (4, 32), (6, 6)])
def test_one_f_one_b_free_links_is_the_textbook_makespan(p, m, schedule):
    # no communication, equal stages: stage 0 ends at (m + p − 1)·(f + b), stage s (b·s) earlier
    z = np.zeros((p - 1, 2))
    ends = one_f_one_b_events(
        np.full((p, 2), 0.1), np.full((p, 2), 0.2), z, z, z, z, micro_batches=m, schedule=schedule
    )
    assert ends[0] == pytest.approx([(m + p - 1) * 0.3] * 2)
    assert ends[:, 0] == pytest.approx((m + p - 1) * 0.3 - 0.2 * np.arange(p))


def test_deepspeed_schedule_sends_an_activation_after_the_next_gradient():
    # 2 stages, 3 micro-batches, no compute, one-way delay L, eager sends. Megatron sends
    # activation i+1 with its receive of gradient i, so two micro-batches are in flight: stage 0
    # ends at (m + 1)·L = 4L. DeepSpeed's stage 0 sends activation i+1 only after its receive of
    # gradient i returned, one micro-batch per round trip: 2m·L = 6L.
    L = 0.1
    z, d = np.zeros((1, 1)), np.full((1, 1), L)
    zero = np.zeros((2, 1))
    meg = one_f_one_b_events(zero, zero, z, z, d, d, micro_batches=3)
    ds = one_f_one_b_events(zero, zero, z, z, d, d, micro_batches=3, schedule="deepspeed")
    assert meg[0, 0] == pytest.approx(4 * L)
    assert ds[0, 0] == pytest.approx(6 * L)
    with pytest.raises(ValueError, match="schedule"):
        one_f_one_b_events(zero, zero, z, z, d, d, micro_batches=3, schedule="pipedream")


def test_one_f_one_b_two_stages_by_hand():
    # 2 stages, 2 micro-batches, no compute, no transmission, one-way delay L.
    # Eager: stage 0 sends both activations at 0; stage 1 answers each at L (lands 2L): [2L, L].
    # Rendezvous: activation 0 leaves at L (stage 1's receive notice), lands 2L; stage 1 posts
    # the receive of activation 1 at 2L, so it leaves at 3L and lands 4L; gradient 1 leaves
    # stage 1 at 4L (stage 0's notice, posted at 3L, is there) and lands at 5L: [5L, 4L].
    L = 0.1
    z, d = np.zeros((1, 1)), np.full((1, 1), L)
    eager = one_f_one_b_events(np.zeros((2, 1)), np.zeros((2, 1)), z, z, d, d, micro_batches=2)
    assert eager.ravel() == pytest.approx([2 * L, L])
    rdv = one_f_one_b_events(
        np.zeros((2, 1)), np.zeros((2, 1)), z, z, d, d, micro_batches=2, rendezvous=True
    )
    assert rdv.ravel() == pytest.approx([5 * L, 4 * L])


def test_one_f_one_b_rendezvous_never_faster_and_extrapolation_exact():
    rng = np.random.default_rng(7)
    for _ in range(6):
        p, r = int(rng.integers(2, 7)), 3
        f = rng.uniform(0, 0.1, (p, r))
        links = [rng.uniform(0, 0.1, (p - 1, r)) for _ in range(2)]
        delay = rng.uniform(0, 0.2, (p - 1, r))
        args = (f, 2 * f, *links, delay, delay * rng.uniform(0.8, 1.2, (p - 1, r)))
        for rdv in (False, True):
            m = int(rng.integers(120, 200))
            exact = one_f_one_b_events(*args, micro_batches=m, rendezvous=rdv)
            fast = one_f_one_b_end_s(*args, micro_batches=m, rendezvous=rdv)
            assert fast == pytest.approx(exact, rel=2e-3)
        eager = one_f_one_b_events(*args, micro_batches=9)
        assert np.all(one_f_one_b_events(*args, micro_batches=9, rendezvous=True) >= eager - 1e-12)


def test_gloo_ring_allreduce():
    # no latency: gloo's segmented ring moves 2·(n−1)/n of the buffer per link, like NCCL's
    c = uniform(4, bw_gbps=1.0, delay_ms=0.0)
    size = 64e6
    want = 2 * 3 / 4 * 8 * size / 1e9
    assert ring_allreduce_s(c, [[0, 1, 2, 3]], size, GLOO)[0] == pytest.approx(want, rel=1e-9)
    assert ring_allreduce_s(c, [[0, 1, 2, 3]], size, NCCL)[0] == pytest.approx(want, rel=1e-9)
    # with WAN latency every segment waits for its receiver's notice: slower than NCCL's ring,
    # at least 2α per window of 2 segments on each of the (n−1)·k sends of both loops
    w = uniform(4, bw_gbps=1.0, delay_ms=100.0)
    gloo, nccl = (ring_allreduce_s(w, [[0, 1, 2, 3]], size, t)[0] for t in (GLOO, NCCL))
    k = int(np.ceil(size / (4 * 2**20)))
    assert gloo > nccl
    assert gloo >= 2 * (3 * k / 2) * 2 * 0.1


def test_baseline_transport_and_gradient_bytes():
    c = get_case("5")
    w = Workload(model=MODELS["gpt3_xl"].with_layers(24), global_batch_size=1024)
    nccl = simulate_1f1b_ring(c, w, tp=1, pp=8, dp=8)
    gloo = simulate_1f1b_ring(c, w, tp=1, pp=8, dp=8, transport=GLOO)
    assert gloo.iter_time_s > nccl.iter_time_s
    fp32 = simulate_1f1b_ring(c, dataclasses.replace(w, gradient_bytes=4), tp=1, pp=8, dp=8)
    assert fp32.breakdown["pipeline_s"] == pytest.approx(nccl.breakdown["pipeline_s"])
    assert fp32.breakdown["dp_sync_s"] == pytest.approx(2 * nccl.breakdown["dp_sync_s"], rel=0.05)


def test_stage_flops_sum_to_the_model_formula():
    w = Workload(model=MODELS["gpt3_xl"].with_layers(40), global_batch_size=4096)
    for pp, dp in [(8, 8), (4, 16), (1, 64)]:
        sc = stage_compute(w.model, pp, 1)
        f, b, _ = sc.per_stage(pp)
        total = (f + b).sum() * V100.flops * w.micro_batches(dp) * dp
        assert total == pytest.approx(w.model_flops(recompute=True), rel=1e-9)


def test_memory_is_16_bytes_per_param_plus_activations():
    m = MODELS["gpt3_xl"]
    est = training_memory(m, layers=3, micro_batch_size=1, in_flight=1)
    p = 3 * m.params_per_layer
    assert est.weights_bytes + est.grads_bytes + est.optimizer_bytes == pytest.approx(16 * p)
    z = training_memory(m, layers=3, micro_batch_size=1, in_flight=1, optimizer_shards=8)
    assert z.optimizer_bytes == pytest.approx(12 * p / 8)
    more = training_memory(m, layers=3, micro_batch_size=1, in_flight=4)
    assert more.activations_bytes - est.activations_bytes == pytest.approx(3 * 3 * 2 * 2048 * 2048)


def test_ours_out_of_memory_is_reported_not_simulated():
    tiny = Hardware(name="tiny", memory_bytes=2 * 2**30, reserved_bytes=2**30)
    w = Workload(model=MODELS["gpt3_xl"], global_batch_size=1024)
    res = simulate_ours(get_case("5"), identity_assignment(8, 8), w, hardware=tiny)
    assert res.status == "oom" and np.isnan(res.pflops)


def test_ours_splits_into_accumulation_rounds_when_memory_needs_it():
    w = Workload(model=MODELS["gpt3_xl"].with_layers(40), global_batch_size=4096)
    res = simulate_ours(get_case("1"), identity_assignment(8, 8), w)
    assert res.breakdown["rounds"] > 1 and res.memory_bytes <= V100.usable_memory_bytes


def test_bad_layouts_raise():
    w = Workload(model=MODELS["gpt3_xl"].with_layers(30), global_batch_size=1024)
    with pytest.raises(ValueError, match="not divisible"):
        simulate_ours(get_case("5"), identity_assignment(8, 8), w)
    with pytest.raises(ValueError, match="span hosts"):
        simulate_1f1b_ring(get_case("3"), Workload(model=MODELS["gpt3_xl"]), tp=2, pp=4, dp=8)
    with pytest.raises(ValueError, match="StageCompute"):
        StageCompute(fwd_s=[0.1, 0.2], bwd_s=0.1).per_stage(3)


@pytest.mark.parametrize("seed", range(5))
def test_slower_links_never_speed_anything_up(seed):
    rng = np.random.default_rng(seed)
    c = get_case("debug")
    w = Workload(model=MODELS["debug"], global_batch_size=16)
    a = Assignment(rng.permutation(8).reshape(2, 4))
    factor = np.where(rng.random((8, 8)) < 0.3, rng.uniform(0.05, 1.0, (8, 8)), 1.0)
    factor = np.minimum(factor, factor.T)
    slow = Cluster(
        name="slow",
        region_of=c.region_of,
        host_of=c.host_of,
        delay_ms=c.delay_ms * 1.5,
        bandwidth_gbps=np.where(np.isinf(c.bandwidth_gbps), 0, c.bandwidth_gbps) * factor,
        link_sharing=LinkSharing("pair"),
    )
    assert simulate_ours(slow, a, w).iter_time_s >= simulate_ours(c, a, w).iter_time_s - 1e-12
    for tp, pp, dp in [(1, 2, 4), (1, 4, 2), (1, 1, 8)]:
        fast_t = simulate_1f1b_ring(c, w, tp=tp, pp=pp, dp=dp).iter_time_s
        assert simulate_1f1b_ring(slow, w, tp=tp, pp=pp, dp=dp).iter_time_s >= fast_t - 1e-12


@pytest.mark.parametrize("seed", range(3))
def test_relabelling_devices_with_the_assignment_changes_nothing(seed):
    rng = np.random.default_rng(seed)
    c = get_case("2")  # hosts and NICs make this non-trivial
    w = Workload(model=MODELS["gpt3_xl"], global_batch_size=1024)
    a = random_assignment(8, 8, rng)
    perm = rng.permutation(64)  # new device i is old device perm[i]
    inv = np.argsort(perm)
    moved = simulate_ours(c.permuted(perm), a.relabel(inv), w).iter_time_s
    assert moved == pytest.approx(simulate_ours(c, a, w).iter_time_s, rel=1e-12)


@pytest.mark.parametrize("case", ["1", "3", "5"])
def test_iteration_is_bounded_below_by_compute_and_the_dp_exchange(case):
    c = get_case(case)
    w = Workload(model=MODELS["gpt3_xl"], global_batch_size=2048)
    a = random_assignment(8, 8, seed=1)
    res = simulate_ours(c, a, w)
    c_dp = tasklet_sizes(w, 8, 8).c_dp_bytes
    assert res.iter_time_s >= res.compute_time_s
    # every device waits at least for its fastest peer's reduced shard: 2 (α + X/β) there
    pair = flow_time_s(c, np.repeat(np.arange(64), 64), np.tile(np.arange(64), 64), c_dp / 8)
    pair = pair.reshape(64, 64)
    least = min(
        2 * min(pair[d, x] for x in a.group(s) if x != d) for s in range(8) for d in a.group(s)
    )
    assert res.breakdown["dp_span_max_s"] >= least - 1e-9
    assert res.iter_time_s >= res.breakdown["pipeline_s"] + least - 1e-9
    assert res.comm_time_s == pytest.approx(res.iter_time_s - res.compute_time_s)


def test_megatron_grad_norm_allreduce():
    # NCCL, uniform links: the norm's 1-float all-reduce over pp = 4 stages takes NCCL's binary
    # tree (root rank 0 = stage 0, depth 2). Stage 0 leaves the 1F1B pipeline last, so the
    # others' partial sums wait at the root and only the 2-hop broadcast remains; the ring would
    # charge 2·3 hops after the last entry.
    alpha = 0.05
    hop = alpha + 8 * 4.0 / 10e9
    c = uniform(8, delay_ms=1e3 * alpha, bw_gbps=10.0)
    w = Workload(model=MODELS["gpt3_xl"].with_layers(8), global_batch_size=64)
    res = simulate_1f1b_ring(c, w, tp=1, pp=4, dp=2, grad_norm=True)
    assert res.breakdown["grad_norm_algo"] == "tree"
    assert res.breakdown["grad_norm_s"] == pytest.approx(2 * hop, rel=1e-6)
    off = simulate_1f1b_ring(c, w, tp=1, pp=4, dp=2)
    assert off.breakdown["grad_norm_s"] == 0.0 and off.iter_time_s < res.iter_time_s


def test_nccl_choice_tree_for_small_ring_for_large_behind_a_nic():
    from system.simulator.collectives import choose_allreduce
    from system.simulator.sharing import with_link_sharing

    alpha, bw = 0.05, 10e9
    c = uniform(8, delay_ms=1e3 * alpha, bw_gbps=bw / 1e9)
    group, entry = [list(range(8))], np.zeros((1, 8))
    small, algo = choose_allreduce(c, group, 4.0, entry)
    # 4 bytes ride one tree of depth 3: 3 hops up, 3 down; the ring takes 2·7 hops
    assert algo == "tree" and small.max() == pytest.approx(6 * (alpha + 32 / bw))
    # 8 GB behind a per-device NIC as fast as a link: the ring's 2·7/8·S per device beats the
    # tree, whose interior nodes send 4 half-messages (1 up + 2 down in one tree, 1 up in the other)
    big, algo = choose_allreduce(with_link_sharing(c, "nic"), group, 8e9, entry)
    ring = 14 * (alpha + 8 * 8e9 / 8 / bw)
    assert algo == "ring" and big.max() == pytest.approx(ring)
    # late entry at the root: the leaves' partial sums wait for it
    late = entry.copy()
    late[0, 0] = 1.0
    end, _ = choose_allreduce(c, group, 4.0, late, ("tree",))
    assert end.max() == pytest.approx(1.0 + 3 * (alpha + 32 / bw))


def test_dp_payload_includes_embedding_and_head():
    # One stage, two replicas, no pipeline: the DP ring carries layers + embeddings + head
    from system.workload import stage_gradient_params

    bw = 1e9
    c = uniform(2, bw_gbps=bw / 1e9)
    m = MODELS["gpt3_xl"].with_layers(4)
    w = Workload(model=m, global_batch_size=8)
    untied = simulate_1f1b_ring(c, w, tp=1, pp=1, dp=2)
    params = 4 * m.params_per_layer + m.embedding_params + m.vocab_size * m.hidden_size + 2 * 2048
    assert stage_gradient_params(m, 1) == [params]
    assert untied.breakdown["dp_sync_s"] == pytest.approx(2 * 8 * params * 2 / 2 / bw)
    tied = simulate_1f1b_ring(c, w, tp=1, pp=1, dp=2, tied_embedding=True)  # one matrix
    assert tied.breakdown["dp_sync_s"] == pytest.approx(
        2 * 8 * (params - m.vocab_size * m.hidden_size) * 2 / 2 / bw
    )
    # pipeline: first stage embeddings (V + s)·h, last the head V·h + 2h
    per = stage_gradient_params(m, 2)
    assert per[0] - per[1] == pytest.approx(m.seq_length * m.hidden_size - 2 * m.hidden_size)


def test_ours_dp_payload_includes_embedding_and_head():
    from system.workload import stage_gradient_params

    bw = 1e9
    c = uniform(4, bw_gbps=bw / 1e9)
    m = MODELS["gpt3_xl"].with_layers(4)
    w = Workload(model=m, global_batch_size=8)
    a = identity_assignment(2, 2)
    res = simulate_ours(c, a, w)
    per = stage_gradient_params(m, 2)
    # two members: each sends half its stage's gradient and gets the reduced half back
    first = 2 * 8 * (per[0] * 2 / 2) / bw
    assert res.breakdown["dp_span_max_s"] == pytest.approx(first, rel=1e-9)
    assert per[0] > tasklet_sizes(w, 2, 2).c_dp_bytes / 2


def test_tied_embedding_allreduce_between_first_and_last_stage():
    alpha, bw = 0.01, 1e9
    c = uniform(4, delay_ms=1e3 * alpha, bw_gbps=bw / 1e9)
    m = MODELS["gpt3_xl"].with_layers(4)
    w = Workload(model=m, global_batch_size=8)
    base = simulate_1f1b_ring(c, w, tp=1, pp=4, dp=1)
    tied = simulate_1f1b_ring(c, w, tp=1, pp=4, dp=1, tied_embedding=True)
    emb = 2.0 * m.vocab_size * m.hidden_size  # fp16 gradient of the word embedding
    # two-rank all-reduce: reduce-scatter + all-gather of S/2 each, the later member's entry
    assert base.breakdown["tied_embedding_s"] == 0.0
    assert tied.breakdown["tied_embedding_s"] == pytest.approx(
        2 * (alpha + 8 * emb / 2 / bw), rel=1e-6
    )
    assert tied.iter_time_s > base.iter_time_s


def test_gloo_one_float_allreduce_matches_a_traced_run():
    # Traced in an emulated case-5 run (devices 0, 8, 24, 40; bandwidth x0.1; Megatron pp4, the
    # grad-norm all-reduce of its optimizer step): when each rank entered and left, seconds.
    from system.emulation.plan import make_plan

    cluster = make_plan(get_case("5").subset([0, 8, 24, 40]), bandwidth_scale=0.1).scaled_cluster()
    entered = np.array([[3.450, 3.366, 3.183, 2.935]])
    left = np.array([3.827, 4.320, 4.196, 3.976])  # includes each rank's local Adam step
    got = ring_allreduce_end_s(cluster, [[0, 1, 2, 3]], 4.0, entered, GLOO)[0]
    assert np.all(got <= left) and np.all(left - got < 0.05)
    # one data segment: far below the full-buffer estimate of 2·(n−1)·k = 12 notice round trips
    assert got.max() - entered.max() < 1.0


def test_blocking_gpipe_schedule_and_sharded_ps_dp():
    # free links, equal stages: blocking GPipe takes (m + p − 1)·(f + b) like 1F1B
    p, m, f, b = 4, 6, 1.0, 2.0
    z = np.zeros((p - 1, 1))
    fwd, bwd = np.full((p, 1), f), np.full((p, 1), b)
    end = one_f_one_b_events(fwd, bwd, z, z, z, z, micro_batches=m, schedule="gpipe")
    assert end.max() == pytest.approx((m + p - 1) * (f + b))
    # with a link delay d each micro-batch's hop is paid once per boundary in each phase
    d = np.full((p - 1, 1), 0.5)
    slow = one_f_one_b_events(fwd, bwd, z, z, d, d, micro_batches=m, schedule="gpipe")
    assert slow.max() == pytest.approx((m + p - 1) * (f + b) + 2 * (p - 1) * 0.5)
    # sharded PS in the 1F1B model: no worse than the ring on uniform links
    c = uniform(8, delay_ms=10.0, bw_gbps=10.0)
    w = Workload(model=MODELS["gpt3_xl"].with_layers(8), global_batch_size=64)
    ring = simulate_1f1b_ring(c, w, tp=1, pp=2, dp=4)
    ps = simulate_1f1b_ring(c, w, tp=1, pp=2, dp=4, dp_protocol="sharded_ps")
    assert ps.breakdown["pipeline_s"] == ring.breakdown["pipeline_s"]
    assert 0 < ps.breakdown["dp_sync_s"] <= ring.breakdown["dp_sync_s"] + 1e-9
    with pytest.raises(ValueError, match="dp_protocol"):
        simulate_1f1b_ring(c, w, tp=1, pp=2, dp=4, dp_protocol="tree")


def test_link_sharing_variants():
    from system.simulator.sharing import with_link_sharing
    from system.simulator.transfers import flow_bandwidth_bps

    c = with_link_sharing(get_case("debug"), "pair")  # 4 regions x 2 devices
    src, dst = np.array([0, 1]), np.array([2, 3])  # two flows between the same two regions
    per_pair = flow_bandwidth_bps(c, src, dst)
    region = flow_bandwidth_bps(with_link_sharing(c, "region"), src, dst)
    assert region == pytest.approx(per_pair / 2)
    # two flows out of one device share its NIC (its fastest link)
    nic = with_link_sharing(c, "nic")
    out = flow_bandwidth_bps(nic, np.array([0, 0]), np.array([2, 4]))
    assert out.sum() <= max(c.bandwidth_gbps[0, 1:]) * 1e9 + 1e-6
    assert with_link_sharing(c, "pair") is c
    with pytest.raises(ValueError, match="link sharing"):
        with_link_sharing(c, "bogus")


def test_ours_accumulation_passes_added_in_one_step_equal_the_pass_by_pass_chain(monkeypatch):
    # GPipe passes chained with start times: once one pass shifts every device equally, the rest
    # are added at once; against the pass-by-pass chain (the shortcut off) within 1e-12
    from system.simulator import ours

    w = Workload(model=MODELS["gpt3_xl"].with_layers(24), global_batch_size=1024)
    a = identity_assignment(8, 8)  # its passes settle at once (a random layout's need not)
    calls = {"n": 0}
    real = ours.gpipe_timeline

    def counted(*args, **kw):
        calls["n"] += 1
        return real(*args, **kw)

    monkeypatch.setattr(ours, "gpipe_timeline", counted)
    fast = simulate_ours(get_case("5"), a, w, recompute="none")
    fast_calls, calls["n"] = calls["n"], 0
    monkeypatch.setattr(ours, "UNIFORM_SHIFT_RTOL", -1.0)
    slow = simulate_ours(get_case("5"), a, w, recompute="none")
    assert fast.breakdown["rounds"] > 2 and calls["n"] == fast.breakdown["rounds"]
    assert fast_calls < calls["n"]
    assert fast.iter_time_s == pytest.approx(slow.iter_time_s, rel=1e-12, abs=0)
