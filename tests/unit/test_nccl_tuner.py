"""NCCL's tuner (system/simulator/nccl_tuner.py) against its constants worked by hand.

Constants are NCCL 2.27.7's ``src/graph/tuning.cc`` and ``src/graph/search.cc``: latencies in
µs, bandwidths in GB/s, a time is ``latency + bytes / (1000 · bandwidth)`` µs.
"""

from __future__ import annotations

import numpy as np
import pytest

from system.cases import get_case
from system.simulator.nccl_tuner import (
    NcclSystem,
    choose,
    search_graphs,
    system_for_group,
    tune_allreduce,
    tune_model,
)

GIB = 1 << 30
MIB = 1 << 20


def one_gpu_nodes(n: int, net_gbps: float = 10.0) -> NcclSystem:
    """n V100 hosts with one GPU each, a 10 Gbit/s NIC behind the CPU (PHB: no LL128)."""
    return NcclSystem(n, n, arch=70, net_gbps=net_gbps, gpu_nic_path="PHB")


def test_one_gpu_per_node_graph_by_hand():
    # 10 Gbit/s NIC = 10000/8000 = 1.25 GB/s; the GPU's PCIe Gen3 x16 = 12 GB/s. The fastest path
    # GPU->NIC is 1.25, the first speed of the sm70 inter-node table not above it is 1.2: one
    # channel (1.25 // 1.2 = 1); 2.4 does not fit (pass 2). The tree keeps 1 channel and raises
    # bwIntra alone to 2.4 (< 2 x 1.2 stops it there; no intra-node hop uses it).
    g = search_graphs(one_gpu_nodes(16))
    assert (g["ring"].n_channels, g["ring"].bw_intra, g["ring"].bw_inter) == (1, 1.2, 1.2)
    assert (g["tree"].n_channels, g["tree"].bw_intra, g["tree"].bw_inter) == (1, 2.4, 1.2)
    assert g["tree"].pattern == "tree"  # one GPU per node: a plain tree (x0.85 below)
    assert tune_model(one_gpu_nodes(16)).comm_channels == 2  # duplicated after the search


def test_sixteen_one_gpu_nodes_one_gib_is_the_ring_by_hand():
    # n = N = 16, 1 GiB = 2^30 B.
    # Ring/Simple: bus 1 x 1.2 = 1.2 GB/s, x n/(2(n-1)) = 16/30 -> 0.64 GB/s.
    #   latency 8.4 + 2(n-1) = 30 network steps x 14 (one GPU per node: the tree's NET/Simple
    #   latency) = 428.4; plateau (2^30 / (2 channels x 16) >= 64 B, sm70) x1.9 = 813.96;
    #   time 813.96 + 2^30 / 640 = 813.96 + 1677721.6 = 1678535.56 us.
    # Tree/Simple: bwInter 1.2 (16 nodes > 2) -> min(0.92 x 1.2, 10.0) = 1.104, plain tree
    #   x0.85 = 0.9384, x1/2 = 0.4692; latency 8.4 + 2 x log2(16) x 14 = 120.4; 2^30 B is past
    #   the correction table (log2(2^30/64) = 24 >= 23); time 120.4 + 2^30/469.2 = 2288572.7 us.
    c = tune_allreduce(one_gpu_nodes(16), GIB)
    assert c.times_us["ring", "Simple"] == pytest.approx(1678535.56, rel=1e-9)
    assert c.times_us["tree", "Simple"] == pytest.approx(120.4 + GIB / 469.2, rel=1e-9)
    assert c.times_us["ring", "LL128"] == -1 and c.times_us["tree", "LL128"] == -1  # PHB
    assert (c.algorithm, c.protocol) == ("ring", "Simple")


def test_small_message_takes_the_tree_with_ll_by_hand():
    # 4 B (a gradient norm), 16 one-GPU nodes.
    # Tree/LL: 1.104 (as above) / 3.8 = 0.29053 (< llMaxBw 20.4), x0.85 x1/2 = 0.123474 GB/s;
    #   latency 6.8 + 2 x 4 x 5.0 (NET tree LL) = 46.8; time 46.8 + 4/123.47 = 46.832 us.
    # Ring/LL: latency 6.6 + 30 x 5.0 = 156.6 us, more than the whole tree time.
    c = tune_allreduce(one_gpu_nodes(16), 4)
    assert c.times_us["tree", "LL"] == pytest.approx(46.8 + 4 / (1000 * 1.104 / 3.8 * 0.85 / 2))
    assert c.times_us["ring", "LL"] == pytest.approx(156.6 + 4 / (1000 * 0.6 * 16 / 30))
    assert (c.algorithm, c.protocol) == ("tree", "LL")


