"""Per-host shaping scripts for real multi-host clusters, as on the paper's AWS hosts (§4.1).

Each host gets ``dtfm-tc-host<k>.sh {apply|show|clear}`` with the shaping the emulated network
was validated with (the same builder, :mod:`system.emulation.tc`): on the egress device an HTB
root, one class per destination host (rate = goodput × the frame overhead at ``mtu``, an 8 ms
token bucket) with an ACK leaf and a data leaf, each with a netem delay of the one-way
``delay_ms`` (the peer's script delays the other direction, so RTT = 2·delay_ms) and ``u32 match
ip dst`` filters; unmatched traffic (ssh, DNS) goes to an unshaped default class. ``apply`` also
adds a host route per peer with the TCP window clamp and CUBIC (the gateway is taken from ``ip
route get``) and sets the TCP sysctls, saving the old values for ``clear``.

Environment of the scripts: ``DTFM_DEV`` the egress device; ``DTFM_DELAY=netem`` (default) or
``path`` (FIFO leaves: the delay comes from the path, e.g. an emulated WAN, for kernels without
``sch_netem``); ``DTFM_STATE`` the folder of the saved sysctls (default ``/run``);
``DTFM_TC=echo`` a dry run printing every command and changing nothing. :func:`parse_script`
reads the shaping back (the tests use both).

The scripts run as root on every host, so nothing reaches them unchecked: the cluster's name
(written into a comment) is a plain name, the device an interface name, every address an IPv4
address, every scale, rate and delay a finite number in range, the MTU in
:data:`system.emulation.tc.MIN_MTU`..:data:`~system.emulation.tc.MAX_MTU` (one ValueError line
otherwise, before any file is written).
"""

from __future__ import annotations

import logging
import math
import re
from pathlib import Path

import numpy as np

from system.cluster import Cluster
from system.emulation import tc

log = logging.getLogger(__name__)

__all__ = [
    "host_links",
    "render_host_script",
    "write_scripts",
    "parse_script",
    "read_hosts",
    "DEFAULT_MTU",
]

DEFAULT_MTU = 1500  # links between regions rarely carry jumbo frames


def read_hosts(path: str | Path) -> list[str]:
    """One IPv4 address per line (``#`` comments allowed), the cluster's host order."""
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"host list {p} does not exist")
    lines = (ln.split("#")[0].strip() for ln in p.read_text().splitlines())
    return [ln for ln in lines if ln]


def host_links(
    cluster: Cluster,
    hosts: list[str],
    *,
    bandwidth_scale: float = 1.0,
    delay_scale: float = 1.0,
    mtu: int = DEFAULT_MTU,
) -> list[list[tc.Peer]]:
    """Per source host, the shaped links to every other host (slowest device pair between them).

    Links with unlimited bandwidth are left out (unshaped, in the default class).
    """
    if len(hosts) != cluster.num_hosts:
        raise ValueError(
            f"host list has {len(hosts)} addresses, cluster {cluster.name!r} has "
            f"{cluster.num_hosts} hosts"
        )
    for h in hosts:
        tc.check_ipv4(h, "host list:")
    if len(set(hosts)) != len(hosts):
        raise ValueError("host list: addresses must be distinct")
    check_scales(bandwidth_scale, delay_scale)
    overhead = tc.frame_overhead(mtu)
    host_of = np.array(cluster.host_of)
    out: list[list[tc.Peer]] = []
    for a in range(cluster.num_hosts):
        links = []
        da = np.flatnonzero(host_of == a)
        for b in range(cluster.num_hosts):
            db = np.flatnonzero(host_of == b)
            gbps = float(cluster.bandwidth_gbps[np.ix_(da, db)].min())
            goodput_bps = gbps * bandwidth_scale * 1e9  # inf when a huge scale overflows: refused
            delay_s = float(cluster.delay_ms[np.ix_(da, db)].max()) * delay_scale / 1e3
            if a != b and math.isfinite(gbps):
                peer = tc.Peer(
                    index=b,
                    ip=hosts[b],
                    rate_bps=goodput_bps * overhead,
                    delay_s=delay_s,
                    goodput_bps=goodput_bps,
                )
                try:
                    links.append(tc.check_link(peer))
                except ValueError as e:
                    raise ValueError(
                        f"tc script: host {a} -> host {b}: {e} (bandwidth_scale="
                        f"{bandwidth_scale:g}, delay_scale={delay_scale:g})"
                    ) from None
        out.append(links)
    return out


