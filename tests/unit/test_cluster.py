"""Cluster validation, derived clusters, and the five paper cases' numbers (paper §4.1)."""

from __future__ import annotations

import numpy as np
import pytest

from system.cases import CASE5_REGIONS, case_names, cluster_from_files, get_case
from system.cluster import Cluster


def _two(**kw):
    base = dict(
        name="t",
        region_of=("a", "b"),
        host_of=(0, 1),
        delay_ms=np.array([[0, 10.0], [10.0, 0]]),
        bandwidth_gbps=np.array([[0, 1.0], [1.0, 0]]),
    )
    base.update(kw)
    return Cluster(**base)


@pytest.mark.parametrize(
    "kw, msg",
    [
        (dict(delay_ms=np.zeros((3, 3))), "shape"),
        (dict(delay_ms=np.array([[0, 1.0], [2.0, 0]])), "not symmetric"),
        (dict(bandwidth_gbps=np.array([[0, 0.0], [0.0, 0]])), "must be > 0"),
        (dict(delay_ms=np.array([[0, -1.0], [-1.0, 0]])), "negative"),
        (dict(delay_ms=np.array([[0, np.inf], [np.inf, 0]])), "non-finite"),
        (dict(host_of=(0,)), "host_of"),
    ],
)
def test_bad_clusters_raise_one_clear_error(kw, msg):
    with pytest.raises(ValueError, match=msg):
        _two(**kw)


def _read_only(m):
    m = np.array(m, dtype=float)
    m.setflags(write=False)
    return m


def test_a_cluster_keeps_only_read_only_matrices_with_its_diagonal():
    # a caller's writable matrices are copied (left as they were); read-only float64 ones with
    # the cluster's diagonal (0 delay, inf bandwidth) are kept; others are copied and mended
    delay, bw = np.array([[5.0, 10.0], [10.0, 5.0]]), np.array([[0, 1.0], [1.0, 0]])
    c = _two(delay_ms=delay, bandwidth_gbps=bw)
    assert c.delay_ms is not delay and delay[0, 0] == 5.0 and delay.flags.writeable
    assert c.delay_ms[0, 0] == 0.0 and c.bandwidth_gbps[1, 1] == np.inf
    kept_delay = _read_only([[0, 10.0], [10.0, 0]])
    kept_bw = _read_only([[np.inf, 1.0], [1.0, np.inf]])
    k = _two(delay_ms=kept_delay, bandwidth_gbps=kept_bw)
    assert k.delay_ms is kept_delay and k.bandwidth_gbps is kept_bw
    m = _two(delay_ms=_read_only([[0, 10.0], [10.0, 0]]), bandwidth_gbps=_read_only(bw))
    assert m.bandwidth_gbps[0, 0] == np.inf and not m.bandwidth_gbps.flags.writeable
    for x in (c, k, m):  # the same cluster whichever way its matrices came
        assert np.array_equal(x.delay_ms, k.delay_ms) and np.array_equal(x.bandwidth_gbps, kept_bw)
    base = np.array([[0, 10.0], [10.0, 0]])
    view = base.view()
    view.setflags(write=False)
    assert _two(delay_ms=view).delay_ms is not view  # a view of a writable array: copied
    with pytest.raises(ValueError, match="not symmetric"):  # a kept matrix is still checked
        _two(delay_ms=_read_only([[0, 1.0], [2.0, 0]]))


