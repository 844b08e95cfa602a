"""Benchmark: the data-parallel exchange of 2 replicas on one emulated WAN link (issue 5 analysis).

    python repro/bench_gloo_wan.py [--case 5 --devices 0,24 --bandwidth-scale 0.1 --skews 0,0.3]

Builds a 2-device emulation and starts 2 gloo ranks in it (this file, re-run as a worker). For
each entry skew (replica 1 enters the exchange that many seconds after replica 0; both clocks
are the machine's one monotonic clock, so every time below is from replica 0's entry) it times:

- ``collectives``: ``all_to_all_single`` + ``all_gather_into_tensor`` of one bucket — the
  runtime's sharded-PS exchange before issue 5;
- ``p2p``: the runtime's :class:`system.runtime.data_parallel.GradBuckets` exchange, its
  first-half receives posted at the common start (as the runtime posts them at iteration start);

and prints, per replica, when it was done next to the simulator's event model
(:func:`system.simulator.comm.sharded_ps_p2p_s`). Medians of ``--repeats`` after one warm-up.
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

OPS = ("collectives", "p2p")


def _worker(shard_bytes: int, skews: list[float], repeats: int, out: str) -> None:
    import datetime

    import torch
    import torch.distributed as dist
    from torch import nn

    from system.runtime.data_parallel import GradBuckets
    from system.runtime.timeline import Timeline

    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=300))
    rank = dist.get_rank()
    group = dist.new_group([0, 1])
    n = shard_bytes // 4
    param = nn.Parameter(torch.zeros(2 * n))
    buckets = GradBuckets([param], dp=2, bucket_mb=1e6, device=torch.device("cpu"),
                          ranks=(0, 1), rank=rank)
    tl = Timeline(rank)
    res = []
    for skew in skews:
        for op in OPS:
            for k in range(repeats + 1):  # the first one warms the connections up
                buckets.buffers[0].fill_(1.0 + rank)
                dist.barrier()
                start = (int(time.monotonic()) + 2) * 1.0  # one instant on the shared clock
                time.sleep(start - time.monotonic())
                if op == "p2p":
                    buckets.post_receives(group, "sharded_ps")
                time.sleep(skew if rank == 1 else 0.0)
                if op == "collectives":
                    recv = torch.empty_like(buckets.buffers[0])
                    dist.all_to_all_single(recv, buckets.buffers[0], group=group)
                    mine = recv.view(2, -1).sum(0).div_(2)
                    dist.all_gather_into_tensor(buckets.buffers[0], mine, group=group)
                else:
                    buckets.sync(group, "sharded_ps", tl)
                done = time.monotonic() - start
                if not torch.allclose(buckets.buffers[0], torch.full_like(buckets.buffers[0], 1.5)):
                    raise RuntimeError(f"{op}: the exchange did not average the replicas")
                if k:
                    res.append({"skew": skew, "op": op, "rank": rank, "done_s": done})
    allr = [None, None]
    dist.all_gather_object(allr, res)
    if rank == 0:
        Path(out).write_text(json.dumps(allr[0] + allr[1]))
    dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--case", default="5")
    ap.add_argument("--devices", default="0,24")
    ap.add_argument("--bandwidth-scale", type=float, default=0.1)
    ap.add_argument("--shard-bytes", type=int, default=3_260_000)
    ap.add_argument("--skews", default="0,0.3,0.8", help="comma-separated seconds")
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args(argv)
    import numpy as np

    from system.cases import get_case
    from system.emulation.netns import Emulation
    from system.emulation.plan import make_plan
    from system.simulator.comm import sharded_ps_p2p_s

    skews = [float(x) for x in a.skews.split(",")]
    cluster = get_case(a.case).subset([int(x) for x in a.devices.split(",")])
    if cluster.num_devices != 2:
        raise SystemExit("error: --devices must name exactly 2 devices")
    plan = make_plan(cluster, bandwidth_scale=a.bandwidth_scale)
    out = Path(f"/tmp/dtfm-bench-{os.getpid()}.json")
    with Emulation(plan) as emu:
        procs = []
        for r in range(2):
            env = dict(os.environ, RANK=str(r), WORLD_SIZE="2", MASTER_ADDR=plan.ip(0),
                       MASTER_PORT="29671", OMP_NUM_THREADS="1", DTFM_BENCH_WORKER="1",
                       **emu.rank_env(r))
            procs.append(subprocess.Popen(emu.exec_prefix(r) + [
                sys.executable, __file__, "--shard-bytes", str(a.shard_bytes), "--skews", a.skews,
                "--repeats", str(a.repeats), "--out", str(out)], env=env))
        for p in procs:
            p.wait(timeout=900)
    if not out.exists():
        raise SystemExit("error: the ranks did not finish (see their output above)")
    rows = json.loads(out.read_text())
    out.unlink()
    scaled = plan.scaled_cluster()
    alpha, beta = float(scaled.delay_s[0, 1]), float(scaled.bandwidth_bps[0, 1])
    print(f"link {cluster.region_of[0]}-{cluster.region_of[1]}: α = {alpha * 1e3:.0f} ms, "
          f"β = {beta / 1e6:.1f} Mbit/s (x{a.bandwidth_scale:g}); shard {a.shard_bytes} B, "
          f"8X/β = {8 * a.shard_bytes / beta:.3f} s; times from replica 0's entry")
    print(f"{'skew s':>7} {'replica':>7} {'collectives s':>14} {'p2p s':>8} {'p2p model s':>12}")
    for skew in skews:
        entry = np.array([[0.0, skew]])
        model = sharded_ps_p2p_s(scaled, [[0, 1]], 2 * a.shard_bytes, entry, posted_s=0.0)[0]
        for r in range(2):
            med = {op: statistics.median(x["done_s"] for x in rows
                                         if x["skew"] == skew and x["op"] == op and x["rank"] == r)
                   for op in OPS}
            print(f"{skew:7.2f} {r:7d} {med['collectives']:14.3f} {med['p2p']:8.3f} "
                  f"{model[r]:12.3f}")
    return 0


if __name__ == "__main__":
    if os.environ.get("DTFM_BENCH_WORKER"):
        p = argparse.ArgumentParser()
        p.add_argument("--shard-bytes", type=int)
        p.add_argument("--skews")
        p.add_argument("--repeats", type=int)
        p.add_argument("--out")
        w = p.parse_args()
        _worker(w.shard_bytes, [float(x) for x in w.skews.split(",")], w.repeats, w.out)
        sys.exit(0)
    sys.exit(main())
