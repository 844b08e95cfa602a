"""Processes that die with their parent, and cleanup that outlives a killed parent.

A run starts processes (torchrun agents, ranks, delayers), temporary folders and network
namespaces. ``timeout`` and Slurm stop a run with SIGTERM (then SIGKILL); a terminal that closes
sends SIGHUP; the OOM killer sends SIGKILL. None of these may leave a rank computing, a port held,
a folder or a namespace behind. Four tools:

* :func:`exit_on_signals` -- SIGTERM and SIGHUP raise ``SystemExit(128 + signal)`` in the main
  thread while the block runs, so ``finally`` blocks (killing ranks, removing folders) run as on
  Ctrl-C. Python's default for both is to die at once, skipping every ``finally``.
* :func:`die_with_parent` -- called by a child at its start: the kernel sends it a signal when
  its parent exits (``PR_SET_PDEATHSIG``, prctl(2)), however the parent died. A child started
  with :func:`child_env` also exits at once if its parent was gone before the call.
* :func:`exit_now` -- leave with a code, skipping interpreter finalization: what a rank calls
  once its results are written and its process group destroyed (see there why).
* :func:`on_death` -- an action that runs when this process exits without cancelling it, also
  after SIGKILL: kill a process with its group and descendants, remove a folder, run a command.
  A guard process (``python -m system.lifeline``, one per process that asks, in its own session
  and deaf to SIGTERM/SIGHUP/SIGINT) holds the actions and reads a pipe whose only writer is this
  process: the kernel closes the pipe when this process ends, and the guard runs what is left, in
  reverse order of registration, then exits.
"""

from __future__ import annotations

import contextlib
import ctypes
import itertools
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import NoReturn

__all__ = [
    "exit_on_signals",
    "die_with_parent",
    "exit_now",
    "run_guarded",
    "child_env",
    "on_death",
    "cancel",
    "process_start_time",
    "descendants",
    "pid_alive",
    "PARENT_ENV",
]

PARENT_ENV = "DTFM_PARENT_PID"  # the pid a child started with child_env() must outlive
_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
_ACTION_TIMEOUT_S = 120.0  # a guard's command action is killed after this


# ---- signals -----------------------------------------------------------------------------------
def _raise_exit(signum, frame) -> None:  # noqa: ARG001
    raise SystemExit(128 + signum)


@contextlib.contextmanager
def exit_on_signals(signals=(signal.SIGTERM, signal.SIGHUP)) -> Iterator[None]:
    """While the block runs, ``signals`` whose handler is the default raise SystemExit(128 + n).

    A handler someone else installed (or SIG_IGN, as under ``nohup``) is left alone; outside the
    main thread (where Python cannot set handlers) this does nothing. The old handlers come back
    when the block ends.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = {}
    for s in signals:
        if signal.getsignal(s) is signal.SIG_DFL:
            old[s] = signal.signal(s, _raise_exit)
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def child_env() -> dict[str, str]:
    """Environment for a child that calls :func:`die_with_parent`: names this process."""
    return {PARENT_ENV: str(os.getpid())}


def die_with_parent(sig: int = signal.SIGKILL) -> None:
    """Have the kernel send ``sig`` to this process when its parent exits (Linux), and exit now
    (code 128 + sig) when the process named by :data:`PARENT_ENV` is already gone. Outside Linux
    only the second check is made."""
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
        except (OSError, AttributeError):  # pragma: no cover - no prctl in this libc
            pass
    parent = os.environ.get(PARENT_ENV, "")
    if parent.isdigit() and not pid_alive(int(parent)):
        os._exit(128 + int(sig))


def exit_now(code: int) -> NoReturn:
    """Flush stdout, stderr and the logging handlers, then end this process with ``code`` at
    once: no ``atexit`` handlers, no interpreter finalization.

    For a rank whose results are written and whose process group is destroyed. Objects a
    framework still holds (DeepSpeed's ZeRO-3 partitions, gloo's work items) keep C++ threads
    alive; when the interpreter tears down around them, a thread touching a Python object
    aborts the process ("terminate called without an active exception", SIGABRT; described in
    pytorch/pytorch pull request 179291), which turns a finished run into a failed one.
    """
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    logging.shutdown()
    os._exit(code)


# ---- processes ---------------------------------------------------------------------------------
def pid_alive(pid: int) -> bool:
    """Whether a process ``pid`` exists (a zombie counts as gone)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state != "Z"


def process_start_time(pid: int) -> int | None:
    """The start time of process ``pid`` in clock ticks since boot (``/proc/<pid>/stat`` field
    22), None when it does not exist. With the pid it names one process: pids are reused."""
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def descendants(pid: int) -> list[int]:
    """Every live descendant of ``pid``, from /proc (children that started their own session,
    as torchrun's workers do, are found too)."""
    children: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(d.name))
    out, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def _kill_tree(pid: int, start: int | None) -> None:
    """SIGKILL ``pid`` (if it is still the process that started at ``start``), its process
    group when it leads one, and every descendant."""
    if start is not None and process_start_time(pid) != start:
        return  # gone, or the pid now names another process
    victims = [pid, *descendants(pid)]
    try:
        if os.getpgid(pid) == pid:
            os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    for v in victims:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(v, signal.SIGKILL)


