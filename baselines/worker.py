"""Rank-side helpers shared by both baseline workers (``baselines/{megatron,deepspeed}/train.py``).

Every baseline rank does the same bookkeeping as our runtime so rows compare directly: the same
seeded batches (:mod:`system.runtime.data`), replica ``r`` of ``dp`` takes its slice of each global
batch cut into micro-batches, the loss is the mean over the whole global batch, and an iteration's
time is the slowest rank's (barrier before, clock stops after the optimizer step). With
``spec.start == "free"`` (:class:`StepClock`) the iterations run back to back after one common
start, as in production training, and losses and times are reduced once at the end.
"""

from __future__ import annotations

import datetime
import json
import logging
import os
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import torch
import torch.distributed as dist

from baselines.spec import BaselineSpec, metrics_from
from system.lifeline import die_with_parent
from system.runtime.data import make_data, micro_batches

log = logging.getLogger(__name__)

__all__ = [
    "load_spec",
    "init_distributed",
    "replica_micro_batches",
    "IterationTimer",
    "StepClock",
    "global_mean_loss",
    "max_over_ranks",
    "write_result",
    "shutdown",
    "metrics",
    "calibrated_cpu_hardware",
]


def load_spec(argv: list[str], *, expect_system: str) -> BaselineSpec:
    """The spec named by ``argv[0]`` (a JSON file), checked to be for ``expect_system``. The rank
    dies with its launcher from here on (:func:`system.lifeline.die_with_parent`)."""
    die_with_parent()
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


def data_for(spec: BaselineSpec):
    """The spec's data (synthetic or the corpus), as our runtime's workers read it."""
    return make_data(spec)


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


class StepClock:
    """Every iteration's time and global mean loss, in any of the spec's start modes.

    ``barrier`` / ``clock``: each iteration is an :class:`IterationTimer`, and after it the loss
    and the slowest rank's time are reduced over all ranks (what :func:`global_mean_loss` and
    :func:`max_over_ranks` do). ``free``: one barrier and common instant before the first
    iteration, then no synchronisation of its own: each rank notes when it ended every
    iteration and its local loss, and :meth:`result` reduces them once (iteration k ends when
    its last rank ends it).
    """

    def __init__(self, device: torch.device, spec: BaselineSpec, dp_size: int) -> None:
        self.device, self.spec, self.dp_size = device, spec, dp_size
        self.free = spec.start == "free"
        self.losses: list[float] = []
        self.times: list[float] = []
        self._ends: list[float] = []
        self._local: list[float] = []
        self._t0: float | None = None

    @contextmanager
    def iteration(self):
        if not self.free:
            with IterationTimer(self.device, self.spec) as timer:
                yield
            self._elapsed = timer.elapsed_s
            return
        if self._t0 is None:
            from system.runtime.worker import start_together

            dist.barrier()
            self._t0, _ = start_together(self.device, self.spec.start_margin_s)
        yield
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        self._ends.append(time.perf_counter() - self._t0)

    def record(self, local_mean: torch.Tensor | None) -> None:
        """After an iteration: this rank's replica loss (``None`` on ranks holding none)."""
        if not self.free:
            self.losses.append(global_mean_loss(local_mean, self.dp_size, self.device))
            self.times.append(max_over_ranks(self._elapsed, self.device))
            return
        self._local.append(0.0 if local_mean is None else float(local_mean.detach()))

    def result(self) -> tuple[list[float], list[float]]:
        """(losses, iteration times), the same on every rank."""
        if self.free:
            loss = torch.tensor(self._local, dtype=torch.float64, device=self.device)
            ends = torch.tensor(self._ends, dtype=torch.float64, device=self.device)
            dist.all_reduce(loss)
            dist.all_reduce(ends, op=dist.ReduceOp.MAX)
            self.losses = (loss.cpu() / self.dp_size).tolist()
            end = ends.cpu().tolist()
            self.times = [b - a for a, b in zip([0.0, *end[:-1]], end, strict=True)]
        return self.losses, self.times


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
