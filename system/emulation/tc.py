"""The one builder of egress shaping: ``tc`` and ``ip route`` lines for a sender (paper §4.1).

Both the emulated network (:mod:`system.emulation.netns`, one namespace per device) and the
scripts for real hosts (:mod:`system.emulation.tcscript`) shape a sender's egress with these
lines, so a real host gets what the emulation was validated with:

- an HTB root whose default class (unshaped, 10 Gbit/s) takes unmatched traffic (ssh, DNS);
- per destination, one HTB class at the link's rate (``rate = ceil``; the rate counts frames,
  so it is the target goodput × the frame overhead of the MTU) with a token bucket of
  :data:`BURST_S` at that rate, and two leaves: pure TCP ACKs (IP packets under 128 bytes, HTB
  priority 0) and everything else (priority 1). Without the ACK leaf a bulk transfer in one
  direction holds back the ACKs of the opposite transfer behind a full queue, and a
  bidirectional exchange (all-to-all) runs at about half the link rate;
- each leaf a netem delay of the pair's one-way delay (where the kernel has ``sch_netem``) or a
  deep FIFO (the delay is added on the path, e.g. by the emulation's bridge), so TCP fills the
  pipe without tail drops;
- per destination, a host route with a TCP window clamp of 1.25 × BDP + 64 KiB and CUBIC
  (:func:`route_lines`);
- optionally (``cap_bps``, a link-sharing experiment) one HTB class above all destination
  classes at the sender's egress cap: each destination class is then guaranteed cap / k (k
  destinations, at most its link rate) and borrows up to its link rate from the cap, so
  concurrent flows split the cap max-min fairly (HTB shares what they borrow in proportion to
  their equal quanta) — a per-device NIC (the ``nic`` model of
  :mod:`system.simulator.sharing`).

Lines are in ``tc -batch`` / ``ip -batch`` syntax (no leading ``tc``/``ip``). They reach root
shells (the real-host scripts run with sudo), so every name in them is checked first: a device
is an interface name (:func:`check_ifname`) or the scripts' quoted ``"$DEV"``, an address is an
IPv4 address (:func:`check_ipv4`), every rate and delay a finite number.
"""

from __future__ import annotations

import ipaddress
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = [
    "Peer",
    "BURST_S",
    "DEFAULT_CLASS",
    "CAP_CLASS",
    "egress_lines",
    "route_lines",
    "htb_burst_bytes",
    "frame_overhead",
    "tcp_window_bytes",
    "TCP_SYSCTLS",
    "check_ifname",
    "check_ipv4",
    "check_link",
    "SCRIPT_DEV",
    "MIN_MTU",
    "MAX_MTU",
]

DEFAULT_CLASS = 9999  # HTB class (id 1:9999) of unmatched traffic
CAP_CLASS = 0x8000  # HTB class of the optional egress cap (destination ids stay below 0x4000)
LEAF_QUEUE_PACKETS = 50_000  # per-destination FIFO (450 MB of jumbo frames): no tail drops
# HTB token bucket depth of every shaped class, in seconds at the class rate. tc's default
# (about one timer tick of bytes) loses rate whenever the qdisc watchdog fires late, which an
# idle VM core waking up does by several ms: measured 0.5-0.9x of the target on idle cores with
# the default, 0.98-1.0x with 8 ms (the long-run rate is still the class rate).
BURST_S = 0.008
# TCP settings of every shaped sender: windows big enough for the largest bandwidth-delay
# product (1.3 Gbit/s x 0.5 s RTT = 81 MB at full scale), and no return to slow start after an
# idle gap (the gradient exchange follows seconds of pipeline traffic on other connections;
# long-lived WAN training connections keep their window in practice). The 8 MB initial receive
# buffer lets the receive window open within one message at jumbo MSS (with the 128 KB default
# a 420 KB message took 2-3 s, 7 RTTs, for its first few repeats).
TCP_SYSCTLS = (
    "net.ipv4.tcp_rmem=4096 8388608 134217728",
    "net.ipv4.tcp_wmem=4096 131072 134217728",
    "net.ipv4.tcp_slow_start_after_idle=0",
)
_TCP_IP_HEADERS = 52  # IP 20 + TCP 20 + timestamp option 12
_ETHERNET_HEADER = 14
# IPv4's minimum datagram every host must accept (RFC 791) up to the largest jumbo frame Linux
# drivers accept (9216 bytes of payload on common NICs; 9000 is the usual jumbo MTU).
MIN_MTU, MAX_MTU = 576, 9216
# A shaped class's rate and a leaf's delay: at least the ACK class's floor (8 kbit/s) and at most
# 1 Tbit/s; delays at most a minute (one-way, what a WAN emulation can mean).
MIN_RATE_BPS, MAX_RATE_BPS = 8000, 10**12
MAX_DELAY_S = 60.0
SCRIPT_DEV = '"$DEV"'  # the device as the real-host scripts name it (set at run time, quoted)
# Linux interface names: at most 15 bytes (IFNAMSIZ - 1), no '/', ':' or whitespace; we also
# keep to letters, digits, '_', '.' and '-' (what ip-link prints for real devices).
_IFNAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,14}")


