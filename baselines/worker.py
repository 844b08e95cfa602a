"""Rank-side helpers shared by both baseline workers (``baselines/{megatron,deepspeed}/train.py``).

Every baseline rank does the same bookkeeping as our runtime so rows compare directly: the same
seeded batches (:mod:`system.runtime.data`), replica ``r`` of ``dp`` takes its slice of each global
batch cut into micro-batches, the loss is the mean over the whole global batch, and an iteration's
time is the slowest rank's (barrier before, clock stops after the optimizer step).
"""

from __future__ import annotations

import datetime
import json
import logging
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

from baselines.spec import BaselineSpec, metrics_from
from system.runtime.data import SyntheticData, micro_batches

log = logging.getLogger(__name__)

__all__ = [
    "load_spec",
    "init_distributed",
    "replica_micro_batches",
    "IterationTimer",
    "global_mean_loss",
    "max_over_ranks",
    "write_result",
    "shutdown",
    "metrics",
    "calibrated_cpu_hardware",
]


def load_spec(argv: list[str], *, expect_system: str) -> BaselineSpec:
    """The spec named by ``argv[0]`` (a JSON file), checked to be for ``expect_system``."""
    if len(argv) != 1:
        raise SystemExit(f"usage: python -m baselines.{expect_system}.train SPEC.json")
    spec = BaselineSpec.from_json(Path(argv[0]).read_text())
    if spec.system != expect_system:
        raise ValueError(f"spec is for system {spec.system!r}, this worker runs {expect_system!r}")
    logging.basicConfig(
        level=logging.INFO,
        stream=sys.stderr,
        format=f"[rank {os.environ.get('RANK', '?')}] %(levelname)s %(name)s: %(message)s",
    )
    return spec


def init_distributed(spec: BaselineSpec) -> torch.device:
    """Join the process group from torchrun's environment: gloo on CPU, NCCL on CUDA."""
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    torch.manual_seed(spec.seed)
    if spec.device == "cuda":
        from baselines.spec import nccl_algo

        algo = nccl_algo(spec)
        if algo is not None:  # read by NCCL when the communicators are created
            os.environ["NCCL_ALGO"] = algo
        local = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local)
        device, backend = torch.device("cuda", local), "nccl"
    else:
        device, backend = torch.device("cpu"), "gloo"
    if not dist.is_initialized():
        from system.runtime.store import bind_to_advertised_address

        bind_to_advertised_address()  # rank 0's store: MASTER_ADDR only, never every interface
        dist.init_process_group(backend=backend, timeout=datetime.timedelta(seconds=spec.timeout_s))
    if dist.get_world_size() != spec.world_size:
        raise ValueError(f"world size {dist.get_world_size()} != tp·pp·dp = {spec.world_size}")
    return device


def data_for(spec: BaselineSpec) -> SyntheticData:
    m = spec.gpt_config()
    return SyntheticData(
        vocab_size=m.vocab_size,
        seq_length=m.seq_length,
        global_batch_size=spec.global_batch_size,
        seed=spec.seed,
    )


def replica_micro_batches(
    spec: BaselineSpec, it: int, dp_rank: int, dp_size: int
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Iteration ``it``'s micro-batches (inputs, targets) for data-parallel replica ``dp_rank``."""
    return micro_batches(
        data_for(spec).batch(it),
        dp=dp_size,
        replica=dp_rank,
        micro_batch_size=spec.micro_batch_size,
    )


class IterationTimer:
    """Times one iteration on this rank: barrier (and with ``spec.start == "clock"`` one common
    wall-clock instant), then wall clock until exit (CUDA synchronised)."""

    def __init__(self, device: torch.device, spec: BaselineSpec | None = None) -> None:
        self.device = device
        self.spec = spec
        self.elapsed_s = float("nan")

    def __enter__(self) -> IterationTimer:
        dist.barrier()
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        if self.spec is not None and self.spec.start == "clock":
            from system.runtime.worker import start_together

            self._t0, _ = start_together(self.device, self.spec.start_margin_s)
        else:
            self._t0 = time.perf_counter()
        return self

    def __exit__(self, *exc) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        self.elapsed_s = time.perf_counter() - self._t0


def global_mean_loss(local_mean: torch.Tensor | None, dp_size: int, device: torch.device) -> float:
    """Mean loss over the global batch: ranks holding a replica's loss pass it, others ``None``.

    Summed over all ranks and divided by ``dp_size`` (one loss-holding rank per replica, e.g.
    the last pipeline stage of each replica with tp rank 0).
    """
    t = torch.zeros(1, dtype=torch.float64, device=device)
    if local_mean is not None:
        t += local_mean.detach().double().to(device)
    dist.all_reduce(t)
    return float(t.item()) / dp_size


def max_over_ranks(value: float, device: torch.device) -> float:
    t = torch.tensor([value], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


def metrics(spec: BaselineSpec, losses: list[float], times: list[float]) -> dict:
    out = metrics_from(spec, losses, times)
    out["world_size"] = spec.world_size
    return out


def write_result(spec: BaselineSpec, result: dict) -> None:
    """Rank 0 writes ``result`` to ``spec.result_path`` (tmp file + rename)."""
    if dist.get_rank() != 0 or not spec.result_path:
        return
    path = Path(spec.result_path)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(result, sort_keys=True))
    os.replace(tmp, path)


def shutdown() -> None:
    """Barrier + destroy the process group (DeepSpeed ZeRO-3 may abort at exit without it)."""
    if dist.is_initialized():
        try:
            dist.barrier()
        finally:
            dist.destroy_process_group()


def calibrated_cpu_hardware(spec: BaselineSpec, repeats: int = 5):
    """A simulator :class:`Hardware` whose compute and optimizer times match this CPU.

    Times one micro-batch forward+backward and one AdamW step of our GPT (``spec``'s shape and
    micro-batch, one thread) and sets ``peak_flops`` (achievable fraction 1) so the simulator's
    per-micro-batch compute (Megatron FLOP count, recompute included) equals the measured time,
    and the optimizer "memory bandwidth" so its Adam step equals the measured one.
    """
    import statistics

    from system.runtime.model import build_model, lm_loss
    from system.simulator.hardware import ADAM_BYTES_PER_PARAM, Hardware
    from system.workload import Workload

    torch.set_num_threads(1)
    m = spec.gpt_config()
    model = build_model(m, spec.seed)
    opt = torch.optim.AdamW(model.parameters(), lr=spec.lr)
    x, y = replica_micro_batches(spec, 0, 0, 1)[0]
    step_s, opt_s = [], []
    for _ in range(repeats + 2):
        t0 = time.perf_counter()
        lm_loss(model(x), y).backward()
        t1 = time.perf_counter()
        opt.step()
        opt.zero_grad()
        step_s.append(t1 - t0)
        opt_s.append(time.perf_counter() - t1)
    compute_s, optim_s = statistics.median(step_s[2:]), statistics.median(opt_s[2:])
    flops = Workload(model=m, global_batch_size=spec.micro_batch_size).model_flops(recompute=True)
    params = sum(p.numel() for p in model.parameters())
    return Hardware(
        name="cpu-1-thread (calibrated)",
        peak_flops=flops / compute_s,
        achievable_fraction=1.0,
        memory_bytes=16 * 2**30,
        reserved_bytes=2**30,
        hbm_bandwidth_bps=8.0 * ADAM_BYTES_PER_PARAM * params / optim_s,
    )
