"""Check an emulated network before a run: RTT and capacity on sampled pairs (paper §4.1 links).

For each sampled ordered pair (i, j): RTT by ``ping`` (median of a few, first one dropped: it pays
ARP) against 2·delay_ms, capacity by a UDP flood (:mod:`system.emulation.probe`) converted to
TCP-goodput terms against the pair's scaled bandwidth, and what the runtime sees: the time of a TCP
message (0.1 s of link time, at least 64 KiB) and a one-byte reply over a warm connection, against
α_ij + 8·X/β_ij + α_ji. The TCP check catches what the link checks cannot: a transport that does
not fill the link (a congestion control that paces short bursts below the link rate). A pair passes
when both are within ``tolerance`` (relative; RTT also passes within ``rtt_floor_ms`` absolute,
which matters only for near-zero delays, e.g. 0.2 ms of bridge/delayer path on a 0 ms link). A pair
that misses is measured again up to ``retries`` times (the probes are Python processes on shared
cores); every attempt is kept in the report, and the last one decides. Pairs that still miss while
other work keeps this machine's CPUs busy are measured again once the load falls
(:func:`verify_links`), and a miss under load is reported as such (:class:`EmulationOverloaded`),
not as a broken emulator."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field

import numpy as np

from system.emulation.plan import FRAME_BYTES, TCP_PAYLOAD_BYTES, EmulationPlan
from system.emulation.probe import UDP_PAYLOAD_BYTES, WIRE_BYTES
from system.emulation.shell import EmulationError, ns_prefix

log = logging.getLogger(__name__)

__all__ = [
    "PairCheck",
    "sample_pairs",
    "measure_rtt_ms",
    "measure_capacity_gbps",
    "measure_tcp_s",
    "tcp_message_bytes",
    "verify_links",
    "busy_cpus",
    "EmulationOverloaded",
    "ON_FAIL",
]

ON_FAIL = ("raise", "warn")  # what verify_links does when a link misses its target

_TIME_RE = re.compile(r"time=([0-9.]+) ms")


@dataclass
class PairCheck:
    src: int
    dst: int
    target_rtt_ms: float
    rtt_ms: float
    target_gbps: float
    gbps: float
    rtt_err: float  # relative error (measured/target - 1); nan when target is 0
    bw_err: float
    ok: bool
    target_tcp_s: float = float("nan")  # α_ij + 8X/β_ij + α_ji for the TCP message
    tcp_s: float = float("nan")  # measured (median of the warm repeats)
    tcp_err: float = float("nan")
    attempts: list = field(default_factory=list)  # (rtt_ms, gbps, tcp_s) of every measurement


def sample_pairs(plan: EmulationPlan, n: int, rng: np.random.Generator) -> list[tuple[int, int]]:
    """``n`` distinct ordered pairs: the longest-delay and the slowest pair first, then random."""
    d = plan.num_devices
    allp = [(i, j) for i in range(d) for j in range(d) if i != j]
    if n >= len(allp):
        return allp
    delay, bw = plan.delay_s, plan.goodput_bps
    picked = [max(allp, key=lambda p: delay[p]), min(allp, key=lambda p: bw[p])]
    rest = [p for p in allp if p not in picked]
    for k in rng.permutation(len(rest)):
        if len(dict.fromkeys(picked)) >= n:
            break
        picked.append(rest[k])
    return list(dict.fromkeys(picked))[:n]


def measure_rtt_ms(plan: EmulationPlan, i: int, j: int, count: int = 6) -> float:
    """Median ping RTT (ms) from device i to device j; the first echo is dropped (ARP)."""
    wait_s = max(2, int(4 * plan.delay_s[i, j] + 2))
    p = subprocess.run(
        ns_prefix(plan.device_ns(i))
        + ["ping", "-n", "-c", str(count), "-i", "0.05", "-W", str(wait_s), plan.ip(j)],
        capture_output=True,
        text=True,
        timeout=count * 0.05 + 3 * wait_s + 5,
    )
    times = [float(x) for x in _TIME_RE.findall(p.stdout)]
    if len(times) < 2:
        raise EmulationError(f"ping {i}->{j} got {len(times)} replies: {p.stdout[-300:]}")
    return statistics.median(times[1:])


def _probe_cmd(plan: EmulationPlan, device: int, *args: str) -> list[str]:
    """The command running ``python -m system.emulation.probe ARGS`` inside ``device``'s
    namespace."""
    probe = [sys.executable, "-m", "system.emulation.probe"]
    return ns_prefix(plan.device_ns(device)) + probe + list(args)


@contextlib.contextmanager
def _receiver(plan: EmulationPlan, device: int, *args: str):
    """A probe receiver (``args``: its subcommand and options) running in ``device``, yielded once
    it printed ``ready``; EmulationError if it did not start; killed on exit if still running."""
    recv = subprocess.Popen(
        _probe_cmd(plan, device, *args), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        if "ready" not in recv.stdout.readline():
            raise EmulationError(
                f"{args[0].split('-')[0]} receiver in device {device} did not start: "
                f"{recv.stderr.read()[-300:]}"
            )
        yield recv
    finally:
        if recv.poll() is None:
            recv.kill()
            recv.wait(timeout=5)


def measure_capacity_gbps(
    plan: EmulationPlan, i: int, j: int, *, port: int = 47000, min_bytes: float = 1e6
) -> float:
    """Capacity of link i→j as TCP goodput (Gbit/s), from a UDP flood's arrival rate."""
    target = float(plan.single_flow_goodput_bps[i, j])
    duration = float(np.clip(min_bytes * 8 / target, 0.3, 2.0))
    with _receiver(plan, j, "udp-recv", "--port", str(port), "--duration-s", str(duration)) as recv:
        subprocess.run(
            _probe_cmd(plan, i, "udp-send", "--dst", plan.ip(j), "--port", str(port))
            + ["--duration-s", str(duration)],
            capture_output=True,
            text=True,
            timeout=duration + 10,
            check=True,
        )
        out, _ = recv.communicate(timeout=duration + 10)
    res = json.loads(out.strip().splitlines()[-1])
    payload_bps = float(res["rate_bps"])
    frames_per_s = payload_bps / 8 / UDP_PAYLOAD_BYTES * WIRE_BYTES / FRAME_BYTES
    return frames_per_s * TCP_PAYLOAD_BYTES * 8 / 1e9  # the same frames full of TCP payload


