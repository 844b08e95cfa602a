"""``mode=external``'s options: a peer's published runs, predicted and scored; every input
file is checked here, before any work."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from repro.config.base import RunConfig, register_mode
from repro.config.options import ConfigError, choice, option
from repro.config.shared import require
from system.external import SOURCES
from system.external.sailor.check import check_inputs as check_sailor_inputs
from system.external.sailor.framework import DP_COLLECTIVES as SAILOR_COLLECTIVES
from system.external.sailor.predict import DATA_FILES

__all__ = ["ExternalConfig"]


ExternalSource = choice("ExternalSource", SOURCES, module=__name__)
ExternalCollective = choice("ExternalCollective", SAILOR_COLLECTIVES, module=__name__)


@dataclass
@register_mode("external")
class ExternalConfig(RunConfig):
    """A peer's published GPU runs: predict every plan, score the ones with measurements."""

    source: ExternalSource = option(ExternalSource.sailor, "whose runs (their file formats)")
    plans: str | None = option(None, "the folder of plans (every plan_config_*.json under it)")
    data_dir: str | None = option(None, "the peer's data files (null: the plans folder's parent)")
    dp_collective: ExternalCollective = option(
        ExternalCollective.auto,
        "all-reduce algorithm: auto (NCCL's tuner), fastest (ring or tree on the link fits), "
        "ring, tree",
    )

    def check(self) -> None:
        super().check()
        require("plans", self.plans, "the folder of plans")
        plans = Path(self.plans)
        if not plans.is_dir():
            raise ConfigError(f"plans={self.plans!r}: no such folder")
        if not any(plans.rglob("plan_config_*.json")):
            raise ConfigError(f"plans={self.plans!r}: no plan_config_*.json under it")
        data = Path(self.data_dir) if self.data_dir is not None else plans.parent
        key = "data_dir" if self.data_dir is not None else "plans"
        missing = [n for n in DATA_FILES if not (data / n).exists()]
        if missing:
            raise ConfigError(f"{key}: {data} lacks {', '.join(missing)}")
        odd = [n for n in DATA_FILES if not (data / n).is_file()]
        if odd:
            raise ConfigError(f"{key}: {data / odd[0]} is not a regular file")
        # every plan and data file, before any run folder or prediction (one line naming the file)
        try:
            check_sailor_inputs(
                self.plans,
                self.data_dir,
                max_devices=self.limits.max_devices,
                max_micro_batches=self.limits.max_micro_batches,
            )
        except (ValueError, OSError) as e:
            raise ConfigError(str(e)) from None
