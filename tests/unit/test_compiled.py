"""The numba kernels: compiled at their first call only, and equal to their Python source."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from baselines.megatron.schedule import megatron_1f1b_program
from system.cost.matching import _values
from system.cost.partition import _lower_edges
from system.cost.tsp import _open_values
from system.simulator.collectives import _tree_pass, _trees
from system.simulator.gpipe_timeline import _chains, gpipe_timeline
from system.simulator.replay import _cycles, _programs, _replay_kernel

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_numba_is_imported_at_a_kernels_first_call_only():
    code = (
        "import sys, numpy as np\n"
        "import repro.run, system.emulation, system.cost.tsp as t\n"
        "assert 'numba' not in sys.modules, 'imported before any kernel ran'\n"
        "t.open_tsp_values(np.ones((1, 3, 3)))\n"
        "assert 'numba' in sys.modules\n"
    )
    env = {"PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"}
    r = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0, r.stderr[-2000:]


def _both(fn, *args):
    """(compiled result, interpreted result) of a kernel writing into its last argument(s)."""
    compiled = [np.array(a, copy=True) if isinstance(a, np.ndarray) else a for a in args]
    python = [np.array(a, copy=True) if isinstance(a, np.ndarray) else a for a in args]
    got = fn(*compiled)
    want = fn.__wrapped__(*python)
    return (got, compiled), (want, python)


def test_held_karp_compiled_equals_its_source():
    w = np.random.default_rng(0).random((6, 6, 6))
    (_, c), (_, p) = _both(_open_values, w, np.empty(6), np.empty((64, 6)))
    assert np.array_equal(c[1], p[1]) and np.array_equal(c[2], p[2])


@pytest.mark.parametrize("n", [1, 4, 6])
def test_bottleneck_values_compiled_equal_their_source(n):
    rng = np.random.default_rng(n)
    mats = np.concatenate([rng.random((5, n, n)), rng.integers(0, 3, (5, n, n)).astype(float)])
    (_, c), (_, p) = _both(_values, mats, np.empty(len(mats)))
    assert np.array_equal(c[1], p[1])


def test_lower_edges_compiled_equal_their_source():
    rng = np.random.default_rng(1)
    link = rng.random((12, 12))
    groups = np.array([rng.permutation(12).reshape(4, 3) for _ in range(5)])
    (got, _), (want, _) = _both(_lower_edges, link, groups)
    assert np.array_equal(got, want)


@pytest.mark.parametrize("v", [1, 2])  # 2: virtual stages, p links (the wrap-around one)
def test_the_replay_compiled_equals_its_source(v):
    from baselines.megatron.schedule import megatron_interleaved_program

    p, m = 4, 8
    rng = np.random.default_rng(2)
    links = p - 1 if v == 1 else p
    start = rng.random(p)  # each stage's first op may wait
    times = [rng.random(p), rng.random(p), *[rng.random(links) for _ in range(6)], start]
    fn = megatron_1f1b_program if v == 1 else megatron_interleaved_program(v)
    prog = _programs(p, m, fn)
    for rendezvous in (False, True):
        (got, _), (want, _) = _both(_replay_kernel, *prog, *times, rendezvous)
        assert got[2] and want[2]
        assert np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1])


@pytest.mark.parametrize("p, m, v", [(2, 2, 2), (3, 9, 2), (4, 8, 3), (4, 12, 2), (5, 10, 4)])
def test_the_interleaved_program_compiled_equals_its_source(p, m, v):
    from baselines.megatron.schedule import _interleaved_kernel, _schedule_table

    tab_i, tab_c = np.array(_schedule_table(m, v, p), dtype=np.int64).reshape(-1, 2).T
    (got, _), (want, _) = _both(_interleaved_kernel, p, m, v, tab_i.copy(), tab_c.copy())
    assert got[-2] == want[-2] == 0  # built
    assert all(np.array_equal(a, b) for a, b in zip(got[:-2], want[:-2], strict=True))


@pytest.mark.parametrize("n", [2, 5, 8])
def test_the_tree_all_reduce_compiled_equals_its_source(n):
    """Both trees, entry times with ties and a NaN (numpy's maximum: NaN wins)."""
    rng = np.random.default_rng(n)
    trees = _trees(n, False)
    e = np.round(rng.random((3, n)), 1)
    e[2, 0] = np.nan
    up, down = rng.random((3, n - 1)), rng.random((3, n - 1))
    for t in range(len(trees.parents)):
        tree = (trees.parents[t], trees.orders[t], trees.cols[t])
        (got, _), (want, _) = _both(_tree_pass, e, *tree, up, down)
        assert np.array_equal(got, want, equal_nan=True)
        assert np.isnan(got[2]).any() and not np.isnan(got[:2]).any()


def _closed_form(arrival, cost, free_at):
    """X[i] = max(X[i-1], arrival[i]) + cost, X[-1] = free_at, as numpy arrays compute it."""
    k = np.arange(arrival.shape[0], dtype=float)[:, None]
    run = np.maximum.accumulate(arrival - k * cost[None, :], axis=0)
    return (k + 1.0) * cost[None, :] + np.maximum(run, free_at[None, :])


@pytest.mark.parametrize("p", [1, 2, 5])
def test_the_gpipe_timeline_compiled_equals_its_source_and_the_closed_form(p):
    """The kernel against its own Python source, and the timeline against the closed form
    written with numpy's running maximum (ties and a -inf receive notice included)."""
    rng = np.random.default_rng(p)
    r, m = 3, 9
    f, b = np.round(rng.random((p, r)), 1), rng.random((p, r))
    start = rng.random((p, r))
    link_f, link_b = rng.random((p - 1, r)), np.round(rng.random((p - 1, r)), 1)
    lat_f, lat_b = link_f * rng.random((p - 1, r)), link_b * rng.random((p - 1, r))
    notice_f, notice_b = rng.random((p - 1, r)), np.full((p - 1, r), -np.inf)
    open_f = start[1:] + notice_f
    chains = 2 * p - 1
    arrive = np.where(np.arange(chains)[:, None] % 2, rng.random((chains, r)), np.nan)
    args = (start[0], np.round(rng.random((chains, r)), 1), rng.random((chains, r)), arrive, m)
    (got, _), (want, _) = _both(_chains, *args)
    assert np.array_equal(got, want)
    got = gpipe_timeline(
        f,
        b,
        link_f,
        link_b,
        m,
        start_s=start,
        notice_fwd_s=notice_f,
        latency_fwd_s=lat_f,
        latency_bwd_s=lat_b,
    )
    fwd, bwd = np.empty((p, r)), np.empty((p, r))
    arrival = np.broadcast_to(start[0], (m, r))
    for s in range(p):
        done = _closed_form(arrival, f[s], start[s])
        fwd[s] = done[-1]
        if s < p - 1:
            arrival = _closed_form(done, link_f[s] - lat_f[s], open_f[s]) + lat_f[s]
    arrival = np.broadcast_to(fwd[p - 1], (m, r))
    for s in range(p - 1, -1, -1):
        done = _closed_form(arrival, b[s], fwd[s])
        bwd[s] = done[-1]
        if s > 0:
            free = fwd[s - 1] + notice_b[s - 1]
            arrival = _closed_form(done, link_b[s - 1] - lat_b[s - 1], free) + lat_b[s - 1]
    assert np.array_equal(got.fwd_end_s, fwd) and np.array_equal(got.bwd_end_s, bwd)


def test_the_cycle_search_compiled_equals_its_source():
    """Period 3 in one column, none in another (a drift), period 1 in a constant one."""
    rng = np.random.default_rng(3)
    w = np.stack([np.tile(rng.random(3), 8), np.arange(24.0), np.full(24, 0.5)], axis=1)
    (got, _), (want, _) = _both(_cycles, w, 8)
    assert np.array_equal(got, want) and got.tolist() == [3, -1, 1]