def tcp_message_bytes(plan: EmulationPlan, i: int, j: int) -> int:
    """Size of the TCP check's message: 0.1 s of the link's goodput, at least 64 KiB."""
    return int(max(65536, min(16 * 2**20, 0.1 * float(plan.single_flow_goodput_bps[i, j]) / 8)))


def measure_tcp_s(
    plan: EmulationPlan,
    i: int,
    j: int,
    nbytes: int,
    *,
    repeats: int = 2,
    warmup: int = 3,
    port: int = 47001,
) -> float:
    """Median time (s) of an ``nbytes`` TCP message i→j plus a one-byte reply j→i, measured on a
    connection warmed up by ``warmup`` messages first (slow start is not the link's property)."""
    timeout = 60.0
    with _receiver(plan, j, "tcp-recv", "--port", str(port), "--timeout-s", str(timeout)) as recv:
        p = subprocess.run(
            _probe_cmd(plan, i, "tcp-send", "--dst", plan.ip(j), "--port", str(port))
            + ["--nbytes", str(nbytes), "--repeats", str(repeats), "--warmup", str(warmup)]
            + ["--timeout-s", str(timeout)],
            capture_output=True,
            text=True,
            timeout=timeout + 10,
            check=True,
        )
        recv.communicate(timeout=timeout)
    times = json.loads(p.stdout.strip().splitlines()[-1])["times_s"]
    return statistics.median(times)


