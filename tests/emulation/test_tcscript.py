"""tc script generator for real hosts: parses back to the links; dry run works (no root)."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from system.cases import get_case
from system.emulation import tc
from system.emulation.shell import ns_prefix
from system.emulation.tcscript import host_links, parse_script, read_hosts, write_scripts

ROOT = Path(__file__).resolve().parents[2]


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


# ---- hostile input: nothing unchecked reaches a script that runs as root -----------------------
PAYLOADS = {
    "newline": "innocent\ntouch {marker} #",
    "semicolon": "x; touch {marker}",
    "command substitution": "x$(touch {marker})",
    "backticks": "x`touch {marker}`",
    "double quote": 'x"; touch {marker}; "',
    "single quote": "x'; touch {marker}; '",
}


def _cli(*args, cwd) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "system.emulation", "tc-script", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )


@pytest.mark.parametrize("what", sorted(PAYLOADS))
def test_a_hostile_topology_name_never_reaches_a_script(tmp_path, what):
    marker = tmp_path / "INJECTED"
    name = PAYLOADS[what].format(marker=marker)
    topo = tmp_path / "inject.yaml"
    topo.write_text(
        json.dumps(
            {
                "name": name,
                "devices": ["a", "b"],
                "pairs": [{"region_a": "a", "region_b": "b", "delay_ms": 10, "bandwidth_gbps": 1}],
            }
        )
    )
    (tmp_path / "hosts.txt").write_text("198.18.1.1\n198.18.1.2\n")
    out = tmp_path / "out"
    got = _cli("--case", str(topo), "--hosts", "hosts.txt", "--out", str(out), cwd=tmp_path)
    for script in sorted(out.glob("*.sh")):  # whatever was written: its dry run must be inert
        for cmd in ("show", "apply", "clear"):
            subprocess.run(
                ["bash", str(script), cmd],
                capture_output=True,
                timeout=10,
                env={"DTFM_TC": "echo", "DTFM_STATE": str(tmp_path), "PATH": "/usr/bin:/bin"},
            )
    assert not marker.exists(), f"the {what} in the topology name ran as a command"
    assert got.returncode == 2 and got.stderr.count("\n") == 1, got.stderr
    assert "is not a plain name" in got.stderr and not list(out.glob("*.sh"))


@pytest.mark.parametrize("what", sorted(PAYLOADS))
def test_hostile_names_in_code_are_refused_too(tmp_path, what):
    """The checks hold below the file reader: a cluster, device or address built in code."""
    bad = PAYLOADS[what].format(marker=tmp_path / "INJECTED")
    c = get_case("5").subset([0, 8])
    with pytest.raises(ValueError, match="not a plain name"):
        write_scripts(dataclasses.replace(c, name=bad), _hosts(2), tmp_path)
    with pytest.raises(ValueError, match="not an interface name"):
        write_scripts(c, _hosts(2), tmp_path, dev=bad)
    with pytest.raises(ValueError, match="not an IPv4 address"):
        write_scripts(c, ["198.18.1.1", f"198.18.1.2{bad}"], tmp_path)
    peer = tc.Peer(index=1, ip=f"198.18.1.2{bad}", rate_bps=1e6, delay_s=0.01, goodput_bps=1e6)
    with pytest.raises(ValueError, match="not an IPv4 address"):
        tc.egress_lines("eth0", [peer], netem=True, mtu=1500)
    with pytest.raises(ValueError, match="not an IPv4 address"):
        tc.route_lines("eth0", [peer])
    with pytest.raises(ValueError, match="not a plain name"):
        ns_prefix(f"dtfm-{bad}")
    assert not list(tmp_path.glob("*.sh")) and not (tmp_path / "INJECTED").exists()


@pytest.mark.parametrize(
    "args,message",
    [
        (["--delay-scale", "inf"], "--delay-scale: 'inf' is not a finite number"),
        (["--delay-scale", "nan"], "--delay-scale: 'nan' is not a finite number"),
        (["--delay-scale", "-1"], "--delay-scale: '-1' is not a finite number in [0, inf)"),
        (["--bandwidth-scale", "inf"], "--bandwidth-scale: 'inf' is not a finite number"),
        (["--bandwidth-scale", "0"], "--bandwidth-scale: '0' is not a finite number in (0, inf)"),
        (["--bandwidth-scale", "1e-12"], "rate 0.000826008 bit/s is outside 8000..1e+12"),
        (["--bandwidth-scale", "1e300"], "is outside 8000..1e+12"),
        (["--delay-scale", "1e6"], "delay 67000 s is outside 0..60"),
        (["--mtu", "100000"], "--mtu: '100000' is not an integer in [576, 9216]"),
        (["--mtu", "100"], "--mtu: '100' is not an integer in [576, 9216]"),
        (["--mtu", "1500.5"], "--mtu: '1500.5' is not an integer"),
        (["--dev", "eth0;reboot"], "--dev: network device 'eth0;reboot' is not an interface"),
        (["--devices", "0,x"], "--devices '0,x': expected device ids"),
        (["--devices", "0,99"], "--devices '0,99': need distinct ids in 0..7"),
    ],
)
def test_bad_numbers_and_names_on_the_command_line_are_one_line(tmp_path, args, message):
    (tmp_path / "hosts.txt").write_text("198.18.1.1\n198.18.1.2\n")
    devices = [] if "--devices" in args else ["--devices", "0,2"]
    got = _cli(
        "--case", "debug", *devices, "--hosts", "hosts.txt", "--out", "out", *args, cwd=tmp_path
    )
    assert got.returncode == 2, got
    assert got.stderr.count("\n") == 1 and message in got.stderr, got.stderr
    assert not (tmp_path / "out").exists()
