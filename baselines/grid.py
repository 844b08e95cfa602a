"""Real Megatron / DeepSpeed baselines: a run spec, a local launcher, the grid search (paper §4).

The paper compares against Megatron and DeepSpeed *tuned by grid search*. This module runs them for
real: :class:`BaselineSpec` names one configuration (system, TP/PP/DP, micro-batch, ZeRO stage),
:func:`run_point` starts one process per rank (``python -m baselines.<system>.train SPEC``) and
returns rank 0's metrics, :func:`run_grid` runs every point of a grid and keeps infeasible ones as
rows with ``status`` ``invalid`` / ``oom`` / ``failed`` / ``timeout`` instead of dropping them.

Launching: :func:`system.runtime.launch.run_ranks`, the launcher our runtime uses too: torchrun
on this machine; with ``rank_prefix[i]`` / ``rank_env[i]`` (per device) one process per rank,
e.g. inside network namespaces (``["ip", "netns", "exec", "ns3"]`` and
``{"GLOO_SOCKET_IFNAME": "eth0"}``, with ``master_addr`` a namespace address). A rank map
(:mod:`baselines.placement`: launch order, or the topology-aware map :func:`place_spec` finds
with the same simulator that predicts the run) puts global rank r on device ``rank_map[r]``;
:func:`run_grid` takes one map per point and records it in the point's result. On a multi-host
cluster start the same workers with torchrun yourself, one spec file everywhere::

    torchrun --nnodes N --nproc-per-node 8 --rdzv-backend c10d --rdzv-endpoint HOST:29500 \\
        -m baselines.megatron.train spec.json        # or baselines.deepspeed.train

Importing this module does not import torch.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from baselines.placement import (
    Placement,
    RankMap,
    check_placement,
    launch_map,
    search_placement,
)
from baselines.spec import SYSTEMS, BaselineSpec, check_spec, metrics_from
from system.cluster import Cluster, LinkSharing
from system.lifeline import cancel, on_death
from system.runtime.launch import LaunchError, LaunchTimeout, run_ranks  # torch-free
from system.workload import Workload

log = logging.getLogger(__name__)

__all__ = [
    "SYSTEMS",
    "BaselineSpec",
    "check_spec",
    "metrics_from",
    "run_point",
    "local_cluster",
    "grid_points",
    "run_grid",
    "best_point",
    "emulation_kwargs",
    "predict_iter_time_s",
    "place_spec",
]

_ROOT = Path(__file__).resolve().parents[1]


def _tail(path: Path, n: int = 3000) -> str:
    return path.read_text(errors="replace")[-n:] if path.exists() else ""


def _failure_status(text: str) -> str:
    low = text.lower()
    if "out of memory" in low or "outofmemoryerror" in low or "cannot allocate memory" in low:
        return "oom"
    return "failed"


def run_point(
    spec: BaselineSpec,
    *,
    rank_prefix=None,
    rank_env=None,
    master_addr="127.0.0.1",
    timeout_s: float = 300.0,
    work_dir: str | Path | None = None,
    rank_map=None,
    device_addrs=None,
) -> dict:
    """Run one configuration; returns ``{"status": ..., **metrics}`` (never raises on failure).

    ``status`` is ``ok``, ``invalid`` (rejected by :func:`check_spec`, with ``error``), ``oom``,
    ``failed`` or ``timeout``. ``rank_prefix``/``rank_env``/``device_addrs`` are per device and
    ``rank_map[r]`` the device of global rank r (:func:`system.runtime.launch.run_ranks`). The
    result has the 1-minute load average of this machine before and after the run
    (``load_avg_1m_start``/``_end``: other processes on a shared machine slow the ranks).
    """
    try:
        check_spec(spec)
    except ValueError as e:
        return {"status": "invalid", "error": str(e)}
    kwargs = dict(
        rank_prefix=rank_prefix,
        rank_env=rank_env,
        master_addr=master_addr,
        timeout_s=timeout_s,
        rank_map=rank_map,
        device_addrs=device_addrs,
    )
    if work_dir is not None:
        return _run_in(Path(work_dir), spec, **kwargs)
    # no folder given: a temporary one, removed on every exit (SIGKILL too: system.lifeline)
    with tempfile.TemporaryDirectory(prefix="dtfm-run-") as tmp:
        guard = on_death("rmtree", tmp)
        try:
            return _run_in(Path(tmp), spec, **kwargs)
        finally:
            cancel(guard)


def _run_in(
    work: Path,
    spec: BaselineSpec,
    *,
    rank_prefix,
    rank_env,
    master_addr,
    timeout_s,
    rank_map,
    device_addrs,
) -> dict:
    """:func:`run_point` with its rank logs, spec and result in ``work``."""
    work.mkdir(parents=True, exist_ok=True)
    result_path = work / "result.json"
    result_path.unlink(missing_ok=True)
    spec = dataclasses.replace(spec, result_path=str(result_path))
    spec_path = work / "spec.json"
    spec_path.write_text(spec.to_json())
    module = f"baselines.{spec.system}.train"
    load = {"load_avg_1m_start": os.getloadavg()[0]}
    t0 = time.monotonic()
    try:
        run_ranks(
            module,
            [str(spec_path)],
            world_size=spec.world_size,
            rank_prefix=rank_prefix,
            rank_env=rank_env,
            master_addr=master_addr,
            timeout_s=timeout_s,
            log_dir=work,
            rank_map=rank_map,
            device_addrs=device_addrs,
        )
    except LaunchTimeout as e:
        return {"status": "timeout", "error": str(e)[:500], "wall_s": time.monotonic() - t0}
    except LaunchError as e:
        text = e.log_tail or _tail(work / f"rank{e.rank or 0}.log")
        log.warning(
            "%s failed (rank %s, exit code %s); log tail:\n%s",
            spec.label(),
            e.rank,
            e.returncode,
            text[-1500:],
        )
        return {
            "status": _failure_status(text),
            "error": text[-500:],
            "failed_rank": e.rank,
            "exit_code": e.returncode,
            "wall_s": time.monotonic() - t0,
        }
    wall_s = time.monotonic() - t0
    if not result_path.exists():
        text = _tail(work / "rank0.log")
        return {
            "status": "failed",
            "error": "all ranks exited 0 but rank 0 wrote no result: " + text[-400:],
            "wall_s": wall_s,
        }
    out = json.loads(result_path.read_text())
    load["load_avg_1m_end"] = os.getloadavg()[0]
    bad = [i for i, x in enumerate(out.get("losses") or []) if not math.isfinite(float(x))]
    if bad:  # a diverged run's times are not a result (as our runtime's worker refuses them)
        return {
            "status": "failed",
            "error": f"training diverged: loss {out['losses'][bad[0]]} at iteration {bad[0]} "
            f"(lr={spec.lr:g})",
            "wall_s": wall_s,
            **load,
        }
    return {"status": "ok", **out, "wall_s": wall_s, **load}


# ---------------------------------------------------------------- grid search


def local_cluster(num_devices: int) -> Cluster:
    """``num_devices`` ranks on this one machine (one host: tensor parallelism allowed)."""
    if num_devices < 1:
        raise ValueError(f"local_cluster: num_devices must be >= 1, got {num_devices}")
    off = 1.0 - np.eye(num_devices)
    return Cluster(
        name=f"local{num_devices}",
        region_of=("local",) * num_devices,
        host_of=(0,) * num_devices,
        delay_ms=off * 0.05,
        bandwidth_gbps=off * 10.0,
        link_sharing=LinkSharing("pair"),  # loopback: no shaped class, no instance quota
        description="ranks on this machine (loopback)",
    )


def _raw_points(system: str, n: int, micro_batch_sizes: Sequence[int]) -> list[tuple]:
    """Every (tp, pp, dp, micro-batch, zero) with tp·pp·dp = n, valid or not."""
    div = [k for k in range(1, n + 1) if n % k == 0]
    shapes = [(tp, pp, n // (tp * pp)) for tp in div for pp in div if (n // tp) % pp == 0]
    if system == "deepspeed":  # the paper's two DeepSpeed variants; tp > 1 is recorded invalid
        shapes = [(tp, pp, dp, 3 if pp == 1 else 1) for tp, pp, dp in shapes]
    else:
        shapes = [(tp, pp, dp, None) for tp, pp, dp in shapes]
    return [(tp, pp, dp, mb, z) for tp, pp, dp, z in shapes for mb in micro_batch_sizes]


def grid_points(
    system: str,
    cluster: Cluster,
    workload: Workload,
    *,
    base: BaselineSpec,
    micro_batch_sizes: Sequence[int] | None = None,
    memory_limit_bytes: float | None = None,
) -> list[tuple[BaselineSpec, str | None]]:
    """The grid for ``system``: ``(spec, reason)`` pairs, ``reason`` None when runnable.

    Runnable points are exactly the simulator's space (:mod:`baselines.space`); every other shape
    on ``cluster.num_devices`` devices is kept with status ``invalid`` and the reason, and with
    ``memory_limit_bytes`` a point whose estimated per-device memory exceeds it gets ``oom``.
    """
    from baselines import space  # the grid the simulator searches too

    if system not in SYSTEMS:
        raise ValueError(f"grid: system {system!r} is not one of {SYSTEMS}")
    if system == "megatron":  # the plain grid: no virtual stages, no distributed optimizer
        found = space.megatron_space(
            cluster, workload, virtual=(1,), overlap=space.MEGATRON_OVERLAP[:1]
        )
    else:
        found = space.deepspeed_space(cluster, workload)
    configs = {
        (c.tp, c.pp, c.dp, c.micro_batch_size, c.zero if system == "deepspeed" else None): c
        for c in found
    }
    mbs = tuple(micro_batch_sizes or space.MICRO_BATCH_SIZES)
    out = []
    for tp, pp, dp, mb, zero in _raw_points(system, cluster.num_devices, mbs):
        spec = dataclasses.replace(
            base, system=system, tp=tp, pp=pp, dp=dp, micro_batch_size=mb, zero=zero
        )
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


def run_grid(
    points: Sequence[tuple[BaselineSpec, str | None]],
    *,
    run=run_point,
    rank_maps: Sequence[RankMap | None] | None = None,
    **run_kwargs,
) -> list[tuple[BaselineSpec, dict]]:
    """Run every runnable point (``run(spec, **run_kwargs)``); others get their status unrun.

    Returns ``(spec, result)`` for every point, in order; ``result["status"]`` is ``ok`` for
    measured points. A reason starting ``oom`` records ``oom``, one starting ``skipped``
    records ``skipped`` (not run on purpose), any other ``invalid``. ``run`` is
    :func:`run_point` by default (emulation passes namespaces through ``run_kwargs``; tests
    pass a stand-in). ``rank_maps`` (one per point, aligned with ``points``): a point with a
    map runs with ``rank_map=list(map.devices)`` and its result records ``placement``,
    ``rank_map`` and ``placement_how``.
    """
    if rank_maps is not None and len(rank_maps) != len(points):
        raise ValueError(f"run_grid: {len(rank_maps)} rank maps for {len(points)} points")
    results = []
    for i, (spec, reason) in enumerate(points):
        rm = rank_maps[i] if rank_maps is not None else None
        placed = (
            {}
            if rm is None
            else {
                "placement": rm.placement,
                "rank_map": list(rm.devices),
                "placement_how": rm.how,
            }
        )
        if reason is not None:
            status = next((s for s in ("oom", "skipped") if reason.startswith(s)), "invalid")
            results.append((spec, {"status": status, "error": reason, **placed}))
            continue
        kw = run_kwargs if rm is None else {**run_kwargs, "rank_map": list(rm.devices)}
        res = {**run(spec, **kw), **placed}
        ok = res["status"] == "ok"
        log.info(
            "grid %s%s: %s %s",
            spec.label(),
            "" if rm is None else f" ranks on devices {list(rm.devices)}",
            res["status"],
            f"{res['iter_time_s']:.3f} s/iter" if ok else res.get("error", "")[:200],
        )
        results.append((spec, res))
    return results


def best_point(results: Sequence[tuple[BaselineSpec, dict]]) -> tuple[BaselineSpec, dict] | None:
    """The measured point with the lowest iteration time (None if none ran successfully)."""
    ok = [(s, r) for s, r in results if r["status"] == "ok"]
    return min(ok, key=lambda sr: sr[1]["iter_time_s"]) if ok else None


def emulation_kwargs(emu) -> dict:
    """``run_point``/``run_grid`` keyword arguments that run ranks inside the devices' namespaces.

    ``emu`` is a :class:`system.emulation.netns.Emulation` (anything with ``plan.num_devices``,
    ``plan.ip(i)``, ``exec_prefix(i)``, ``rank_env(i)`` and ``master_addr``). The lists are per
    device: with a rank map, global rank r runs in device ``rank_map[r]``'s namespace and the
    rendezvous is at the address of rank 0's device.
    """
    n = emu.plan.num_devices
    return {
        "rank_prefix": [emu.exec_prefix(i) for i in range(n)],
        "rank_env": [emu.rank_env(i) for i in range(n)],
        "master_addr": emu.master_addr,
        "device_addrs": [emu.plan.ip(i) for i in range(n)],
    }


def _baseline_config(spec: BaselineSpec):
    from baselines.space import BaselineConfig

    return BaselineConfig(
        system=spec.system,
        tp=spec.tp,
        pp=spec.pp,
        dp=spec.dp,
        micro_batch_size=spec.micro_batch_size,
        zero=spec.zero or 0,
        virtual_stages=spec.virtual_stages,
        distributed_optimizer=spec.distributed_optimizer,
        overlap_grad_reduce=spec.overlap_grad_reduce,
        overlap_param_gather=spec.overlap_param_gather,
        overlap_comm=spec.overlap_comm,
    )


def _dp_request(spec: BaselineSpec) -> str:
    """The simulator's ``dp_collective`` for the spec's (``tree+allgather`` is its ``tree``)."""
    return "tree" if spec.dp_collective.startswith("tree") else spec.dp_collective


def _simulate(spec: BaselineSpec, cluster: Cluster, hardware, transport, rank_map):
    """baselines/*/perf.py's SimResult for ``spec`` with ``rank_map`` (ValueError: no model)."""
    kw = {} if hardware is None else {"hardware": hardware}
    if transport is not None:
        kw["transport"] = transport
    cfg = _baseline_config(spec)
    rm = None if rank_map is None else [int(d) for d in rank_map]
    if cfg.zero != 3:  # the spec's DP collective (the launcher passes its NCCL/framework flags)
        kw["dp_collective"] = _dp_request(spec)
    if spec.system == "megatron":
        from baselines.megatron.perf import simulate_megatron

        return simulate_megatron(cluster, spec.workload(), cfg, rank_map=rm, **kw)
    from baselines.deepspeed.perf import simulate_deepspeed

    return simulate_deepspeed(cluster, spec.workload(), cfg, rank_map=rm, **kw)


def predict_iter_time_s(
    spec: BaselineSpec, cluster: Cluster, hardware=None, transport=None, rank_map=None
) -> float | None:
    """The simulator's iteration time for ``spec`` on ``cluster`` (baselines/*/perf.py).

    ``hardware`` is a :class:`system.simulator.hardware.Hardware` (default V100), ``transport``
    a :class:`system.simulator.transfers.Transport` (default NCCL; the CPU runs use GLOO),
    ``rank_map`` the device of each global rank (default launch order). None when the simulator
    has no model for the point (it raises ValueError, e.g. ZeRO-0/2 or TP across hosts).
    """
    try:
        res = _simulate(spec, cluster, hardware, transport, rank_map)
    except ValueError as e:
        log.info("no simulator prediction for %s: %s", spec.label(), e)
        return None
    return float(res.iter_time_s)


def place_spec(
    spec: BaselineSpec, cluster: Cluster, placement: str, hardware=None, transport=None
) -> RankMap:
    """The rank map ``spec`` runs under on ``cluster``: ``launch`` (rank r on device r, the
    paper's protocol) or ``topology`` (:func:`baselines.placement.search_placement`, ranked by
    the same simulator, hardware and transport as :func:`predict_iter_time_s`, so a row's
    prediction and its measured run use one map). A point the simulator has no model for keeps
    launch order under ``topology`` too (``how`` says so)."""
    if check_placement(placement) == Placement.launch:
        return launch_map(cluster)
    try:
        _, rm = search_placement(
            cluster,
            spec.workload(),
            _baseline_config(spec),
            lambda cand: _simulate(spec, cluster, hardware, transport, cand.devices),
            dp_collective=_dp_request(spec),
            **({} if transport is None else {"transport": transport}),
        )
    except ValueError as e:
        devices = launch_map(cluster).devices
        return RankMap(Placement.topology, devices, f"launch order (no simulator model: {e})")
    return rm
