"""``mode=quality``: its options and its systems (the study is :mod:`.run`)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from repro.config.base import RunConfig, register_mode
from repro.config.options import ConfigError, choice, option
from repro.config.shared import (
    QUALITY_STUDY_SYSTEMS,
    Backend,
    CaseOptions,
    ModelName,
    ModelOptions,
    check_emulated_links,
)
from system.compression import Compression, DPCompression, LocalSGD, PipeCompression

__all__ = ["QualityConfig", "QUALITY_SYSTEMS", "QUALITY_REFERENCE"]

# the study's systems: RunSpec options of our runtime (its
# ``compression``, and ``dp_mode`` for the ring), or None for a real baseline (its own worker)
_TOPK = DPCompression(method="topk", ratio=0.05, bits=8)
QUALITY_SYSTEMS: dict[str, dict | None] = {
    "ours": {},
    "ours_pipe_q4": dict(
        compression=Compression(pipe=PipeCompression(method="quantize", fwd_bits=4, bwd_bits=8))
    ),
    "ours_aq_sgd": dict(
        compression=Compression(pipe=PipeCompression(method="aq_sgd", fwd_bits=4, bwd_bits=8))
    ),
    "ours_dp_topk": dict(compression=Compression(dp=_TOPK)),
    "ring_dp_topk": dict(compression=Compression(dp=_TOPK), dp_mode="ring"),
    "diloco_h4": dict(compression=Compression(local=LocalSGD(method="diloco", inner_steps=4))),
    "diloco_h16": dict(compression=Compression(local=LocalSGD(method="diloco", inner_steps=16))),
    "megatron": None,
    "deepspeed": None,
}
QUALITY_REFERENCE = "ours"  # the uncompressed run that sets each case's target loss
if tuple(QUALITY_SYSTEMS) != QUALITY_STUDY_SYSTEMS:  # the reports read the names from there
    raise ImportError("mode=quality: QUALITY_SYSTEMS and QUALITY_STUDY_SYSTEMS name other systems")


QualitySystem = choice("QualitySystem", QUALITY_SYSTEMS, module=__name__)


@dataclass
@register_mode("quality", "repro.studies.quality.run:run", rows=True)
class QualityConfig(ModelOptions, CaseOptions, RunConfig):
    """Time to a target loss on emulated links: compression, DiLoCo, ours and the baselines."""

    case: str = option("5", "the paper case whose links are emulated (4 and 5 in the sweep)")
    model: ModelName = option(ModelName.debug, "the GPT trained (debug or small on 2 cores)")
    batch: int = option(32, "global batch in sequences", ge=1)
    micro_batch_size: int = option(8, "sequences per micro-batch", ge=1)
    seq_length: int = option(64, "tokens per sequence (characters of the corpus)", ge=1)
    vocab_size: int = option(64, "the model's vocabulary (the corpus has 63 symbols)", ge=1)
    pp: int = option(2, "pipeline stages of ours (and of the baselines)", ge=1)
    dp: int = option(2, "data-parallel replicas (DiLoCo's replicas)", ge=1)
    iters: int = option(64, "training iterations of every system", ge=1)
    lr: float = option(0.005, "AdamW learning rate of every system (DiLoCo: inner)", gt=0)
    train_sequences: int = option(512, "training sequences of the corpus, repeated", ge=1)
    target_iters: int = option(40, "the target is the reference's loss after this many", ge=1)
    window: int = option(8, "losses smoothed by a trailing mean over this many iterations", ge=1)
    snapshot_every: int = option(16, "held-out evaluation every this many iterations", ge=1)
    systems: list[QualitySystem] = option(list(QUALITY_SYSTEMS), "the systems run, in order")
    devices: list[int] | None = option(
        None, "device ids of the case (null: the first of each region)", ge=0
    )
    bandwidth_scale: float = option(0.1, "every bandwidth x this (as mode=emulate)", gt=0, le=100)
    delay_scale: float = option(1.0, "every one-way delay x this", gt=0, le=100)
    backend: Backend = option(Backend.auto, "netem, or the NFQUEUE delayer (auto: netem if any)")
    timeout_s: float = option(900.0, "wall-clock limit of one run (its ranks killed after)", gt=0)

    def check(self) -> None:
        super().check()
        n = self.pp * self.dp
        self.limits.check_ranks(n, f"pp x dp = {self.pp} x {self.dp}")
        n_case = self.cluster().num_devices
        if self.devices is not None and (
            len(self.devices) != n or len(set(self.devices)) != n or max(self.devices) >= n_case
        ):
            raise ConfigError(
                f"devices={self.devices}: {n} distinct ids in 0..{n_case - 1} (pp x dp)"
            )
        if self.target_iters > self.iters:
            raise ConfigError(f"target_iters={self.target_iters} is past iters={self.iters}")
        if self.iters % self.snapshot_every or self.snapshot_every % 16:
            raise ConfigError(
                f"snapshot_every={self.snapshot_every}: a multiple of DiLoCo's H = 16 that "
                f"divides iters={self.iters}"
            )
        if self.batch % (self.dp * self.micro_batch_size):
            raise ConfigError(
                f"batch={self.batch} is not divisible by dp={self.dp} x "
                f"micro_batch_size={self.micro_batch_size}"
            )
        if self.train_sequences < self.batch:
            raise ConfigError(
                f"train_sequences={self.train_sequences}: at least one batch ({self.batch})"
            )
        regions = len(set(self.cluster().region_of))
        if not self.devices and n > regions:
            raise ConfigError(f"case={self.case}: {regions} regions < pp x dp = {n}; give devices")
        if not self.systems:
            raise ConfigError("systems=[]: name at least one system")
        check_emulated_links(
            self.cluster().subset(self.picked_devices()), self.bandwidth_scale, self.delay_scale
        )
        self.limits.check_memory(
            self.model_config(),
            pp=self.pp,
            dp=self.dp,
            micro_batch_size=self.micro_batch_size,
            batch=self.batch,
        )

    def picked_devices(self) -> list[int]:
        """The case's devices the job emulates: ``devices``, else the first device of each
        region (region order), one per rank (pp x dp)."""
        if self.devices:
            return list(self.devices)
        first: dict = {}
        for d, region in enumerate(self.cluster().region_of):
            first.setdefault(region, d)
        return list(first.values())[: self.pp * self.dp]

    def model_config(self):
        """The GPT every system of the job trains (the mode's sequence length and vocabulary)."""
        from system.workload import get_model

        return dataclasses.replace(
            get_model(self.model, self.layers),
            seq_length=self.seq_length,
            vocab_size=self.vocab_size,
        )
