"""All-reduce algorithms against hand computations (system/simulator/collectives.py), and their use
in the baselines' DP step (system/simulator/baseline_training.py)."""

from __future__ import annotations

import numpy as np
import pytest

from system.cluster import Cluster, LinkSharing
from system.simulator.baseline_training import simulate_1f1b_ring
from system.simulator.collectives import (
    TREE_CHUNK_BYTES,
    allreduce_end_s,
    btree_parents,
    choose_allreduce,
    dtree_parents,
    two_level_block,
)
from system.simulator.sharing import with_link_sharing
from system.workload import MODELS, Workload

ALPHA, BW = 0.02, 10e9  # s, bit/s


def uniform(n: int, alpha: float = ALPHA, bw: float = BW) -> Cluster:
    off = ~np.eye(n, dtype=bool)
    return Cluster(
        name=f"u{n}",
        region_of=("r",) * n,
        host_of=tuple(range(n)),
        delay_ms=np.where(off, alpha * 1e3, 0.0),
        bandwidth_gbps=np.where(off, bw / 1e9, 0.0),
        link_sharing=LinkSharing("pair"),
    )


def two_regions(alpha_in=0.005, bw_in=8e9, alpha_x=0.1, bw_x=1e9) -> Cluster:
    """Devices 0, 1 in region A and 2, 3 in region B."""
    region = np.array([0, 0, 1, 1])
    same = np.equal.outer(region, region)
    off = ~np.eye(4, dtype=bool)
    return Cluster(
        name="two-regions",
        region_of=("A", "A", "B", "B"),
        host_of=(0, 1, 2, 3),
        delay_ms=np.where(off, np.where(same, alpha_in, alpha_x) * 1e3, 0.0),
        bandwidth_gbps=np.where(off, np.where(same, bw_in, bw_x) / 1e9, 0.0),
        link_sharing=LinkSharing("pair"),
    )


def test_ncclgetbtree_and_double_tree_shapes():
    # NCCL's illustration for 14 ranks: 0 -> 8 -> {4, 12}, 4 -> {2, 6}, 12 -> {10, 13}, ...
    p = btree_parents(14)
    assert [p[8], p[4], p[12], p[2], p[6], p[10], p[13], p[1], p[3]] == [
        0,
        8,
        8,
        4,
        4,
        12,
        12,
        2,
        2,
    ]
    first, second = dtree_parents(4)
    assert second == [1, 3, 1, -1]  # mirror: rank r plays rank 3 - r
    _, shifted = dtree_parents(5)
    assert shifted[1] == -1  # odd count: the copy shifted by one rank has root 1


def test_ring_allreduce_by_hand():
    c, s = uniform(4), 1e9
    end, name = allreduce_end_s(c, [[0, 1, 2, 3]], s, np.zeros((1, 4)), "ring")
    assert name == "ring"
    assert end.max() == pytest.approx(6 * (ALPHA + 8 * s / 4 / BW))  # 2(n-1) steps of S/n


def test_tree_allreduce_by_hand_under_pair_sharing():
    # 4 ranks: tree 0 has parents [-, 2, 0, 2], tree 1 (mirror) [1, 3, 1, -]. Pair 1->2 carries
    # tree 0's up flow and tree 1's down flow, pair 2->1 the reverse. The pipeline, at each
    # edge's rate alone (BW): the worst member (rank 1 in tree 0) gets the first chunk c up 1->2,
    # 2->0, down 0->2, 2->1 = 4α + 32c/BW, the rest of its half (S/2 − c) streaming at BW. The
    # busiest link: pair 1->2 moves both halves (BW/2 each with all flows at once), then α.
    c, s = uniform(4), 1e9
    end, name = allreduce_end_s(c, [[0, 1, 2, 3]], s, np.zeros((1, 4)), "tree")
    chunk = TREE_CHUNK_BYTES
    pipeline = 4 * ALPHA + 32 * chunk / BW + 8 * (s / 2 - chunk) / BW
    busiest = 8 * (s / 2) / (BW / 2) + ALPHA
    assert busiest > pipeline  # a big message: the shared pair decides
    assert name == "tree" and end.max() == pytest.approx(busiest)
    # a latency-bound one: the pipeline decides
    end, _ = allreduce_end_s(uniform(4, alpha=1.0), [[0, 1, 2, 3]], s, np.zeros((1, 4)), "tree")
    pipeline = 4 * 1.0 + 32 * chunk / BW + 8 * (s / 2 - chunk) / BW
    assert end.max() == pytest.approx(pipeline)