def busy_cpus(window_s: float = 1.0) -> tuple[float, int]:
    """(CPUs busy, CPUs) over ``window_s`` from /proc/stat: the machine's load while this process
    waits. Between measurements the emulation is idle (no traffic, delayers asleep), so what is
    busy then is other work on the machine. ((nan, 0) where /proc/stat cannot be read.)"""

    def snap() -> tuple[int, int, int]:
        with open("/proc/stat") as f:
            lines = f.read().splitlines()
        vals = [int(x) for x in lines[0].split()[1:9]]  # user..steal (guest is inside user)
        cpus = sum(1 for ln in lines[1:] if ln.startswith("cpu"))
        return sum(vals), vals[3] + vals[4], cpus  # total, idle + iowait

    try:
        t0, i0, cpus = snap()
        time.sleep(window_s)
        t1, i1, _ = snap()
    except (OSError, ValueError, IndexError):
        return float("nan"), 0
    if t1 <= t0:
        return 0.0, cpus
    return (1.0 - (i1 - i0) / (t1 - t0)) * cpus, cpus


class EmulationOverloaded(EmulationError):
    """Links off target while other work kept this machine's CPUs busy: a measurement that
    cannot be trusted, not evidence of a broken emulator (the message gives the load)."""


def _loaded(busy: float, cpus: int, threshold: float) -> bool:
    return cpus > 0 and busy >= threshold * cpus


def _back_off(max_s: float, threshold: float) -> tuple[float, int, float]:
    """Wait, at most ``max_s``, until less than ``threshold`` of the CPUs is busy; returns
    (busy CPUs, CPUs, seconds waited) at the end."""
    t0 = time.monotonic()
    busy, cpus = busy_cpus()
    while _loaded(busy, cpus, threshold) and time.monotonic() - t0 < max_s:
        time.sleep(min(4.0, max(0.0, max_s - (time.monotonic() - t0))))
        busy, cpus = busy_cpus()
    return busy, cpus, time.monotonic() - t0


def verify_links(
    plan: EmulationPlan,
    *,
    pairs: int = 6,
    tolerance: float = 0.10,
    on_fail: str = "raise",
    seed: int = 0,
    rtt_floor_ms: float = 0.5,
    retries: int = 1,
    busy_threshold: float = 0.25,
    backoff_s: float = 120.0,
) -> dict:
    """Measure sampled pairs; return {"pairs": [...], "ok": bool, ...}; raise or warn on misses.

    A loaded machine is told from a broken emulator: when pairs miss, the CPUs are measured
    while the emulation is idle (:func:`busy_cpus`); if at least ``busy_threshold`` of them are
    busy with other work, verification waits (at most ``backoff_s``) for the load to fall and
    measures the missed pairs again. Pairs that still miss raise :class:`EmulationOverloaded`
    (naming the load) when the machine was still loaded, else :class:`EmulationError`. The
    report holds the load (``busy_cpus``, ``cpus``, ``load_avg_1m``, ``backoff_s``).
    """
    if on_fail not in ON_FAIL:
        raise ValueError(f"verify on_fail must be one of {ON_FAIL}, got {on_fail!r}")
    if not (0 < busy_threshold <= 1 and 0 <= backoff_s < float("inf")):
        raise ValueError("verify: busy_threshold must be in (0, 1] and backoff_s finite >= 0")
    checks = [
        _check_pair(plan, i, j, tolerance, rtt_floor_ms, 1 + retries)
        for i, j in sample_pairs(plan, pairs, np.random.default_rng(seed))
    ]
    load = {"busy_cpus": None, "cpus": None, "backoff_s": 0.0}
    if not all(c.ok for c in checks):
        busy, cpus = busy_cpus()
        load.update(busy_cpus=busy, cpus=cpus)
        if _loaded(busy, cpus, busy_threshold):
            log.warning(
                "emulated links: %d pair(s) off target while %.1f of %d CPUs were busy with "
                "other work; waiting up to %.0f s for the load to fall, then measuring again",
                sum(not c.ok for c in checks),
                busy,
                cpus,
                backoff_s,
            )
            busy, cpus, waited = _back_off(backoff_s, busy_threshold)
            checks = [
                c if c.ok else _check_pair(plan, c.src, c.dst, tolerance, rtt_floor_ms, 1, c)
                for c in checks
            ]
            after, cpus = busy_cpus()
            load.update(busy_cpus=max(busy, after), cpus=cpus, backoff_s=waited)
    report = {
        "ok": all(c.ok for c in checks),
        "tolerance": tolerance,
        "pairs": [asdict(c) for c in checks],
        "max_abs_rtt_err": float(np.nanmax([abs(c.rtt_err) for c in checks] or [0.0])),
        "max_abs_bw_err": float(max([abs(c.bw_err) for c in checks] or [0.0])),
        "max_abs_tcp_err": float(max([abs(c.tcp_err) for c in checks] or [0.0])),
        "load_avg_1m": os.getloadavg()[0],
        **load,
    }
    if not report["ok"]:
        bad = [(c.src, c.dst) for c in checks if not c.ok]
        msg = f"emulated links off target by more than {tolerance:.0%} on pairs {bad}"
        overloaded = _loaded(load["busy_cpus"] or 0.0, load["cpus"] or 0, busy_threshold)
        if overloaded:
            msg += (
                f" while this machine was loaded by other work ({load['busy_cpus']:.1f} of "
                f"{load['cpus']} CPUs busy, 1-minute load {report['load_avg_1m']:.1f}, after "
                f"waiting {load['backoff_s']:.0f} s for it to fall)"
            )
        if on_fail == "raise":
            raise (EmulationOverloaded if overloaded else EmulationError)(msg)
        log.warning("%s", msg)
    return report


