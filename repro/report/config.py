"""The reports: each rebuilds files of a results folder from what is stored there."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from repro.config.base import RunConfig, register_mode
from repro.config.options import ConfigError, option

__all__ = ["ReportConfig", "CollectConfig", "EmulationReportConfig", "CompareBaselinesConfig"]


@dataclass
class FolderReport(RunConfig):
    """A report of an existing results folder (``results_dir``)."""

    def check(self) -> None:
        super().check()
        if self.results_dir is None or not Path(self.results_dir).is_dir():
            raise ConfigError(f"results_dir={self.results_dir!r}: no such results folder")
        from system.results import has_stored_rows

        if not has_stored_rows(self.results_dir):
            raise ConfigError(
                f"results_dir={self.results_dir!r}: no rows (no runs.parquet, parts/ or rows/ "
                "there): nothing ran in this folder yet"
            )


@dataclass
@register_mode("report", "repro.report.build:run")
class ReportConfig(FolderReport):
    """Rebuild a study's REPORT.md, tables and figures from its runs.parquet alone."""


@dataclass
@register_mode("collect", "repro.report.build:collect")
class CollectConfig(FolderReport):
    """Fold a study's parts (and older schemas) into runs.parquet; rewrite runs.csv."""


@dataclass
@register_mode("emulation_report", "repro.report.emulation:run")
class EmulationReportConfig(FolderReport):
    """Simulator vs emulated runs: validation.{md,csv,png} from mode=emulate rows."""


@dataclass
@register_mode("compare_baselines", "repro.report.baselines:run")
class CompareBaselinesConfig(FolderReport):
    """Real baselines vs our runtime on the same emulated settings: COMPARISON.md."""

    ours_dir: str = option("results/emulation", "the folder of our runtime's emulated rows")
