"""EmulationPlan: names, addresses, scaled rates and delays (pure, no root)."""

from __future__ import annotations

import ipaddress

import numpy as np
import pytest

from system.cases import get_case
from system.emulation.plan import FRAME_BYTES, FRAME_OVERHEAD, PREFIX, EmulationPlan, make_plan


def test_names_and_addresses_stay_in_benchmark_range():
    plan = make_plan(get_case("debug"), tag="t1")
    assert all(ns.startswith(PREFIX) for ns in plan.namespaces)
    assert len(set(plan.namespaces)) == 9
    net = ipaddress.ip_network("198.18.0.0/15")
    assert all(ipaddress.ip_address(plan.ip(i)) in net for i in range(8))


def test_scaled_rates_and_delays():
    c = get_case("5").subset([0, 8, 24])
    plan = make_plan(c, bandwidth_scale=0.1, delay_scale=0.5, tag="t2")
    sc = plan.scaled_cluster()
    np.testing.assert_allclose(sc.bandwidth_gbps, c.bandwidth_gbps * 0.1)
    np.testing.assert_allclose(plan.delay_s, c.delay_s * 0.5)
    np.testing.assert_allclose(plan.rate_bps[0, 1], c.bandwidth_bps[0, 1] * 0.1 * FRAME_OVERHEAD)
    rows = plan.delay_table()
    assert len(rows) == 6 and all(d > 0 for _, _, d in rows)
    rec = plan.scale_record()
    assert rec["emu_bandwidth_scale"] == 0.1 and rec["emu_delay_scale"] == 0.5
    assert sc.meta["bandwidth_scale"] == 0.1


def test_fast_links_are_capped():
    c = get_case("1").subset([0, 1, 8])  # NVLink pair + a 25 Gbit/s pair
    plan = make_plan(c, bandwidth_scale=0.1, tag="t3", max_rate_gbps=1.0)
    assert plan.scaled_cluster().bandwidth_gbps[0, 1] == 1.0
    assert plan.scaled_cluster().bandwidth_gbps[0, 2] == 1.0


@pytest.mark.parametrize(
    "kw", [{"tag": "bad-tag"}, {"tag": ""}, {"bandwidth_scale": 0.0}, {"delay_scale": -1.0}]
)
def test_bad_plans(kw):
    args = {"cluster": get_case("debug"), "tag": "ok"} | kw
    with pytest.raises(ValueError):
        EmulationPlan(**args)


def test_device_tc_and_route_lines():
    from system.emulation.netns import BURST_S, device_route_lines, device_tc_lines, htb_burst_bytes

    plan = make_plan(get_case("debug").subset([0, 2, 4]), bandwidth_scale=0.1, tag="t4")
    lines = device_tc_lines(plan, 0, netem=False)
    assert lines[0].startswith("qdisc add dev eth0 root handle 1: htb")
    # per destination: parent class, ACK leaf, data leaf, 2 leaf qdiscs, 2 filters
    assert len(lines) == 2 + 2 * 7
    assert sum("netem" in ln for ln in lines) == 0
    assert sum(f"match ip dst {plan.ip(2)}/32" in ln for ln in lines) == 2
    r = int(round(plan.rate_bps[0, 1]))
    assert f"classid 1:2 htb rate {r}bit ceil {r}bit" in "\n".join(lines)
    # a token bucket of BURST_S at the class rate on the destination class and its data leaf
    b = htb_burst_bytes(r)
    assert b == pytest.approx(r * BURST_S / 8, abs=1) and b >= 2 * FRAME_BYTES
    assert sum(f"burst {b} cburst {b}" in ln for ln in lines if f"rate {r}bit" in ln) == 2
    netem = device_tc_lines(plan, 1, netem=True)
    delays = sorted(float(ln.split("delay ")[1].split("ms")[0]) for ln in netem if "netem" in ln)
    assert delays == pytest.approx(
        sorted([plan.delay_s[1, 0] * 1e3] * 2 + [plan.delay_s[1, 2] * 1e3] * 2)
    )
    handles = [
        ln.split("handle ")[1].split(":")[0]
        for ln in netem
        if ln.startswith("qdisc") and "parent" in ln
    ]
    assert len(set(handles)) == len(handles) and all(int(h, 16) <= 0xFFFF for h in handles)
    routes = device_route_lines(plan, 0)
    assert len(routes) == 2 and routes[0].startswith(f"route add {plan.ip(1)}/32 dev eth0 window ")
    assert all(r.endswith(" congctl cubic") for r in routes)
    assert not any("congctl" in r for r in device_route_lines(plan, 0, congctl=None))
    bdp = plan.goodput_bps[0, 1] * 2 * plan.delay_s[0, 1] / 8
    assert int(routes[0].split(" window ")[1].split()[0]) >= bdp


