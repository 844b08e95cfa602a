"""``mode=quality_curves``: its options (the study is :mod:`.run`)."""

from __future__ import annotations

from dataclasses import dataclass

from repro.config.base import RunConfig, register_mode
from repro.config.options import ConfigError, choice, option
from repro.config.shared import QUALITY_METHODS, ModelName, load_case

__all__ = ["QualityCurvesConfig", "QualityMethod", "METHODS"]

METHODS = QUALITY_METHODS  # the study's methods, the reference first (settings: .methods.GRIDS)
QualityMethod = choice("QualityMethod", METHODS, module=__name__)


@dataclass
@register_mode("quality_curves", "repro.studies.quality_curves.run:run", rows=True)
class QualityCurvesConfig(RunConfig):
    """Loss against tokens of every method, tuned on a validation split, then scored over
    seeds on a test split; trained in one process (the runtime's arithmetic, no links)."""

    study: str = option("quality", "the study's name: results go to results/<study>")
    model: ModelName = option(ModelName.small, "the GPT trained (system/workload.py MODELS)")
    seq_length: int = option(64, "tokens per sequence (characters of the corpus)", ge=2)
    pp: int = option(2, "pipeline stages (the boundary pipe compression acts on)", ge=1)
    dp: int = option(2, "data-parallel replicas (DiLoCo's replicas)", ge=1)
    batch: int = option(8, "global batch in sequences", ge=1)
    micro_batch_size: int = option(4, "sequences per micro-batch", ge=1)
    iters: int = option(2048, "training iterations of every run", ge=1)
    warmup_iters: int = option(100, "linear learning-rate warm-up, then cosine decay", ge=0)
    min_lr_ratio: float = option(0.1, "the cosine ends at this fraction of the peak", ge=0, le=1)
    train_sequences: int = option(4096, "training windows of the corpus, repeated", ge=1)
    eval_every: int = option(64, "held-out loss every this many iterations", ge=1)
    eval_sequences: int = option(128, "held-out windows per evaluation", ge=1)
    seeds: int = option(5, "scored seeds per method: seed, seed+1, ...", ge=1, le=100)
    tune_seed: int = option(1000, "the seed of every tuning run", ge=0)
    methods: list[QualityMethod] = option(list(METHODS), "the methods, the reference first")
    select_case: str = option("5", "the paper case whose simulated time ranks the trials")
    select_fraction: float = option(
        0.75,
        "trials are ranked by time to the reference's validation loss at this fraction of its run",
        gt=0,
        le=1,
    )
    paper_cases: list[str] = option(["4", "5"], "cases of the paper-scale projection")
    jobs: int = option(2, "runs trained at once (processes)", ge=1, le=64)

    def check(self) -> None:
        super().check()
        methods = [str(m) for m in self.methods]
        if not methods or methods[0] != METHODS[0]:
            raise ConfigError(f"methods={methods}: the reference {METHODS[0]!r} comes first")
        if len(set(methods)) != len(methods):
            raise ConfigError(f"methods={methods}: a method is named twice")
        if self.warmup_iters >= self.iters:
            raise ConfigError(f"warmup_iters={self.warmup_iters} must be below iters={self.iters}")
        for m in methods:
            h = {"diloco_h4": 4, "diloco_h16": 16, "diloco_h64": 64}.get(m)
            if h and self.eval_every % h:
                raise ConfigError(f"eval_every={self.eval_every} must be a multiple of {m}'s H={h}")
        if self.batch % (self.dp * self.micro_batch_size):
            raise ConfigError(
                f"batch={self.batch} must be a multiple of dp x micro_batch_size "
                f"({self.dp} x {self.micro_batch_size})"
            )
        for c in [self.select_case, *self.paper_cases]:
            load_case(str(c), "paper")
        self.base_spec().validate()

    def base_spec(self, **options):
        """The RunSpec every run of the study shares, with ``options`` on top."""
        from system.runtime.spec import RunSpec

        return RunSpec(
            model=str(self.model),
            seq_length=self.seq_length,
            pp=self.pp,
            dp=self.dp,
            global_batch_size=self.batch,
            micro_batch_size=self.micro_batch_size,
            iters=self.iters,
            lr_schedule="cosine",
            lr_warmup_iters=self.warmup_iters,
            lr_min_ratio=self.min_lr_ratio,
            data="kjv",
            train_sequences=self.train_sequences,
            **options,
        )
