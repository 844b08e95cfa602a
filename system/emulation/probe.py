"""Small link probes run inside device namespaces: UDP capacity and TCP transfer time.

``python -m system.emulation.probe udp-recv --port P --duration-s D`` prints one JSON line with
the payload bytes received and the first/last arrival times; ``udp-send --dst IP --port P
--duration-s D`` sends back-to-back datagrams (the sender's HTB class paces them). A UDP flood
measures the shaped capacity without TCP's slow start, so a pair with a 250 ms RTT is verified in
a fraction of a second. ``tcp-recv`` / ``tcp-send`` time a payload over one warmed-up TCP
connection (what gloo sees), used to check α + 8·X/β on a pair.
"""

from __future__ import annotations

import argparse
import json
import socket
import sys
import time

from system.emulation.plan import MTU

__all__ = ["main", "steady_rate", "UDP_PAYLOAD_BYTES", "WIRE_BYTES"]

# One datagram = several full-size IP fragments (payload a multiple of 8 bytes), so the flood
# needs fewer system calls than one frame per datagram and a Python probe keeps up on busy cores.
FRAGMENT_PAYLOAD = (MTU - 20) // 8 * 8
FRAGMENTS = min(10, 65507 // FRAGMENT_PAYLOAD)
UDP_PAYLOAD_BYTES = FRAGMENTS * FRAGMENT_PAYLOAD - 8
WIRE_BYTES = FRAGMENTS * (FRAGMENT_PAYLOAD + 20 + 14)


def _udp_recv(port: int, duration_s: float, skip_first: int) -> dict:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 * 1024 * 1024)
    s.bind(("0.0.0.0", port))
    print(json.dumps({"ready": True}), flush=True)
    s.settimeout(duration_s + 5.0)
    times, sizes, n = [], [], 0
    deadline = None
    try:
        while True:
            data = s.recv(65536)
            now = time.monotonic()
            if data == b"END":
                break
            deadline = deadline or now + duration_s + 2.0
            n += 1
            if n > skip_first:
                times.append(now)
                sizes.append(len(data))
            if now > deadline:
                break
    except TimeoutError:
        pass
    s.close()
    return {"packets": n, "bytes": sum(sizes), **steady_rate(times, sizes)}


def steady_rate(times: list[float], sizes: list[int], settle: float = 0.25) -> dict:
    """Paced arrival rate (bit/s) after the first ``settle`` of the arrival span.

    The shaper lets its token bucket (a few ms of rate) through at once before it paces; those
    early arrivals are left out, so the rate is the long-run one the class enforces.
    """
    if len(times) < 4:
        return {"rate_bps": 0.0}
    t0 = times[0] + settle * (times[-1] - times[0])
    k = next(i for i, t in enumerate(times) if t >= t0)
    k = min(k, len(times) - 2)
    span = times[-1] - times[k]
    payload = sum(sizes[k + 1 :])  # bytes that arrived after the first kept arrival
    return {"span_s": span, "rate_bps": 8.0 * payload / span if span > 0 else 0.0}


def _udp_send(dst: str, port: int, duration_s: float) -> dict:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1024 * 1024)
    payload = b"x" * UDP_PAYLOAD_BYTES
    end = time.monotonic() + duration_s
    sent = 0
    while time.monotonic() < end:
        try:
            s.sendto(payload, (dst, port))
            sent += 1
        except OSError:  # ENOBUFS when the qdisc is full: back off a little
            time.sleep(0.0005)
    time.sleep(0.05)
    for _ in range(20):  # the END marker may be dropped by a full queue: repeat it
        try:
            s.sendto(b"END", (dst, port))
        except OSError:
            pass
        time.sleep(0.01)
    return {"sent": sent}


def _tcp_recv(port: int, timeout_s: float) -> dict:
    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("0.0.0.0", port))
    srv.listen(1)
    print(json.dumps({"ready": True}), flush=True)
    srv.settimeout(timeout_s)
    conn, _ = srv.accept()
    conn.settimeout(timeout_s)
    got = 0
    while True:  # protocol: 8-byte size, then that many bytes, reply 1 byte; size 0 ends
        hdr = _recv_exact(conn, 8)
        size = int.from_bytes(hdr, "big")
        if size == 0:
            break
        _recv_exact(conn, size)
        got += size
        conn.sendall(b"k")
    conn.close()
    srv.close()
    return {"bytes": got}


def _recv_exact(conn: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = conn.recv(min(n - len(buf), 4 * 1024 * 1024))
        if not chunk:
            raise ConnectionError("peer closed")
        buf += chunk
    return bytes(buf)


def _tcp_send(
    dst: str, port: int, nbytes: int, repeats: int, timeout_s: float, warmup: int = 1
) -> dict:
    s = socket.create_connection((dst, port), timeout=timeout_s)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    payload = b"y" * nbytes
    times = []
    for _ in range(repeats + warmup):  # the first transfers warm the connection up (slow start)
        t0 = time.perf_counter()
        s.sendall(len(payload).to_bytes(8, "big") + payload)
        _recv_exact(s, 1)
        times.append(time.perf_counter() - t0)
    s.sendall((0).to_bytes(8, "big"))
    s.close()
    return {"warmup_s": times[:warmup], "times_s": times[warmup:]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="link probes for emulation verification")
    ap.add_argument("kind", choices=["udp-recv", "udp-send", "tcp-recv", "tcp-send"])
    ap.add_argument("--dst", default="")
    ap.add_argument("--port", type=int, default=47000)
    ap.add_argument("--duration-s", type=float, default=0.5)
    ap.add_argument("--skip-first", type=int, default=3)
    ap.add_argument("--nbytes", type=int, default=1 << 20)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--warmup", type=int, default=1, help="tcp-send: untimed transfers first")
    ap.add_argument("--timeout-s", type=float, default=60.0)
    a = ap.parse_args(argv)
    if a.kind == "udp-recv":
        out = _udp_recv(a.port, a.duration_s, a.skip_first)
    elif a.kind == "udp-send":
        out = _udp_send(a.dst, a.port, a.duration_s)
    elif a.kind == "tcp-recv":
        out = _tcp_recv(a.port, a.timeout_s)
    else:
        out = _tcp_send(a.dst, a.port, a.nbytes, a.repeats, a.timeout_s, a.warmup)
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
