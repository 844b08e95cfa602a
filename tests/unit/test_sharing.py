"""Link-sharing models on a 3-device example computed by hand (system/simulator/sharing.py).

Devices 0 and 1 in region A, device 2 in region B; 0↔1 8 Gbit/s, 5 ms; A↔B 4 Gbit/s, 50 ms.
Five concurrent flows: a = 0→1, b = 0→2, c = 1→2, d = 2→0, e = 2→1. The hand computation of
each model (max-min fair: all flows rise together; a full capacity freezes its flows):

- pair: every flow alone on its pair: a 8, the rest 4;
- nic (cap = each device's fastest link: 8, 8, 4): device 2's egress (d, e) and ingress (b, c)
  fill at 2 each; then a rises alone until device 0's egress (a + b ≤ 8) and device 1's ingress
  (a + e ≤ 8) fill at a = 6;
- region (A→B carries b, c; B→A carries d, e; 4 Gbit/s each): 2 each, a keeps 8;
- flow (16 streams, as measured: pair rates unchanged; AWS quotas 5 Gbit/s to other regions,
  10 Gbit/s per instance): device 2's cross-region egress (d, e) fills at 2.5; b and c reach
  their pairs' 4; a stops at 6 where device 0's instance egress (a + b ≤ 10) fills;
- tc_class (device 2 sees 0 and 1 with the same 50 ms / 4 Gbit/s setting: one netem rate): d, e
  share 4 → 2 each; b, c 4; a stops at 6 (device 0's instance egress, a + b ≤ 10).
"""

from __future__ import annotations

import numpy as np
import pytest

from system.cluster import Cluster, LinkSharing
from system.simulator.sharing import (
    LINK_SHARING,
    _compact,
    link_sharing_of,
    max_min_rates,
    shared_bandwidth_bps,
    with_link_sharing,
)

SRC = np.array([0, 0, 1, 2, 2])
DST = np.array([1, 2, 2, 0, 1])
EXPECTED_GBPS = {
    "pair": [8, 4, 4, 4, 4],
    "nic": [6, 2, 2, 2, 2],
    "region": [8, 2, 2, 2, 2],
    "flow": [6, 4, 4, 2.5, 2.5],
    "tc_class": [6, 4, 4, 2, 2],
}


def three_devices() -> Cluster:
    bw = np.array([[0, 8.0, 4.0], [8.0, 0, 4.0], [4.0, 4.0, 0]])
    delay = np.array([[0, 5.0, 50.0], [5.0, 0, 50.0], [50.0, 50.0, 0]])
    return Cluster(
        name="three",
        region_of=("A", "A", "B"),
        host_of=(0, 1, 2),
        delay_ms=delay,
        bandwidth_gbps=bw,
        link_sharing=LinkSharing("pair"),
    )


@pytest.mark.parametrize("model", LINK_SHARING)
def test_each_model_on_three_devices_by_hand(model):
    c = with_link_sharing(three_devices(), model)
    assert link_sharing_of(c) == model
    got = shared_bandwidth_bps(c, SRC, DST) / 1e9
    assert got == pytest.approx(EXPECTED_GBPS[model], rel=1e-9)


def test_every_model_is_tested_by_hand():
    assert set(EXPECTED_GBPS) == set(LINK_SHARING)


def test_flow_model_scales_with_streams_per_connection():
    # one socket instead of the measured 16: each pair gives a sixteenth; no quota binds then
    c = with_link_sharing(three_devices(), "flow", streams=1)
    got = shared_bandwidth_bps(c, SRC, DST) / 1e9
    assert got == pytest.approx(np.array([8, 4, 4, 4, 4]) / 16)


def test_flows_on_one_pair_split_it_and_self_flows_are_free():
    c = three_devices()
    got = shared_bandwidth_bps(c, [0, 0, 1], [1, 1, 1]) / 1e9
    assert got[:2] == pytest.approx([4, 4]) and np.isinf(got[2])


