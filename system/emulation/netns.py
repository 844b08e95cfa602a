"""One machine emulating a geo-distributed cluster: namespaces, bridge, HTB and delay (paper §4.1).

Layout for an :class:`~system.emulation.plan.EmulationPlan` with tag T and D devices::

    dtfm-T-d0 (eth0 198.18.0.1) ─┐                      ┌─ dtfm-T-d1 (eth0 198.18.0.2) ...
                                 └── v0 ─ br0 ─ v1 ─────┘      (bridge in dtfm-T-br)

- bandwidth: HTB on each device's ``eth0`` egress, one class per destination (``u32 match ip
  dst``), rate = target goodput × frame overhead;
- delay, backend ``netem`` (kernel has sch_netem): a netem leaf under each HTB class, as on the
  paper's hosts; backend ``nfqueue`` (no netem, this project's machines): every bridged IPv4
  packet goes to NFQUEUE in the bridge namespace, where :mod:`system.emulation.delayer` holds it
  for the pair's one-way delay. Never on the sender's own output path (TCP collapses there).

Nothing is created in the host's namespace; all names start with ``dtfm-``. :class:`Emulation`
records its ownership before it creates anything, removes what a dead owner left behind
(:func:`system.emulation.cleanup.reap_dead`), and removes everything it built on exit, error,
Ctrl-C, SIGTERM, SIGHUP and at interpreter exit; a guard process removes it after a SIGKILL
(:mod:`system.lifeline`).
"""

from __future__ import annotations

import atexit
import contextlib
import json
import logging
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from system.emulation import tc
from system.emulation.cleanup import STATE_ROOT, kill_netns_pids, owners, reap_dead, write_state
from system.emulation.plan import (
    DEVICE_IFNAME,
    FRAME_BYTES,
    FRAME_OVERHEAD,
    MTU,
    PREFIX,
    EmulationPlan,
)
from system.emulation.shell import EmulationError, missing_tools, ns_prefix, run_batch, run_cmd
from system.lifeline import cancel, exit_on_signals, on_death

log = logging.getLogger(__name__)

__all__ = [
    "Emulation",
    "has_netem",
    "device_tc_lines",
    "device_route_lines",
    "htb_burst_bytes",
    "tcp_congestion_control",
    "BACKENDS",
    "BURST_S",
    "STATE_ROOT",
]

BURST_S = tc.BURST_S
BACKENDS = ("auto", "netem", "nfqueue")  # auto: netem where the kernel has it, else nfqueue

# Per-namespace TCP settings of every emulated device (the real-host scripts set the same)
_DEVICE_SYSCTLS = tc.TCP_SYSCTLS


def has_netem(ns: str | None = None) -> bool:
    """Whether the kernel offers sch_netem (tried on ``lo`` of a scratch namespace ``ns``)."""
    ns = ns or f"{PREFIX}probe{os.getpid()}"
    run_cmd(["ip", "netns", "add", ns])
    try:
        p = run_cmd(
            ["tc", "qdisc", "add", "dev", "lo", "root", "netem", "delay", "1ms"], ns=ns, check=False
        )
        return p.returncode == 0
    finally:
        run_cmd(["ip", "netns", "del", ns], check=False)


def htb_burst_bytes(rate_bps: float) -> int:
    """Token bucket depth of a class of ``rate_bps`` at the emulation's MTU (:mod:`.tc`)."""
    return tc.htb_burst_bytes(rate_bps, FRAME_BYTES)


def _peers(plan: EmulationPlan, i: int) -> list[tc.Peer]:
    rate, delay, goodput = plan.rate_bps, plan.delay_s, plan.goodput_bps
    return [
        tc.Peer(
            index=j,
            ip=plan.ip(j),
            rate_bps=float(rate[i, j]),
            delay_s=float(delay[i, j]),
            goodput_bps=float(goodput[i, j]),
        )
        for j in range(plan.num_devices)
        if j != i
    ]


