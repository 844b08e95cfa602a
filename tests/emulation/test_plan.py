"""EmulationPlan: names, addresses, scaled rates and delays (pure, no root)."""

from __future__ import annotations

import ipaddress

import numpy as np
import pytest

from system.cases import get_case
from system.emulation.plan import FRAME_OVERHEAD, PREFIX, EmulationPlan, make_plan


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


@pytest.mark.parametrize("kw", [{"tag": "bad-tag"}, {"tag": ""}, {"bandwidth_scale": 0.0},
                                {"delay_scale": -1.0}])
def test_bad_plans(kw):
    args = {"cluster": get_case("debug"), "tag": "ok"} | kw
    with pytest.raises(ValueError):
        EmulationPlan(**args)
