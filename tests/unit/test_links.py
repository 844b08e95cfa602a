"""Message-size-dependent links: the fitted curve's edges and the hook in transfers.flow_time_s."""

from __future__ import annotations

import math

import numpy as np
import pytest

from system.cluster import Cluster, LinkSharing, fingerprint
from system.links import (
    FIT_MAX_BYTES,
    BandwidthCurve,
    CurveStack,
    KindPairCurves,
    SizeDependentLinks,
)
from system.simulator.collectives import ring_collective_s
from system.simulator.transfers import flow_time_s

# GH-96 4 -> 4 node fit of Sailor's data: negative below ~0.1 MB, ~74 GB/s at 8 MB
GH = BandwidthCurve(-0.65351182, 11.42553946, 45.25031399, peak_bps=8 * 92.55e9, flows=4)


def test_curve_value_floor_and_cap():
    x = math.log2(8e6 / 1e6)
    expect = (-0.65351182 * x * x + 11.42553946 * x + 45.25031399) * 8e9
    assert float(GH.bandwidth_bps(8e6)) == pytest.approx(expect)
    # the fit is <= 0 at 2^16 B, positive at 2^17: messages below 2^17 take 2^17's time
    assert GH.floor_bytes == 2.0**17
    assert float(GH.time_s(10.0)) == pytest.approx(float(GH.time_s(2.0**17)))
    # above the largest measured size the bandwidth stays at that size's (capped at the peak)
    assert float(GH.bandwidth_bps(4 * FIT_MAX_BYTES)) == float(GH.bandwidth_bps(FIT_MAX_BYTES))
    assert float(GH.bandwidth_bps(FIT_MAX_BYTES)) <= GH.peak_bps
    # one flow's share: all 4 flows move the message at once
    assert float(GH.time_s(8e6)) == pytest.approx(4 * 8 * 8e6 / expect)
    assert 0 < float(GH.efficiency(8e6)) < 1


def test_a_curve_stack_times_each_curve_as_the_curve_does():
    # a floor above the smallest size (GH), a flat fit below its peak, one capped at its peak,
    # one flow and several; sizes at 0, below the floor, inside and above the measured range
    curves = [
        GH,
        BandwidthCurve(0.0, 0.0, 2.0, peak_bps=16e9),
        BandwidthCurve(-0.1, 1.0, 30.0, peak_bps=100e9, flows=8),
        BandwidthCurve(0.02, 0.5, 1.0, peak_bps=40e9, flows=2),
    ]
    stack = CurveStack(curves)
    sizes = [0.0, 0.5, 1.0, 10.0, 2.0**16, 2.0**17 - 1, 3e5, 8e6, FIT_MAX_BYTES, 4 * FIT_MAX_BYTES]
    sizes += list(np.geomspace(1.0, 1e11, 200))
    for n in sizes:
        want = np.array([float(c.time_s(n)) for c in curves])
        assert np.array_equal(stack.time_s(n), want), n  # the same floats, not close ones
    with pytest.raises(ValueError, match="at least one curve"):
        CurveStack([])


def test_curve_rejects_a_fit_never_positive():
    with pytest.raises(ValueError, match="not positive at any measured message size"):
        BandwidthCurve(0.0, 0.0, -1.0, peak_bps=1e9)
    with pytest.raises(ValueError, match="a must be a finite number"):
        BandwidthCurve(float("nan"), 0.0, 1.0, peak_bps=1e9)


def _two_hosts(links):
    return Cluster(
        name="two",
        region_of=("a",) * 4,
        host_of=(0, 0, 1, 1),
        delay_ms=np.zeros((4, 4)),
        bandwidth_gbps=np.full((4, 4), 8 * 92.55 / 4),
        link_sharing=LinkSharing("pair"),
        links=links,
    )


def test_flow_time_follows_the_curve_and_flat_links_are_unchanged():
    links = SizeDependentLinks(between={(0, 1): GH, (1, 0): GH}, within={})
    sized, flat = _two_hosts(links), _two_hosts(None)
    t = flow_time_s(sized, [0, 1], [2, 3], 8e6)
    assert t == pytest.approx([float(GH.time_s(8e6))] * 2)
    # within a host there is no curve: the flat bandwidth applies
    assert flow_time_s(sized, [0], [1], 8e6)[0] == pytest.approx(
        flow_time_s(flat, [0], [1], 8e6)[0]
    )
    # a ring over the two hosts moves S/n per step at that size's bandwidth
    ring = ring_collective_s(sized, [[0, 2]], 16e6)[0]
    assert ring == pytest.approx(2 * float(GH.time_s(8e6)) * 1 / 1, rel=1e-9)