@pytest.mark.parametrize("n", [3, 4, 8, 16, 32, 64])
@pytest.mark.parametrize("nbytes", [MIB, 16 * MIB, 256 * MIB, GIB])
@pytest.mark.parametrize("net_gbps", [1.0, 2.0, 10.0])
def test_one_gpu_per_node_gradient_sizes_take_the_ring(n, nbytes, net_gbps):
    # For one GPU per node the tree's bandwidth is 0.5 x 0.85 x 0.92 = 0.39 of the channel's,
    # the ring's n/(2(n-1)) >= 0.5: on NICs of up to 10 Gbit/s, from 1 MiB on, the ring's extra
    # latency (about 2(n-1) x 14 x 1.9 us) never pays for that.
    assert tune_allreduce(one_gpu_nodes(n, net_gbps), nbytes).algorithm == "ring"


def test_fast_nics_and_many_ranks_take_the_tree_at_one_mib_by_hand():
    # 64 one-GPU nodes on 100 Gbit/s NICs (12.5 GB/s; PCIe 12): one channel at 12 GB/s.
    # Ring/Simple: 12 x 64/126 = 6.0952 GB/s; latency (8.4 + 126 x 14) x 1.9 = 3367.56;
    #   1 MiB: 3367.56 + 2^20/6095.2 = 3539.6 us.
    # Ring/LL: min(20.4, 6) x 64/126 = 3.0476 GB/s; latency 6.6 + 126 x 5.0 = 636.6; 980.7 us.
    # Tree/Simple: min(0.92 x 12, 1 x 10.0 (sm70, > 2 nodes)) = 10, x0.85 x1/2 = 4.25 GB/s,
    #   x0.5 correction at 2^20 B (log2(2^20/64) = 14); latency 8.4 + 2 x 6 x 14 = 176.4;
    #   176.4 + 2^20/2125 = 669.8 us: the tree. From 64 MiB on the ring again.
    sys = one_gpu_nodes(64, 100.0)
    c = tune_allreduce(sys, MIB)
    assert c.times_us["ring", "Simple"] == pytest.approx(3367.56 + MIB / (12e3 * 64 / 126))
    assert c.times_us["ring", "LL"] == pytest.approx(636.6 + MIB / (6e3 * 64 / 126))
    assert c.times_us["tree", "Simple"] == pytest.approx(176.4 + MIB / 2125)
    assert (c.algorithm, c.protocol) == ("tree", "Simple")
    assert tune_allreduce(sys, 64 * MIB).algorithm == "ring"


def test_two_nodes_of_eight_gpus_take_the_tree_by_hand():
    # Two nodes, where the tree's bwIntra may reach twice bwInter: 2 nodes x 8 V100 (NVLink,
    # 6 links x 20 GB/s = 120 GB/s per GPU), one 100 Gbit/s NIC (12.5 GB/s) per node under the
    # GPUs' PCIe switch (PXB).
    # Ring graph: fastest GPU->NIC path min(12.5, 12) = 12 -> speed 12, 12.5 // 12 = 1 channel;
    #   lower speeds bring no more total (6 GB/s x 2 = 12, not more); no duplication (< 25).
    # Tree graph: 1 channel at bwInter 12; bwIntra raised 15, 18, 20, 24 (stops at 2 x 12).
    # On 2 nodes the tuner reads bwIntra:
    # Ring/Simple: 12 x 16/30 = 6.4 GB/s; latency 8.4 + 28 NVLink steps x 3.4 + 2 network steps
    #   x 14 = 131.6, x1.9 plateau = 250.04; time 250.04 + 2^30/6400 = 168022.2 us.
    # Tree/Simple: min(0.92 x 24, 1 x 18.5 (sm70, 2 nodes)) = 18.5, balanced tree (no x0.85),
    #   x1/2 = 9.25 GB/s; latency 8.4 + 2 x (7 x 4.0 + 1 x 14) = 92.4; time 92.4 + 2^30/9250 =
    #   116172.6 us: the tree wins, by the factor of two it sees inside the node.
    # Tree/LL128 (enabled: PXB, NVLink): min(18.5 x 120/128, 20) = 17.34 x 1/2 = 8.67 GB/s,
    #   latency 14 + 2 x (7 x 1.25 + 8.5) = 48.5: 48.5 + 2^30/8671.9 = 123866 us, slower.
    sys = NcclSystem(16, 2, arch=70, intra="nvlink", nvlinks=6, net_gbps=100, gpu_nic_path="PXB")
    g = search_graphs(sys)
    assert (g["ring"].n_channels, g["ring"].bw_intra) == (1, 12.0)
    assert (g["tree"].n_channels, g["tree"].bw_intra, g["tree"].bw_inter) == (1, 24.0, 12.0)
    c = tune_allreduce(sys, GIB)
    assert c.times_us["ring", "Simple"] == pytest.approx(250.04 + GIB / 6400, rel=1e-9)
    assert c.times_us["tree", "Simple"] == pytest.approx(92.4 + GIB / 9250, rel=1e-9)
    ll128 = 18.5 * 120 / 128 / 2
    assert c.times_us["tree", "LL128"] == pytest.approx(48.5 + GIB / (1000 * ll128), rel=1e-9)
    assert (c.algorithm, c.protocol) == ("tree", "Simple")
    # the same nodes, three of them: the tree reads bwInter (12) and loses
    three = NcclSystem(24, 3, arch=70, nvlinks=6, net_gbps=100, gpu_nic_path="PXB")
    assert tune_allreduce(three, GIB).algorithm == "ring"


