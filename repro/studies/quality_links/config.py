"""``mode=quality_links``: its options (the study is :mod:`.run`)."""

from __future__ import annotations

from dataclasses import dataclass

from repro.config.base import register_mode
from repro.config.options import ConfigError, option
from repro.config.shared import load_case
from repro.studies.quality_curves.config import QualityCurvesConfig, QualityMethod

__all__ = ["QualityLinksConfig"]


@dataclass
@register_mode("quality_links", "repro.studies.quality_links.run:run", rows=True)
class QualityLinksConfig(QualityCurvesConfig):
    """Seconds per iteration of every method's scored setting on emulated links (cases 4 and 5),
    and end-to-end runs checking time to target = iterations to target × seconds per iteration.
    Each method's setting is chosen from the ``mode=quality_curves`` tuning rows in
    ``results_dir``, as that mode chooses it."""

    cases: list[str] = option(["4", "5"], "the paper cases whose links are emulated")
    timing_iters: int = option(12, "iterations of each timing run", ge=2)
    timing_warmup: int = option(2, "iterations left out of the timing median", ge=0)
    bandwidth_scale: float = option(0.1, "every bandwidth x this (as mode=emulate)", gt=0, le=100)
    delay_scale: float = option(1.0, "every one-way delay x this", gt=0, le=100)
    check_methods: list[QualityMethod] = option(
        ["ours", "dp_topk"], "methods run end to end as the check of the product"
    )
    check_case: str = option("5", "the case of the end-to-end check")
    check_iters: int = option(128, "iterations of an end-to-end check run (its own schedule)", ge=8)
    timeout_s: float = option(1800.0, "wall-clock limit of one run (its ranks killed after)", gt=0)

    def check(self) -> None:
        super().check()
        if self.timing_warmup >= self.timing_iters:
            raise ConfigError(
                f"timing_warmup={self.timing_warmup} must be below timing_iters={self.timing_iters}"
            )
        for c in [*self.cases, self.check_case]:
            load_case(str(c), "paper")
        if self.results_dir is None:
            raise ConfigError("results_dir: give the folder of the mode=quality_curves rows")