def device_tc_lines(
    plan: EmulationPlan, i: int, *, netem: bool, dev: str = DEVICE_IFNAME
) -> list[str]:
    """``tc -batch`` lines shaping device i's egress: one HTB class per destination, ACK and
    data leaves, netem (backend ``netem``) or FIFO leaves (``nfqueue``: the bridge adds the
    delay), under the plan's egress cap if it has one. The builder is shared with the real-host
    scripts (:func:`.tc.egress_lines`).
    """
    cap = plan.scaled_egress_cap_gbps
    cap_bps = None if cap is None else cap * 1e9 * FRAME_OVERHEAD
    return tc.egress_lines(dev, _peers(plan, i), netem=netem, mtu=MTU, cap_bps=cap_bps)


def tcp_congestion_control() -> str | None:
    """``cubic`` when this kernel has it (built in or loaded), else None (the default stays)."""
    try:
        have = Path("/proc/sys/net/ipv4/tcp_available_congestion_control").read_text().split()
    except OSError:
        return None
    return "cubic" if "cubic" in have else None


def device_route_lines(
    plan: EmulationPlan, i: int, *, dev: str = DEVICE_IFNAME, congctl: str | None = "cubic"
) -> list[str]:
    """Host routes from device i to every peer with a TCP window clamp of 1.25 x BDP + 64 KiB
    and CUBIC (:func:`system.emulation.tc.route_lines`, which says why).

    A namespace may only pick a congestion control from the host's allowed list (here reno and
    bbr, with bbr the default), so the per-namespace sysctl cannot select CUBIC; a route metric
    can. ``congctl=None`` leaves the default (a kernel without CUBIC); the TCP check of
    :func:`system.emulation.verify.verify_links` then tells whether the transport fills the links.
    """
    return tc.route_lines(dev, _peers(plan, i), congctl=congctl)


