"""Real Megatron / DeepSpeed baselines: a run spec, a local launcher, the grid search (paper §4).

The paper compares against Megatron and DeepSpeed *tuned by grid search*. This module runs them for
real: :class:`BaselineSpec` names one configuration (system, TP/PP/DP, micro-batch, ZeRO stage),
:func:`run_point` starts one process per rank (``python -m baselines.<system>.train SPEC``) and
returns rank 0's metrics, :func:`run_grid` runs every point of a grid and keeps infeasible ones as
rows with ``status`` ``invalid`` / ``oom`` / ``failed`` / ``timeout`` instead of dropping them.

Launching: :func:`system.runtime.launch.run_ranks`, the launcher our runtime uses too: torchrun
on this machine; with ``rank_prefix[i]`` / ``rank_env[i]`` one process per rank, e.g. inside
network namespaces (``["ip", "netns", "exec", "ns3"]`` and ``{"GLOO_SOCKET_IFNAME": "eth0"}``,
with ``master_addr`` a namespace address). On a multi-host cluster start the same workers with
torchrun yourself, one spec file everywhere::

    torchrun --nnodes N --nproc-per-node 8 --rdzv-backend c10d --rdzv-endpoint HOST:29500 \\
        -m baselines.megatron.train spec.json        # or baselines.deepspeed.train

Importing this module does not import torch.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from baselines.spec import SYSTEMS, BaselineSpec, check_spec, metrics_from
from system.cluster import Cluster
from system.runtime.launch import LaunchError, LaunchTimeout, run_ranks  # torch-free
from system.workload import Workload

log = logging.getLogger(__name__)

__all__ = ["SYSTEMS", "BaselineSpec", "check_spec", "metrics_from", "run_point",
           "local_cluster", "grid_points", "run_grid", "best_point", "emulation_kwargs",
           "predict_iter_time_s"]

_ROOT = Path(__file__).resolve().parents[1]


def _tail(path: Path, n: int = 3000) -> str:
    return path.read_text(errors="replace")[-n:] if path.exists() else ""


def _failure_status(text: str) -> str:
    low = text.lower()
    if "out of memory" in low or "outofmemoryerror" in low or "cannot allocate memory" in low:
        return "oom"
    return "failed"


def run_point(spec: BaselineSpec, *, rank_prefix=None, rank_env=None, master_addr="127.0.0.1",
              timeout_s: float = 300.0, work_dir: str | Path | None = None) -> dict:
    """Run one configuration; returns ``{"status": ..., **metrics}`` (never raises on failure).

    ``status`` is ``ok``, ``invalid`` (rejected by :func:`check_spec`, with ``error``), ``oom``,
    ``failed`` or ``timeout``.
    """
    try:
        check_spec(spec)
    except ValueError as e:
        return {"status": "invalid", "error": str(e)}
    work = Path(work_dir or tempfile.mkdtemp(prefix="baseline-"))
    work.mkdir(parents=True, exist_ok=True)
    result_path = work / "result.json"
    result_path.unlink(missing_ok=True)
    spec = dataclasses.replace(spec, result_path=str(result_path))
    spec_path = work / "spec.json"
    spec_path.write_text(spec.to_json())
    module = f"baselines.{spec.system}.train"
    t0 = time.monotonic()
    try:
        run_ranks(module, [str(spec_path)], world_size=spec.world_size, rank_prefix=rank_prefix,
                  rank_env=rank_env, master_addr=master_addr, timeout_s=timeout_s, log_dir=work)
    except LaunchTimeout as e:
        return {"status": "timeout", "error": str(e)[:500], "wall_s": time.monotonic() - t0}
    except LaunchError as e:
        text = e.log_tail or _tail(work / f"rank{e.rank or 0}.log")
        log.warning("%s failed (rank %s, exit code %s); log tail:\n%s", spec.label(), e.rank,
                    e.returncode, text[-1500:])
        return {"status": _failure_status(text), "error": text[-500:], "failed_rank": e.rank,
                "exit_code": e.returncode, "wall_s": time.monotonic() - t0}
    wall_s = time.monotonic() - t0
    if not result_path.exists():
        text = _tail(work / "rank0.log")
        return {"status": "failed", "error": "all ranks exited 0 but rank 0 wrote no result: "
                + text[-400:], "wall_s": wall_s}
    out = json.loads(result_path.read_text())
    return {"status": "ok", **out, "wall_s": wall_s}


# ---------------------------------------------------------------- grid search


def local_cluster(num_devices: int) -> Cluster:
    """``num_devices`` ranks on this one machine (one host: tensor parallelism allowed)."""
    if num_devices < 1:
        raise ValueError(f"local_cluster: num_devices must be >= 1, got {num_devices}")
    off = 1.0 - np.eye(num_devices)
    return Cluster(name=f"local{num_devices}", region_of=("local",) * num_devices,
                   host_of=(0,) * num_devices, delay_ms=off * 0.05, bandwidth_gbps=off * 10.0,
                   description="ranks on this machine (loopback)")


def _raw_points(system: str, n: int, micro_batch_sizes: Sequence[int]) -> list[tuple]:
    """Every (tp, pp, dp, micro-batch, zero) with tp·pp·dp = n, valid or not."""
    div = [k for k in range(1, n + 1) if n % k == 0]
    shapes = [(tp, pp, n // (tp * pp)) for tp in div for pp in div if (n // tp) % pp == 0]
    if system == "deepspeed":  # the paper's two DeepSpeed variants; tp > 1 is recorded invalid
        shapes = [(tp, pp, dp, 3 if pp == 1 else 1) for tp, pp, dp in shapes]
    else:
        shapes = [(tp, pp, dp, None) for tp, pp, dp in shapes]
    return [(tp, pp, dp, mb, z) for tp, pp, dp, z in shapes for mb in micro_batch_sizes]


def grid_points(system: str, cluster: Cluster, workload: Workload, *, base: BaselineSpec,
                micro_batch_sizes: Sequence[int] | None = None,
                memory_limit_bytes: float | None = None) -> list[tuple[BaselineSpec, str | None]]:
    """The grid for ``system``: ``(spec, reason)`` pairs, ``reason`` None when runnable.

    Runnable points are exactly the simulator's space (:mod:`baselines.space`); every other shape
    on ``cluster.num_devices`` devices is kept with status ``invalid`` and the reason, and with
    ``memory_limit_bytes`` a point whose estimated per-device memory exceeds it gets ``oom``.
    """
    from baselines import space  # the grid the simulator searches too

    if system not in SYSTEMS:
        raise ValueError(f"grid: system {system!r} is not one of {SYSTEMS}")
    enum = space.megatron_space if system == "megatron" else space.deepspeed_space
    configs = {(c.tp, c.pp, c.dp, c.micro_batch_size, c.zero if system == "deepspeed" else None): c
               for c in enum(cluster, workload)}
    mbs = tuple(micro_batch_sizes or space.MICRO_BATCH_SIZES)
    out = []
    for tp, pp, dp, mb, zero in _raw_points(system, cluster.num_devices, mbs):
        spec = dataclasses.replace(base, system=system, tp=tp, pp=pp, dp=dp, micro_batch_size=mb,
                                   zero=zero)
        cfg = configs.get((tp, pp, dp, mb, zero))
        reason = None
        if cfg is None:
            try:
                check_spec(spec)
                reason = "outside the simulator's space (e.g. a tensor-parallel group across hosts)"
            except ValueError as e:
                reason = str(e)
        elif memory_limit_bytes is not None:
            need = space.config_memory_bytes(cfg, workload)
            if need > memory_limit_bytes:
                reason = f"oom: needs {need / 2**30:.1f} GiB > {memory_limit_bytes / 2**30:.1f} GiB"
        out.append((spec, reason))
    return out


def run_grid(points: Sequence[tuple[BaselineSpec, str | None]], *, run=run_point,
             **run_kwargs) -> list[tuple[BaselineSpec, dict]]:
    """Run every runnable point (``run(spec, **run_kwargs)``); others get their status unrun.

    Returns ``(spec, result)`` for every point, in order; ``result["status"]`` is ``ok`` for
    measured points. ``run`` is :func:`run_point` by default (emulation passes namespaces
    through ``run_kwargs``; tests pass a stand-in).
    """
    results = []
    for spec, reason in points:
        if reason is not None:
            status = "oom" if reason.startswith("oom") else "invalid"
            results.append((spec, {"status": status, "error": reason}))
            continue
        res = run(spec, **run_kwargs)
        ok = res["status"] == "ok"
        log.info("grid %s: %s %s", spec.label(), res["status"],
                 f"{res['iter_time_s']:.3f} s/iter" if ok else res.get("error", "")[:200])
        results.append((spec, res))
    return results


def best_point(results: Sequence[tuple[BaselineSpec, dict]]) -> tuple[BaselineSpec, dict] | None:
    """The measured point with the lowest iteration time (None if none ran successfully)."""
    ok = [(s, r) for s, r in results if r["status"] == "ok"]
    return min(ok, key=lambda sr: sr[1]["iter_time_s"]) if ok else None


def emulation_kwargs(emu) -> dict:
    """``run_point``/``run_grid`` keyword arguments that run rank i inside device i's namespace.

    ``emu`` is a :class:`system.emulation.netns.Emulation` (anything with ``plan.num_devices``,
    ``exec_prefix(i)``, ``rank_env(i)`` and ``master_addr``).
    """
    n = emu.plan.num_devices
    return {"rank_prefix": [emu.exec_prefix(i) for i in range(n)],
            "rank_env": [emu.rank_env(i) for i in range(n)], "master_addr": emu.master_addr}


def predict_iter_time_s(spec: BaselineSpec, cluster: Cluster, hardware=None,
                        transport=None) -> float | None:
    """The simulator's iteration time for ``spec`` on ``cluster`` (baselines/*/perf.py).

    ``hardware`` is a :class:`system.simulator.hardware.Hardware` (default V100), ``transport``
    a :class:`system.simulator.comm.Transport` (default NCCL; the CPU runs use GLOO). None when
    the simulator has no model for the point (it raises ValueError, e.g. ZeRO-0/2 or TP across
    hosts).
    """
    from baselines.space import BaselineConfig

    cfg = BaselineConfig(system=spec.system, tp=spec.tp, pp=spec.pp, dp=spec.dp,
                         micro_batch_size=spec.micro_batch_size, zero=spec.zero or 0)
    kw = {} if hardware is None else {"hardware": hardware}
    if transport is not None:
        kw["transport"] = transport
    try:
        if spec.system == "megatron":
            from baselines.megatron.perf import simulate_megatron

            res = simulate_megatron(cluster, spec.workload(), cfg, **kw)
        else:
            from baselines.deepspeed.perf import simulate_deepspeed

            res = simulate_deepspeed(cluster, spec.workload(), cfg, **kw)
    except ValueError as e:
        log.info("no simulator prediction for %s: %s", spec.label(), e)
        return None
    return float(res.iter_time_s)