def check_scales(bandwidth_scale: float, delay_scale: float) -> None:
    """ValueError unless ``bandwidth_scale`` is finite and > 0 and ``delay_scale`` finite >= 0
    (an infinite bandwidth would drop every link from the shaping, silently)."""
    for name, v, low_ok in (
        ("bandwidth_scale", bandwidth_scale, False),
        ("delay_scale", delay_scale, True),
    ):
        if (
            isinstance(v, bool)
            or not isinstance(v, (int, float))
            or not math.isfinite(v)
            or v < 0
            or (v == 0 and not low_ok)
        ):
            need = ">= 0" if low_ok else "> 0"
            raise ValueError(f"tc script: {name} must be a finite number {need}, got {v!r}")


_COMMENT_SAFE = re.compile(r"[\w.()\[\],=+-]+(?: [\w.()\[\],=+-]+)*")


def _commands(prefix: str, lines: list[str]) -> list[str]:
    return [f"  {prefix} {ln}" for ln in lines] or ["  :"]


def render_host_script(
    cluster: Cluster,
    host: int,
    links: list[tc.Peer],
    *,
    dev: str = "eth0",
    mtu: int = DEFAULT_MTU,
    scales: dict | None = None,
) -> str:
    """The bash script for one host (apply / show / clear)."""
    if not _COMMENT_SAFE.fullmatch(cluster.name):
        raise ValueError(f"tc script: cluster name {cluster.name!r} is not a plain name")
    tc.check_ifname(dev)
    d = tc.SCRIPT_DEV
    routes = []
    for ln in tc.route_lines(d, links, congctl=None):  # congctl and gateway decided at apply
        dst = ln.split()[2]
        routes.append(
            f"  $IP route replace {dst} $(via {dst.split('/')[0]}) "
            f"{' '.join(ln.split()[3:])} $CC  # -> host {_dst_host(links, dst)}"
        )
    unroutes = [f"  $IP route del {p.ip}/32 2>/dev/null || true" for p in links]
    sysctls = " ".join(f'"{kv}"' for kv in tc.TCP_SYSCTLS)
    scale_txt = ", ".join(f"{k}={float(v):g}" for k, v in (scales or {}).items()) or "none"
    return "\n".join(
        [
            "#!/usr/bin/env bash",
            f"# dtfm tc script: cluster {cluster.name}, host {host}; MTU {mtu}; "
            f"scales: {scale_txt}",
            "# usage: $0 apply|show|clear   (DTFM_DEV=<egress device>, DTFM_DELAY=netem|path,",
            "#        DTFM_STATE=<folder for saved sysctls>, DTFM_TC=echo for a dry run)",
            "set -Eeuo pipefail",
            f'DEV="${{DTFM_DEV:-{dev}}}"',
            'DELAY="${DTFM_DELAY:-netem}"',
            f'SAVED="${{DTFM_STATE:-/run}}/dtfm-tc-host{host}.sysctl"',
            'if [ "${DTFM_TC:-tc}" = echo ]; then TC="echo tc"; IP="echo ip"; SYSCTL="echo sysctl"',
            'else TC="${DTFM_TC:-tc}"; IP=ip; SYSCTL=sysctl; fi',
            "# CUBIC where the kernel has it (the simulator's links assume a loss-based TCP)",
            'CC=""; grep -qw cubic /proc/sys/net/ipv4/tcp_available_congestion_control \\',
            '  2>/dev/null && CC="congctl cubic"',
            "via() {  # the gateway towards $1, if any (real hosts behind a router)",
            '  [ "$IP" = ip ] || return 0',
            '  ip -o route get "$1" 2>/dev/null | awk \'{for (i = 1; i < NF; i++) if ($i == "via") '
            'print "via", $(i + 1)}\' | head -1',
            "}",
            "shape_netem() {",
            *_commands("$TC", tc.egress_lines(d, links, netem=True, mtu=mtu)),
            "}",
            "shape_path() {  # no sch_netem here: FIFO leaves, the path adds the delay",
            *_commands("$TC", tc.egress_lines(d, links, netem=False, mtu=mtu)),
            "}",
            "routes() {",
            *(routes or ["  :"]),
            "}",
            "unroutes() {",
            *(unroutes or ["  :"]),
            "}",
            "set_sysctls() {",
            '  if [ "$IP" = ip ] && [ ! -e "$SAVED" ]; then',
            f"    for kv in {sysctls}; do",
            '      k="${kv%%=*}"; echo "$k=$(sysctl -n "$k" | tr -s "[:space:]" " ")" >> "$SAVED"',
            "    done",
            "  fi",
            f'  for kv in {sysctls}; do $SYSCTL -q -w "$kv"; done',
            "}",
            "restore_sysctls() {",
            '  [ -f "$SAVED" ] || return 0',
            '  while IFS= read -r kv; do $SYSCTL -q -w "$kv" || true; done < "$SAVED"',
            '  if [ "$IP" = ip ]; then rm -f "$SAVED"; fi',
            "}",
            'case "${1:-show}" in',
            "apply)",
            '  $TC qdisc del dev "$DEV" root 2>/dev/null || true',
            '  case "$DELAY" in',
            "    netem)",
            "      trap 'echo \"$0: tc failed; a kernel without sch_netem needs DTFM_DELAY=path "
            "(the "
            'delay then comes from the path)" >&2; $TC qdisc del dev "$DEV" root 2>/dev/null\' ERR',
            "      shape_netem; trap - ERR ;;",
            "    path) shape_path ;;",
            '    *) echo "$0: DTFM_DELAY must be netem or path, got $DELAY" >&2; exit 2 ;;',
            "  esac",
            "  routes",
            "  set_sysctls",
            "  ;;",
            "show)",
            '  $TC -s qdisc show dev "$DEV"; $TC -s class show dev "$DEV"',
            '  $TC filter show dev "$DEV"',
            '  $IP route show dev "$DEV"',
            '  echo "tcp congestion control: ${CC:-the kernel default (no cubic)}"',
            "  ;;",
            "clear)",
            '  $TC qdisc del dev "$DEV" root 2>/dev/null || true',
            "  unroutes",
            "  restore_sysctls",
            "  ;;",
            '*) echo "usage: $0 apply|show|clear" >&2; exit 2 ;;',
            "esac",
            "",
        ]
    )