def _check_pair(
    plan: EmulationPlan,
    i: int,
    j: int,
    tolerance: float,
    rtt_floor_ms: float,
    tries: int,
    earlier: PairCheck | None = None,
) -> PairCheck:
    """Measure pair (i, j) up to ``tries`` times until it is within tolerance (busy cores make
    the probes miss); every attempt is kept (after ``earlier``'s), the last one decides."""
    t_rtt = 2e3 * float(plan.delay_s[i, j])
    t_bw = float(plan.single_flow_goodput_bps[i, j]) / 1e9
    nbytes = tcp_message_bytes(plan, i, j)
    t_tcp = float(
        plan.delay_s[i, j] + plan.delay_s[j, i] + 8.0 * nbytes / plan.single_flow_goodput_bps[i, j]
    )
    attempts = list(earlier.attempts) if earlier is not None else []
    for _ in range(tries):
        rtt = measure_rtt_ms(plan, i, j)
        bw = measure_capacity_gbps(plan, i, j)
        tcp = measure_tcp_s(plan, i, j, nbytes)
        rtt_err = rtt / t_rtt - 1 if t_rtt > 0 else float("nan")
        bw_err, tcp_err = bw / t_bw - 1, tcp / t_tcp - 1
        ok = (
            abs(rtt - t_rtt) <= max(tolerance * t_rtt, rtt_floor_ms)
            and abs(bw_err) <= tolerance
            and abs(tcp_err) <= tolerance
        )
        attempts.append((rtt, bw, tcp))
        if ok:
            break
    log.info(
        "link %d->%d: RTT %.2f ms (target %.2f), %.4f Gbit/s (target %.4f), TCP %.0f KiB "
        "%.3f s (target %.3f) %s",
        i,
        j,
        rtt,
        t_rtt,
        bw,
        t_bw,
        nbytes / 1024,
        tcp,
        t_tcp,
        "ok" if ok else "OFF",
    )
    return PairCheck(
        i,
        j,
        t_rtt,
        rtt,
        t_bw,
        bw,
        rtt_err,
        bw_err,
        ok,
        target_tcp_s=t_tcp,
        tcp_s=tcp,
        tcp_err=tcp_err,
        attempts=attempts,
    )
