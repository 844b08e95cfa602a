"""``mode=attribution``'s options: the ladder of simulations from Megatron as launched to ours."""

from __future__ import annotations

from dataclasses import dataclass

from repro.config.base import RunConfig, register_mode
from repro.config.options import option
from repro.config.shared import LinkSharing, check_cases
from system.simulator.sharing import DEFAULT_LINK_SHARING
from system.workload import PAPER_BATCH_SIZES

__all__ = ["AttributionConfig"]


@dataclass
@register_mode("attribution")
class AttributionConfig(RunConfig):
    """Speed-up attribution: a ladder of simulations from Megatron as launched to ours."""

    cases: list[str] = option(["4", "5"], "the cases of the ladder")
    layers: list[int] = option([40], "model depths", ge=1)
    batches: list[int] = option(list(PAPER_BATCH_SIZES), "global batch sizes", ge=1)
    link_sharing: LinkSharing = option(
        LinkSharing(DEFAULT_LINK_SHARING), "how concurrent flows share links (every rung)"
    )

    def check(self) -> None:
        super().check()
        self.cases = check_cases("cases", self.cases)
