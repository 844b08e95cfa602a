"""Benchmark: gloo collectives on one emulated WAN link vs the α + 8·X/β model (issue 5 analysis).

    python repro/bench_gloo_wan.py [--case 5 --devices 0,24 --bandwidth-scale 0.1 --repeats 4]

Builds a 2-device emulation, starts 2 gloo ranks inside it (this file, re-run as a worker with
RANK set) and times, after a warm-up, ``all_to_all_single`` (``a2a``), ``all_gather_into_tensor``
(``ag``) and both back to back (the runtime's sharded-PS exchange for dp=2) for a tiny and a big
shard. Prints one table: median seconds per op next to α + X/β and 2α + X/β. Rank processes
only import torch.distributed in worker mode.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SIZES = (1000, 3_260_000)  # shard bytes per rank
OPS = ("a2a", "ag", "both")


def _worker(repeats: int, out: str) -> None:
    import datetime

    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=300))
    rank = dist.get_rank()
    res = {}
    for nbytes in SIZES:
        n = nbytes // 4
        for op in OPS:
            times = []
            for _ in range(repeats + 1):  # first one warms the connection up
                buf, recv = torch.ones(2 * n), torch.empty(2 * n)
                dist.barrier()
                time.sleep(0.3)
                t = time.perf_counter()
                if op in ("a2a", "both"):
                    dist.all_to_all_single(recv, buf)
                if op in ("ag", "both"):
                    dist.all_gather_into_tensor(buf, recv[:n].clone())
                times.append(time.perf_counter() - t)
            res[f"{op}:{nbytes}"] = statistics.median(times[1:])
    if rank == 0:
        Path(out).write_text(json.dumps(res))
    dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--case", default="5")
    ap.add_argument("--devices", default="0,24")
    ap.add_argument("--bandwidth-scale", type=float, default=0.1)
    ap.add_argument("--repeats", type=int, default=4)
    a = ap.parse_args(argv)
    from system.cases import get_case
    from system.emulation.netns import Emulation
    from system.emulation.plan import make_plan

    cluster = get_case(a.case).subset([int(x) for x in a.devices.split(",")])
    if cluster.num_devices != 2:
        raise SystemExit("error: --devices must name exactly 2 devices")
    plan = make_plan(cluster, bandwidth_scale=a.bandwidth_scale)
    out = f"/tmp/dtfm-bench-{os.getpid()}.json"
    with Emulation(plan) as emu:
        procs = []
        for r in range(2):
            env = dict(os.environ, RANK=str(r), WORLD_SIZE="2", MASTER_ADDR=plan.ip(0),
                       MASTER_PORT="29671", OMP_NUM_THREADS="1", DTFM_BENCH_WORKER="1",
                       **emu.rank_env(r))
            procs.append(subprocess.Popen(emu.exec_prefix(r) + [sys.executable, __file__, "--repeats",
                                                                str(a.repeats), "--out", out], env=env))
        for p in procs:
            p.wait(timeout=600)
    res = json.loads(Path(out).read_text())
    Path(out).unlink(missing_ok=True)
    alpha, beta = float(plan.delay_s[0, 1]), float(plan.goodput_bps[0, 1])
    print(f"link {cluster.region_of[0]}-{cluster.region_of[1]}: α = {alpha * 1e3:.0f} ms, "
          f"β = {beta / 1e6:.1f} Mbit/s (scaled x{a.bandwidth_scale:g})")
    print(f"{'op':>5} {'shard B':>9} {'measured s':>11} {'a+X/b':>8} {'2a+X/b':>8}")
    for nbytes in SIZES:
        for op in OPS:
            k = 2 if op == "both" else 1
            x = 8 * nbytes / beta
            print(f"{op:>5} {nbytes:>9} {res[f'{op}:{nbytes}']:11.3f} {k * (alpha + x):8.3f} "
                  f"{k * (2 * alpha + x):8.3f}")
    return 0


if __name__ == "__main__":
    if os.environ.get("DTFM_BENCH_WORKER"):
        p = argparse.ArgumentParser()
        p.add_argument("--repeats", type=int)
        p.add_argument("--out")
        w = p.parse_args()
        _worker(w.repeats, w.out)
        sys.exit(0)
    sys.exit(main())
