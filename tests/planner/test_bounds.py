"""The planner's lower bound (system/planner/bounds.py): below every plan of its shape that the
planner simulates or that can be enumerated, the exchange term by hand, and the bound at scale."""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path

import numpy as np
import pytest

from system.cases import load_topology
from system.planner import bounds
from system.planner.compute import compute_model
from system.planner.search import RECOMPUTE, SCHEDULES, Planner
from system.simulator.sharing import with_link_sharing
from system.workload import get_model

ROOT = Path(__file__).resolve().parents[2]


def _recording(monkeypatch) -> tuple[list, list]:
    """Every candidate the planner simulates, and (configuration bound, candidate) for those
    the search simulates from a bounded entry."""
    seen, entries = [], []
    simulate, simulate_entry = Planner._simulate, Planner.simulate_entry

    def record(self, *args, **kw):
        c = simulate(self, *args, **kw)
        seen.append(c)
        return c

    def record_entry(self, entry):
        c = simulate_entry(self, entry)
        entries.append((entry[1], c))
        return c

    monkeypatch.setattr(Planner, "_simulate", record)
    monkeypatch.setattr(Planner, "simulate_entry", record_entry)
    return seen, entries


def _check_every(planner: Planner, seen: list) -> int:
    net = bounds._Network(planner.cluster)
    memo: dict[tuple, float] = {}
    checked = 0
    for c in seen:
        if not math.isfinite(c.iter_time_s):
            continue
        key = (c.pp, c.dp, c.micro_batch_size)
        if key not in memo:
            memo[key] = bounds.shape_lower_bound_s(planner, *key, net)
        assert c.iter_time_s >= memo[key] * (1 - 1e-9), (key, c.config(), c.iter_time_s)
        checked += 1
    return checked


@pytest.mark.parametrize(
    "sharing, streams, layers, batch",
    [
        pytest.param("tc_class", 16, 8, 64, marks=pytest.mark.slow),
        pytest.param("pair", 16, 8, 64, marks=pytest.mark.slow),
        pytest.param("nic", 16, 8, 64, marks=pytest.mark.slow),
        pytest.param("flow", 16, 8, 64, marks=pytest.mark.slow),
        pytest.param("flow", 64, 8, 64, marks=pytest.mark.slow),
        # deeper and larger: the placement cases sharpen about half the shapes' bounds here
        pytest.param("tc_class", 16, 16, 256, marks=pytest.mark.slow),
        pytest.param("pair", 16, 16, 256, marks=pytest.mark.slow),
    ],
)
def test_bound_below_every_plan_the_planner_simulates(
    tmp_path, monkeypatch, sharing, streams, layers, batch
):
    """A 64-GPU fleet of four types on machines of 4 and 8 in eight regions: every candidate
    the search simulates (heuristics, the planner's layouts, the local search) takes at least
    its shape's bound, and at least the bound its configuration was searched in the order
    of (which prunes the search)."""
    from system.planner.fleets import fleet

    p = tmp_path / "f.json"
    p.write_text(json.dumps(fleet(64)))
    extra = {"streams": streams} if sharing == "flow" else {}
    cluster = with_link_sharing(load_topology(p), sharing, **extra)
    model = get_model("gpt3_xl", layers)
    seen, entries = _recording(monkeypatch)
    planner = Planner(
        cluster, model, batch, compute_model(model, set(cluster.gpus)), time_limit_s=60
    )
    result = planner.run()
    assert _check_every(planner, seen) > 10
    for bound, c in entries:
        assert c.iter_time_s >= bound * (1 - 1e-9), (c.config(), c.iter_time_s, bound)
    assert result.lower_bound_s <= result.best.iter_time_s


def _east_west(tmp_path, devices: list[str], links: str = "") -> Path:
    """A topology file of ``devices`` (YAML entries) in regions east and west, 0.5 Gbit/s and
    40 ms between them, 5 Gbit/s and 2 ms inside a region, and ``links`` (more YAML keys)."""
    p = tmp_path / "f.yaml"
    pairs = (
        "pairs:\n  - {region_a: east, region_b: west, delay_ms: 40, bandwidth_gbps: 0.5}\n"
        "intra_delay_ms: 2\nintra_bandwidth_gbps: 5\n"
    )
    p.write_text("devices:\n" + "".join(f"  - {d}\n" for d in devices) + pairs + links)
    return p


