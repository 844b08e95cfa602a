"""Time one data-parallel exchange alone, as the runtimes run it.

``python -m system.runtime.exchange_bench SPEC.json`` on every rank (started by
:func:`system.runtime.launch.run_ranks`).

Two exchanges over all ranks, one gradient of ``nbytes`` (fp32) per rank:

- ``sharded_ps``: our runtime's sharded parameter server (:class:`GradBuckets`, one bucket):
  receives of the first half posted before the exchange, as the runtime posts them at the
  iteration's start; each rank sends its n−1 shards to their owners at once;
- ``ring``: ``torch.distributed.all_reduce`` (gloo's ring, what the baselines' DP runs on CPU);
- ``ring_p2p``, ``tree``, ``two_level``: NCCL's ring, double binary tree and the two-level
  all-reduce over point-to-point (:mod:`system.runtime.collectives`; ``block`` and ``inner``
  choose the two-level one's blocks and its algorithm across them), every receive posted before
  the common start.

Each repeat starts on every rank at one wall-clock instant (rank 0 picks it a margin ahead and
broadcasts it; the ranks share a host clock in the emulation), and its time is the latest rank's
end minus that instant. ``warmup`` repeats first (connections open, windows grown). Rank 0 writes
``{"times_s": [...], "per_rank_s": [[...], ...]}`` to ``result_path``. The point-to-point
all-reduces' sums are checked after every repeat (every element must be the sum of the ranks'
fills).
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from system.lifeline import exit_now
from system.runtime.collectives import allreduce
from system.runtime.data_parallel import GradBuckets
from system.runtime.timeline import Timeline

__all__ = ["ExchangeSpec", "run"]

EXCHANGES = ("sharded_ps", "ring", "ring_p2p", "tree", "two_level")
P2P_ALGORITHMS = {"ring_p2p": "ring", "tree": "tree", "two_level": "two_level"}


@dataclass(frozen=True)
class ExchangeSpec:
    """One benchmark: which exchange, the gradient bytes per rank, the repeats."""

    exchange: str
    nbytes: int
    repeats: int = 3
    warmup: int = 1
    margin_s: float = 0.5  # how far ahead rank 0 sets each repeat's common start
    timeout_s: float = 300.0
    result_path: str | None = None
    block: int = 2  # two_level: ranks per block
    inner: str = "ring"  # two_level: the all-reduce across blocks (ring or tree)

    def __post_init__(self) -> None:
        if self.exchange not in EXCHANGES:
            raise ValueError(f"exchange must be one of {EXCHANGES}, got {self.exchange!r}")
        if self.inner not in ("ring", "tree") or self.block < 2:
            raise ValueError(f"exchange bench: inner ring or tree, block >= 2; got {self}")
        if self.nbytes < 4 or self.repeats < 1 or self.warmup < 0 or self.margin_s <= 0:
            raise ValueError(
                f"exchange bench: nbytes >= 4, repeats >= 1, warmup >= 0, margin_s > 0; got {self}"
            )

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)


def _common_start(margin_s: float) -> float:
    """A wall-clock instant every rank agrees on, ``margin_s`` after rank 0 chose it."""
    t = torch.tensor([time.time() + margin_s], dtype=torch.float64)
    dist.broadcast(t, src=0)
    return float(t.item())


def run(spec: ExchangeSpec) -> dict | None:
    """Run the benchmark on this rank; rank 0 returns (and writes) the result."""
    import datetime

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=spec.timeout_s))
    try:
        rank, world = dist.get_rank(), dist.get_world_size()
        param = torch.nn.Parameter(torch.zeros(spec.nbytes // 4))
        buckets = GradBuckets(
            [param],
            dp=world,
            bucket_mb=spec.nbytes / 2**20 + 1,
            device=torch.device("cpu"),
            ranks=tuple(range(world)),
            rank=rank,
        )
        timeline = Timeline(rank)
        mine = []
        for k in range(spec.warmup + spec.repeats):
            param.grad.fill_(float(rank + k))
            if spec.exchange == "sharded_ps":
                buckets.post_receives(None, "sharded_ps")
            op = None
            if spec.exchange in P2P_ALGORITHMS:
                op = allreduce(
                    buckets.buffers[0],
                    P2P_ALGORITHMS[spec.exchange],
                    block=spec.block,
                    inner=spec.inner,
                ).post()
            dist.barrier()
            start = _common_start(spec.margin_s)
            time.sleep(max(0.0, start - time.time()))
            if spec.exchange == "sharded_ps":
                buckets.sync(None, "sharded_ps", timeline)
            elif op is not None:
                op.run()
            else:
                dist.all_reduce(buckets.buffers[0])
            end = time.time()
            want = world * (world - 1) / 2 + world * k  # sum over ranks of rank + k
            if op is not None and not bool((param.grad == want).all()):
                raise RuntimeError(f"{spec.exchange}: the all-reduce's sum is not {want}")
            if k >= spec.warmup:
                mine.append(end - start)
        got = [torch.zeros(len(mine), dtype=torch.float64) for _ in range(world)]
        dist.all_gather(got, torch.tensor(mine, dtype=torch.float64))
        dist.barrier()
        if rank != 0:
            return None
        per_rank = [g.tolist() for g in got]
        out = {"times_s": [max(r[i] for r in per_rank) for i in range(len(mine))]}
        out["per_rank_s"] = per_rank
        if spec.result_path:
            Path(spec.result_path).write_text(json.dumps(out))
        return out
    finally:
        dist.destroy_process_group()


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        raise SystemExit("usage: python -m system.runtime.exchange_bench SPEC.json")
    run(ExchangeSpec(**json.loads(Path(argv[0]).read_text())))
    return 0


if __name__ == "__main__":
    exit_now(main(sys.argv[1:]))  # results written, group destroyed: skip finalization
