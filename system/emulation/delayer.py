"""Userspace per-pair delay for kernels without ``sch_netem``, paper §4.1 links.

Runs inside the bridge namespace: an iptables rule sends every bridged IPv4 packet to NFQUEUE
queue ``--queue``; this process reads the packet's source and destination addresses (only the
first 20 bytes are copied), looks up the pair's one-way delay and gives the packet its ACCEPT
verdict once the delay has passed since the kernel took the packet in (its receive timestamp,
which a timestamping socket of this process switches on), so time spent waiting for this process
is part of the delay, not added to it. Delays are constant per pair, so each pair's packets
leave in arrival order. One thread: ``select`` on the queue's socket with a timeout equal to the
next release time. The emulator runs one process per queue and hashes flows over the queues.

Usage (the emulator starts it): ``python -m system.emulation.delayer --table T.json
--ready-file R --stats-file S [--queue 0]``. The table is ``[[src_ip, dst_ip, delay_s], ...]``.
It stops on SIGTERM/SIGINT or when its parent dies, and writes stats (packets, release lateness,
kernel-queue intake wait) every second and then.
"""

from __future__ import annotations

import argparse
import ctypes
import errno
import heapq
import json
import os
import select
import signal
import socket
import sys
import time
from pathlib import Path

__all__ = ["main", "load_table", "EARLY_S"]

EARLY_S = 50e-6  # release up to 50 µs early: about the wake-up latency of select()


def load_table(path: str | Path) -> dict[bytes, float]:
    """{src_ip_bytes + dst_ip_bytes: delay_s} from the JSON table file."""
    rows = json.loads(Path(path).read_text())
    table: dict[bytes, float] = {}
    for n, row in enumerate(rows):
        if len(row) != 3 or float(row[2]) < 0:
            raise ValueError(f"delay table {path}: row {n} must be [src_ip, dst_ip, delay_s >= 0]")
        table[socket.inet_aton(row[0]) + socket.inet_aton(row[1])] = float(row[2])
    return table


def _raise_priority() -> str:
    """Real-time FIFO priority (else nice -15): lateness under CPU load is the delayer's error."""
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(20))
        return "fifo"
    except (OSError, AttributeError):
        try:
            os.nice(-15)
            return "nice"
        except OSError:
            return "normal"


def _die_with_parent() -> None:
    try:  # PR_SET_PDEATHSIG = 1: get SIGTERM when the emulator dies without cleaning up
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)
    except OSError:
        pass


def _write_json(path: str | None, data: dict) -> None:
    if not path:
        return
    from system.results import atomic_write_text  # standard library only: cheap to import

    atomic_write_text(path, json.dumps(data))


class _Bounded:
    """A socket view whose ``recv`` reports EAGAIN after ``n`` reads (bounds one batch)."""

    def __init__(self, sock: socket.socket, n: int) -> None:
        self.sock, self.left = sock, n

    def recv(self, size: int) -> bytes:
        if self.left <= 0:
            raise BlockingIOError(errno.EAGAIN, "batch done")
        self.left -= 1
        return self.sock.recv(size)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--table", required=True)
    ap.add_argument("--queue", type=int, default=0)
    ap.add_argument("--ready-file", default=None)
    ap.add_argument("--stats-file", default=None)
    ap.add_argument("--max-len", type=int, default=200_000, help="kernel queue length (packets)")
    args = ap.parse_args(argv)

    from netfilterqueue import COPY_PACKET, NetfilterQueue

    _die_with_parent()
    priority = _raise_priority()
    parent = os.getppid()
    table = load_table(args.table)
    heap: list[tuple[float, int, object]] = []
    seq = 0
    stats = {
        "packets": 0,
        "delayed": 0,
        "max_late_s": 0.0,
        "sum_late_s": 0.0,
        "max_backlog": 0,
        "priority": "?",
        "stamped": 0,
        "max_intake_s": 0.0,
        "sum_intake_s": 0.0,
    }
    stop = False
    stats["priority"] = priority

    def on_signal(signum, frame):  # noqa: ARG001
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    wall_minus_mono = time.time() - time.monotonic()

    def on_packet(pkt) -> None:
        nonlocal seq
        now = time.monotonic()
        # when the kernel took the packet in (wall clock), or 0: the delay counts from then, so
        # time spent waiting in the queue for this process is not added to the pair's delay
        stamp = pkt.get_timestamp()
        if stamp > 0:
            arrived = min(now, stamp - wall_minus_mono)
            stats["stamped"] += 1
            stats["sum_intake_s"] += now - arrived
            stats["max_intake_s"] = max(stats["max_intake_s"], now - arrived)
        else:
            arrived = now
        hdr = pkt.get_payload()
        stats["packets"] += 1
        delay = table.get(hdr[12:20], 0.0) if len(hdr) >= 20 else 0.0
        if delay <= 0.0:
            pkt.accept()
            return
        seq += 1
        heapq.heappush(heap, (arrived + delay, seq, pkt))
        stats["delayed"] += 1

    # a socket asking for receive timestamps turns the kernel's packet timestamping on, so every
    # queued packet carries the time it arrived (the queue's intake delay becomes measurable)
    stamp_sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    stamp_sock.setsockopt(socket.SOL_SOCKET, getattr(socket, "SO_TIMESTAMP", 29), 1)
    nfq = NetfilterQueue()
    nfq.bind(
        args.queue,
        on_packet,
        max_len=args.max_len,
        mode=COPY_PACKET,
        range=20,
        sock_len=64 * 1024 * 1024,
    )
    sock = socket.fromfd(nfq.get_fd(), socket.AF_NETLINK, socket.SOCK_RAW)
    sock.setblocking(False)
    _write_json(args.ready_file, {"pid": os.getpid(), "queue": args.queue, "pairs": len(table)})
    last_check = time.monotonic()
    try:
        while not stop:
            now = time.monotonic()
            while heap and heap[0][0] <= now + EARLY_S:  # release everything that is due
                due, _, pkt = heapq.heappop(heap)
                late = now - due
                stats["sum_late_s"] += late
                stats["max_late_s"] = max(stats["max_late_s"], late)
                pkt.accept()
            timeout = min(0.2, heap[0][0] - now) if heap else 0.2
            ready, _, _ = select.select([sock], [], [], max(timeout, 0.0))
            if ready:
                nfq.run_socket(_Bounded(sock, 256))  # at most 256 messages, then release again
                stats["max_backlog"] = max(stats["max_backlog"], len(heap))
            if now - last_check > 1.0:
                last_check = now
                wall_minus_mono = time.time() - time.monotonic()  # follow clock adjustments
                if os.getppid() != parent:
                    break
                _write_json(args.stats_file, stats)
    finally:
        for _, _, pkt in heap:  # let in-flight packets go rather than drop them
            pkt.accept()
        _write_json(args.stats_file, stats)
        nfq.unbind()
    return 0


if __name__ == "__main__":
    sys.exit(main())
