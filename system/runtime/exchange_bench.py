"""Time one data-parallel exchange alone, as the runtimes run it.

``python -m system.runtime.exchange_bench SPEC.json`` on every rank (started by
:func:`system.runtime.launch.run_ranks`).

Two exchanges over all ranks, one gradient of ``nbytes`` (fp32) per rank:

- ``sharded_ps``: our runtime's sharded parameter server (:class:`GradBuckets`, one bucket):
  receives of the first half posted before the exchange, as the runtime posts them at the
  iteration's start; each rank sends its n−1 shards to their owners at once;
- ``ring``: ``torch.distributed.all_reduce`` (gloo's ring, what the baselines' DP runs on CPU).

Each repeat starts on every rank at one wall-clock instant (rank 0 picks it a margin ahead and
broadcasts it; the ranks share a host clock in the emulation), and its time is the latest rank's
end minus that instant. ``warmup`` repeats first (connections open, windows grown). Rank 0 writes
``{"times_s": [...], "per_rank_s": [[...], ...]}`` to ``result_path``.
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
from system.runtime.data_parallel import GradBuckets
from system.runtime.timeline import Timeline

__all__ = ["ExchangeSpec", "run"]

EXCHANGES = ("sharded_ps", "ring")


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

    def __post_init__(self) -> None:
        if self.exchange not in EXCHANGES:
            raise ValueError(f"exchange must be one of {EXCHANGES}, got {self.exchange!r}")
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
            dist.barrier()
            start = _common_start(spec.margin_s)
            time.sleep(max(0.0, start - time.time()))
            if spec.exchange == "sharded_ps":
                buckets.sync(None, "sharded_ps", timeline)
            else:
                dist.all_reduce(buckets.buffers[0])
            end = time.time()
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
