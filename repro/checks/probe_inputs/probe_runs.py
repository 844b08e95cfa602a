"""What surrounds a probe's commands: locks, mounts, a git repository, signals, leftovers.

A hostile input often needs more than a command line: the team's locks on a shared machine (a
probe that builds namespaces holds the namespace lock), a read-only or full filesystem (a small
tmpfs), a git repository whose index is stale, a dry run of generated scripts and a marker file
an injected command would create, or a signal sent to a training run once its ranks run and an
account of what the run left behind (processes, ports, folders, namespaces), which is removed
afterwards whatever the code under test did.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from repro.checks.probe_inputs.hostile import MARKER, PY, Probe

__all__ = ["NotRun", "Context", "around", "after", "signal_step", "tmpfs", "read_only", "fill"]


class NotRun(Exception):
    """A probe this machine cannot run (the message says why)."""


@dataclass
class Context:
    """What :func:`around` prepared: the scratch folder and the git index's stamp."""

    tree: Path
    scratch: Path
    index_mtime_ns: int | None = None


@contextlib.contextmanager
def _flock(path: Path, exclusive: bool):
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _sh(*args: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(list(args), capture_output=True, text=True, timeout=60, **kw)


@contextlib.contextmanager
def tmpfs(folder: Path, *, size: str = "4m"):
    """A tmpfs of ``size`` mounted on ``folder`` (created), unmounted on exit; :class:`NotRun`
    where this process cannot mount one (not root, no tmpfs)."""
    if os.geteuid() != 0:
        raise NotRun("needs root to mount a tmpfs")
    folder.mkdir(parents=True, exist_ok=True)
    if _sh("mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)).returncode:
        raise NotRun("mount -t tmpfs failed on this machine")
    try:
        yield folder
    finally:
        _sh("umount", "-l", str(folder))


def read_only(folder: Path) -> None:
    """Remount the tmpfs on ``folder`` read-only."""
    _sh("mount", "-o", "remount,ro", str(folder))


def fill(folder: Path) -> None:
    """Write to ``folder`` until its device is full."""
    with open(folder / "filler", "wb") as f, contextlib.suppress(OSError):
        while True:
            f.write(b"\0" * 65536)
            f.flush()


@contextlib.contextmanager
def _mount(kind: str, scratch: Path):
    """``ro``: ``R/ro`` a read-only tmpfs holding a study; ``full``: ``R/full`` a full tmpfs."""
    with tmpfs(scratch / kind) as d:
        if kind == "ro":
            from system.results import make_row, write_rows

            write_rows(d / "study", [make_row({"mode": "simulate", "case": "5"}, iter_time_s=1.0)])
            read_only(d)
        else:
            fill(d)
        yield


def _git_repo(tree: Path) -> int:
    """Make the copy a git repository whose index is stale; returns the index's mtime."""
    env = {**os.environ, "GIT_AUTHOR_NAME": "p", "GIT_AUTHOR_EMAIL": "p@p"}
    env |= {"GIT_COMMITTER_NAME": "p", "GIT_COMMITTER_EMAIL": "p@p"}
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "copy"]):
        _sh("git", *args, cwd=tree, env=env)
    os.utime(tree / "pyproject.toml", (1, 1))  # the index's stat data no longer matches
    return (tree / ".git" / "index").stat().st_mtime_ns


@contextlib.contextmanager
def around(probe: Probe, tree: Path, scratch: Path, lock_dir: str | None):
    """The team's locks (``lock_dir``: the namespace lock first for an emulating probe, then the
    CPU lock shared), the probe's mount and git repository; yields a :class:`Context`."""
    if probe.netns and os.geteuid() != 0:
        raise NotRun("builds network namespaces: needs root")
    with contextlib.ExitStack() as stack:
        if lock_dir:
            if probe.netns:
                stack.enter_context(_flock(Path(lock_dir) / "dtfm-netns.lock", True))
            stack.enter_context(_flock(Path(lock_dir) / "dtfm-cpu.lock", False))
        if probe.mount:
            stack.enter_context(_mount(probe.mount, scratch))
        ctx = Context(tree, scratch)
        if probe.note == "git":
            ctx.index_mtime_ns = _git_repo(tree)
        yield ctx


