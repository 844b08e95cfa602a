"""``mode=sailor_planner``'s options: Sailor's planner on its own studies beside ours."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from repro.config.base import RunConfig, register_mode
from repro.config.options import ConfigError, option
from repro.config.shared import require
from system.external.sailor.predict import DATA_FILES

__all__ = ["SailorPlannerConfig"]


@dataclass
@register_mode("sailor_planner")
class SailorPlannerConfig(RunConfig):
    """Sailor's planner on its own studies beside ours: every plan under both simulators."""

    data_dir: str | None = option(
        None, "folder of Sailor's data files (profiles, layer sizes, bandwidth fits, configs)"
    )
    gpus_per_host: int = option(4, "GPUs per machine in the fleets (Sailor's studies: 4)", ge=1)

    def check(self) -> None:
        super().check()
        require("data_dir", self.data_dir, "the folder of Sailor's data files")
        data = Path(self.data_dir)
        missing = [n for n in DATA_FILES if not (data / n).is_file()]
        if missing:
            raise ConfigError(f"data_dir={self.data_dir!r}: lacks {', '.join(missing)}")
