"""What a run leaves on this machine: its process tree, listening ports and temporary folders.

A test snapshots a running job (:func:`snapshot`), kills it, then asks :func:`left_after` what
survived: processes of the snapshot still alive (the same pid and start time), TCP ports the
snapshot's processes listened on that something still listens on, folders that still exist.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from system.lifeline import descendants, process_start_time

__all__ = ["Snapshot", "snapshot", "left_after", "cmdline"]


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


def _socket_inodes(pid: int) -> set[int]:
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


def _listening(pid: int | None = None) -> dict[int, int]:
    """{socket inode: port} of TCP sockets in LISTEN state, in the network namespace of ``pid``
    (this process's when None)."""
    out = {}
    base = f"/proc/{pid}/net" if pid else "/proc/net"
    for name in ("tcp", "tcp6"):
        try:
            lines = Path(base, name).read_text().splitlines()[1:]
        except OSError:
            continue
        for ln in lines:
            cols = ln.split()
            if len(cols) > 9 and cols[3] == "0A":  # LISTEN
                out[int(cols[9])] = int(cols[1].rsplit(":", 1)[1], 16)
    return out


def snapshot(root: int, folders=()) -> Snapshot:
    """The process tree under ``root`` (root included), their listening ports, ``folders``."""
    s = Snapshot(folders=set(map(str, folders)))
    listening = _listening()
    for pid in [root, *descendants(root)]:
        start = process_start_time(pid)
        if start is None:
            continue
        s.procs[pid] = start
        s.ports |= {listening[i] for i in _socket_inodes(pid) if i in listening}
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
        ports = sorted(s.ports & set(_listening().values()))
        folders = sorted(f for f in s.folders if Path(f).exists())
        if not (procs or ports or folders) or time.monotonic() > end:
            return {"processes": procs, "ports": ports, "folders": folders}
        time.sleep(0.2)


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return False


def remove(s: Snapshot) -> None:
    """Kill whatever of ``s`` still runs and remove its folders (a failed test cleans up)."""
    import shutil
    import signal

    for pid, start in s.procs.items():
        if process_start_time(pid) == start:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
    for f in s.folders:
        shutil.rmtree(f, ignore_errors=True)


def guard_of(pid: int) -> int:
    """The lifeline guard ``pid`` started (:mod:`system.lifeline`): its child running it."""
    guards = [d for d in descendants(pid) if "system.lifeline" in " ".join(cmdline(d))]
    assert len(guards) == 1, guards
    return guards[0]
