"""tc script generator for real hosts: parses back to the cluster's links; dry run works (no root)."""

from __future__ import annotations

import subprocess

import pytest

from system.cases import get_case
from system.emulation.tcscript import host_links, parse_script, read_hosts, write_scripts


def _hosts(n: int) -> list[str]:
    return [f"198.18.1.{i + 1}" for i in range(n)]


def test_scripts_parse_back_to_case5_links(tmp_path):
    c = get_case("5").subset([0, 8, 24, 40])  # Oregon, Virginia, Tokyo, London
    paths = write_scripts(c, _hosts(4), tmp_path, bandwidth_scale=0.5)
    assert len(paths) == 4
    for h, p in enumerate(paths):
        got = parse_script(p.read_text())
        assert len(got) == 3
        for j in range(4):
            if j == h:
                continue
            rate_kbit, delay_ms = got[f"198.18.1.{j + 1}"]
            assert rate_kbit == pytest.approx(c.bandwidth_gbps[h, j] * 0.5e6, rel=1e-6)
            assert delay_ms == pytest.approx(c.delay_ms[h, j], abs=1e-3)


def test_dry_run_prints_every_command(tmp_path):
    c = get_case("debug")
    paths = write_scripts(c, _hosts(8), tmp_path, dev="ens5")
    for cmd in ("apply", "show", "clear"):
        assert subprocess.run(["bash", "-n", str(paths[0])]).returncode == 0
        out = subprocess.run(["bash", str(paths[0]), cmd], capture_output=True, text=True, timeout=10,
                             env={"DTFM_TC": "echo", "PATH": "/usr/bin:/bin"})
        assert out.returncode == 0, out.stderr
        assert "ens5" in out.stdout
    out = subprocess.run(["bash", str(paths[3]), "apply"], capture_output=True, text=True, timeout=10,
                         env={"DTFM_TC": "echo", "PATH": "/usr/bin:/bin"}).stdout
    got = parse_script(out)  # the dry run's commands carry the same shaping as the file
    assert got == parse_script(paths[3].read_text())
    assert len(got) == 7 and out.count("netem delay") == 7
    bad = subprocess.run(["bash", str(paths[0]), "bogus"], capture_output=True, text=True,
                         env={"DTFM_TC": "echo", "PATH": "/usr/bin:/bin"})
    assert bad.returncode == 2


def test_multi_gpu_hosts_get_one_class_per_host():
    c = get_case("1")  # 8 hosts x 8 GPUs
    links = host_links(c, _hosts(8))
    assert all(len(x) == 7 for x in links)
    assert links[0][0].rate_kbit == 25_000_000 and links[0][0].delay_ms == 0.0


def test_bad_host_lists(tmp_path):
    c = get_case("debug")
    with pytest.raises(ValueError, match="8 hosts"):
        host_links(c, _hosts(3))
    with pytest.raises(ValueError, match="not an IPv4"):
        host_links(c, _hosts(7) + ["nohost"])
    with pytest.raises(ValueError, match="distinct"):
        host_links(c, _hosts(7) + ["198.18.1.1"])
    f = tmp_path / "hosts.txt"
    f.write_text("# region order\n198.18.1.1\n198.18.1.2  # second\n\n")
    assert read_hosts(f) == ["198.18.1.1", "198.18.1.2"]
    with pytest.raises(FileNotFoundError):
        read_hosts(tmp_path / "missing.txt")