def check_ifname(dev: str) -> str:
    """``dev`` if it is a plain interface name (``eth0``, ``ens5``, ``br-lan.10``), else
    ValueError."""
    if not isinstance(dev, str) or not _IFNAME.fullmatch(dev):
        raise ValueError(
            f"network device {dev!r} is not an interface name (1-15 letters, digits, '_.-')"
        )
    return dev


def check_ipv4(ip: str, what: str = "address") -> str:
    """``ip`` if it is a dotted IPv4 address, else ValueError naming ``what``."""
    try:
        ipaddress.IPv4Address(ip)
    except (ipaddress.AddressValueError, ValueError, TypeError):
        raise ValueError(f"{what} {ip!r} is not an IPv4 address") from None
    return ip


def check_link(p: Peer) -> Peer:
    """``p`` if its rate is in :data:`MIN_RATE_BPS`..:data:`MAX_RATE_BPS` and its delay in
    0..:data:`MAX_DELAY_S` (finite), else ValueError naming the peer."""
    if not (math.isfinite(p.rate_bps) and MIN_RATE_BPS <= p.rate_bps <= MAX_RATE_BPS):
        raise ValueError(
            f"link to {p.ip}: rate {p.rate_bps:g} bit/s is outside {MIN_RATE_BPS}..{MAX_RATE_BPS:g}"
        )
    if not (math.isfinite(p.delay_s) and 0 <= p.delay_s <= MAX_DELAY_S):
        raise ValueError(f"link to {p.ip}: delay {p.delay_s:g} s is outside 0..{MAX_DELAY_S:g}")
    return p


def _check_dev(dev: str) -> str:
    return dev if dev == SCRIPT_DEV else check_ifname(dev)


def frame_overhead(mtu: int) -> float:
    """Frame bytes per TCP payload byte at ``mtu`` (HTB counts frames, the cost model payload)."""
    if isinstance(mtu, bool) or not isinstance(mtu, int) or not MIN_MTU <= mtu <= MAX_MTU:
        raise ValueError(f"mtu must be an integer in {MIN_MTU}..{MAX_MTU}, got {mtu!r}")
    return (mtu + _ETHERNET_HEADER) / (mtu - _TCP_IP_HEADERS)


@dataclass(frozen=True)
class Peer:
    """One destination of a sender: its index (class ids), address, HTB rate and one-way delay."""

    index: int  # 0..4094, unique per sender (device or host id)
    ip: str
    rate_bps: float  # HTB rate, frames counted (goodput × frame_overhead(mtu))
    delay_s: float  # one-way delay of this pair (netem leaves; path delay otherwise)
    goodput_bps: float  # payload rate (the TCP window clamp's bandwidth-delay product)


def htb_burst_bytes(rate_bps: float, frame_bytes: int) -> int:
    """Token bucket depth of a class of ``rate_bps``: :data:`BURST_S` of rate, at least 2 frames."""
    return max(int(rate_bps * BURST_S / 8), 2 * frame_bytes)


