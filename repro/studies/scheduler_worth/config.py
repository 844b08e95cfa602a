"""``mode=scheduler_worth``'s options: the scheduler's layout against a user's first tries."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from repro.config.base import RunConfig, register_mode
from repro.config.options import ConfigError, option
from repro.config.shared import LinkSharing, check_file
from system.simulator.sharing import DEFAULT_LINK_SHARING

__all__ = ["SchedulerWorthConfig"]


@dataclass
@register_mode("scheduler_worth")
class SchedulerWorthConfig(RunConfig):
    """The scheduler's layout against the layouts a user would try first, setting by setting."""

    sailor_dir: str | None = option(
        None,
        "folder of Sailor's bandwidth fits (multizone_bandwidths_het.json, "
        "intra_node_bandwidths.json) for the multi-zone setting; null: that setting is left out",
    )
    spot_seeds: list[int] = option([0, 1, 2], "pre-emption draws per spot variant", ge=0)
    trials: int = option(1000, "the scheduler's GA trials per setting", ge=1)
    patience_trials: int = option(200, "stop after this many trials without a better TOTAL", ge=1)
    time_limit_s: float = option(
        900.0,
        "a safety limit on the scheduler per setting (trials and patience stop it first)",
        gt=0,
    )
    random_layouts: int = option(5, "random rank maps per setting (the median is reported)", ge=1)
    planner_time_limit_s: float | None = option(
        60.0, "the planner's (system/planner) time limit per setting; null: no planner column", gt=0
    )
    link_sharing: list[LinkSharing] = option(
        [LinkSharing(DEFAULT_LINK_SHARING), LinkSharing.pair, LinkSharing.nic],
        "link-sharing models each layout is simulated under (the first is the table's)",
    )

    def check(self) -> None:
        super().check()
        if not self.link_sharing:
            raise ConfigError("link_sharing=[]: name at least one model")
        if self.sailor_dir is not None:
            for name in ("multizone_bandwidths_het.json", "intra_node_bandwidths.json"):
                check_file("sailor_dir", str(Path(self.sailor_dir) / name))
            # the multi-zone setting is the table's last: its fits are read now, not after the
            # other settings have run
            from system.external.sailor.bandwidth import multizone_cluster

            try:
                multizone_cluster(self.sailor_dir)
            except (ValueError, OSError) as e:
                raise ConfigError(f"sailor_dir={self.sailor_dir!r}: {e}") from None
