"""RunSpec: everything one training run needs, checked once, sent to every rank as JSON.

The launcher (:mod:`system.runtime.launch`) validates a spec before any process starts, so bad
input (pp·dp ≠ world size, layers not divisible by pp, an assignment that misses devices) is one
clear ``ValueError`` in the caller, never a hang in a worker.

``stages`` is the scheduler's assignment table (``stages[s][r]`` = device = rank that runs stage
``s`` of replica ``r``, :class:`system.assignment.Assignment`); when it is ``None`` the
``layout`` (``identity`` or ``random`` with ``seed``) makes one.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path

from system.assignment import Assignment, identity_assignment, random_assignment
from system.workload import GPTConfig, Workload, get_model

__all__ = ["SpecBase", "RunSpec", "DEVICES", "DP_MODES", "LAYOUTS", "STARTS"]

DEVICES = ("cpu", "cuda")  # gloo on CPU processes, NCCL on GPUs
DP_MODES = ("sharded_ps", "allreduce")
STARTS = ("barrier", "clock")
LAYOUTS = ("identity", "random")
OPTIMIZERS = ("adamw", "sgd")


@dataclass(frozen=True, kw_only=True)  # no slots: callers read defaults as BaselineSpec.lr
class SpecBase:
    """What every multi-rank training run names, ours (:class:`RunSpec`) and the baselines'
    (``baselines.grid.BaselineSpec``): the model and its shape overrides, the parallel layout,
    the batch, the optimizer's seed and rate, the device and how iterations start. The
    workers of both read it from one JSON file under the same launcher."""

    model: str = "debug"  # key of system.workload.MODELS
    layers: int | None = None  # num_layers override
    hidden_size: int | None = None  # overrides for benchmarks (None = the model's)
    seq_length: int | None = None
    vocab_size: int | None = None
    pp: int = 1  # pipeline stages
    dp: int = 1  # data-parallel replicas
    global_batch_size: int = 8  # sequences per iteration
    micro_batch_size: int = 1  # sequences per micro-batch
    iters: int = 3
    seed: int = 0
    lr: float = 3e-3  # AdamW, betas (0.9, 0.999), no weight decay
    device: str = "cpu"  # cpu (gloo) | cuda (NCCL)
    # how every rank starts an iteration: "barrier" (leave a barrier; ranks leave it up to a
    # few link delays apart, and each times itself from its own exit) or "clock" (after the
    # barrier rank 0 names a wall-clock instant ``start_margin_s`` ahead and every rank starts
    # then: all ranks time one iteration from the same instant, which needs clocks in sync —
    # one machine, as in the WAN emulation, or NTP-synced hosts)
    start: str = "barrier"
    start_margin_s: float = 1.0

    def gpt_config(self) -> GPTConfig:
        cfg = get_model(self.model, self.layers)
        over = {
            k: getattr(self, k)
            for k in ("hidden_size", "seq_length", "vocab_size")
            if getattr(self, k) is not None
        }
        return replace(cfg, **over) if over else cfg

    def check_shared(self, where: str) -> None:
        """One ValueError, prefixed ``where``, for a bad shared field (each spec checks more)."""
        if self.pp < 1 or self.dp < 1:
            raise ValueError(f"{where}: pp={self.pp} and dp={self.dp} must both be >= 1")
        for k in ("iters", "global_batch_size", "micro_batch_size"):
            if getattr(self, k) < 1:
                raise ValueError(f"{where}: {k} must be >= 1, got {getattr(self, k)}")
        if self.device not in DEVICES:
            raise ValueError(f"{where}: device {self.device!r} is not one of {DEVICES}")
        if self.start not in STARTS:
            raise ValueError(f"{where}: start {self.start!r} is not one of {STARTS}")
        if not self.start_margin_s > 0:
            raise ValueError(f"{where}: start_margin_s must be > 0, got {self.start_margin_s}")

    def to_dict(self) -> dict:
        return asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1, sort_keys=True)

    @classmethod
    def from_dict(cls, data: dict):
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"{cls.__name__}: unknown field(s) {unknown}; known: {sorted(known)}")
        return cls(**data)


@dataclass(frozen=True, slots=True, kw_only=True)
class RunSpec(SpecBase):
    """One training run of our runtime (paper §3.5)."""

    # iterations left out of the reported medians (connections, allocator and caches warm up;
    # on emulated WAN links the second iteration is still up to 30% slow with 8 ranks)
    warmup_iters: int = 1
    optimizer: str = "adamw"  # adamw | sgd
    stages: list[list[int]] | None = None  # assignment table; None = from layout
    layout: str = "identity"  # identity | random (used when stages is None)
    dp_mode: str = "sharded_ps"  # sharded_ps | allreduce
    bucket_mb: float = 25.0  # gradient bucket size (MiB of fp32)
    checkpointing: bool = False  # recompute block activations in backward
    amp: bool = False  # fp16 autocast (CUDA only)
    loss_scale: float | None = None  # static/initial loss scale; None = 2**16 with amp, else 1
    dynamic_loss_scale: bool = True  # halve on overflow, double after 1000 clean steps
    # micro-batch receives posted ahead of compute; None = all of the pass at its start (GPipe
    # keeps every micro-batch's boundary tensors anyway, and a receive posted late delays its
    # sender by one notice crossing the link, α)
    recv_ahead: int | None = None
    probe_links: bool = False  # time one activation transfer per pipeline link before training
    trace_path: str | None = None  # Chrome trace JSON (merged over ranks) if set
    metrics_out: str | None = None  # rank 0 writes its metrics JSON here
    pg_timeout_s: float = 120.0  # torch.distributed timeout per collective
    extra: dict = field(default_factory=dict)  # free-form labels carried into metrics

    # ---- derived ------------------------------------------------------------------------------
    @property
    def world_size(self) -> int:
        return self.pp * self.dp

    def workload(self) -> Workload:
        return Workload(
            model=self.gpt_config(),
            global_batch_size=self.global_batch_size,
            micro_batch_size=self.micro_batch_size,
        )

    def assignment(self) -> Assignment:
        if self.stages is not None:
            return Assignment.from_stages(self.stages)
        if self.layout == "random":
            return random_assignment(self.pp, self.dp, self.seed)
        return identity_assignment(self.pp, self.dp)

    def resolved(self) -> RunSpec:
        """The same spec with ``stages`` filled in from ``layout`` (what workers receive)."""
        return replace(self, stages=self.assignment().stages.tolist())

    # ---- checks --------------------------------------------------------------------------------
    def validate(self, world_size: int | None = None) -> None:
        """Raise one ValueError naming the bad input; ``world_size`` = processes to be started."""
        self.check_shared("RunSpec")
        if world_size is not None and world_size != self.pp * self.dp:
            raise ValueError(
                f"RunSpec: pp·dp = {self.pp}·{self.dp} = {self.pp * self.dp} "
                f"does not equal world_size={world_size}"
            )
        if self.warmup_iters < 0:
            raise ValueError(f"RunSpec: warmup_iters must be >= 0, got {self.warmup_iters}")
        if self.layout not in LAYOUTS:
            raise ValueError(f"RunSpec: layout {self.layout!r} is not one of {LAYOUTS}")
        if self.dp_mode not in DP_MODES:
            raise ValueError(f"RunSpec: dp_mode {self.dp_mode!r} is not one of {DP_MODES}")
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"RunSpec: optimizer {self.optimizer!r} is not one of {OPTIMIZERS}")
        if self.amp and self.device != "cuda":
            raise ValueError(
                "RunSpec: amp=True needs device='cuda' (fp16 autocast on CPU is not used)"
            )
        if self.recv_ahead is not None and self.recv_ahead < 1:
            raise ValueError(f"RunSpec: recv_ahead must be None or >= 1, got {self.recv_ahead}")
        if self.bucket_mb <= 0:
            raise ValueError(f"RunSpec: bucket_mb must be > 0, got {self.bucket_mb}")
        self.workload().check_layout(self.pp, self.dp)  # layers % pp, batch % (dp·micro)
        if self.stages is not None:
            try:
                a = Assignment.from_stages(self.stages)
            except ValueError as e:
                raise ValueError(f"RunSpec: bad assignment: {e}") from None
            if (a.pp, a.dp) != (self.pp, self.dp):
                raise ValueError(
                    f"RunSpec: assignment has shape pp={a.pp}, dp={a.dp} but the "
                    f"run asks for pp={self.pp}, dp={self.dp}"
                )

    # ---- JSON (to_dict, to_json, from_dict: SpecBase) ---------------------------------------
    @classmethod
    def load(cls, path: str | Path) -> RunSpec:
        return cls.from_dict(json.loads(Path(path).read_text()))
