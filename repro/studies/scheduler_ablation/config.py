"""``mode=scheduler_ablation``'s options: the Fig. 4 search-quality runs."""

from __future__ import annotations

from dataclasses import dataclass

from repro.config.base import RunConfig, register_mode
from repro.config.options import option
from repro.config.shared import check_cases
from system.cases import PAPER_CASES

__all__ = ["SchedulerAblationConfig"]


@dataclass
@register_mode("scheduler_ablation")
class SchedulerAblationConfig(RunConfig):
    """Fig. 4 data: best TOTAL vs trials for the tailored local search, Kernighan-Lin, random."""

    cases: list[str] = option(list(PAPER_CASES), "the cases")
    seeds: list[int] = option([0, 1, 2], "search seeds", ge=0)
    trials: int = option(10, "GA trials per run", ge=1)
    population: int = option(16, "GA population", ge=2)
    random_layouts: int = option(5000, "random layouts per seed (the random baseline)", ge=1)

    def check(self) -> None:
        super().check()
        self.cases = check_cases("cases", self.cases)