class Emulation:
    """Context manager: build the emulated network of ``plan``, tear it down on any exit.

    Example (needs root)::

        with Emulation(make_plan(get_case("debug"), bandwidth_scale=0.1)) as emu:
            emu.exec_prefix(0)   # ["ip", "netns", "exec", "dtfm-<tag>-d0"]
    """

    def __init__(
        self,
        plan: EmulationPlan,
        *,
        backend: str = "auto",
        delayer_workers: int | None = None,
        shape_egress: bool = True,
    ) -> None:
        if backend not in BACKENDS:
            raise ValueError(f"emulation backend must be one of {BACKENDS}, got {backend!r}")
        workers = min(2, os.cpu_count() or 1) if delayer_workers is None else delayer_workers
        if not 1 <= workers <= 16:
            raise ValueError(f"emulation delayer_workers must be 1..16, got {delayer_workers}")
        # backend nfqueue: delayer processes, flows hashed over as many queues (one per core
        # up to 2: each handles every packet of its flows in Python)
        self.delayer_workers = workers
        # False: leave each device's egress (HTB, routes, TCP sysctls) to the caller, who applies
        # the real-host script inside the namespace (tests/multihost); the bridge still delays
        self.shape_egress = shape_egress
        self.plan = plan
        self.requested_backend = backend
        self.backend: str | None = None
        self.state_dir = STATE_ROOT / f"{PREFIX}{plan.tag}"
        self._delayers: list[subprocess.Popen] = []
        self.tcp_congestion_control: str | None = None  # set by setup()
        self._created: list[str] = []
        self._signals: contextlib.ExitStack | None = None
        self._guard: int | None = None
        self._closed = True
        self.setup_s = 0.0

    # ---- public helpers ---------------------------------------------------------------------
    def exec_prefix(self, i: int) -> list[str]:
        return ns_prefix(self.plan.device_ns(i))

    def rank_env(self, i: int) -> dict[str, str]:
        return {"GLOO_SOCKET_IFNAME": DEVICE_IFNAME, "TP_SOCKET_IFNAME": DEVICE_IFNAME}

    @property
    def master_addr(self) -> str:
        return self.plan.ip(0)

    def delayer_stats(self) -> dict:
        """The delayers' counters summed (maxima: the max) plus the kernel's NFQUEUE counters.

        ``sum_late_s`` / ``delayed``: mean release lateness; ``sum_intake_s`` / ``stamped``: mean
        wait in the kernel queue before a delayer read the packet (its delay counts from the
        kernel's arrival stamp, so intake waits shorter than the pair's delay cost nothing).
        """
        stats: dict = {}
        for f in sorted(self.state_dir.glob("delayer_stats*.json")):
            try:
                one = json.loads(f.read_text())
            except (OSError, ValueError):
                continue
            for k, v in one.items():
                if k.startswith("max_"):
                    stats[k] = max(stats.get(k, 0.0), v)
                elif isinstance(v, int | float):
                    stats[k] = stats.get(k, 0) + v
                else:
                    stats[k] = v
        if self.backend == "nfqueue" and not self._closed:
            p = run_cmd(
                ["cat", "/proc/net/netfilter/nfnetlink_queue"], ns=self.plan.bridge_ns, check=False
            )
            for line in p.stdout.splitlines():  # queue, portid, waiting, mode, range,
                cols = line.split()  # queue_dropped, user_dropped, ...
                if len(cols) >= 7:
                    for k, c in (("kernel_waiting", 2), ("queue_dropped", 5), ("user_dropped", 6)):
                        stats[k] = stats.get(k, 0) + int(cols[c])
        if stats:
            stats["workers"] = self.delayer_workers
        return stats

    def tcp_retransmits(self) -> list[int]:
        """Per device: TCP segments retransmitted so far (``TcpRetransSegs``)."""
        out = []
        for i in range(self.plan.num_devices):
            p = run_cmd(["cat", "/proc/net/snmp"], ns=self.plan.device_ns(i), check=False)
            lines = [ln.split() for ln in p.stdout.splitlines() if ln.startswith("Tcp:")]
            try:
                out.append(int(lines[1][lines[0].index("RetransSegs")]))
            except (IndexError, ValueError):
                out.append(-1)
        return out

    # ---- lifecycle --------------------------------------------------------------------------
    def __enter__(self) -> Emulation:
        self.setup()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def setup(self) -> None:
        if os.geteuid() != 0:
            raise EmulationError("network emulation needs root (namespaces, tc, iptables)")
        missing = missing_tools(
            ("ip", "tc") if self.requested_backend == "netem" else ("ip", "tc", "iptables")
        )
        if missing:
            raise EmulationError(f"network emulation needs {', '.join(missing)} on PATH")
        t0 = time.perf_counter()
        reap_dead()  # earlier runs killed before they could clean up (their guard too)
        taken = [o for o in owners(self.plan.tag) if o.tag == self.plan.tag and o.alive]
        if taken:
            raise EmulationError(
                f"emulation tag {self.plan.tag!r} is in use by the live process {taken[0].pid}"
            )
        self._closed = False
        atexit.register(self.close)
        self._signals = contextlib.ExitStack()
        self._signals.enter_context(exit_on_signals())  # SIGTERM/SIGHUP: close() runs
        try:
            write_state(
                self.state_dir,
                tag=self.plan.tag,
                namespaces=[*self.plan.namespaces, self._probe_ns],
                backend=None,
            )
            self._guard = on_death(
                "run",
                [sys.executable, "-m", "system.emulation", "cleanup", "--tag", self.plan.tag],
            )
            self.backend = self._pick_backend()
            self._build()
        except BaseException:
            self.close()
            raise
        self.setup_s = time.perf_counter() - t0
        log.info(
            "emulation %s: %d devices, backend %s, bandwidth x%g, delay x%g (%.1f s)",
            self.plan.tag,
            self.plan.num_devices,
            self.backend,
            self.plan.bandwidth_scale,
            self.plan.delay_scale,
            self.setup_s,
        )

    @property
    def _probe_ns(self) -> str:
        return f"{PREFIX}{self.plan.tag}-probe"

    def _pick_backend(self) -> str:
        if self.requested_backend != "auto":
            return self.requested_backend
        return "netem" if has_netem(self._probe_ns) else "nfqueue"

    def _build(self) -> None:
        p, br = self.plan, self.plan.bridge_ns
        congctl = tcp_congestion_control()
        if congctl is None:
            log.warning(
                "emulation: this kernel has no CUBIC; TCP keeps the host's default "
                "congestion control (the link verification's TCP check will tell)"
            )
        self.tcp_congestion_control = congctl or "default"
        for ns in p.namespaces:
            run_cmd(["ip", "netns", "add", ns])
            self._created.append(ns)
            run_cmd(["sysctl", "-q", "-w", "net.ipv6.conf.all.disable_ipv6=1"], ns=ns, check=False)
        bridge_lines = ["link add br0 type bridge", "link set br0 up"]
        for i in range(p.num_devices):
            bridge_lines += [
                f"link add v{i} mtu {MTU} type veth peer name {DEVICE_IFNAME} "
                f"netns {p.device_ns(i)}",
                f"link set v{i} master br0",
                f"link set v{i} up",
            ]
        run_batch("ip", bridge_lines, ns=br)
        for i in range(p.num_devices):
            ns = p.device_ns(i)
            run_batch(
                "ip",
                [
                    "link set lo up",
                    f"link set {DEVICE_IFNAME} mtu {MTU}",
                    f"addr add {p.ip(i)}/{p.prefixlen} dev {DEVICE_IFNAME}",
                    f"link set {DEVICE_IFNAME} up",
                ],
                ns=ns,
            )
            if not self.shape_egress:
                continue
            run_batch("tc", device_tc_lines(p, i, netem=self.backend == "netem"), ns=ns)
            run_batch("ip", device_route_lines(p, i, congctl=congctl), ns=ns)
            for kv in _DEVICE_SYSCTLS:
                run_cmd(["sysctl", "-q", "-w", kv], ns=ns, check=False)
        if self.backend == "nfqueue":
            self._start_delayer()

    def _start_delayer(self) -> None:
        """Start one delayer per NFQUEUE queue; the iptables rule spreads flows over them."""
        br = self.plan.bridge_ns
        table = self.state_dir / "delays.json"
        table.write_text(json.dumps(self.plan.delay_table()))
        run_cmd(["sysctl", "-q", "-w", "net.bridge.bridge-nf-call-iptables=1"], ns=br)
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(
                filter(None, [_project_root(), os.environ.get("PYTHONPATH")])
            ),
        }
        ready = []
        for q in range(self.delayer_workers):
            ready.append(self.state_dir / f"delayer_ready{q}.json")
            ready[-1].unlink(missing_ok=True)
            log_f = open(self.state_dir / f"delayer{q}.log", "w")  # noqa: SIM115 (the child keeps it)
            self._delayers.append(
                subprocess.Popen(
                    [
                        "ip",
                        "netns",
                        "exec",
                        br,
                        sys.executable,
                        "-m",
                        "system.emulation.delayer",
                        "--table",
                        str(table),
                        "--queue",
                        str(q),
                        "--ready-file",
                        str(ready[-1]),
                        "--stats-file",
                        str(self.state_dir / f"delayer_stats{q}.json"),
                    ],
                    stdout=log_f,
                    stderr=subprocess.STDOUT,
                    env=env,
                )
            )
            log_f.close()
        deadline = time.monotonic() + 20.0
        for q, (proc, f) in enumerate(zip(self._delayers, ready, strict=True)):
            while not f.exists():
                if proc.poll() is not None:
                    raise EmulationError(
                        f"delayer {q} exited ({proc.returncode}): "
                        f"{(self.state_dir / f'delayer{q}.log').read_text()[-500:]}"
                    )
                if time.monotonic() > deadline:
                    raise EmulationError(f"delayer {q} did not become ready within 20 s")
                time.sleep(0.05)
        n = self.delayer_workers
        target = ["--queue-num", "0"] if n == 1 else ["--queue-balance", f"0:{n - 1}"]
        run_cmd(["iptables", "-A", "FORWARD", "-j", "NFQUEUE", *target], ns=br)

    def close(self) -> None:
        """Remove everything this emulation created; safe to call twice; never raises."""
        if self._closed:
            return
        self._closed = True
        for proc in self._delayers:
            if proc.poll() is None:
                proc.terminate()
        for proc in self._delayers:
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)
        for ns in reversed(self._created):
            kill_netns_pids(ns)
            try:
                run_cmd(["ip", "netns", "del", ns], check=True, timeout_s=15)
            except EmulationError as e:
                log.warning("cleanup: %s", e)
        self._created.clear()
        try:
            stats = self.delayer_stats()
            if stats:
                log.info("delayer stats: %s", stats)
            shutil.rmtree(self.state_dir, ignore_errors=True)
        except OSError:
            pass
        if self._guard is not None:
            cancel(self._guard)
            self._guard = None
        if self._signals is not None:
            self._signals.close()
            self._signals = None
        atexit.unregister(self.close)


def _project_root() -> str:
    return str(Path(__file__).resolve().parents[2])