def test_udp_steady_rate_leaves_out_the_initial_burst():
    from system.emulation.probe import steady_rate

    # 20 datagrams arrive at once (the token bucket), then 1000 B every 1 ms = 8 Mbit/s
    times = [0.0] * 20 + [0.001 * k for k in range(1, 401)]
    sizes = [1000] * len(times)
    assert steady_rate(times, sizes)["rate_bps"] == pytest.approx(8e6, rel=1e-9)
    naive = 8 * sum(sizes[1:]) / times[-1]
    assert naive > 8.3e6  # what counting the burst would report
    assert steady_rate([0.0, 1.0], [1, 1])["rate_bps"] == 0.0  # too few arrivals: no estimate


def test_egress_cap_sits_above_the_destination_classes():
    from system.emulation import tc
    from system.emulation.netns import device_tc_lines
    from system.emulation.plan import FRAME_OVERHEAD
    from system.simulator.sharing import link_sharing_of

    c = get_case("debug").subset([0, 2, 4, 6])
    plan = make_plan(c, bandwidth_scale=0.1, tag="tcap", egress_cap_gbps=1.0)
    lines = device_tc_lines(plan, 0, netem=False)
    cap = int(round(0.1e9 * FRAME_OVERHEAD))
    parent = f"1:{tc.CAP_CLASS:x}"
    assert f"parent 1: classid {parent} htb rate {cap}bit ceil {cap}bit" in "\n".join(lines)
    dest = [ln for ln in lines if f"parent {parent} classid" in ln]
    assert len(dest) == 3  # every destination class borrows from the cap
    for j, ln in zip((1, 2, 3), dest, strict=True):
        r = int(round(plan.rate_bps[0, j]))
        g = max(8000, min(r, cap // 3))  # guaranteed an equal share, up to its link
        assert f"htb rate {g}bit ceil {r}bit" in ln
    # one flow alone reaches min(link, cap): what the link checks expect
    assert plan.single_flow_goodput_bps[0, 1] == pytest.approx(min(plan.goodput_bps[0, 1], 0.1e9))
    # the simulator sees the cap as the nic model at the scaled cap
    sc = plan.scaled_cluster()
    assert link_sharing_of(sc) == "nic" and sc.link_sharing.nic_gbps == pytest.approx(0.1)
    assert link_sharing_of(make_plan(c, tag="tnocap").scaled_cluster()) == "pair"
    with pytest.raises(ValueError, match="egress_cap_gbps"):
        make_plan(c, tag="tbad", egress_cap_gbps=0.0)


@pytest.mark.parametrize("cap_gbps", [1e-9, 1e6])
def test_an_egress_cap_tc_cannot_shape_is_refused_before_any_namespace(cap_gbps):
    """A cap below tc's slowest rate used to become ``htb rate 0bit`` (every packet held), one
    above its fastest an HTB rate tc refuses only once the namespaces exist."""
    from system.emulation import tc
    from system.emulation.tc import Peer

    c = get_case("debug").subset([0, 2])
    with pytest.raises(ValueError, match=r"egress cap: .* bit/s after bandwidth_scale=0.1"):
        make_plan(c, bandwidth_scale=0.1, tag="tcap2", egress_cap_gbps=cap_gbps)
    peer = Peer(index=0, ip="198.18.0.2", rate_bps=1e6, delay_s=0.0, goodput_bps=1e6)
    for cap_bps in (1.0, 1e13, float("nan")):
        with pytest.raises(ValueError, match="egress cap .* is outside 8000"):
            tc.egress_lines("veth0", [peer], netem=False, mtu=1500, cap_bps=cap_bps)
