"""``mode=schedule``'s options: one case's layout search (paper §3.4)."""

from __future__ import annotations

from dataclasses import dataclass

from repro.config.base import RunConfig, register_mode
from repro.config.options import ConfigError, group, option
from repro.config.shared import (
    CaseOptions,
    LayoutOptions,
    SchedulerOptions,
    WorkloadName,
    check_layout,
)

__all__ = ["ScheduleConfig"]


@dataclass
@register_mode("schedule")
class ScheduleConfig(LayoutOptions, CaseOptions, RunConfig):
    """Schedule one case (paper §3.4) and write the layout as JSON."""

    scheduler: SchedulerOptions = group(
        SchedulerOptions, "scheduler.* (null budget: until 20 trials bring nothing, 60 s at most)"
    )
    workload: WorkloadName = option(
        WorkloadName.dtfm_reference, "tasklet sizes: system/workload.py WORKLOADS"
    )
    out: str | None = option(
        None, "the JSON file (null: results_dir/case<case>-<method>-seed<seed>.json)"
    )
    verbose: bool = option(False, "show the search's progress")

    def check(self) -> None:
        super().check()
        check_layout(f"case {self.case}", self.cluster().num_devices, self.pp, self.dp)
        if self.out is not None and (not self.out.strip() or self.out.endswith("/")):
            raise ConfigError(f"out={self.out!r}: not a file path")
