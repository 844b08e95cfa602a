"""GPU types, the mixed-fleet case and the iteration-time surrogate objective."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from system.cases import cluster_from_files, get_case
from system.cluster import Cluster
from system.cost.iteration import ACHIEVABLE, IterationTimeEvaluator, split_layers
from system.gpus import GPU_TYPES, get_gpu
from system.scheduler import schedule
from system.workload import MODELS, Workload, tasklet_sizes


@given(
    st.lists(st.floats(0.5, 8.0), min_size=2, max_size=4),
    st.integers(4, 12),
    st.lists(st.integers(1, 8), min_size=4, max_size=4),
)
def test_split_layers_is_the_min_max_optimum(speeds, layers, caps):
    caps = caps[: len(speeds)]
    got = split_layers(speeds, caps, layers)
    best = None
    for split in itertools.product(*[range(1, c + 1) for c in caps]):
        if sum(split) == layers:
            t = max(n / v for n, v in zip(split, speeds, strict=True))
            best = t if best is None else min(best, t)
    if best is None:
        assert got is None
    else:
        assert got is not None and got.sum() == layers and np.all(got <= caps)
        assert max(got / np.asarray(speeds)) == pytest.approx(best, rel=1e-12)


def test_gpu_types_and_the_mixed_fleet_case():
    assert get_gpu("A100").peak_flops > get_gpu("V100").peak_flops > get_gpu("T4").peak_flops
    with pytest.raises(ValueError, match="unknown GPU type 'H900'"):
        get_gpu("H900")
    c = get_case("mixed")
    assert c.num_devices == 64 and set(c.gpus) == {"V100", "A100", "T4", "L4"}
    assert c.peak_flops()[0] == GPU_TYPES["A100"].peak_flops
    assert c.subset([0, 40]).gpus == ("A100", "T4")
    assert get_case("5").gpus == ("V100",) * 64  # no type named: the paper's V100
    with pytest.raises(ValueError, match="gpu_of has 1 entries"):
        Cluster(
            name="x",
            region_of=("a", "b"),
            host_of=(0, 1),
            gpu_of=("T4",),
            delay_ms=np.zeros((2, 2)),
            bandwidth_gbps=np.ones((2, 2)),
        )


def test_topology_files_carry_gpu_types(tmp_path):
    pairs = tmp_path / "pairs.csv"
    pairs.write_text("region_a,region_b,delay_ms,bandwidth_gbps\na,b,10,1\na,a,1,10\nb,b,1,10\n")
    devices = tmp_path / "devices.csv"
    devices.write_text("region,host,gpu\na,0,A100\na,0,A100\nb,1,T4\nb,1,T4\n")
    c = cluster_from_files(pairs, devices)
    assert c.gpus == ("A100", "A100", "T4", "T4")
    devices.write_text("region,gpu\na,A100\nb,B200\n")
    with pytest.raises(ValueError, match="unknown GPU type 'B200'"):
        cluster_from_files(pairs, devices)


@pytest.mark.slow
def test_iteration_time_objective_separates_fast_and_slow_gpus():
    c = get_case("mixed").subset(list(range(0, 64, 4)))  # 4 A100, 4 V100, 4 T4, 4 L4
    work = Workload(model=MODELS["gpt3_xl"], global_batch_size=64)
    sizes = tasklet_sizes(work, 4, 4)
    r = schedule(c, sizes, pp=4, dp=4, seed=0, objective="iteration_time", workload=work)
    layers = r.stats["layers_per_stage"]
    assert sum(layers) == 24 and len(set(layers)) > 1  # uneven: faster stages hold more
    ev = IterationTimeEvaluator(c, sizes, pp=4, dp=4, workload=work)
    comm = schedule(c, sizes, pp=4, dp=4, seed=0)
    part = [tuple(sorted(comm.assignment.group(s))) for s in range(4)]
    assert r.stats["iteration_time_s"] <= ev.total(part) + 1e-9
    with pytest.raises(ValueError, match="needs a GA method and a Workload"):
        schedule(c, sizes, pp=4, dp=4, objective="iteration_time")
    with pytest.raises(ValueError, match="unknown objective"):
        schedule(c, sizes, pp=4, dp=4, objective="flops")


def test_stage_compute_runs_each_stage_at_its_slowest_gpu():
    from system.assignment import Assignment
    from system.simulator.hardware import stage_compute_for

    c = get_case("mixed").subset([0, 16, 32, 48])  # A100, V100, T4, L4
    work = Workload(model=MODELS["gpt3_xl"], global_batch_size=8)
    a = Assignment(np.array([[0, 1], [2, 3]]))  # stage 0: A100+V100, stage 1: T4+L4
    even = stage_compute_for(c, a, work, [12, 12])
    f, b, _ = even.per_stage(2)
    ratio_v100_t4 = GPU_TYPES["V100"].peak_flops / GPU_TYPES["T4"].peak_flops
    assert b[1] / b[0] > ratio_v100_t4 > 1  # T4 stage slower, plus the logits on the last one
    uneven = stage_compute_for(c, a, work, [16, 8])
    assert uneven.per_stage(2)[0][0] == pytest.approx(f[0] * 16 / 12)


def test_bench_scheduler_spot_variants_and_sections():
    from repro.checks.bench import scheduler as bench_scheduler
    from repro.config import validate

    for name in bench_scheduler.SPOT_VARIANTS:
        assert bench_scheduler.spot_variant(name).num_devices == 64
    assert set(bench_scheduler.SECTIONS) == {"plateau", "gaps", "quality", "scaling", "scale"}
    with pytest.raises(ValueError, match="sections.1.: Invalid value 'speed'"):
        validate({"mode": "bench_scheduler", "sections": ["plateau", "speed"]})


@settings(max_examples=20, deadline=None)
@given(st.integers(0, 2**32 - 1))
def test_cached_compute_term_equals_its_definition(seed):
    """compute_values (cached per multiset of group speeds and memory caps) equals
    (m + pp − 1) · max_g layers_g · flops / speed_g with the layer split in partition order."""
    c = get_case("mixed")
    work = Workload(model=MODELS["gpt3_xl"], global_batch_size=1024)
    ev = IterationTimeEvaluator(c, tasklet_sizes(work, 8, 8), pp=8, dp=8, workload=work)
    rng = np.random.default_rng(seed)
    parts = []
    for _ in range(30):
        perm = rng.permutation(64)
        parts.append([tuple(sorted(int(x) for x in perm[8 * g : 8 * g + 8])) for g in range(8)])
    got = ev.compute_values(parts)
    for p, value in zip(parts, got, strict=True):
        layers = ev.layers(p)
        speed = np.array([c.peak_flops()[list(g)].min() for g in p]) * ACHIEVABLE
        want = (ev.compute.micro_batches + 7) * (layers * ev.compute.layer_flops / speed).max()
        assert value == pytest.approx(want, rel=1e-12)