def after(probe: Probe, ctx: Context, started_s: float) -> str:
    """What the probe left that its output does not say: an injected command's marker, new
    files and where, a rewritten git index."""
    notes = []
    if probe.dry_run_scripts:
        folder = Path(probe.dry_run_scripts.replace("R/", f"{ctx.scratch}/"))
        scripts = sorted(folder.glob("*.sh")) if folder.is_dir() else []
        for script in scripts:
            for cmd in ("show", "apply", "clear"):
                with contextlib.suppress(subprocess.SubprocessError, OSError):
                    subprocess.run(
                        ["bash", str(script), cmd],
                        capture_output=True,
                        timeout=10,
                        env={
                            "DTFM_TC": "echo",
                            "DTFM_STATE": str(ctx.scratch),
                            "PATH": "/usr/bin:/bin",
                        },
                    )
        notes.append(f"{len(scripts)} scripts written and dry-run")
    if probe.note == "marker":
        ran = (ctx.scratch / MARKER).exists()
        notes.append(
            "THE INJECTED COMMAND RAN (R/INJECTED exists)" if ran else "nothing injected ran"
        )
    if probe.note == "files":
        new = sorted(
            str(f.relative_to(ctx.tree))
            for f in ctx.tree.rglob("*")
            if f.is_file()
            and f.stat().st_mtime >= started_s
            and f.suffix in (".json", ".parquet", ".csv", ".md")
            and not {"outputs", "jobs", ".git"} & set(f.relative_to(ctx.tree).parts)
        )
        notes.append(
            "wrote " + (", ".join(new[:3]) + (" ..." if len(new) > 3 else "") or "nothing")
        )
    if probe.note == "git":
        now = (ctx.tree / ".git" / "index").stat().st_mtime_ns
        notes.append(
            "rewrote .git/index (took .git/index.lock)"
            if now != ctx.index_mtime_ns
            else "left .git/index alone"
        )
    return "; ".join(notes)


def _owned_tag(pid: int) -> str | None:
    """The emulation tag whose state names ``pid`` as its owner (None: not emulating)."""
    for d in Path(tempfile.gettempdir()).glob("dtfm-*"):
        with contextlib.suppress(OSError, ValueError):
            st = json.loads((d / "state.json").read_text())
            if st.get("owner_pid") == pid:
                return str(st.get("tag") or d.name[5:])
    return None


def _namespaces(tag: str | None) -> list[str]:
    if not tag:
        return []
    out = _sh("ip", "netns", "list").stdout.split("\n")
    return [ln.split()[0] for ln in out if ln.startswith(f"dtfm-{tag}-")]


def signal_step(probe: Probe, cmd: list[str], tree: Path, env: dict) -> tuple[str, str, str]:
    """Start ``cmd``, wait for its ``probe.ranks`` ranks, send ``probe.signal``, and return
    (exit code, a description of what was left, its output); whatever was left is removed."""
    from repro.checks.leftovers import as_a_job, cmdline, left_after, snapshot, stop
    from system.lifeline import descendants

    sig = getattr(signal, probe.signal)
    with tempfile.TemporaryFile("w+") as log:
        p = subprocess.Popen(
            cmd,
            cwd=tree,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=as_a_job,
        )
        snap, tag = None, None
        try:
            end = time.monotonic() + probe.timeout_s
            ranks: list[int] = []
            while p.poll() is None and time.monotonic() < end:
                ranks = [
                    d
                    for d in descendants(p.pid)
                    if "system.runtime.worker" in cmdline(d)
                    and "system.runtime.torchrun" not in cmdline(d)
                ]
                if len(ranks) >= probe.ranks:
                    break
                time.sleep(0.2)
            if p.poll() is not None or len(ranks) < probe.ranks:
                log.seek(0)
                return str(p.poll()), f"its {probe.ranks} ranks never ran", log.read()
            time.sleep(3.0)
            tag = _owned_tag(p.pid)
            folders = {
                str(Path(a).parent) for r in ranks for a in cmdline(r) if a.endswith("spec.json")
            }
            if tag:
                folders.add(str(Path(tempfile.gettempdir()) / f"dtfm-{tag}"))
            snap = snapshot(p.pid, folders)
            spaces = _namespaces(tag)
            p.send_signal(sig)
            try:
                p.wait(timeout=60)
            except subprocess.TimeoutExpired:
                pass
            left = left_after(snap, timeout_s=30)
            gone = [ns for ns in spaces if ns in set(_namespaces(tag))]
            counts = {
                "processes": len(left["processes"]),
                "ports": len(left["ports"]),
                "folders": len(left["folders"]),
                "namespaces": len(gone),
            }
            what = ", ".join(f"{n} {k}" for k, n in counts.items() if n) or "nothing"
            before = (
                f"{len(snap.procs)} processes, {len(snap.ports)} ports, {len(spaces)} namespaces"
            )
            log.seek(0)
            code = str(p.returncode if p.returncode is not None else "still running")
            return code, f"{probe.signal} with {before} up; left {what}", log.read()
        finally:
            stop(p, snap)
            if tag and _namespaces(tag):  # the old code's leftovers: removed, owner dead
                subprocess.run(
                    [PY, "-m", "system.emulation", "cleanup", "--tag", tag],
                    capture_output=True,
                    timeout=120,
                    env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[3])},
                )
