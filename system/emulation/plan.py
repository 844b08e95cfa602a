"""What to emulate: namespaces, addresses, per-pair rates and delays for one Cluster (paper §4.1).

The paper shaped its AWS hosts with ``tc`` (HTB bandwidth + netem delay per destination). On one
machine we give every device its own network namespace, join them with a bridge that lives in a
bridge namespace, shape each sender's egress with one HTB class per destination and delay each
packet in the bridge namespace by the pair's one-way ``delay_ms`` (so RTT = 2·delay_ms, the
project's delay semantics, see :mod:`system.cluster`).

Scaling: 2 CPU cores cannot move 64 devices' traffic at AWS rates. An :class:`EmulationPlan`
therefore carries a ``bandwidth_scale`` (every bandwidth × scale) and a ``delay_scale``; both are
recorded in every result row so the simulator can be run on the same scaled cluster
(:meth:`EmulationPlan.scaled_cluster`).

HTB counts Ethernet frames, the cost model counts payload bytes: a TCP segment with timestamps
carries ``TCP_PAYLOAD_BYTES`` = 1448 payload bytes in a 1514-byte frame at MTU 1500, so the HTB
rate is the target goodput × 1514/1448 (``FRAME_OVERHEAD``).
"""

from __future__ import annotations

import ipaddress
import logging
import secrets
from dataclasses import dataclass, field

import numpy as np

from system.cluster import Cluster, LinkSharing

log = logging.getLogger(__name__)

__all__ = [
    "PREFIX",
    "EmulationPlan",
    "make_plan",
    "check_tag",
    "FRAME_OVERHEAD",
    "DELAYER_CAPACITY_GBPS",
]

PREFIX = "dtfm-"  # every namespace, file and process title we create starts with this
SUBNET = ipaddress.ip_network("198.18.0.0/16")  # inside 198.18.0.0/15 (RFC 2544 benchmarking)
# Jumbo frames inside the emulation: every packet crosses the userspace delayer, whose cost is
# per packet, so 9000-byte frames carry six times the data of 1500-byte ones for the same CPU
# (measured: 1.1 Gbit/s at MTU 1500, 2.1 at 9000 on an idle core). Only the transport's
# segment size changes; links keep their delay and goodput.
MTU = 9000
TCP_PAYLOAD_BYTES = MTU - 52  # MSS with TCP timestamps: IP 20 + TCP 20 + options 12
FRAME_BYTES = MTU + 14  # Ethernet header + IP packet as HTB counts it on a veth
FRAME_OVERHEAD = FRAME_BYTES / TCP_PAYLOAD_BYTES
# Measured capacity of the userspace NFQUEUE delayer at MTU 9000, on an idle core.
DELAYER_CAPACITY_GBPS = 2.1
DEVICE_IFNAME = "eth0"  # the veth end inside each device namespace


def check_tag(tag: str) -> str:
    """``tag`` if it is 1-12 ASCII letters and digits (it becomes namespace and folder names)."""
    if not isinstance(tag, str) or not (0 < len(tag) <= 12 and tag.isascii() and tag.isalnum()):
        raise ValueError(f"emulation tag {tag!r} must be 1-12 letters/digits")
    return tag


