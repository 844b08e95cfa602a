"""The one launcher of every multi-rank run: our runtime's and both baselines' workers.

:func:`run_ranks` starts ``world_size`` ranks of ``python -m MODULE ARGS`` and waits for them:

* **torchrun** (every run on this machine): one agent, ``python -m system.runtime.torchrun``
  (its stores bound to the advertised address, :mod:`system.runtime.store`), ``--nnodes 1
  --nproc-per-node W``, c10d on ``127.0.0.1:PORT``, gloo on loopback; logs in ``rank<i>.log``.
* **one process per rank** (``rank_prefix``, e.g. ``["ip", "netns", "exec", "dtfm-T-d3"]``): the
  WAN emulation runs each rank in its own network namespace, which torchrun cannot; the launcher
  sets torchrun's environment (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``,
  ``MASTER_ADDR``, ``MASTER_PORT``) itself. ``rank_map[r]`` names the device global rank r runs on
  (default r; per-device lists are indexed by device), so a baseline's groups land as placed.

On a rank's failure, a timeout or Ctrl-C every rank is killed and :class:`LaunchError` (or
:class:`LaunchTimeout`) names the failing rank with its log tail. No rank outlives its launcher
(:mod:`system.lifeline`): SIGTERM and SIGHUP unwind it like Ctrl-C, the kernel signals ranks and
agent when their parent dies, and a guard process kills every rank's process tree and removes
:func:`launch`'s temporary folder even after a SIGKILL. :func:`launch` runs a :class:`RunSpec`
of our runtime and returns rank 0's metrics.

Several hosts: start one agent per host yourself, with the same worker and spec::

    python -m system.runtime.torchrun --nnodes 2 --nproc-per-node 4 --rdzv-backend c10d \\
        --rdzv-endpoint HOST0:29500 --rdzv-id JOB --rdzv-conf is_host=1 \\
        --local-addr THIS_HOST -m system.runtime.worker spec.json     # is_host=0 elsewhere

with ``GLOO_SOCKET_IFNAME`` / ``NCCL_SOCKET_IFNAME`` set to the interface that reaches the other
hosts and ``metrics_out`` in the spec (rank 0 writes it). Device ``i`` is global rank ``i`` =
group rank · nproc_per_node + local rank; c10d numbers hosts in join order, so when the rank →
host map matters use ``--rdzv-backend static --node-rank K --master-addr HOST0 --master-port N``.
"""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from system.lifeline import cancel, child_env, descendants, exit_on_signals, on_death
from system.runtime.spec import RunSpec

log = logging.getLogger(__name__)

__all__ = [
    "RunSpec",
    "launch",
    "run_ranks",
    "free_port",
    "kill_all",
    "check_rank_map",
    "LaunchError",
    "LaunchTimeout",
]

_REPO_ROOT = Path(__file__).resolve().parents[2]


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free on ``host`` a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


class LaunchError(RuntimeError):
    """A rank failed: ``rank`` (None when unknown), ``returncode`` and ``log_tail``."""

    def __init__(
        self,
        message: str,
        *,
        rank: int | None = None,
        returncode: int | None = None,
        log_tail: str = "",
    ) -> None:
        super().__init__(message)
        self.rank, self.returncode, self.log_tail = rank, returncode, log_tail


class LaunchTimeout(LaunchError, TimeoutError):
    """The ranks were still running when the launcher's time limit passed."""


_guarded: dict[int, int] = {}  # pid of a started rank or agent -> its lifeline action