def test_subset_renumbers_the_hosts_of_the_curves():
    links = SizeDependentLinks(between={(0, 1): GH, (1, 0): GH}, within={1: GH})
    sub = _two_hosts(links).subset([2, 3])  # host 1 only, renumbered 0
    assert sub.links.between == {} and sub.links.within == {0: GH}


SLOW = BandwidthCurve(0.0, 0.0, 1.0, peak_bps=8e9)


def _kind_pairs():
    # hosts 0, 2 of kind 0 and host 1 of kind 1; no curve from kind 1 to kind 1
    return KindPairCurves((0, 1, 0), {(0, 0): GH, (0, 1): SLOW, (1, 0): SLOW})


def test_kind_pair_curves_hold_the_pairwise_dict():
    kp = _kind_pairs()
    every = {(0, 1): SLOW, (0, 2): GH, (1, 0): SLOW, (1, 2): SLOW, (2, 0): GH, (2, 1): SLOW}
    assert dict(kp.items()) == every and len(kp) == 6 and kp == every
    for bad in [(0, 0), (1, 1), (0, 3), (-1, 0), 5, "x", (0, 1, 2)]:
        assert kp.get(bad) is None
    # a subset is the dict's subset, renumbered
    links = SizeDependentLinks(between=kp, within={1: GH})
    sub = links.subset([2, 1])
    assert dict(sub.between.items()) == {(0, 1): SLOW, (1, 0): SLOW}
    assert sub.within == {1: GH}


def test_kind_pair_efficiency_equals_the_pairwise_dict_s():
    # the kind-pair links find each flow's curve by array lookup; the plain dict of the same
    # pairs asks pair by pair: every flow the same value, inside hosts and between them, hosts
    # the map does not know (no curve: 1) and several sizes at once
    kp = _kind_pairs()
    within = {0: GH, 2: SLOW}
    fast = SizeDependentLinks(between=kp, within=within)
    plain = SizeDependentLinks(between=dict(kp.items()), within=within)
    rng = np.random.default_rng(3)
    for _ in range(200):
        n = int(rng.integers(1, 40))
        hs, hd = rng.integers(-1, 5, n), rng.integers(-1, 5, n)
        sizes = rng.choice([1e3, 3e6, 3e6, 5e8], n)
        for nbytes in (sizes, 4e6):
            want = plain.efficiency(hs, hd, nbytes)
            assert fast.efficiency(hs, hd, nbytes).tolist() == want.tolist()
    grid = np.array([[0, 1], [2, 2]])  # a 2-D shape comes back as given
    assert fast.efficiency(grid, grid.T, 1e6).shape == (2, 2)
    assert fast.efficiency([], [], 1e6).shape == (0,)


def test_fingerprint_of_kind_pair_links_is_exact():
    def cluster(kp):
        return Cluster(
            name="three",
            region_of=("a",) * 3,
            host_of=(0, 1, 2),
            delay_ms=np.zeros((3, 3)),
            bandwidth_gbps=np.full((3, 3), 8.0),
            link_sharing=LinkSharing("pair"),
            links=SizeDependentLinks(between=kp, within={}),
        )

    assert fingerprint(cluster(_kind_pairs())) == fingerprint(cluster(_kind_pairs()))
    other = KindPairCurves((0, 1, 0), {(0, 0): SLOW, (0, 1): SLOW, (1, 0): SLOW})
    moved = KindPairCurves((0, 0, 1), {(0, 0): GH, (0, 1): SLOW, (1, 0): SLOW})
    fps = {fingerprint(cluster(k)) for k in (_kind_pairs(), other, moved)}
    assert len(fps) == 3
    # the same links as a plain dict: the same content, so the same iteration times
    plain = dict(_kind_pairs().items())
    a, b = cluster(_kind_pairs()), cluster(plain)
    assert flow_time_s(a, [0, 1, 2], [2, 0, 1], 3e6).tolist() == (
        flow_time_s(b, [0, 1, 2], [2, 0, 1], 3e6).tolist()
    )