def test_a_copy_or_subset_of_a_checked_cluster_is_not_checked_or_copied_again(monkeypatch):
    """A cluster's read-only matrices are checked once: dataclasses.replace keeps them and a
    subset hands over its principal submatrices (finite, symmetric, of the right signs because
    the whole is) without checking or copying them; anything else is still checked."""
    from dataclasses import replace

    import system.cluster as cluster_mod

    c = get_case("5")
    calls = []
    real = cluster_mod._check_values
    monkeypatch.setattr(cluster_mod, "_check_values", lambda *a: calls.append(a[0]) or real(*a))
    again = replace(c, description="again")
    assert again.delay_ms is c.delay_ms and again.bandwidth_gbps is c.bandwidth_gbps
    s = c.subset([5, 0, 17])
    assert not calls
    assert np.array_equal(s.delay_ms, c.delay_ms[np.ix_([5, 0, 17], [5, 0, 17])])
    assert np.array_equal(s.bandwidth_gbps, c.bandwidth_gbps[np.ix_([5, 0, 17], [5, 0, 17])])
    assert not s.delay_ms.flags.writeable and s.delay_ms.flags.owndata
    assert s.subset([2, 1]).bandwidth_gbps[0, 1] == c.bandwidth_gbps[17, 0] and not calls
    fresh = _read_only([[0, 1.0], [2.0, 0]])  # read-only, kept as handed over, never checked
    with pytest.raises(ValueError, match="not symmetric"):
        _two(delay_ms=fresh, bandwidth_gbps=_read_only([[np.inf, 1.0], [1.0, np.inf]]))
    assert calls == ["cluster 't'"]
    with pytest.raises(ValueError, match="only a read-only matrix"):
        cluster_mod._mark_checked(np.zeros((2, 2)))
    n = len(cluster_mod._CHECKED)
    del s
    assert len(cluster_mod._CHECKED) == n - 2  # a matrix gone takes its entry with it


def test_link_time_is_latency_plus_size_over_bandwidth():
    c = _two()
    t = c.link_time_s(1e9)  # 8 Gbit over 1 Gbit/s + 10 ms
    assert t[0, 1] == pytest.approx(8.010)
    assert t[0, 0] == 0.0
    assert not c.delay_ms.flags.writeable


def test_subset_scaled_and_permuted_keep_links():
    c = get_case("5")
    s = c.subset([0, 8, 16])
    assert s.regions == ("Oregon", "Virginia", "Ohio")
    assert s.delay_ms[0, 1] == 67 and s.bandwidth_gbps[0, 1] == pytest.approx(0.79)
    half = s.scaled(bandwidth_scale=0.5)
    assert half.bandwidth_gbps[0, 2] == pytest.approx(0.55)
    assert half.meta["bandwidth_scale"] == 0.5
    p = c.permuted(list(reversed(range(64))))
    assert p.delay_ms[63, 62] == c.delay_ms[0, 1]


@pytest.mark.parametrize("name", case_names())
def test_every_case_builds(name):
    c = get_case(name)
    n = 8 if name == "debug" else 64
    assert c.num_devices == n
    off = ~np.eye(n, dtype=bool)
    assert np.all(c.bandwidth_gbps[off] > 0)


def test_case_numbers_match_the_paper():
    c1 = get_case("1")
    assert (
        c1.num_hosts == 8 and c1.bandwidth_gbps[0, 8] == 25.0 and c1.bandwidth_gbps[0, 1] == 1200.0
    )
    c2 = get_case("2")
    assert (
        c2.num_hosts == 40 and c2.bandwidth_gbps[0, 1] == 100.0 and c2.bandwidth_gbps[0, 40] == 10.0
    )
    c3 = get_case("3")
    assert c3.delay_ms[0, 40] == 10.0 and c3.bandwidth_gbps[0, 40] == 1.12
    assert c3.bandwidth_gbps[0, 1] == 10.0
    c4 = get_case("4")
    assert c4.regions == ("Virginia", "Oregon", "California", "Ohio")
    assert c4.bandwidth_gbps[0, 16] == 1.15  # Virginia-Oregon, case-4 table
    c5 = get_case("5")
    assert c5.regions == CASE5_REGIONS
    assert c5.bandwidth_gbps[0, 8] == 0.79  # Oregon-Virginia, case-5 table
    assert c5.delay_ms[0, 1] == 5.0 and c5.bandwidth_gbps[0, 1] == 2.0
    # worldwide: 10-250 ms and 0.3-1.3 Gbit/s across regions (paper §4.1)
    across = np.not_equal.outer(np.array(c5.region_of), np.array(c5.region_of))
    assert c5.delay_ms[across].min() >= 10 and c5.delay_ms[across].max() <= 250
    assert c5.bandwidth_gbps[across].min() >= 0.3 and c5.bandwidth_gbps[across].max() <= 1.3