def _dst_host(links: list[tc.Peer], dst: str) -> int:
    return next(p.index for p in links if f"{p.ip}/32" == dst)


def write_scripts(
    cluster: Cluster,
    hosts: list[str],
    out_dir: str | Path,
    *,
    dev: str = "eth0",
    bandwidth_scale: float = 1.0,
    delay_scale: float = 1.0,
    mtu: int = DEFAULT_MTU,
) -> list[Path]:
    """Write one executable script per host into ``out_dir``; returns their paths."""
    from system.results import atomic_write_text

    out = Path(out_dir)
    scales = {"bandwidth_scale": bandwidth_scale, "delay_scale": delay_scale}
    paths = []
    for h, links in enumerate(
        host_links(
            cluster, hosts, bandwidth_scale=bandwidth_scale, delay_scale=delay_scale, mtu=mtu
        )
    ):
        p = out / f"dtfm-tc-host{h}.sh"
        atomic_write_text(p, render_host_script(cluster, h, links, dev=dev, mtu=mtu, scales=scales))
        p.chmod(0o755)
        paths.append(p)
    log.info("wrote %d tc scripts to %s", len(paths), out)
    return paths


_CLASS_RE = re.compile(r"parent 1: classid 1:([0-9a-f]+) htb rate (\d+)bit")
_NETEM_RE = re.compile(r"parent 1:([0-9a-f]+) handle [0-9a-f]+: netem delay ([0-9.]+)ms")
_FILTER_RE = re.compile(r"prio 2 u32 match ip dst ([0-9.]+)/32 flowid 1:([0-9a-f]+)")


def parse_script(text: str) -> dict[str, tuple[int, float]]:
    """{dst_ip: (HTB rate bit/s, netem delay ms)} from a script's text or its dry-run output.

    The rate is the destination class's; the delay is its data leaf's (0 without netem).
    """
    rates = {int(c, 16): int(r) for c, r in _CLASS_RE.findall(text)}  # not 10gbit default
    delays = {int(c, 16): float(d) for c, d in _NETEM_RE.findall(text)}
    out = {}
    for ip, leaf in _FILTER_RE.findall(text):
        n = int(leaf, 16) - 0x2000
        out[ip] = (rates[n], delays.get(int(leaf, 16), 0.0))
    return out
