"""``mode=collectives``'s options: one step of the all-reduce experiment on ``results_dir``."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from repro.config.base import RunConfig, register_mode
from repro.config.options import ConfigError, choice, option

__all__ = ["CollectivesConfig", "CollectivesStep"]

CollectivesStep = choice(
    "CollectivesStep", ("register", "measure", "posthoc", "verdict"), module=__name__
)


@dataclass
@register_mode("collectives")
class CollectivesConfig(RunConfig):
    """The simulator's all-reduces against the runtime's: register, measure (root), posthoc,
    verdict."""

    step: CollectivesStep = option(
        CollectivesStep.register,
        "register: predictions.csv and experiment.json (commit them before measuring; never "
        "rewritten); measure: measured.csv (root); posthoc: the current model's predictions "
        "of the registered experiment, posthoc.csv; verdict: verdict.{csv,md}, all in "
        "results_dir",
    )

    def check(self) -> None:
        super().check()
        from repro.studies.collectives import experiment as cc

        folder = Path(self.results_dir)
        try:  # the files a user may have edited, before any emulation is built
            if self.step == CollectivesStep.register:
                if (folder / "predictions.csv").exists():
                    raise ValueError(
                        f"{folder / 'predictions.csv'} exists: a registration is not rewritten"
                    )
                if (folder / "experiment.json").exists():
                    cc.read_experiment(folder)
                return
            exp, _ = cc.read_registration(folder)
            if self.step == CollectivesStep.verdict:
                cc.read_measured(folder / "measured.csv")
                if (folder / "posthoc.csv").exists():
                    cc.read_predictions(folder / "posthoc.csv", exp)
        except (ValueError, OSError) as e:
            raise ConfigError(str(e)) from None