def test_host_nics_bind_under_every_model():
    # two devices on host 0 (NIC 1 Gbit/s) send to a third host at once: 0.5 each
    c = Cluster(
        name="hosts",
        region_of=("r",) * 3,
        host_of=(0, 0, 1),
        delay_ms=np.zeros((3, 3)),
        bandwidth_gbps=np.full((3, 3), 10.0),
        link_sharing=LinkSharing("pair"),
        host_nic_gbps=(1.0, 10.0),
    )
    for model in LINK_SHARING:
        got = shared_bandwidth_bps(with_link_sharing(c, model), [0, 1], [2, 2]) / 1e9
        assert got == pytest.approx([0.5, 0.5]), model


def test_max_min_gives_the_leftover_to_the_unconstrained_flow():
    # resource 0 (cap 3) holds flows 0, 1; resource 1 (cap 1) holds flow 1 only
    rates = max_min_rates(np.array([3.0, 1.0]), np.array([0, 1, 1]), np.array([0, 0, 1]), 2)
    assert rates.tolist() == pytest.approx([2.0, 1.0])


def test_bad_model():
    c = three_devices()
    with pytest.raises(ValueError, match="link sharing must be one of"):
        with_link_sharing(c, "device_nic")
    assert with_link_sharing(c, "pair") is c  # already under it: unchanged


def test_a_repeated_flow_set_is_answered_as_computed_and_stays_private():
    from system.simulator import sharing

    c = with_link_sharing(three_devices(), "nic")
    first = shared_bandwidth_bps(c, SRC, DST)
    first[:] = 0.0  # the caller's copy: the memo keeps its own
    again = shared_bandwidth_bps(c, SRC, DST)
    assert again == pytest.approx(np.array(EXPECTED_GBPS["nic"]) * 1e9, rel=1e-9)
    assert np.array_equal(again, sharing._allocate(c, SRC, DST))
    # the same devices under another model are another cluster: not the nic answer
    other = shared_bandwidth_bps(with_link_sharing(c, "pair"), SRC, DST)
    assert other / 1e9 == pytest.approx(EXPECTED_GBPS["pair"], rel=1e-9)


def test_a_fingerprint_is_the_clusters_content():
    from dataclasses import replace

    from system.cluster import fingerprint

    a, b = three_devices(), three_devices()  # built apart from the same data
    assert a is not b and fingerprint(a) == fingerprint(b)
    faster = b.bandwidth_gbps.copy()
    faster[0, 1] = faster[1, 0] = 9.0
    assert fingerprint(replace(b, bandwidth_gbps=faster)) != fingerprint(a)
    assert fingerprint(replace(b, host_of=(0, 0, 1))) != fingerprint(a)
    assert fingerprint(with_link_sharing(b, "nic")) != fingerprint(with_link_sharing(b, "pair"))
    assert fingerprint(replace(b, name="renamed", meta={"case": "x"})) == fingerprint(a)


@pytest.mark.parametrize("size", [1, 5, 32, 33, 200])
def test_dense_ids_are_the_sorted_ranks_on_either_path(size):
    # up to 32 keys take a Python path, more np.unique or a table: the same ids either way
    rng = np.random.default_rng(size)
    for top in (8, 10**9):
        key = rng.integers(0, top, size=size)
        ids, k = _compact(key)
        distinct, want = np.unique(key, return_inverse=True)
        assert k == distinct.size and ids.tolist() == want.ravel().tolist()


