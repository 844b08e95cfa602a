"""Per-host tc scripts for real multi-host clusters, as on the paper's AWS hosts (§4.1).

Each host gets ``dtfm-tc-host<k>.sh {apply|show|clear}``: on its egress device an HTB root,
one class per destination host (rate = bandwidth × scale, ceil = rate) with a netem leaf
(``delay`` = one-way delay_ms × scale; the peer's script delays the other direction, so RTT =
2·delay_ms) and a ``u32 match ip dst`` filter; unmatched traffic (ssh, DNS) goes to an unshaped
default class. ``DTFM_TC=echo`` turns any script into a dry run that prints its commands, and
:func:`parse_script` reads the shaping back (the tests use both).
"""

from __future__ import annotations

import ipaddress
import logging
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from system.cluster import Cluster

log = logging.getLogger(__name__)

__all__ = ["HostLink", "host_links", "render_host_script", "write_scripts", "parse_script", "read_hosts"]

_DEFAULT_CLASS = 1


@dataclass(frozen=True)
class HostLink:
    dst_host: int
    dst_ip: str
    rate_kbit: int
    delay_ms: float


def read_hosts(path: str | Path) -> list[str]:
    """One IPv4 address per line (``#`` comments allowed), the cluster's host order."""
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"host list {p} does not exist")
    return [ln.split("#")[0].strip() for ln in p.read_text().splitlines() if ln.split("#")[0].strip()]


def host_links(cluster: Cluster, hosts: list[str], *, bandwidth_scale: float = 1.0,
               delay_scale: float = 1.0) -> list[list[HostLink]]:
    """Per source host, the shaped links to every other host (slowest device pair between them)."""
    if len(hosts) != cluster.num_hosts:
        raise ValueError(f"host list has {len(hosts)} addresses, cluster {cluster.name!r} has "
                         f"{cluster.num_hosts} hosts")
    for h in hosts:
        try:
            ipaddress.IPv4Address(h)
        except ValueError as e:
            raise ValueError(f"host list: {h!r} is not an IPv4 address") from e
    if len(set(hosts)) != len(hosts):
        raise ValueError("host list: addresses must be distinct")
    if bandwidth_scale <= 0 or delay_scale < 0:
        raise ValueError("tc script: bandwidth_scale must be > 0 and delay_scale >= 0")
    host_of = np.array(cluster.host_of)
    out: list[list[HostLink]] = []
    for a in range(cluster.num_hosts):
        links = []
        da = np.flatnonzero(host_of == a)
        for b in range(cluster.num_hosts):
            if a == b:
                continue
            db = np.flatnonzero(host_of == b)
            bw = float(cluster.bandwidth_gbps[np.ix_(da, db)].min()) * bandwidth_scale
            dl = float(cluster.delay_ms[np.ix_(da, db)].max()) * delay_scale
            links.append(HostLink(b, hosts[b], max(1, int(round(bw * 1e6))), dl))
        out.append(links)
    return out


def render_host_script(cluster: Cluster, host: int, links: list[HostLink], *, dev: str = "eth0",
                       scales: dict | None = None) -> str:
    """The bash script for one host (apply / show / clear)."""
    body = []
    for n, ln in enumerate(links):
        cid = n + 2
        body.append(f"  $TC class add dev \"$DEV\" parent 1: classid 1:{cid} htb rate {ln.rate_kbit}kbit "
                    f"ceil {ln.rate_kbit}kbit  # -> host {ln.dst_host}")
        if ln.delay_ms > 0:
            body.append(f"  $TC qdisc add dev \"$DEV\" parent 1:{cid} handle {cid}: netem delay "
                        f"{ln.delay_ms:.3f}ms limit 1000000")
        body.append(f"  $TC filter add dev \"$DEV\" parent 1: protocol ip prio 1 u32 match ip dst "
                    f"{ln.dst_ip}/32 flowid 1:{cid}")
    scale_txt = ", ".join(f"{k}={v}" for k, v in (scales or {}).items()) or "none"
    return "\n".join([
        "#!/usr/bin/env bash",
        f"# dtfm tc script: cluster {cluster.name}, host {host}; scales: {scale_txt}",
        "# usage: $0 apply|show|clear   (DTFM_DEV=<egress device>, DTFM_TC=echo for a dry run)",
        "set -euo pipefail",
        f'DEV="${{DTFM_DEV:-{dev}}}"',
        'TC="${DTFM_TC:-tc}"',
        'case "${1:-show}" in',
        "apply)",
        '  $TC qdisc del dev "$DEV" root 2>/dev/null || true',
        f'  $TC qdisc add dev "$DEV" root handle 1: htb default {_DEFAULT_CLASS}',
        f'  $TC class add dev "$DEV" parent 1: classid 1:{_DEFAULT_CLASS} htb rate 100gbit',
        *body,
        "  ;;",
        "show)",
        '  $TC -s qdisc show dev "$DEV"; $TC -s class show dev "$DEV"; $TC filter show dev "$DEV"',
        "  # the simulator's links assume a loss-based TCP such as CUBIC; BBR paces short bursts",
        "  # below the link rate (system/emulation/netns.py, device_route_lines)",
        '  echo "tcp congestion control: $(sysctl -n net.ipv4.tcp_congestion_control 2>/dev/null'
        ' || echo unknown)"',
        "  ;;",
        "clear)",
        '  $TC qdisc del dev "$DEV" root 2>/dev/null || true',
        "  ;;",
        '*) echo "usage: $0 apply|show|clear" >&2; exit 2 ;;',
        "esac",
        "",
    ])


def write_scripts(cluster: Cluster, hosts: list[str], out_dir: str | Path, *, dev: str = "eth0",
                  bandwidth_scale: float = 1.0, delay_scale: float = 1.0) -> list[Path]:
    """Write one executable script per host into ``out_dir``; returns their paths."""
    from system.results import atomic_write_text

    out = Path(out_dir)
    scales = {"bandwidth_scale": bandwidth_scale, "delay_scale": delay_scale}
    paths = []
    for h, links in enumerate(host_links(cluster, hosts, bandwidth_scale=bandwidth_scale,
                                         delay_scale=delay_scale)):
        p = out / f"dtfm-tc-host{h}.sh"
        atomic_write_text(p, render_host_script(cluster, h, links, dev=dev, scales=scales))
        p.chmod(0o755)
        paths.append(p)
    log.info("wrote %d tc scripts to %s", len(paths), out)
    return paths


_CLASS_RE = re.compile(r"classid 1:(\d+) htb rate (\d+)kbit")
_NETEM_RE = re.compile(r"parent 1:(\d+) handle \d+: netem delay ([0-9.]+)ms")
_FILTER_RE = re.compile(r"match ip dst ([0-9.]+)/32 flowid 1:(\d+)")


def parse_script(text: str) -> dict[str, tuple[int, float]]:
    """{dst_ip: (rate_kbit, delay_ms)} from a script's text or its dry-run output."""
    rates = {int(c): int(r) for c, r in _CLASS_RE.findall(text) if int(c) != _DEFAULT_CLASS}
    delays = {int(c): float(d) for c, d in _NETEM_RE.findall(text)}
    return {ip: (rates[int(c)], delays.get(int(c), 0.0)) for ip, c in _FILTER_RE.findall(text)}