def egress_lines(
    dev: str, peers: Sequence[Peer], *, netem: bool, mtu: int, cap_bps: float | None = None
) -> list[str]:
    """``tc -batch`` lines that shape ``dev``'s egress towards ``peers`` (see the module doc);
    ``cap_bps``: the sender's total egress cap (frames counted), None for none."""
    _check_dev(dev)
    frame_overhead(mtu)  # checks the MTU
    frame = mtu + _ETHERNET_HEADER
    if len({p.index for p in peers}) != len(peers) or any(not 0 <= p.index < 4095 for p in peers):
        raise ValueError("egress_lines: peer indices must be distinct and in 0..4094")
    if cap_bps is not None and not MIN_RATE_BPS <= cap_bps <= MAX_RATE_BPS:  # NaN fails too
        raise ValueError(
            f"egress_lines: the egress cap {cap_bps:g} bit/s is outside "
            f"{MIN_RATE_BPS}..{MAX_RATE_BPS:g}"
        )
    lines = [
        f"qdisc add dev {dev} root handle 1: htb default {DEFAULT_CLASS}",
        f"class add dev {dev} parent 1: classid 1:{DEFAULT_CLASS} htb rate 10gbit quantum 65536",
    ]
    parent = "1:"
    if cap_bps is not None:
        cap = int(round(cap_bps))
        b = htb_burst_bytes(cap, frame)
        parent = f"1:{CAP_CLASS:x}"
        lines.append(
            f"class add dev {dev} parent 1: classid {parent} htb rate {cap}bit ceil {cap}bit "
            f"burst {b} cburst {b} quantum 65536"
        )
    for p in peers:
        check_ipv4(p.ip, "egress_lines: peer")
        check_link(p)
        n = p.index + 1
        cid, ack, data = f"{n:x}", f"{0x1000 + n:x}", f"{0x2000 + n:x}"
        r = int(round(p.rate_bps))
        # guaranteed rate: the link's, or under a cap an equal share of it (borrowing up to r)
        g = r if cap_bps is None else max(8000, min(r, int(cap_bps / len(peers))))
        r_ack = max(8000, g // 20)
        b = htb_burst_bytes(r, frame)
        burst = f"burst {b} cburst {b}"
        lines.append(
            f"class add dev {dev} parent {parent} classid 1:{cid} htb rate {g}bit ceil {r}bit "
            f"{burst} quantum 65536"
        )
        lines.append(
            f"class add dev {dev} parent 1:{cid} classid 1:{ack} htb rate {r_ack}bit "
            f"ceil {r}bit prio 0 quantum {frame}"
        )
        lines.append(
            f"class add dev {dev} parent 1:{cid} classid 1:{data} htb rate {g}bit "
            f"ceil {r}bit {burst} prio 1 quantum 65536"
        )
        for leaf in (ack, data):
            handle = f"{int(leaf, 16) + 0x1000:x}"
            if netem and p.delay_s > 0:
                lines.append(
                    f"qdisc add dev {dev} parent 1:{leaf} handle {handle}: netem "
                    f"delay {p.delay_s * 1e3:.3f}ms limit 1000000"
                )
            else:
                lines.append(
                    f"qdisc add dev {dev} parent 1:{leaf} handle {handle}: pfifo "
                    f"limit {LEAF_QUEUE_PACKETS}"
                )
        dst = f"match ip dst {p.ip}/32"
        # TCP (protocol 6), IP total length < 128: pure ACKs (with timestamps/SACK options)
        lines.append(
            f"filter add dev {dev} parent 1: protocol ip prio 1 u32 {dst} "
            f"match ip protocol 6 0xff match u16 0x0000 0xff80 at 2 flowid 1:{ack}"
        )
        lines.append(f"filter add dev {dev} parent 1: protocol ip prio 2 u32 {dst} flowid 1:{data}")
    return lines


def tcp_window_bytes(goodput_bps: float, delay_s: float) -> int:
    """Window clamp of a link: 1.25 × its bandwidth-delay product (RTT = 2 × one-way) + 64 KiB.

    Without a clamp, loss-free CUBIC grows its window far past the bandwidth-delay product and
    the excess sits in the sender's HTB queue; control messages that follow bulk data on the same
    connection (gloo's rendezvous) then wait behind seconds of queue. The clamp keeps the pipe
    full (window > BDP) with at most a quarter RTT of queue.
    """
    return int(1.25 * goodput_bps * 2.0 * delay_s / 8.0) + 65536


def route_lines(
    dev: str, peers: Sequence[Peer], *, congctl: str | None = "cubic", via: str | None = None
) -> list[str]:
    """``ip -batch`` host routes to every peer with the window clamp and ``congctl``.

    CUBIC, not BBR: BBR paces a connection at its delivery-rate estimate, which for the
    runtime's short bursts (a few activations, then idle) stays far below the link (measured:
    64 KiB messages 4x slower than α + X/β on a 210 ms link), and its ProbeRTT stalls a transfer
    by an RTT every 10 s. ``via``: a gateway (real hosts behind a router); None = on-link.
    """
    _check_dev(dev)
    if congctl is not None and congctl not in ("cubic", "reno", "bbr"):
        raise ValueError(f"route_lines: congctl must be cubic, reno or bbr, got {congctl!r}")
    for p in peers:
        check_ipv4(p.ip, "route_lines: peer")
        check_link(p)
    cc = f" congctl {congctl}" if congctl else ""
    gw = f" via {check_ipv4(via, 'route_lines: gateway')}" if via else ""
    return [
        f"route add {p.ip}/32{gw} dev {dev} window {tcp_window_bytes(p.goodput_bps, p.delay_s)}{cc}"
        for p in peers
    ]