def _filling_by_rounds(cap, flow_of, resource_of, num_flows):
    """Progressive filling written the plain way, round by round over every entry: the
    reference the compiled :func:`max_min_rates` must equal bit for bit."""
    rate = np.zeros(num_flows)
    active = np.ones(num_flows, dtype=bool)
    left = np.asarray(cap, dtype=float).copy()
    live = np.ones(flow_of.size, dtype=bool)
    for _ in range(left.size + 1):
        if not live.any():
            break
        count = np.bincount(resource_of[live], minlength=left.size)
        used = count > 0
        share = np.full(left.size, np.inf)
        share[used] = left[used] / count[used]
        step = float(share.min())
        rate[active] += step
        left[used] -= count[used] * step
        full = used & (share <= step * (1.0 + 1e-12) + 1e-300)
        active[np.unique(flow_of[live & full[resource_of]])] = False
        live &= active[flow_of]
    return rate


def test_max_min_rates_equal_plain_rounds_bit_for_bit():
    rng = np.random.default_rng(7)
    for trial in range(400):
        flows, resources = int(rng.integers(1, 40)), int(rng.integers(1, 30))
        entries = [
            (f, int(r))
            for f in range(flows)
            for r in rng.choice(
                resources, size=min(int(rng.integers(1, 5)), resources), replace=False
            )
        ]
        flow_of = np.array([f for f, _ in entries])
        resource_of = np.array([r for _, r in entries])
        if trial % 2:  # capacities with ties: several resources fill in one round
            cap = rng.choice([1.0, 2.0, 3.0, 7.5, 1e9], size=resources)
        else:
            cap = rng.uniform(0.1, 10.0, size=resources)
        got = max_min_rates(cap, flow_of, resource_of, flows)
        want = _filling_by_rounds(cap, flow_of, resource_of, flows)
        assert np.array_equal(got, want), trial


def test_tc_classes_rank_each_sender_s_settings_as_unique_does():
    from system.simulator import sharing

    rng = np.random.default_rng(3)
    for n in (1, 2, 5, 17):
        delay = rng.choice([0.0, 1.5, 40.0, 40.0000000001], size=(n, n))
        gbps = rng.choice([1.0, 2.5, 10.0], size=(n, n))
        delay, gbps = (delay + delay.T) / 2, (gbps + gbps.T) / 2
        np.fill_diagonal(delay, 0.0)
        c = Cluster(
            name=f"tc{n}",
            region_of=("a",) * n,
            host_of=tuple(range(n)),
            delay_ms=delay,
            bandwidth_gbps=gbps,
            link_sharing=LinkSharing("tc_class"),
        )
        want = np.stack(
            [
                np.unique(
                    np.stack([np.round(c.delay_ms[s], 9), np.round(c.bandwidth_gbps[s], 9)]),
                    axis=1,
                    return_inverse=True,
                )[1].ravel()
                for s in range(n)
            ]
        )
        assert np.array_equal(sharing._tc_class(c), want)


def test_tc_classes_ranked_by_value_ids_equal_the_sort_s(monkeypatch):
    # from CODED_CLASSES_FROM devices the classes come from value ids; they must equal the one
    # sort's, also for values equal only after rounding to 1e-9 and for -0.0 against 0.0
    from system.simulator import sharing

    rng = np.random.default_rng(7)
    n = sharing.CODED_CLASSES_FROM + 3
    delay = rng.choice([0.0, -0.0, 1.5, 40.0, 40.0000000001, 40.0000000004], size=(n, n))
    gbps = rng.choice([1.0, 2.5, 10.0, 7.0, 7.0000000000001], size=(n, n))
    delay, gbps = np.minimum(delay, delay.T), np.minimum(gbps, gbps.T)
    np.fill_diagonal(delay, 0.0)
    c = Cluster(
        name="coded",
        region_of=("a",) * n,
        host_of=tuple(range(n)),
        delay_ms=delay,
        bandwidth_gbps=gbps,
        link_sharing=LinkSharing("tc_class"),
    )
    coded = sharing._tc_class_coded(c)
    assert coded is not None
    monkeypatch.setattr(sharing, "CODED_CLASSES_FROM", 10**9)
    assert np.array_equal(coded, sharing._tc_class(c))
    # too many distinct settings for the id table: the sort decides
    many = Cluster(
        name="many",
        region_of=("a",) * n,
        host_of=tuple(range(n)),
        delay_ms=(np.add.outer(np.arange(n), np.arange(n)) % 97) * 0.5 + 1.0 - np.eye(n),
        bandwidth_gbps=(np.add.outer(np.arange(n), np.arange(n)) % 13) + 1.0,
        link_sharing=LinkSharing("tc_class"),
    )
    assert sharing._tc_class_coded(many) is None