def test_one_node_of_eight_a100_by_hand():
    # 8 A100 over NVLink, 12 links x 20 GB/s = 240 GB/s per GPU. Intra-node speeds: 40 is the
    # first <= 240; 240 // 40 = 6 channels, 6 x 40 >= 240 (totalBw) ends the search; 40 >= 25
    # doubles them at half speed: 12 x 20 (30 would need 12 x 30 = 360 > 240).
    # Ring/Simple: 12 x 20 = 240 x 8/14 = 137.1 GB/s; latency 8.4 + 14 x 3.4 = 56.0 (no plateau
    # on one node). Tree/Simple: min(0.92 x 240, 12 x 24.0) = 220.8 x 1/2 = 110.4 GB/s.
    sys = NcclSystem(8, 1, arch=80, intra="nvlink", nvlinks=12)
    g = search_graphs(sys)["ring"]
    assert (g.n_channels, g.bw_intra) == (12, 20.0)
    c = tune_allreduce(sys, GIB)
    assert c.times_us["ring", "Simple"] == pytest.approx(56.0 + GIB / (240e3 * 8 / 14))
    assert c.times_us["tree", "Simple"] == pytest.approx(8.4 + 2 * 7 * 4.0 + GIB / 110.4e3)
    assert c.algorithm == "ring"


def test_reduce_scatter_offers_pat_on_one_gpu_per_node_and_ring_for_gradients():
    # PAT (one GPU per node, Simple only): bus 0.75 x bwInter 1.2 = 0.9 GB/s (no ring ratio);
    # latency 8 + log2(16) x 14/3.5 + 16 x 2.8 = 68.8 us. Ring: 1.2 x 16/15 = 1.28 GB/s,
    # latency 8.4 + 15 x 14 = 218.4 us (no plateau outside all-reduce).
    sys = one_gpu_nodes(16)
    small = choose(sys, "reducescatter", 64 * 1024)
    assert small.times_us["pat", "Simple"] == pytest.approx(68.8 + 65536 / 900)
    assert small.algorithm == "pat"
    big = choose(sys, "reducescatter", GIB)
    assert big.times_us["ring", "Simple"] == pytest.approx(218.4 + GIB / 1280)
    assert (big.algorithm, big.protocol) == ("ring", "Simple")
    assert "tree" not in {a for a, _ in big.times_us}  # no tree for reduce-scatter


def test_one_rank_and_bad_inputs():
    assert tune_allreduce(NcclSystem(1, 1), GIB).algorithm == "ring"
    with pytest.raises(ValueError, match="n_nodes <= n_ranks"):
        NcclSystem(2, 3)
    with pytest.raises(ValueError, match="intra"):
        NcclSystem(4, 1, intra="infiniband")
    with pytest.raises(ValueError, match="path type"):
        NcclSystem(4, 2, gpu_nic_path="XYZ")
    with pytest.raises(ValueError, match="message bytes"):
        tune_allreduce(NcclSystem(4, 4), float("nan"))
    with pytest.raises(ValueError, match="collective"):
        choose(NcclSystem(4, 4), "alltoall", 8)


def test_system_for_group_reads_hosts_links_and_nics():
    c1 = get_case("1")  # 8 hosts x 8 V100 over NVLink, 25 Gbit/s NICs
    inside = system_for_group(c1, range(8))
    assert (inside.n_ranks, inside.n_nodes, inside.intra, inside.nvlinks) == (8, 1, "nvlink", 6)
    across = system_for_group(c1, range(0, 64, 8))
    assert (across.n_nodes, across.net_gbps, across.arch) == (8, 25.0, 70)
    c5 = get_case("5")  # one V100 per host; no NIC figure: the fastest link leaving the host
    s5 = system_for_group(c5, range(0, 64, 8))
    bw = np.where(np.eye(64, dtype=bool), 0.0, c5.bandwidth_gbps)
    assert (s5.n_nodes, s5.net_gbps) == (8, pytest.approx(bw[::8].max(axis=1).min()))
    with pytest.raises(ValueError, match="distinct"):
        system_for_group(c5, [0, 0])


def test_every_gpu_type_has_an_arch():
    from system.gpus import GPU_TYPES
    from system.simulator.nccl_tuner import GPU_ARCH

    assert set(GPU_ARCH) == set(GPU_TYPES)
