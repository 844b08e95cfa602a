"""What a run leaves on this machine: its process tree, listening ports and temporary folders
(used by the killed-run tests and the hostile-input probes).

A test snapshots a running job (:func:`snapshot`), kills it, then asks :func:`left_after` what
survived: processes of the snapshot still alive (the same pid and start time), TCP ports the
snapshot's processes listened on that something still listens on, folders that still exist.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from system.lifeline import descendants, process_start_time

__all__ = [
    "Snapshot",
    "snapshot",
    "left_after",
    "stop",
    "cmdline",
    "guard_of",
    "listening",
    "socket_inodes",
    "start_job",
    "as_a_job",
]


@dataclass
class Snapshot:
    procs: dict[int, int] = field(default_factory=dict)  # pid -> start time
    ports: set[int] = field(default_factory=set)  # TCP ports they listened on
    folders: set[str] = field(default_factory=set)


def cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")[:-1]
    except OSError:
        return []


def socket_inodes(pid: int) -> set[int]:
    """Inodes of the sockets process ``pid`` holds open."""
    out = set()
    try:
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            try:
                target = os.readlink(fd)
            except OSError:
                continue
            if target.startswith("socket:["):
                out.add(int(target[8:-1]))
    except OSError:
        pass
    return out


def listening() -> dict[int, str]:
    """{socket inode: local address as /proc shows it, ``HEXADDR:HEXPORT``} of every TCP socket
    in LISTEN state in this network namespace."""
    out = {}
    for name in ("tcp", "tcp6"):
        try:
            lines = Path(f"/proc/net/{name}").read_text().splitlines()[1:]
        except OSError:
            continue
        for ln in lines:
            cols = ln.split()
            if len(cols) > 9 and cols[3] == "0A":  # TCP_LISTEN
                out[int(cols[9])] = cols[1]
    return out


def _ports() -> dict[int, int]:
    return {inode: int(addr.rsplit(":", 1)[1], 16) for inode, addr in listening().items()}


def snapshot(root: int, folders=()) -> Snapshot:
    """The process tree under ``root`` (root included), their listening ports, ``folders``."""
    s = Snapshot(folders=set(map(str, folders)))
    ports = _ports()
    for pid in [root, *descendants(root)]:
        start = process_start_time(pid)
        if start is None:
            continue
        s.procs[pid] = start
        s.ports |= {ports[i] for i in socket_inodes(pid) if i in ports}
    return s


def left_after(s: Snapshot, timeout_s: float = 30.0) -> dict:
    """What of ``s`` is still there once ``timeout_s`` has passed (or at once when nothing is):
    ``{"processes": [(pid, cmdline)], "ports": [...], "folders": [...]}``, empty lists if none."""
    end = time.monotonic() + timeout_s
    while True:
        procs = [
            (pid, " ".join(cmdline(pid))[:120])
            for pid, start in s.procs.items()
            if process_start_time(pid) == start and not _zombie(pid)
        ]
        ports = sorted(s.ports & set(_ports().values()))
        folders = sorted(f for f in s.folders if Path(f).exists())
        if not (procs or ports or folders) or time.monotonic() > end:
            return {"processes": procs, "ports": ports, "folders": folders}
        time.sleep(0.2)


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return False


def stop(p: subprocess.Popen, s: Snapshot | None) -> None:
    """After a test, failed or not: the job killed if it still runs, and whatever of ``s``
    survived killed or removed (a test of cleanup leaves nothing to the machine either way)."""
    import shutil
    import signal

    if p.poll() is None:
        p.kill()
        p.wait(timeout=30)
    for pid, start in (s.procs if s is not None else {}).items():
        if process_start_time(pid) == start:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
    for f in s.folders if s is not None else ():
        shutil.rmtree(f, ignore_errors=True)


def guard_of(pid: int) -> int:
    """The lifeline guard ``pid`` started (:mod:`system.lifeline`): its child running it."""
    guards = [d for d in descendants(pid) if "system.lifeline" in " ".join(cmdline(d))]
    if len(guards) != 1:
        raise LookupError(f"process {pid} has {len(guards)} lifeline guards, not one: {guards}")
    return guards[0]


def as_a_job() -> None:
    """``preexec_fn`` of a job under test: SIGTERM, SIGHUP and SIGINT at their defaults, as a
    job started from a terminal or by Slurm has them. A job inherits ignored signals, so a test
    run under ``nohup`` would otherwise start jobs that a hang-up cannot stop."""
    for s in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(s, signal.SIG_DFL)


def start_job(*overrides: str) -> subprocess.Popen:
    """``python repro/run.py *overrides`` as a job would run: in its own process group (which
    the tests never signal), this checkout on the path, output collected."""
    root = Path(__file__).resolve().parents[2]
    return subprocess.Popen(
        [sys.executable, "repro/run.py", *overrides],
        cwd=root,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONPATH": str(root), "OMP_NUM_THREADS": "1"},
        start_new_session=True,
        preexec_fn=as_a_job,
    )