def test_bound_below_every_enumerated_plan(tmp_path):
    """Four GPUs of two types in two regions: every placement, shape, micro-batch,
    recomputation, schedule and layer split, each at least its shape's bound."""
    devices = ["{region: east, gpu: A100, host: a}"] * 2 + ["{region: west, gpu: T4}"] * 2
    p = _east_west(tmp_path, devices, "intra_host_bandwidth_gbps: 1000\n")
    cluster = with_link_sharing(load_topology(p), "tc_class")
    model = get_model("gpt3_xl", 2)
    planner = Planner(cluster, model, 4, compute_model(model, set(cluster.gpus)))
    net = bounds._Network(cluster)
    n, checked = cluster.num_devices, 0
    for pp in (1, 2):
        splits = [(2,)] if pp == 1 else [(1, 1)]
        for dp in (1, 2, 4):
            if pp * dp > n:
                continue
            for devs in itertools.permutations(range(n), pp * dp):
                stages = np.asarray(devs, dtype=np.int64).reshape(pp, dp)
                for mbs in (1, 2):
                    if (4 // dp) % mbs:
                        continue
                    low = bounds.shape_lower_bound_s(planner, pp, dp, mbs, net)
                    for sch, rc, split in itertools.product(SCHEDULES, RECOMPUTE, splits):
                        c = planner.evaluate("enum", stages, split, mbs, rc, sch, 1)
                        if math.isfinite(c.iter_time_s):
                            assert c.iter_time_s >= low * (1 - 1e-9), (pp, dp, mbs, sch, rc)
                            checked += 1
    assert checked > 100


def test_exchange_term_by_hand(tmp_path):
    """Two regions of four one-GPU machines (5 Gbit/s inside, 0.5 between): eight members
    must be four and four, so each sender shares 0.5 Gbit/s among four peers of the other
    region: at least 4 / 0.5e9 s per bit of a shard sent twice."""
    p = _east_west(tmp_path, ["east"] * 4 + ["west"] * 4)
    net = bounds._Network(with_link_sharing(load_topology(p), "tc_class"))
    assert net.min_peers_per_bps(8) == pytest.approx(4 / 0.5e9, rel=1e-9)
    # four members fit one region: three peers at 5 Gbit/s
    assert net.min_peers_per_bps(4) == pytest.approx(3 / 5e9, rel=1e-9)
    assert net.exchange_s(8, 1e6) == pytest.approx(0.002 + 16e6 * 4 / 0.5e9, rel=1e-9)
    pair = bounds._Network(with_link_sharing(load_topology(p), "pair"))
    assert pair.exchange_s(8, 1e6) == pytest.approx(0.002 + 16e6 / 5e9, rel=1e-9)


def _two_regions(tmp_path):
    """Four A100s on one machine in east, four T4s on one machine in west, 0.5 Gbit/s between."""
    devices = ["{region: east, gpu: A100, host: a}"] * 4 + ["{region: west, gpu: T4, host: b}"] * 4
    p = _east_west(tmp_path, devices, "intra_host_bandwidth_gbps: 1000\n")
    cluster = with_link_sharing(load_topology(p), "tc_class")
    model = get_model("gpt3_xl", 4)
    return Planner(cluster, model, 8, compute_model(model, set(cluster.gpus)))


def test_placement_cases_by_hand(tmp_path):
    """Two pipelines of two stages fit the A100 machine, so inside one region every stage group
    may be all A100; four do not, two of them then sit on the T4s and every stage group holds
    two T4s (the sorted fleet alone would allow four A100s in the first). A pipeline that
    crosses sends each message over the 0.5 Gbit/s link. A one-stage pipeline crosses
    nothing."""
    planner = _two_regions(tmp_path)
    a100, t4 = planner._rates[1].max(), planner._rates[1].min()
    assert a100 > t4
    act_bits = 8.0 * 2 * planner.model.seq_length * planner.model.hidden_size
    two = bounds.placement_cases(planner, 2, 2, 1)
    assert two["crossing"]["link_floor_s"] == pytest.approx(act_bits / 0.5e9, rel=1e-12)
    assert list(two["inside"]["slowest"]) == [a100, a100]
    assert list(two["inside"]["region_caps"]) == [2, 2]
    four = bounds.placement_cases(planner, 2, 4, 1)
    assert list(four["inside"]["slowest"]) == [t4, t4]
    # five pipelines of two stages do not fit two regions of four GPUs: every placement crosses
    assert set(bounds.placement_cases(planner, 2, 5, 1)) == {"crossing"}
    assert set(bounds.placement_cases(planner, 1, 8, 1)) == {"inside"}
    # each case's terms are at least the terms without one, and the shape's bound their least
    for pp, dp in ((2, 2), (2, 4), (4, 2)):
        plain = max(bounds.shape_terms_s(planner, pp, dp, 1).values())
        cases = bounds.placement_cases(planner, pp, dp, 1)
        each = [
            max(bounds.shape_terms_s(planner, pp, dp, 1, **kw).values()) for kw in cases.values()
        ]
        assert min(each) >= plain * (1 - 1e-12)
        assert bounds.shape_lower_bound_s(planner, pp, dp, 1) == min(each)
    assert max(bounds.shape_terms_s(planner, 2, 4, 1, **four["inside"]).values()) > max(
        bounds.shape_terms_s(planner, 2, 4, 1).values()
    )


def test_placement_cases_need_regions_set_by_links(tmp_path):
    """One region, or a machine in two regions (which a topology file refuses, but a cluster
    built in code may hold): one case, the plain terms."""
    import dataclasses

    planner = _two_regions(tmp_path)
    assert set(bounds.placement_cases(planner, 2, 2, 1)) == {"crossing", "inside"}
    cluster = planner.cluster
    # machine 0 holds the four east GPUs and one west GPU; machine 1 the other three west
    spanning = dataclasses.replace(cluster, host_of=(0, 0, 0, 0, 0, 1, 1, 1))
    assert not bounds._Network(spanning).regional
    from system.planner.fleets import fleet

    whole = fleet(64)
    first = whole["devices"][0]["region"]
    one = {**whole, "devices": [d for d in whole["devices"] if d["region"] == first], "pairs": []}
    q = tmp_path / "one.json"
    q.write_text(json.dumps(one))
    cluster = with_link_sharing(load_topology(q), "tc_class")
    model = get_model("gpt3_xl", 4)
    planner = Planner(cluster, model, 8, compute_model(model, set(cluster.gpus)))
    assert bounds.placement_cases(planner, 2, 2, 1) == {"any": {}}


def test_the_iteration_bound_is_the_least_shape_bound(tmp_path):
    """Shapes taken in the order of their plain terms and left once those reach the least found:
    the least over every shape all the same."""
    from system.planner.fleets import fleet

    p = tmp_path / "f.json"
    p.write_text(json.dumps(fleet(64)))
    cluster = with_link_sharing(load_topology(p), "tc_class")
    model = get_model("gpt3_xl", 16)
    planner = Planner(cluster, model, 256, compute_model(model, set(cluster.gpus)))
    every = min(bounds.shape_lower_bound_s(planner, *k) for k in bounds._shapes(planner))
    assert bounds.iteration_lower_bound_s(planner) == every
    plain = min(max(bounds.shape_terms_s(planner, *k).values()) for k in bounds._shapes(planner))
    assert every > plain  # the cases sharpen the bound on this fleet


def test_layout_exchange_by_region_counts_equals_the_pairwise_count(tmp_path):
    """On a fleet whose links are set per region pair, counting a sender's destinations per
    region gives the pairwise classes' bound exactly."""
    from system.planner.fleets import fleet

    p = tmp_path / "f.json"
    p.write_text(json.dumps(fleet(128)))
    cluster = with_link_sharing(load_topology(p), "tc_class")
    model = get_model("gpt3_xl", 8)
    planner = Planner(cluster, model, 64, compute_model(model, set(cluster.gpus)))
    rng = np.random.default_rng(0)
    for pp, dp in ((2, 16), (4, 8), (1, 32), (8, 4)):
        stages = rng.permutation(128)[: pp * dp].reshape(pp, dp)
        fast = bounds.layout_exchange_terms(planner, stages)[1]
        planner._bound_network.tc_class = False  # the pairwise count
        dense = bounds.layout_exchange_terms(planner, stages)[1]
        planner._bound_network.tc_class = True
        assert fast == pytest.approx(dense, rel=1e-12), (pp, dp)


@pytest.mark.slow
@pytest.mark.parametrize("gpus", [1024, 4096])
def test_bound_at_scale_is_the_committed_one_and_below_its_plan(gpus):
    fleet = ROOT / "system" / "data" / "fleets" / f"mixed-{gpus}.json"
    cluster = with_link_sharing(load_topology(fleet, max_devices=gpus), "tc_class")
    model = get_model("gpt3_xl", 40)
    planner = Planner(cluster, model, gpus, compute_model(model, set(cluster.gpus)))
    got = planner.lower_bound_s()
    rec = json.loads((ROOT / "results" / "planner" / f"mixed-{gpus}-plan.json").read_text())
    assert rec["lower_bound_s"] == pytest.approx(got, rel=1e-9)
    assert 2.0 < got <= rec["iteration_time_s"]
