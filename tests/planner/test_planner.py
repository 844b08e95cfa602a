"""The planner (system/planner): fleet files, never slower than a heuristic, the enumerated
optimum on small fleets, the cost objective's time cap, plan.json back through mode=simulate."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy as np
import pytest

from system.cases import load_topology
from system.planner.compute import compute_model
from system.planner.search import HEURISTICS, RECOMPUTE, SCHEDULES, Planner
from system.workload import get_model

ROOT = Path(__file__).resolve().parents[2]
FLEET = ROOT / "system" / "data" / "fleets" / "four-regions.yaml"

PAIRS = """pairs:
  - {region_a: east, region_b: west, delay_ms: 40, bandwidth_gbps: 0.5}
intra_delay_ms: 2
intra_bandwidth_gbps: 5
"""


def _fleet(tmp_path: Path, devices: list[str], extra: str = "", name: str = "f.yaml") -> Path:
    body = "devices:\n" + "".join(f"  - {d}\n" for d in devices) + PAIRS + extra
    p = tmp_path / name
    p.write_text(body)
    return p


def test_fleet_file_types_hosts_and_links(tmp_path):
    p = _fleet(
        tmp_path,
        [
            "east",
            "{region: east, gpu: A100, host: h1}",
            "{region: east, gpu: A100, host: h1}",
            "{region: west, gpu: T4, host: 7}",
        ],
        "intra_host_bandwidth_gbps: 600\nintra_host_delay_ms: 0.01\n",
    )
    c = load_topology(p)
    assert c.gpus == ("V100", "A100", "A100", "T4")
    assert c.host_of == (0, 1, 1, 2)
    assert c.bandwidth_gbps[1, 2] == 600 and c.delay_ms[1, 2] == 0.01
    assert c.bandwidth_gbps[0, 1] == 5 and c.delay_ms[0, 1] == 2  # same region, two machines
    assert c.bandwidth_gbps[0, 3] == 0.5 and c.delay_ms[2, 3] == 40


def test_fleet_file_of_region_names_is_unchanged(tmp_path):
    c = load_topology(_fleet(tmp_path, ["east", "east", "west"]))
    assert c.gpu_of is None and c.host_of == (0, 1, 2)


def test_committed_fleet_has_three_types_on_hosts_of_4_and_8_in_four_regions():
    c = load_topology(FLEET)
    assert len(set(c.gpus)) == 3 and len(c.regions) == 4
    per_host = {h: c.host_of.count(h) for h in set(c.host_of)}
    assert set(per_host.values()) == {4, 8}


@pytest.mark.parametrize(
    "entry, what",
    [
        ("{region: east, gpu: H900}", "unknown GPU type"),
        ("{region: east, gpus: A100}", "unknown key"),
        ("{gpu: A100}", "needs a region"),
        ("{region: 5}", "region must be a name"),
        ("{region: 'ea;st'}", "not a plain name"),
        ("{region: east, host: true}", "host must be a name or a number"),
        ("{region: west, host: h1}", "already in region"),
        ("[east]", "expected a region name"),
    ],
)
def test_bad_device_entry_is_one_line_naming_file_and_entry(tmp_path, entry, what):
    p = _fleet(tmp_path, ["{region: east, host: h1}", entry])
    with pytest.raises(ValueError) as e:
        load_topology(p)
    msg = str(e.value)
    assert what in msg and str(p) in msg and "devices[1]" in msg and "\n" not in msg


def test_intra_host_delay_without_bandwidth_is_refused(tmp_path):
    p = _fleet(tmp_path, ["east", "west"], "intra_host_delay_ms: 1\n")
    with pytest.raises(ValueError, match="intra_host_delay_ms needs intra_host_bandwidth_gbps"):
        load_topology(p)


def _profiles(folder: Path) -> Path:
    """Sailor-format profiles of a 3-layer model (h 1024, s 2048): A100-40 at half its FP16
    peak (tensor cores), V100-16 at 10 TFLOPS (below its FP32 peak: an FP32 profile)."""
    folder.mkdir()
    s, h = 2048, 1024
    flops = 24.0 * s * h * h + 4.0 * s * s * h  # forward, one sequence
    total = {"A100-40": 3.0 * flops / (0.5 * 312e12), "V100-16": 3.0 * flops / 10e12}
    prof = {
        "M": {
            g: {"1": {"1": {str(k): [t / 3, 2 * t / 3, 0.01] for k in range(3)}}}
            for g, t in total.items()
        }
    }
    (folder / "profiles_tmp.json").write_text(json.dumps(prof))
    cfg = {"hidden_size": h, "sequence_length": s, "num_layers": 1, "num_all_layers": 3}
    cfg.update({"vocab_size": 1000, "heads": 8, "model": "M"})
    (folder / "training_config_m.json").write_text(json.dumps(cfg))
    return folder


def test_compute_source_per_type_from_profiles(tmp_path):
    """A type with a tensor-core profile row gets its measured efficiency; an FP32 profile and
    an unprofiled type the shared one; every row says which."""
    m = compute_model(get_model("gpt3_xl", 8), {"A100", "V100", "T4"}, _profiles(tmp_path / "p"))
    rows = {r["gpu"]: r for r in m.rows()}
    assert rows["A100"]["compute_source"].startswith("profile: M")
    assert m.rate("A100", 1) == pytest.approx(0.5 * 312e12)
    assert "FP32" in rows["V100"]["compute_source"]
    assert m.rate("V100", 1) == pytest.approx(0.30 * 125e12)
    assert rows["T4"]["compute_source"].startswith("peak")
    plain = compute_model(get_model("gpt3_xl", 8), {"A100"})
    assert plain.rate("A100", 1) == pytest.approx(312e12 * 0.30)


# ---- small fleets: heuristics and the enumerated optimum ---------------------------------------
def _small(tmp_path: Path, devices: list[str]):
    """A small fleet under the project's default link sharing (``tc_class``, under which the
    lower bound also charges the data-parallel exchange)."""
    from system.simulator.sharing import with_link_sharing

    fleet = load_topology(_fleet(tmp_path, devices, "intra_host_bandwidth_gbps: 1000\n"))
    return with_link_sharing(fleet, "tc_class")


SMALL_FLEETS = {
    "two types, two regions": [
        "{region: east, gpu: A100, host: a}",
        "{region: east, gpu: A100, host: a}",
        "{region: west, gpu: T4, host: b}",
        "{region: west, gpu: T4, host: b}",
    ],
    "three types": [
        "{region: west, gpu: T4}",
        "{region: east, gpu: V100, host: a}",
        "{region: east, gpu: A100, host: a}",
        "{region: west, gpu: A100}",
    ],
}


def _enumerate(planner: Planner):
    """The best iteration time over every placement of every shape on every device subset,
    every micro-batch, recomputation, schedule and layer split (fewest rounds that fit)."""
    n, layers = planner.cluster.num_devices, planner.model.num_layers
    best = None
    for pp in range(1, min(n, layers) + 1):
        for dp in range(1, n // pp + 1):
            if planner.batch % dp:
                continue
            splits = [
                c for c in itertools.product(range(1, layers + 1), repeat=pp) if sum(c) == layers
            ]
            for devs in itertools.permutations(range(n), pp * dp):
                stages = np.asarray(devs, dtype=np.int64).reshape(pp, dp)
                for mbs in planner.micro_batch_sizes:
                    if (planner.batch // dp) % mbs:
                        continue
                    m = planner.batch // (dp * mbs)
                    for sch, rc, split in itertools.product(SCHEDULES, RECOMPUTE, splits):
                        usable = planner.usable[stages].min(axis=1)
                        rounds = 1
                        if sch == "gpipe":
                            ok = [
                                r
                                for r in range(1, m + 1)
                                if m % r == 0
                                and planner.fits(split, usable, [m // r] * pp, mbs, rc) is not None
                            ]
                            if not ok:
                                continue
                            rounds = ok[0]
                        c = planner.evaluate("enum", stages, split, mbs, rc, sch, rounds)
                        if best is None or c.iter_time_s < best.iter_time_s:
                            best = c
    return best


@pytest.mark.slow
@pytest.mark.parametrize("fleet", sorted(SMALL_FLEETS))
def test_plan_never_slower_than_a_heuristic_and_near_the_enumerated_optimum(tmp_path, fleet):
    cluster = _small(tmp_path, SMALL_FLEETS[fleet])
    model = get_model("gpt3_xl", 3)
    compute = compute_model(model, set(cluster.gpus))
    kw = dict(time_limit_s=120.0, micro_batch_sizes=(1, 2))
    planner = Planner(cluster, model, 4, compute, **kw)
    result = planner.run()
    assert result.search_time_s < 120.0  # finished, not cut off
    for name in HEURISTICS:
        h = result.heuristics[name]
        if h is not None:
            assert result.best.iter_time_s <= h.iter_time_s + 1e-12, name
    found = _enumerate(Planner(cluster, model, 4, compute, **kw))
    optimum = found.iter_time_s
    gap = result.best.iter_time_s / optimum - 1.0
    print(
        f"{fleet}: plan {result.best.iter_time_s:.4f} s {result.best.config()} "
        f"{result.best.stages.tolist()} {result.best.layers}; optimum {optimum:.4f} s "
        f"{found.config()} {found.stages.tolist()} {found.layers}; gap {gap:.2%}"
    )
    assert gap >= -1e-9  # the enumeration holds every plan the planner can make
    assert gap <= 0.02
    assert result.lower_bound_s <= optimum


# V100 (37.5 TFLOPS sustained at $3.06 an hour) beside L4 (36.3 at $1.67): the fastest plan
# uses all four GPUs, the cheapest only the L4s
COST_FLEET = ["{region: east, gpu: V100, host: a}"] * 2 + ["{region: east, gpu: L4, host: b}"] * 2


@pytest.mark.slow
def test_cost_objective_respects_max_iter_time(tmp_path):
    cluster = _small(tmp_path, COST_FLEET)
    model = get_model("gpt3_xl", 4)
    compute = compute_model(model, set(cluster.gpus))
    fast = Planner(cluster, model, 8, compute, time_limit_s=60).run().best
    cheap = Planner(cluster, model, 8, compute, objective="cost", time_limit_s=60).run().best
    assert cheap.cost_usd <= fast.cost_usd + 1e-12
    assert cheap.iter_time_s > fast.iter_time_s  # the fleet is made so: a cap to respect
    cap = 0.5 * (fast.iter_time_s + cheap.iter_time_s)
    capped = Planner(
        cluster, model, 8, compute, objective="cost", max_iter_time_s=cap, time_limit_s=60
    ).run()
    assert capped.best.iter_time_s <= cap
    for h in capped.heuristics.values():
        assert h is None or h.iter_time_s <= cap


@pytest.mark.slow
def test_mode_plan_writes_a_plan_that_mode_simulate_reads_back(tmp_path):
    from repro.run import run

    fleet = _fleet(
        tmp_path,
        ["{region: east, gpu: A100, host: a}"] * 2 + ["{region: west, gpu: T4, host: b}"] * 2,
        "intra_host_bandwidth_gbps: 1000\n",
    )
    out = tmp_path / "plan.json"
    common = {"case": str(fleet), "results_dir": str(tmp_path / "r")}
    run({"mode": "plan", "layers": 4, "batch": 8, "time_limit_s": 30, "out": str(out), **common})
    rec = json.loads(out.read_text())
    for key in (
        "iteration_time_s",
        "cost_per_iteration_usd",
        "heuristics",
        "stages",
        "layers_per_stage",
        "devices_used",
        "config",
        "memory_per_device_bytes",
        "search_time_s",
        "lower_bound_s",
    ):
        assert key in rec, key
    assert all(v is None or rec["iteration_time_s"] <= v for v in rec["heuristics"].values())
    assert sum(rec["layers_per_stage"]) == 4
    got = run({"mode": "simulate", "plan": str(out), **common})
    assert got["iteration_time_s"] == pytest.approx(rec["iteration_time_s"], rel=1e-12)


def test_synthetic_fleet_is_a_topology_file(tmp_path):
    from system.planner.fleets import fleet

    p = tmp_path / "f.json"
    p.write_text(json.dumps(fleet(128)))
    c = load_topology(p)
    assert c.num_devices == 128 and sorted(set(c.gpus)) == ["A100", "L4", "T4", "V100"]
    assert all(c.gpus.count(g) == 32 for g in set(c.gpus))
    per_host = {h: c.host_of.count(h) for h in set(c.host_of)}
    assert set(per_host.values()) == {4, 8}
    with pytest.raises(ValueError, match="multiple of 64"):
        fleet(100)


def test_time_limit_cuts_the_search_and_says_so(tmp_path, monkeypatch):
    """A limit too short for the heuristics' searches: the plan is still never slower than a
    heuristic that reported, and the cut ones are listed. The search's clock moves 1 ms at
    every reading, so the limit strikes after 500 readings however fast the machine is."""
    import system.planner.search as search
    from system.planner.fleets import fleet

    p = tmp_path / "f.json"
    p.write_text(json.dumps(fleet(64)))
    cluster = load_topology(p)
    model = get_model("gpt3_xl", 8)
    ticks = itertools.count()

    class Clock:
        @staticmethod
        def perf_counter():
            return 0.001 * next(ticks)

    monkeypatch.setattr(search, "time", Clock)
    got = Planner(
        cluster, model, 64, compute_model(model, set(cluster.gpus)), time_limit_s=0.5
    ).run()
    assert got.time_cut and got.search_time_s < 30
    assert got.heuristics_cut  # 500 readings are too few for four full searches of 64 devices
    reported = [h for h in got.heuristics.values() if h is not None]
    assert reported  # and some ended before the limit
    assert all(got.best.iter_time_s <= h.iter_time_s for h in reported)


def test_stagewise_layout_keeps_each_stage_in_few_regions(tmp_path):
    # four V100s in each of two regions: stage-major, each stage's group is one region
    devices = [f"{{region: {r}, gpu: V100, host: {r}}}" for r in ("east", "west") for _ in range(4)]
    cluster = load_topology(str(_fleet(tmp_path, devices)))
    model = get_model("gpt3_xl", 4)
    planner = Planner(cluster, model, 8, compute_model(model, set(cluster.gpus)))
    pool = list(range(cluster.num_devices))
    region = np.asarray(cluster.region_of)
    by_stage = planner.stagewise(pool, 2, 4, "west")
    assert [sorted(set(region[row])) for row in by_stage] == [["west"], ["east"]]
    by_pipeline = planner.anchored(pool, 2, 4, "west")
    assert all(len(set(region[col])) == 1 for col in by_pipeline.T)  # each pipeline in one
    assert planner.stagewise(pool, 3, 3, "east") is None  # more devices than the pool
    assert "stagewise" in planner.layouts


@pytest.mark.slow
def test_a_budgeted_search_gives_the_same_plan_however_fast_the_clock_runs(tmp_path, monkeypatch):
    """With a work budget the phases end by the work charged, not the clock: a clock ten
    times slower or faster gives the same plan, the same simulations and the same charge,
    within the budget; the time limit is then only a safety stop, reported when it strikes."""
    import system.planner.search as search
    from system.planner.fleets import fleet

    p = tmp_path / "f.json"
    p.write_text(json.dumps(fleet(64)))
    cluster = load_topology(p)
    model = get_model("gpt3_xl", 8)
    compute = compute_model(model, set(cluster.gpus))
    real = search.time.perf_counter

    def run(speed: float, budget, limit_s: float = 600.0):
        start = real()

        class Clock:  # the search's clock, running ``speed`` times as fast as the real one
            @staticmethod
            def perf_counter():
                return start + speed * (real() - start)

        monkeypatch.setattr(search, "time", Clock)
        got = Planner(
            cluster, model, 64, compute, time_limit_s=limit_s, budget_device_sims=budget
        ).run()
        monkeypatch.setattr(search, "time", __import__("time"))
        return got

    def plan_of(r):
        b = r.best
        return (b.stages.tobytes(), b.layers, b.micro_batch_size, b.recompute, b.schedule)

    budget = 8_000  # a few dozen simulations of this fleet: the phases end by the budget
    slow, fast = run(0.1, budget), run(10.0, budget)
    assert plan_of(slow) == plan_of(fast)
    assert slow.simulations == fast.simulations and slow.spent_device_sims == fast.spent_device_sims
    assert slow.heuristics_cut == fast.heuristics_cut and slow.heuristics_cut
    assert slow.skipped == fast.skipped > 0  # entries past a phase's share are left out
    assert budget * 0.9 <= slow.spent_device_sims <= budget
    assert not slow.time_cut and not fast.time_cut
    for h in slow.heuristics.values():
        assert h is None or slow.best.iter_time_s <= h.iter_time_s
    cut = run(1000.0, budget, limit_s=60.0)  # a clock past the limit at once: a safety stop
    assert cut.time_cut


def test_a_pool_s_shapes_include_each_smaller_pool_s_fullest_shapes(tmp_path):
    """Past the small-fleet size a pool's shapes are its fullest ones and the layer divisors;
    the planner's layouts also take, from each pool, the fullest shapes of every smaller pool
    size (the same shape placed with this pool's devices)."""
    from system.planner.fleets import fleet

    p = tmp_path / "f.json"
    p.write_text(json.dumps(fleet(256)))
    cluster = load_topology(p)
    model = get_model("gpt3_xl", 40)
    planner = Planner(cluster, model, 1024, compute_model(model, set(cluster.gpus)))
    sizes = [len(pool) for _, pool in planner.pools()]
    n = max(s for s in sizes if s < cluster.num_devices)
    got = planner.pool_shapes(n, sizes)
    assert len(got) == len(set(got)) and set(planner.shapes(n)) <= set(got)
    want = set(planner.shapes(n))
    for m in sizes:
        for dp in range(1, min(m, 1024) + 1):
            top = min(40, m // dp)
            if m < n and 1024 % dp == 0 and top >= 1 and top * dp * 2 > m:
                want.add((top, dp))
    assert set(got) == want
    assert set(got) - set(planner.shapes(n))  # shapes a smaller pool fills, new to this pool