def kill_all(procs: list[subprocess.Popen]) -> None:
    """SIGKILL every process of ``procs`` that still runs, its process group and descendants."""
    for p in procs:
        if p.poll() is None:
            for pid in descendants(p.pid):
                try:
                    os.kill(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                p.kill()
    for p in procs:
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:  # pragma: no cover
            log.warning("rank process %d did not exit after SIGKILL", p.pid)
            continue
        if p.pid in _guarded:
            cancel(_guarded.pop(p.pid))


def _tail(path: Path, n: int = 3000) -> str:
    try:
        return path.read_text(errors="replace")[-n:]
    except OSError:
        return ""


def _base_env(world_size: int, master_addr: str, port: int) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        OMP_NUM_THREADS="1",
        MKL_NUM_THREADS="1",
        PYTHONUNBUFFERED="1",
        # a rank killed by SIGABRT/SIGSEGV (a C++ abort in gloo, say) writes every thread's
        # Python stack into its log: where it died, not only that it did
        PYTHONFAULTHANDLER="1",
        MASTER_ADDR=master_addr,
        MASTER_PORT=str(port),
        WORLD_SIZE=str(world_size),
        **child_env(),
    )
    env["PYTHONPATH"] = os.pathsep.join(
        [str(_REPO_ROOT)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    )
    return env


def _start_logged(cmd: list[str], env: dict[str, str], log_path: Path) -> subprocess.Popen:
    """Start ``cmd`` from the repository root in its own session, stdout+stderr to ``log_path``
    (the child keeps its copy of the file descriptor; ours closes here)."""
    with open(log_path, "wb") as out:
        p = subprocess.Popen(
            cmd,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=str(_REPO_ROOT),
            start_new_session=True,
        )
    _guarded[p.pid] = on_death("kill", p.pid)  # killed with its tree if we are SIGKILLed
    return p


def _wait(procs, logs, deadline_s, t0, describe) -> None:
    """Poll ``procs`` until all exit 0; raise LaunchError/LaunchTimeout otherwise."""
    while True:
        codes = [p.poll() for p in procs]
        bad = [r for r, c in enumerate(codes) if c not in (None, 0)]
        if bad:
            r, c = describe(bad[0], codes[bad[0]])
            tail = _tail(logs[min(r, len(logs) - 1)]) if r is not None else _tail(logs[0])
            raise LaunchError(
                f"rank {r} exited with code {c}; its log ends:\n{tail}",
                rank=r,
                returncode=c,
                log_tail=tail,
            )
        if all(c == 0 for c in codes):
            return
        if time.monotonic() - t0 > deadline_s:
            waiting = [r for r, c in enumerate(codes) if c is None]
            tail = _tail(logs[waiting[0]])
            raise LaunchTimeout(
                f"run timed out after {deadline_s:.0f} s; ranks still running: "
                f"{waiting}; rank {waiting[0]} log ends:\n{tail}",
                rank=waiting[0],
                log_tail=tail,
            )
        time.sleep(0.05)


def check_rank_map(rank_map, world_size: int) -> list[int]:
    """``rank_map`` as a list (identity when None); ValueError unless it permutes the ranks."""
    if rank_map is None:
        return list(range(world_size))
    try:
        devices = [int(d) for d in rank_map]
    except (TypeError, ValueError):
        msg = f"launch: rank_map must be a list of device ids, got {rank_map!r}"
        raise ValueError(msg) from None
    if sorted(devices) != list(range(world_size)):
        raise ValueError(
            f"launch: rank_map {devices} is not a permutation of devices 0..{world_size - 1}"
        )
    return devices


def check_run_args(
    world_size: int,
    *,
    rank_prefix=None,
    rank_env=None,
    device_addrs=None,
    rank_map=None,
    timeout_s: float = 600.0,
) -> list[int]:
    """The checks :func:`run_ranks` makes before it starts anything (ValueError naming the
    argument); returns the device of each rank (:func:`check_rank_map`)."""
    for name, lst in (
        ("rank_prefix", rank_prefix),
        ("rank_env", rank_env),
        ("device_addrs", device_addrs),
    ):
        if lst is not None and len(lst) != world_size:
            raise ValueError(f"launch: {name} has {len(lst)} entries, world_size is {world_size}")
    if rank_env is not None and rank_prefix is None:
        raise ValueError("launch: rank_env needs rank_prefix (torchrun gives all ranks one env)")
    devices = check_rank_map(rank_map, world_size)
    if devices != list(range(world_size)) and rank_prefix is None:
        raise ValueError(
            "launch: a rank_map other than launch order needs rank_prefix (one process per "
            "rank); torchrun starts local rank r in its slot r"
        )
    if not 0 < timeout_s < float("inf"):  # NaN fails too: every run ends
        raise ValueError(f"launch: timeout_s must be finite and > 0, got {timeout_s}")
    if world_size < 1:
        raise ValueError(f"launch: world_size must be >= 1, got {world_size}")
    return devices


_ROOT_CAUSE = re.compile(r"rank\s*:\s*(\d+).*?\n\s*exitcode\s*:\s*(-?\d+)", re.S)


def run_ranks(
    module: str,
    args: list[str],
    *,
    world_size: int,
    rank_prefix: list[list[str]] | None = None,
    rank_env: list[dict] | None = None,
    master_addr: str = "127.0.0.1",
    master_port: int | None = None,
    timeout_s: float = 600.0,
    log_dir: str | Path,
    rank_map: list[int] | None = None,
    device_addrs: list[str] | None = None,
) -> None:
    """Run ``python -m module *args`` as ``world_size`` ranks (see the module doc); wait for all.

    Args:
        rank_prefix: per device, a command prefix (one process per rank instead of torchrun).
        rank_env: per device, extra environment variables (with ``rank_prefix``).
        master_addr, master_port: rendezvous address (port: a free local port by default).
        timeout_s: wall-clock limit; every rank is killed when it passes.
        log_dir: ``rank<i>.log`` per global rank (and torchrun's agent log) go here.
        rank_map: ``rank_map[r]`` is the device global rank ``r`` runs on: it starts with
            ``rank_prefix[rank_map[r]]`` and ``rank_env[rank_map[r]]`` (default: rank r on
            device r). Megatron and DeepSpeed build their groups from global rank order, so
            this decides which devices share a tensor-, pipeline- or data-parallel group
            (baselines/placement.py). A permutation of ``0..world_size-1``; a non-identity map
            needs ``rank_prefix`` (torchrun puts local rank r in slot r).
        device_addrs: per device, the address a rank listening there is reached at; rank 0
            hosts the rendezvous, so ``MASTER_ADDR`` becomes ``device_addrs[rank_map[0]]``
            (overriding ``master_addr``).

    Raises:
        ValueError: per-device lists of the wrong length, a rank map that is not a
            permutation, a bad timeout.
        LaunchError: a rank failed; LaunchTimeout: the time ran out.
    """
    devices = check_run_args(
        world_size,
        rank_prefix=rank_prefix,
        rank_env=rank_env,
        device_addrs=device_addrs,
        rank_map=rank_map,
        timeout_s=timeout_s,
    )
    if device_addrs is not None:
        master_addr = str(device_addrs[devices[0]])
    run_dir = Path(log_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    try:  # a port free on the rendezvous address (a namespace's address is not local here)
        port = master_port or free_port(master_addr)
    except OSError:
        port = free_port()
    env = _base_env(world_size, master_addr, port)
    logs = [run_dir / f"rank{r}.log" for r in range(world_size)]
    with exit_on_signals():  # SIGTERM/SIGHUP unwind through the finally below
        procs: list[subprocess.Popen] = []
        t0 = time.monotonic()
        try:
            if rank_prefix is None:
                procs.append(
                    _start_torchrun(module, args, world_size, master_addr, port, env, run_dir)
                )
                log.info(
                    "torchrun: %d ranks of %s (rendezvous %s:%d), logs in %s",
                    world_size,
                    module,
                    master_addr,
                    port,
                    run_dir,
                )

                def describe(_i, code):  # torchrun's summary names the first failing rank
                    text = _tail(run_dir / "torchrun.log", 20000)
                    m = _ROOT_CAUSE.search(text.split("Root Cause", 1)[-1])
                    return (int(m.group(1)), int(m.group(2))) if m else (None, code)

                try:
                    _wait(procs, [run_dir / "torchrun.log"], timeout_s, t0, describe)
                except LaunchError as e:
                    kill_all(procs)
                    _collect_torchrun_logs(run_dir, world_size)
                    r = e.rank if e.rank is not None and not isinstance(e, LaunchTimeout) else 0
                    tail = _tail(logs[r]) or e.log_tail
                    if isinstance(e, LaunchTimeout):
                        raise LaunchTimeout(
                            f"run timed out after {timeout_s:.0f} s; ranks still running: "
                            f"{list(range(world_size))}; rank 0 log ends:\n{tail}",
                            rank=0,
                            log_tail=tail,
                        ) from None
                    raise LaunchError(
                        f"rank {e.rank} exited with code {e.returncode}; its log ends:\n{tail}",
                        rank=e.rank,
                        returncode=e.returncode,
                        log_tail=tail,
                    ) from None
                finally:
                    kill_all(procs)
                    _collect_torchrun_logs(run_dir, world_size)
                return
            for r in range(world_size):
                dev = devices[r]  # global rank r runs where device rank_map[r] is
                renv = dict(
                    env, RANK=str(r), LOCAL_RANK=str(r), LOCAL_WORLD_SIZE="1", GROUP_RANK=str(r)
                )
                if rank_env is not None:
                    renv.update({k: str(v) for k, v in rank_env[dev].items()})
                cmd = [*rank_prefix[dev], sys.executable, "-m", module, *args]
                procs.append(_start_logged(cmd, renv, logs[r]))
            log.info(
                "launched %d ranks of %s (port %d, rank -> device %s), logs in %s",
                world_size,
                module,
                port,
                devices,
                run_dir,
            )
            _wait(procs, logs, timeout_s, t0, lambda r, c: (r, c))
        finally:  # error, timeout, Ctrl-C: no rank survives its launcher
            kill_all(procs)


def _start_torchrun(module, args, world_size, master_addr, port, env, run_dir) -> subprocess.Popen:
    env = dict(env)
    if master_addr in ("127.0.0.1", "localhost", "::1"):
        env.setdefault("GLOO_SOCKET_IFNAME", "lo")  # gloo's listeners on loopback too
    cmd = [
        sys.executable,
        "-m",
        "system.runtime.torchrun",
        "--nnodes",
        "1",
        "--nproc-per-node",
        str(world_size),
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        f"{master_addr}:{port}",
        "--rdzv-id",
        f"dtfm-{os.getpid()}-{port}",
        "--local-addr",
        master_addr,
        "--max-restarts",
        "0",
        "--monitor-interval",
        "0.1",
        "--log-dir",
        str(run_dir / "torchrun"),
        "--redirects",
        "3",
        "-m",
        module,
        *args,
    ]
    return _start_logged(cmd, env, run_dir / "torchrun.log")


def _collect_torchrun_logs(run_dir: Path, world_size: int) -> None:
    """torchrun's ``<log-dir>/<run>/attempt_0/<local rank>/std{out,err}.log`` -> rank<i>.log."""
    for r in range(world_size):
        parts = sorted((run_dir / "torchrun").glob(f"*/attempt_*/{r}/std*.log"))
        text = "".join(_tail(p, 10**7) for p in parts)
        (run_dir / f"rank{r}.log").write_text(text)


@exit_on_signals()  # SIGTERM/SIGHUP: the temporary folder goes in the finally below
def launch(
    spec: RunSpec,
    *,
    world_size: int | None = None,
    rank_prefix: list[list[str]] | None = None,
    rank_env: list[dict] | None = None,
    master_addr: str = "127.0.0.1",
    master_port: int | None = None,
    timeout_s: float = 600.0,
    log_dir: str | Path | None = None,
) -> dict:
    """Run ``spec`` (:func:`run_ranks` with our runtime's worker); return rank 0's metrics dict.

    Args:
        spec: the run; validated here, before any process starts.
        world_size: processes to start (default ``spec.pp * spec.dp``; must equal it).
        rank_prefix, rank_env, master_addr, master_port, timeout_s: as :func:`run_ranks`.
        log_dir: keep ``spec.json`` and per-rank ``rank<i>.log`` here (default: a temp folder).

    Raises:
        ValueError: bad spec or per-rank lists of the wrong length.
        LaunchError (a RuntimeError): a rank failed or the run timed out (with its log tail).
    """
    world_size = spec.world_size if world_size is None else int(world_size)
    spec.validate(world_size)
    check_run_args(world_size, rank_prefix=rank_prefix, rank_env=rank_env, timeout_s=timeout_s)
    tmp = tempfile.TemporaryDirectory(prefix="dtfm-run-") if log_dir is None else None
    run_dir = Path(tmp.name if tmp else log_dir)
    guard = on_death("rmtree", run_dir) if tmp else None  # removed even if we are SIGKILLed
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        metrics_path = Path(spec.metrics_out) if spec.metrics_out else run_dir / "metrics.json"
        metrics_path.unlink(missing_ok=True)
        wspec = replace(spec.resolved(), metrics_out=str(metrics_path.resolve()))
        spec_path = run_dir / "spec.json"
        spec_path.write_text(wspec.to_json())
        t0 = time.monotonic()
        run_ranks(
            "system.runtime.worker",
            [str(spec_path.resolve())],
            world_size=world_size,
            rank_prefix=rank_prefix,
            rank_env=rank_env,
            master_addr=master_addr,
            master_port=master_port,
            timeout_s=timeout_s,
            log_dir=run_dir,
        )
        if not metrics_path.exists():
            raise LaunchError(
                "all ranks exited 0 but rank 0 wrote no metrics; log ends:\n"
                f"{_tail(run_dir / 'rank0.log')}",
                rank=0,
                returncode=0,
            )
        metrics = json.loads(metrics_path.read_text())
        metrics["launch_wall_s"] = time.monotonic() - t0
        return metrics
    finally:
        if tmp is not None:
            tmp.cleanup()
            cancel(guard)
