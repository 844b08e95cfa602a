"""Rank module of the collectives test: every algorithm of :mod:`system.runtime.collectives`
against ``torch.distributed.all_reduce`` on the same inputs; rank 0 writes the largest
difference of each case to the JSON file named by ``argv[1]``."""

from __future__ import annotations

import datetime
import json
import sys

import torch
import torch.distributed as dist

from system.lifeline import exit_now
from system.runtime.collectives import allreduce

CHUNK = 131072  # float32 elements in one 512 KiB tree chunk


def cases(n: int) -> list[tuple[str, dict]]:
    out = [("ring", {}), ("tree", {})]
    for k in (2, 4):
        if n % k == 0 and n // k >= 2:
            out += [("two_level", {"block": k, "inner": inner}) for inner in ("ring", "tree")]
    return out


def main(argv: list[str]) -> int:
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
    rank, n = dist.get_rank(), dist.get_world_size()
    sizes = [1, n + 2, 1000, CHUNK, CHUNK + 1, 4 * CHUNK + 12345]
    worst = {}
    for algorithm, kw in cases(n):
        for size in sizes:
            gen = torch.Generator().manual_seed(1000 * rank + size)
            x = torch.rand(size, generator=gen) / n
            ref = x.clone()
            dist.all_reduce(ref)
            op = allreduce(x, algorithm, **kw).post()
            dist.barrier()
            op.run()
            diff = torch.tensor([(x - ref).abs().max().item()], dtype=torch.float64)
            dist.all_reduce(diff, op=dist.ReduceOp.MAX)
            name = "/".join([algorithm] + [f"{k}={v}" for k, v in kw.items()] + [str(size)])
            worst[name] = diff.item()
    dist.barrier()
    if rank == 0:
        with open(argv[0], "w") as f:
            json.dump(worst, f)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    exit_now(main(sys.argv[1:]))
