"""tc script generator for real hosts: parses back to the links; dry run works (no root)."""

from __future__ import annotations

import subprocess

import pytest

from system.cases import get_case
from system.emulation import tc
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
            rate_bps, delay_ms = got[f"198.18.1.{j + 1}"]
            goodput_bps = c.bandwidth_gbps[h, j] * 0.5e9
            assert rate_bps == pytest.approx(goodput_bps * tc.frame_overhead(1500), rel=1e-6)
            assert delay_ms == pytest.approx(c.delay_ms[h, j], abs=1e-3)


def test_dry_run_prints_every_command(tmp_path):
    c = get_case("debug")
    paths = write_scripts(c, _hosts(8), tmp_path, dev="ens5")
    for cmd in ("apply", "show", "clear"):
        assert subprocess.run(["bash", "-n", str(paths[0])]).returncode == 0
        out = subprocess.run(
            ["bash", str(paths[0]), cmd],
            capture_output=True,
            text=True,
            timeout=10,
            env={"DTFM_TC": "echo", "PATH": "/usr/bin:/bin"},
        )
        assert out.returncode == 0, out.stderr
        assert "ens5" in out.stdout
    out = subprocess.run(
        ["bash", str(paths[3]), "apply"],
        capture_output=True,
        text=True,
        timeout=10,
        env={"DTFM_TC": "echo", "PATH": "/usr/bin:/bin"},
    ).stdout
    got = parse_script(out)  # the dry run's commands carry the same shaping as the file
    assert got == parse_script(paths[3].read_text())
    assert len(got) == 7 and out.count("netem delay") == 14  # ACK and data leaf per peer
    assert out.count("route replace") == 7 and "tcp_slow_start_after_idle=0" in out
    path = subprocess.run(
        ["bash", str(paths[3]), "apply"],
        capture_output=True,
        text=True,
        timeout=10,
        env={"DTFM_TC": "echo", "DTFM_DELAY": "path", "PATH": "/usr/bin:/bin"},
    ).stdout
    assert "netem" not in path and path.count("pfifo") == 14
    assert {ip: r for ip, (r, _) in parse_script(path).items()} == {
        ip: r for ip, (r, _) in got.items()
    }
    bad = subprocess.run(
        ["bash", str(paths[0]), "bogus"],
        capture_output=True,
        text=True,
        env={"DTFM_TC": "echo", "PATH": "/usr/bin:/bin"},
    )
    assert bad.returncode == 2


def test_multi_gpu_hosts_get_one_class_per_host():
    c = get_case("1")  # 8 hosts x 8 GPUs
    links = host_links(c, _hosts(8))
    assert all(len(x) == 7 for x in links)
    assert links[0][0].goodput_bps == 25e9 and links[0][0].delay_s == 0.0


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


def test_scripts_shape_like_the_emulation(tmp_path):
    """A host's script carries the emulation's builder output: ACK leaves, 8 ms token bucket."""
    from system.emulation.plan import make_plan

    c = get_case("5").subset([0, 8])
    text = write_scripts(c, _hosts(2), tmp_path, mtu=9000)[0].read_text()
    plan = make_plan(c, tag="cmp")
    emu = tc.egress_lines(
        '"$DEV"',
        [
            tc.Peer(
                index=1,
                ip="198.18.1.2",
                rate_bps=float(plan.rate_bps[0, 1]),
                delay_s=float(plan.delay_s[0, 1]),
                goodput_bps=float(plan.goodput_bps[0, 1]),
            )
        ],
        netem=True,
        mtu=9000,
    )
    for line in emu:
        assert f"$TC {line}" in text
    burst = tc.htb_burst_bytes(plan.rate_bps[0, 1], 9014)
    assert f"burst {burst} cburst {burst}" in text and "prio 0" in text