def test_tree_of_one_chunk_rides_one_tree_and_waits_for_late_members():
    c = uniform(8)
    entry = np.zeros((1, 8))
    end, _ = allreduce_end_s(c, [list(range(8))], 4.0, entry, "tree")
    assert end.max() == pytest.approx(6 * (ALPHA + 32 / BW))  # depth 3: 3 up, 3 down
    entry[0, 0] = 1.0  # the root enters late: the partial sums wait, then 3 hops down
    end, _ = allreduce_end_s(c, [list(range(8))], 4.0, entry, "tree")
    assert end.max() == pytest.approx(1.0 + 3 * (ALPHA + 32 / BW))


def test_two_level_allreduce_by_hand():
    # reduce-scatter inside A and B (1 step of S/2), ring all-reduce of S/2 across (2 ranks:
    # 2 steps of S/4), all-gather inside (1 step of S/2)
    a_in, b_in, a_x, b_x, s = 0.005, 8e9, 0.1, 1e9, 1e9
    c = two_regions(a_in, b_in, a_x, b_x)
    assert two_level_block(c, [[0, 1, 2, 3]]) == 2
    end, name = allreduce_end_s(c, [[0, 1, 2, 3]], s, np.zeros((1, 4)), "two_level")
    hand = 2 * (a_in + 8 * s / 2 / b_in) + 2 * (a_x + 8 * s / 4 / b_x)
    assert name == "two_level/ring" and end.max() == pytest.approx(hand)
    # the flat ring crosses the slow pair on every step: 6 steps of S/4 at b_x
    ring, _ = allreduce_end_s(c, [[0, 1, 2, 3]], s, np.zeros((1, 4)), "ring")
    assert ring.max() == pytest.approx(6 * (a_x + 8 * s / 4 / b_x))
    best, how = choose_allreduce(c, [[0, 1, 2, 3]], s, np.zeros((1, 4)))
    assert how == "two_level/ring" and best.max() == pytest.approx(hand)


def test_two_level_needs_region_blocks():
    c = two_regions()
    assert two_level_block(c, [[0, 2, 1, 3]]) == 0  # alternating regions
    assert two_level_block(c, [[0, 1]]) == 0  # one block only
    with pytest.raises(ValueError, match="region blocks"):
        allreduce_end_s(c, [[0, 2, 1, 3]], 1e6, np.zeros((1, 4)), "two_level")
    end, how = choose_allreduce(c, [[0, 2, 1, 3]], 1e9, np.zeros((1, 4)))
    assert not how.startswith("two_level")


def test_choice_depends_on_link_sharing():
    # a big message on uniform links: under pair sharing a tree parent receives from two
    # children at two links' rates and the tree wins; behind a per-device NIC the ring's
    # 2(n-1)/n·S per device beats the tree's 2·S
    c, s = uniform(8), 4e9
    _, under_pair = choose_allreduce(c, [list(range(8))], s, np.zeros((1, 8)), ("ring", "tree"))
    _, under_nic = choose_allreduce(
        with_link_sharing(c, "nic"), [list(range(8))], s, np.zeros((1, 8)), ("ring", "tree")
    )
    assert (under_pair, under_nic) == ("tree", "ring")


