"""Start one worker process per rank for a :class:`RunSpec`, wait, return rank 0's metrics.

Each rank runs ``python -m system.runtime.worker <spec.json>`` with the usual torch.distributed
environment (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``) and
``OMP_NUM_THREADS=1``. ``rank_prefix[i]`` is put in front of rank ``i``'s command and
``rank_env[i]`` is merged into its environment, which is how the WAN emulation runs rank ``i``
inside network namespace ``dtfm-i``::

    launch(spec, world_size=4,
           rank_prefix=[["ip", "netns", "exec", f"dtfm-{i}"] for i in range(4)],
           rank_env=[{"GLOO_SOCKET_IFNAME": f"veth{i}"} for i in range(4)],
           master_addr="198.18.0.1")   # rank 0's namespace address

Rank ``i`` is device ``i`` of the assignment (``spec.stages[s][r] == i`` means rank ``i`` runs
stage ``s`` of replica ``r``). If any rank fails, the time runs out, or the caller presses
Ctrl-C, every rank's process group is killed and the error carries the failing rank's stderr.

The same worker runs under ``torchrun``, which sets the environment itself:

* one host, one process per device (GPU or CPU core)::

    torchrun --standalone --nproc-per-node 4 -m system.runtime.worker spec.json

* several hosts (static rendezvous: run on every host, ``--node-rank`` 0..N-1, the address and
  port of host 0 reachable from all; device ``i`` of the assignment is global rank ``i`` =
  node_rank·nproc_per_node + local_rank, so order hosts as the scheduler's device ids)::

    torchrun --nnodes 2 --nproc-per-node 4 --node-rank 0 \\
             --master-addr HOST0 --master-port 29500 -m system.runtime.worker spec.json

  or elastic c10d rendezvous: ``--rdzv-backend c10d --rdzv-endpoint HOST0:29500 --rdzv-id JOB``
  (ranks are then assigned in join order; pass ``--node-rank`` with the static form when the
  rank → device map matters, as it does for a scheduled assignment). Set ``GLOO_SOCKET_IFNAME`` /
  ``NCCL_SOCKET_IFNAME`` to the interface that reaches the other hosts.
  With torchrun, set ``metrics_out`` in the spec: rank 0 writes it.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from system.runtime.spec import RunSpec

log = logging.getLogger(__name__)

__all__ = ["RunSpec", "launch", "free_port"]

_REPO_ROOT = Path(__file__).resolve().parents[2]


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free on ``host`` a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _kill_all(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                p.kill()
    for p in procs:
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:  # pragma: no cover
            log.warning("rank process %d did not exit after SIGKILL", p.pid)


def _tail(path: Path, n: int = 3000) -> str:
    try:
        return path.read_text(errors="replace")[-n:]
    except OSError:
        return ""


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
    """Run ``spec`` with one local process per rank; return rank 0's metrics dict.

    Args:
        spec: the run; validated here, before any process starts.
        world_size: processes to start (default ``spec.pp * spec.dp``; must equal it).
        rank_prefix: per rank, a command prefix (e.g. ``["ip", "netns", "exec", "dtfm-3"]``).
        rank_env: per rank, extra environment variables (e.g. ``GLOO_SOCKET_IFNAME``).
        master_addr, master_port: rendezvous of rank 0 (port: a free local port by default).
        timeout_s: wall-clock limit for the whole run; all ranks are killed when it passes.
        log_dir: keep ``spec.json`` and per-rank ``rank<i>.log`` here (default: a temp folder).

    Raises:
        ValueError: bad spec or per-rank lists of the wrong length.
        RuntimeError: a rank failed or the run timed out (message has the rank's stderr tail).
    """
    world_size = spec.world_size if world_size is None else int(world_size)
    spec.validate(world_size)
    for name, lst in (("rank_prefix", rank_prefix), ("rank_env", rank_env)):
        if lst is not None and len(lst) != world_size:
            raise ValueError(f"launch: {name} has {len(lst)} entries, world_size is {world_size}")
    if timeout_s <= 0:
        raise ValueError(f"launch: timeout_s must be > 0, got {timeout_s}")

    tmp = tempfile.TemporaryDirectory(prefix="dtfm-run-") if log_dir is None else None
    run_dir = Path(tmp.name if tmp else log_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    metrics_path = Path(spec.metrics_out) if spec.metrics_out else run_dir / "metrics.json"
    metrics_path.unlink(missing_ok=True)
    wspec = replace(spec.resolved(), metrics_out=str(metrics_path.resolve()))
    spec_path = run_dir / "spec.json"
    spec_path.write_text(wspec.to_json())
    port = master_port or free_port()

    base_env = dict(os.environ)
    base_env.update(
        OMP_NUM_THREADS="1",
        MKL_NUM_THREADS="1",
        WORLD_SIZE=str(world_size),
        MASTER_ADDR=master_addr,
        MASTER_PORT=str(port),
        PYTHONUNBUFFERED="1",
    )
    base_env["PYTHONPATH"] = os.pathsep.join(
        [str(_REPO_ROOT)] + [p for p in base_env.get("PYTHONPATH", "").split(os.pathsep) if p]
    )

    procs: list[subprocess.Popen] = []
    logs: list[Path] = []
    t0 = time.monotonic()
    try:
        for rank in range(world_size):
            env = dict(base_env, RANK=str(rank), LOCAL_RANK=str(rank))
            if rank_env is not None:
                env.update({k: str(v) for k, v in rank_env[rank].items()})
            cmd = list(rank_prefix[rank]) if rank_prefix is not None else []
            cmd += [sys.executable, "-m", "system.runtime.worker", str(spec_path.resolve())]
            logs.append(run_dir / f"rank{rank}.log")
            with open(logs[-1], "wb") as out:
                procs.append(
                    subprocess.Popen(
                        cmd,
                        env=env,
                        stdout=out,
                        stderr=subprocess.STDOUT,
                        cwd=str(_REPO_ROOT),
                        start_new_session=True,
                    )
                )
        log.info("launched %d ranks (port %d), logs in %s", world_size, port, run_dir)
        while True:
            codes = [p.poll() for p in procs]
            bad = [r for r, c in enumerate(codes) if c not in (None, 0)]
            if bad:
                r = bad[0]
                raise RuntimeError(
                    f"rank {r} exited with code {codes[r]}; its log ends:\n{_tail(logs[r])}"
                )
            if all(c == 0 for c in codes):
                break
            if time.monotonic() - t0 > timeout_s:
                waiting = [r for r, c in enumerate(codes) if c is None]
                raise RuntimeError(
                    f"run timed out after {timeout_s:.0f} s; ranks still running: "
                    f"{waiting}; rank {waiting[0]} log ends:\n{_tail(logs[waiting[0]])}"
                )
            time.sleep(0.05)
        if not metrics_path.exists():
            raise RuntimeError(
                f"all ranks exited 0 but rank 0 wrote no metrics; log ends:\n{_tail(logs[0])}"
            )
        metrics = json.loads(metrics_path.read_text())
        metrics["launch_wall_s"] = time.monotonic() - t0
        return metrics
    finally:  # error, timeout, Ctrl-C: no rank survives its launcher
        _kill_all(procs)
        if tmp is not None:
            tmp.cleanup()