# ---- the guard ---------------------------------------------------------------------------------
_lock = threading.Lock()
_ids = itertools.count(1)
_actions: dict[int, dict] = {}  # what the guard holds for this process, to replay on a restart
_guard: tuple[int, int] | None = None  # (owner pid, write end of the guard's pipe)


def _forget_in_child() -> None:
    """After a fork: the child must not hold its parent's pipe open, nor its actions or lock."""
    global _guard, _lock
    if _guard is not None:
        with contextlib.suppress(OSError):
            os.close(_guard[1])
    _guard = None
    _actions.clear()
    _lock = threading.Lock()


os.register_at_fork(after_in_child=_forget_in_child)


def _start_guard() -> int:
    """Start this process's guard; returns the write end of its pipe."""
    read_end, write_end = os.pipe()  # both close on exec: the guard's stdin is a dup
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join([root, *filter(None, [env.get("PYTHONPATH")])])
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "system.lifeline"],
            stdin=read_end,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=env,
            cwd=root,
            start_new_session=True,  # a signal to our process group does not reach it
        )
        proc.returncode = 0  # never waited for: it outlives this process by design
    finally:
        os.close(read_end)
    return write_end


def _send(message: dict) -> None:
    """Write one message to the guard; a new guard (the first, or one after the last was killed)
    gets every action held instead, ``message``'s included."""
    global _guard
    for _attempt in range(2):
        if _guard is None or _guard[0] != os.getpid():
            _guard = (os.getpid(), _start_guard())
            lines = [{"add": i, **a} for i, a in _actions.items()]
        else:
            lines = [message]
        try:
            os.write(_guard[1], b"".join((json.dumps(m) + "\n").encode() for m in lines))
            return
        except OSError:  # the guard is gone: start another
            with contextlib.suppress(OSError):
                os.close(_guard[1])
            _guard = None
    raise OSError("lifeline: could not start a guard process")


def on_death(kind: str, target) -> int:
    """Register an action for when this process exits without :func:`cancel`; returns its id.

    ``kind``: ``"kill"`` (``target`` a pid: SIGKILL it, its group and its descendants; skipped
    if the pid was reused meanwhile), ``"rmtree"`` (a folder to remove) or ``"run"`` (an
    argument list run with a timeout of two minutes).
    """
    if kind not in ("kill", "rmtree", "run"):
        raise ValueError(f"lifeline: unknown action {kind!r}")
    action: dict = {"kind": kind, "target": target}
    if kind == "kill":
        action = {"kind": kind, "target": int(target), "start": process_start_time(int(target))}
    elif kind == "rmtree":
        action["target"] = str(Path(target).resolve())
    with _lock:
        i = next(_ids)
        _actions[i] = action
        _send({"add": i, **action})
    return i


def cancel(action_id: int) -> None:
    """Forget an action of :func:`on_death` (its owner cleaned up itself)."""
    with _lock:
        if _actions.pop(action_id, None) is not None and _guard is not None:
            with contextlib.suppress(OSError):
                _send({"drop": action_id})


def run_guarded(cmd: list[str], *, timeout_s: float, **kw) -> subprocess.CompletedProcess:
    """:func:`subprocess.run` (output captured as text) whose child is killed with its tree
    when this process dies, SIGKILL included (:func:`on_death`), or when it outlives
    ``timeout_s`` (``subprocess.TimeoutExpired``). ``kw`` goes to :class:`subprocess.Popen`."""
    with subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw
    ) as p:
        guard = on_death("kill", p.pid)
        try:
            out, err = p.communicate(timeout=timeout_s)
        except BaseException:
            _kill_tree(p.pid, None)
            p.wait()
            raise
        finally:
            cancel(guard)
    return subprocess.CompletedProcess(cmd, p.returncode, out, err)


def _run(action: dict) -> None:
    kind, target = action["kind"], action["target"]
    if kind == "kill":
        _kill_tree(int(target), action.get("start"))
    elif kind == "rmtree":
        shutil.rmtree(target, ignore_errors=True)
    else:
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            subprocess.run(
                [str(a) for a in target],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                timeout=_ACTION_TIMEOUT_S,
            )


def _guard_main() -> int:
    """The guard: collect actions from stdin until EOF (its owner is gone), then run them."""
    for s in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(s, signal.SIG_IGN)
    held: dict[int, dict] = {}
    for line in sys.stdin.buffer:
        try:
            msg = json.loads(line)
        except ValueError:
            continue
        if "drop" in msg:
            held.pop(int(msg["drop"]), None)
        elif "add" in msg:
            held[int(msg.pop("add"))] = msg
    for i in sorted(held, reverse=True):
        with contextlib.suppress(Exception):
            _run(held[i])
    return 0


if __name__ == "__main__":
    sys.exit(_guard_main())