def test_baseline_dp_records_its_collective_and_best_is_never_slower():
    c = two_regions(alpha_x=0.2, bw_x=0.5e9)
    w = Workload(model=MODELS["gpt3_xl"].with_layers(4), global_batch_size=8)
    times = {}
    for algo in ("ring", "tree", "two_level", "best"):
        r = simulate_1f1b_ring(c, w, tp=1, pp=1, dp=4, dp_collective=algo)
        times[algo] = r.iter_time_s
        if algo != "best":
            assert r.breakdown["dp_collective"].startswith(algo)
    assert times["best"] == pytest.approx(min(times["ring"], times["tree"], times["two_level"]))
    # ZeRO-1 offers reduce-scatter + all-gather or a tree all-reduce + all-gather
    z = simulate_1f1b_ring(c, w, tp=1, pp=1, dp=4, zero=1, dp_collective="best")
    assert z.breakdown["dp_collective"] in ("ring", "tree+allgather")
    with pytest.raises(ValueError, match="dp_collective"):
        simulate_1f1b_ring(c, w, tp=1, pp=1, dp=4, dp_collective="butterfly")


def test_ours_1f1b_on_free_links_and_the_flag_allreduce():
    from system.assignment import identity_assignment
    from system.simulator import StageCompute, simulate_ours

    c = uniform(8, alpha=0.0, bw=1e15)
    w = Workload(model=MODELS["gpt3_xl"].with_layers(4), global_batch_size=32)
    comp = StageCompute(fwd_s=0.01, bwd_s=0.03)
    a = identity_assignment(4, 2)  # p = 4, m = 16 micro-batches per replica
    one = simulate_ours(c, a, w, compute=comp, schedule="1f1b")
    gp = simulate_ours(c, a, w, compute=comp, schedule="gpipe", rounds=1)
    for r in (one, gp):  # both (m + p − 1)(f + b) on free links
        assert r.breakdown["pipeline_s"] == pytest.approx((16 + 4 - 1) * 0.04, rel=1e-5)
    assert one.config["schedule"] == "1f1b" and one.breakdown["flag_allreduce_s"] == 0.0
    # fp16 loss scaling: a one-float all-reduce over all 8 ranks before the step (tree, 6 hops)
    slow = uniform(8, alpha=0.05)
    flag = simulate_ours(slow, a, w, compute=comp, loss_scaling=True)
    plain = simulate_ours(slow, a, w, compute=comp)
    assert flag.breakdown["flag_allreduce_algo"] == "tree"
    assert 0 < flag.breakdown["flag_allreduce_s"] <= 6 * (0.05 + 32 / BW) + 1e-9
    assert flag.iter_time_s == pytest.approx(plain.iter_time_s + flag.breakdown["flag_allreduce_s"])
    few = Workload(model=MODELS["gpt3_xl"].with_layers(4), global_batch_size=4)  # m = 2 < p
    assert simulate_ours(c, a, few, compute=comp, schedule="1f1b").breakdown[
        "pipeline_s"
    ] == pytest.approx((2 + 4 - 1) * 0.04, rel=1e-5)
    with pytest.raises(ValueError, match="schedule"):
        simulate_ours(c, a, w, compute=comp, schedule="zb-v")


@pytest.mark.parametrize("p,m", [(1, 3), (2, 1), (3, 2), (4, 4), (5, 17), (8, 3)])
def test_ours_1f1b_program_never_deadlocks_and_keeps_its_order(p, m):
    from system.simulator.ours import overlapped_1f1b_program
    from system.simulator.replay import replay

    rng = np.random.default_rng(p * 100 + m)
    f, b = rng.uniform(0.01, 0.02, (p, 1)), rng.uniform(0.02, 0.04, (p, 1))
    link = rng.uniform(0.0, 0.05, (max(p - 1, 0), 1))
    ends = replay(
        f,
        b,
        link,
        link,
        link / 2,
        link / 2,
        m,
        schedule=overlapped_1f1b_program,
        buffer_fwd_s=np.inf,
        buffer_bwd_s=np.inf,
    )
    assert np.all(ends[:, 0] >= m * (f[:, 0] + b[:, 0]) - 1e-12)
    for s in range(p):  # every forward and backward exactly once
        ops = overlapped_1f1b_program(s, p, m)
        assert sorted(o.arg for o in ops if o.kind == "F") == list(range(m))
        assert sorted(o.arg for o in ops if o.kind == "B") == list(range(m))
