"""``mode=link_sharing``'s options: one step of the link-sharing experiment on ``results_dir``."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from repro.config.base import RunConfig, register_mode
from repro.config.options import ConfigError, choice, option

__all__ = ["LinkSharingConfig", "SharingStep"]

SharingStep = choice("SharingStep", ("register", "measure", "verdict"), module=__name__)


@dataclass
@register_mode("link_sharing")
class LinkSharingConfig(RunConfig):
    """Which link-sharing model predicts emulated exchanges: register, measure (root), verdict."""

    step: SharingStep = option(
        SharingStep.register,
        "register: predictions.json (commit it before measuring); measure: measured.csv (root); "
        "verdict: verdict.{csv,md}, all in results_dir",
    )

    def check(self) -> None:
        super().check()
        if self.step == SharingStep.register:
            return
        from repro.studies.link_sharing.experiment import read_measured, read_registration

        folder = Path(self.results_dir)
        try:  # the files a user may have edited, before any emulation is built
            read_registration(folder / "predictions.json")
            if self.step == SharingStep.verdict:
                read_measured(folder / "measured.csv")
        except (ValueError, OSError) as e:
            raise ConfigError(str(e)) from None