def test_flow_ids_are_each_key_s_sorted_rank_whichever_way_they_are_made():
    # a few keys (in Python), keys dense in their range (a table) and keys spread wide (a
    # sort) all give each key its rank among the distinct keys
    from system.simulator.sharing import _compact

    rng = np.random.default_rng(2)
    for size, top in ((20, 50), (5000, 9000), (5000, 10**7), (300, 10**6)):
        key = rng.integers(0, top, size)
        distinct, want = np.unique(key, return_inverse=True)
        got, count = _compact(key)
        assert np.array_equal(got, want.ravel()) and count == distinct.size


def test_row_ranks_refuses_values_out_of_range():
    from system.simulator.sharing import _row_ranks

    assert np.array_equal(_row_ranks(np.array([[2, 0, 2], [1, 1, 0]]), 3), [[1, 0, 1], [1, 1, 0]])
    with pytest.raises(ValueError, match="out of 0..count-1"):
        _row_ranks(np.array([[0, 3]]), 3)


@pytest.mark.parametrize("model", LINK_SHARING)
@pytest.mark.parametrize("host_nics", [False, True])
@pytest.mark.parametrize("case", ["5", "system/data/fleets/four-regions.yaml"])
def test_alone_bps_is_each_flow_s_rate_on_its_own(model, host_nics, case):
    # case 5: one GPU a host in eight regions; the four-region fleet: hosts of 4 and 8 GPUs,
    # whose flows inside a host no host NIC caps
    import dataclasses

    from system.cases import get_case
    from system.simulator.sharing import alone_bps

    c = with_link_sharing(get_case(case), model)
    rng = np.random.default_rng(11)
    if host_nics:  # caps that bind some flows alone and not others
        c = dataclasses.replace(c, host_nic_gbps=tuple(rng.uniform(0.5, 20.0, c.num_hosts)))
    src = rng.integers(0, c.num_devices, 200)
    dst = rng.integers(0, c.num_devices, 200)
    got = alone_bps(c, src, dst)
    want = [shared_bandwidth_bps(c, [a], [b])[0] for a, b in zip(src, dst, strict=True)]
    assert np.array_equal(got, np.array(want))
    assert np.isinf(got[src == dst]).all() and (src == dst).any()


def test_a_subset_s_tc_classes_read_off_the_whole_equal_its_own():
    from system.cases import get_case
    from system.simulator import sharing

    whole = with_link_sharing(get_case("system/data/fleets/four-regions.yaml"), "tc_class")
    rng = np.random.default_rng(5)
    for size in (2, 9, 30):
        idx = rng.choice(whole.num_devices, size=size, replace=False).tolist()
        sub = sharing.subset(whole, idx)
        kept = sharing._derived(sub, "tc_class")  # the entry the subset left
        assert np.array_equal(kept, sharing._tc_class(sub))
        plain = whole.subset(idx)
        assert sharing.fingerprint(plain) == sharing.fingerprint(sub)


def test_max_min_rates_refuses_ids_out_of_range():
    with pytest.raises(ValueError, match="out of range"):
        max_min_rates(np.array([1.0]), np.array([0, 1]), np.array([0, 0]), 1)
    with pytest.raises(ValueError, match="out of range"):
        max_min_rates(np.array([1.0]), np.array([0]), np.array([1]), 1)
    with pytest.raises(ValueError, match="alike"):
        max_min_rates(np.array([1.0]), np.array([0, 0]), np.array([0]), 1)
