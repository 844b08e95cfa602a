"""``mode=sensitivity``'s options (none of its own): the case-5 claims under each assumption."""

from __future__ import annotations

from dataclasses import dataclass

from repro.config.base import RunConfig, register_mode

__all__ = ["SensitivityConfig"]


@dataclass
@register_mode("sensitivity")
class SensitivityConfig(RunConfig):
    """How the case-5 claims move with the simulator's untested assumptions, one at a time."""