@dataclass(frozen=True)
class EmulationPlan:
    """Everything the emulator creates for one scaled cluster; pure data, no side effects.

    ``rate_bps[i, j]`` is the HTB rate of device i's class towards device j (frames), and
    ``delay_s[i, j]`` the one-way delay the bridge adds to packets from i to j.
    """

    cluster: Cluster  # the cluster as given (unscaled)
    tag: str  # short run tag: namespaces are dtfm-<tag>-d<i> and dtfm-<tag>-br
    bandwidth_scale: float = 1.0
    delay_scale: float = 1.0
    max_rate_gbps: float = 10.0  # cap for "infinite"/very fast links (NVLink in cases 1-2)
    # per-device egress cap above the per-destination classes (Gbit/s of goodput, before
    # scaling; None: no cap, each pair independent). The simulator sees it as the ``nic`` model.
    egress_cap_gbps: float | None = None
    meta: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        check_tag(self.tag)
        if not (self.bandwidth_scale > 0 and np.isfinite(self.bandwidth_scale)):
            raise ValueError(f"bandwidth_scale must be > 0, got {self.bandwidth_scale}")
        if not (self.delay_scale >= 0 and np.isfinite(self.delay_scale)):
            raise ValueError(f"delay_scale must be >= 0, got {self.delay_scale}")
        if self.egress_cap_gbps is not None and not (
            self.egress_cap_gbps > 0 and np.isfinite(self.egress_cap_gbps)
        ):
            raise ValueError(f"egress_cap_gbps must be > 0, got {self.egress_cap_gbps}")
        if self.cluster.num_devices > 250:
            raise ValueError(
                f"emulation supports at most 250 devices, got {self.cluster.num_devices}"
            )
        self._check_links()

    def _check_links(self) -> None:
        """Every scaled link, and the egress cap, within what tc can shape
        (:func:`system.emulation.tc.check_link`): a bandwidth or delay scale that overflows or
        underflows a link is refused here, before any namespace exists, naming the pair and the
        scales."""
        from system.emulation.tc import MAX_DELAY_S, MAX_RATE_BPS, MIN_RATE_BPS

        rate, delay = self.rate_bps, self.delay_s
        off = ~np.eye(self.num_devices, dtype=bool)
        bad = off & ~(
            (rate >= MIN_RATE_BPS) & (rate <= MAX_RATE_BPS) & (delay >= 0) & (delay <= MAX_DELAY_S)
        )
        cap = self.scaled_egress_cap_gbps
        if cap is not None and not MIN_RATE_BPS <= cap * 1e9 * FRAME_OVERHEAD <= MAX_RATE_BPS:
            raise ValueError(
                f"egress cap: {cap * 1e9 * FRAME_OVERHEAD:g} bit/s after "
                f"bandwidth_scale={self.bandwidth_scale:g}; tc shapes {MIN_RATE_BPS}.."
                f"{MAX_RATE_BPS:g} bit/s"
            )
        if bad.any():
            i, j = (int(x) for x in np.argwhere(bad)[0])
            raise ValueError(
                f"emulated link {i}->{j}: {rate[i, j]:g} bit/s and {delay[i, j] * 1e3:g} ms after "
                f"bandwidth_scale={self.bandwidth_scale:g}, delay_scale={self.delay_scale:g}; "
                f"tc shapes {MIN_RATE_BPS}..{MAX_RATE_BPS:g} bit/s and delays up to "
                f"{MAX_DELAY_S:g} s"
            )

    # ---- names ----------------------------------------------------------------------------
    @property
    def num_devices(self) -> int:
        return self.cluster.num_devices

    @property
    def bridge_ns(self) -> str:
        return f"{PREFIX}{self.tag}-br"

    def device_ns(self, i: int) -> str:
        return f"{PREFIX}{self.tag}-d{i}"

    @property
    def namespaces(self) -> list[str]:
        return [self.device_ns(i) for i in range(self.num_devices)] + [self.bridge_ns]

    def ip(self, i: int) -> str:
        """Address of device i: 198.18.0.(i+1) (a /16 inside 198.18.0.0/15)."""
        return str(SUBNET.network_address + i + 1)

    @property
    def prefixlen(self) -> int:
        return SUBNET.prefixlen

    # ---- links ----------------------------------------------------------------------------
    @property
    def scaled_egress_cap_gbps(self) -> float | None:
        """The per-device egress cap the emulation realises (goodput, Gbit/s), or None."""
        if self.egress_cap_gbps is None:
            return None
        return self.egress_cap_gbps * self.bandwidth_scale

    def scaled_cluster(self) -> Cluster:
        """The cluster the emulation actually realises (feed this to the simulator): its links
        scaled, and with an egress cap the ``nic`` sharing model at that cap (each destination
        class is its own pipe otherwise: the ``pair`` model)."""
        c = self.cluster.scaled(bandwidth_scale=self.bandwidth_scale, delay_scale=self.delay_scale)
        bw = np.minimum(c.bandwidth_gbps, self.max_rate_gbps)
        cap = self.scaled_egress_cap_gbps
        sharing = LinkSharing("pair") if cap is None else LinkSharing("nic", nic_gbps=cap)
        return Cluster(
            name=c.name,
            region_of=c.region_of,
            host_of=c.host_of,
            delay_ms=c.delay_ms,
            bandwidth_gbps=bw,
            host_nic_gbps=None,
            link_sharing=sharing,
            description=c.description,
            meta={**c.meta, "emulated": True, "max_rate_gbps": self.max_rate_gbps},
        )

    @property
    def goodput_bps(self) -> np.ndarray:
        """(D, D) target payload rate per link (bit/s), diagonal inf."""
        return self.scaled_cluster().bandwidth_bps

    @property
    def single_flow_goodput_bps(self) -> np.ndarray:
        """(D, D) payload rate one flow alone reaches: its link's, or the egress cap if lower
        (what the link checks of :mod:`system.emulation.verify` expect)."""
        cap = self.scaled_egress_cap_gbps
        good = self.goodput_bps
        return good if cap is None else np.minimum(good, cap * 1e9)

    @property
    def rate_bps(self) -> np.ndarray:
        """(D, D) HTB rate per link, frames counted (target goodput × FRAME_OVERHEAD)."""
        return self.goodput_bps * FRAME_OVERHEAD

    @property
    def delay_s(self) -> np.ndarray:
        return self.scaled_cluster().delay_s

    def delay_table(self) -> list[tuple[str, str, float]]:
        """(src_ip, dst_ip, one-way delay s) for every ordered pair with a non-zero delay."""
        d = self.delay_s
        return [
            (self.ip(i), self.ip(j), float(d[i, j]))
            for i in range(self.num_devices)
            for j in range(self.num_devices)
            if i != j and d[i, j] > 0
        ]

    def scale_record(self) -> dict:
        """The scale factors for a results row (simulator inputs on the same setting)."""
        return {
            "emu_bandwidth_scale": self.bandwidth_scale,
            "emu_delay_scale": self.delay_scale,
            "emu_max_rate_gbps": self.max_rate_gbps,
            "emu_num_devices": self.num_devices,
            "emu_frame_overhead": FRAME_OVERHEAD,
            "emu_egress_cap_gbps": self.scaled_egress_cap_gbps,
        }

    def check_capacity(self, capacity_gbps: float = DELAYER_CAPACITY_GBPS) -> float:
        """Worst-case aggregate rate through the delayer if every device sends at once (Gbit/s).

        Each device sends at most its fastest class rate at a time in the workloads we run
        (one peer at a time per stream); the sum over devices bounds the bridge's load. Logs a
        warning when it exceeds the delayer's measured capacity (the delayer would then add
        queueing delay the simulator does not know about).
        """
        r = self.rate_bps.copy()
        np.fill_diagonal(r, 0.0)
        total = float(r.max(axis=1).sum()) / 1e9
        if total > capacity_gbps:
            log.warning(
                "emulation %s: up to %.2f Gbit/s may cross the delayer (capacity ~%.1f); "
                "lower bandwidth_scale",
                self.tag,
                total,
                capacity_gbps,
            )
        return total


def make_plan(
    cluster: Cluster,
    *,
    bandwidth_scale: float = 1.0,
    delay_scale: float = 1.0,
    tag: str | None = None,
    max_rate_gbps: float = 10.0,
    egress_cap_gbps: float | None = None,
) -> EmulationPlan:
    """A plan with a fresh tag (random unless given), validated.

    The default tag is 10 random hex digits, unique to this run: a tag derived from the pid
    repeats when the pid is reused, and a run would then meet a killed run's namespaces under
    its own names. A given tag is the caller's to keep unique (the emulation refuses a tag a
    live run holds).
    """
    if cluster.host_nic_gbps is not None and len(set(cluster.host_of)) < cluster.num_devices:
        log.warning(
            "emulation: devices sharing a host NIC are emulated with separate links "
            "(NIC sharing is not modelled); pick one device per host"
        )
    tag = tag or secrets.token_hex(5)
    return EmulationPlan(
        cluster=cluster,
        tag=tag,
        bandwidth_scale=bandwidth_scale,
        delay_scale=delay_scale,
        max_rate_gbps=max_rate_gbps,
        egress_cap_gbps=egress_cap_gbps,
    )