def test_authors_code_variant_differs_where_documented():
    assert get_case("5", "dtfm_code").delay_ms[0, 1] == 10.0
    c3 = get_case("3", "dtfm_code")
    assert c3.delay_ms[0, 40] == 11.0 and c3.bandwidth_gbps[0, 1] == 5.0
    assert get_case("1", "dtfm_code").bandwidth_gbps[0, 8] == pytest.approx(25 / 8)
    # only links between hosts carry the unit mix-up; inside a host their matrices hold 100
    assert get_case("1", "dtfm_code").bandwidth_gbps[0, 1] == 100.0
    c2 = get_case("2", "dtfm_code")
    assert c2.bandwidth_gbps[0, 1] == 100.0 and c2.bandwidth_gbps[0, 4] == pytest.approx(10 / 8)
    assert c2.bandwidth_gbps[32, 33] == pytest.approx(10 / 8)  # single-GPU hosts


def test_spot_cluster_builds_hosts_of_the_given_sizes():
    from system.cases import spot_cluster

    c = spot_cluster("s", host_sizes=(2, 2, 1), across_gbps=1.0, inside_gbps=50.0)
    assert c.host_of == (0, 0, 1, 1, 2) and c.num_hosts == 3
    assert c.bandwidth_gbps[0, 1] == 50.0 and c.bandwidth_gbps[1, 2] == 1.0
    with pytest.raises(ValueError, match="host_sizes"):
        spot_cluster("bad", host_sizes=(2, 0), across_gbps=1.0, inside_gbps=50.0)


def test_unknown_case_and_variant():
    with pytest.raises(ValueError, match="unknown case '9'"):
        get_case("9")
    with pytest.raises(ValueError, match="unknown case variant"):
        get_case("5", "nope")
    assert get_case("worldwide").name == get_case(5).name


def test_user_topology_from_csv_and_yaml(tmp_path):
    pairs = tmp_path / "pairs.csv"
    pairs.write_text("region_a,region_b,delay_ms,bandwidth_gbps\nx,y,20,0.5\nx,x,1,10\ny,y,2,5\n")
    devs = tmp_path / "devices.txt"
    devs.write_text("x\nx\ny\n")
    c = cluster_from_files(pairs, devs, name="mine")
    assert c.num_devices == 3 and c.delay_ms[0, 2] == 20 and c.bandwidth_gbps[0, 1] == 10
    y = tmp_path / "pairs.yaml"
    y.write_text("pairs:\n  - {region_a: x, region_b: y, delay_ms: 20, bandwidth_gbps: 0.5}\n")
    c2 = cluster_from_files(y, ["x", "y", "y"], intra_delay_ms=1, intra_bandwidth_gbps=3)
    assert c2.bandwidth_gbps[1, 2] == 3 and c2.bandwidth_gbps[0, 1] == 0.5


def test_user_topology_errors(tmp_path):
    pairs = tmp_path / "pairs.csv"
    pairs.write_text("region_a,region_b,delay_ms,bandwidth_gbps\nx,y,20,0\n")
    with pytest.raises(ValueError, match="row 1"):
        cluster_from_files(pairs, ["x", "y"])
    pairs.write_text("region_a,region_b,delay_ms,bandwidth_gbps\nx,y,20,1\n")
    with pytest.raises(ValueError, match="no link values for regions 'x' and 'z'"):
        cluster_from_files(pairs, ["x", "z"])
    with pytest.raises(FileNotFoundError):
        cluster_from_files(tmp_path / "missing.csv", ["x"])
