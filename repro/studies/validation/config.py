"""The options of the registered validation's steps (calibrate or profile -> predict -> commit
-> measure -> score), each a mode."""

from __future__ import annotations

from dataclasses import dataclass

from repro.config.base import RunConfig, register_mode
from repro.config.options import ConfigError, option
from repro.config.shared import check_file, require

__all__ = [
    "ProfileConfig",
    "CalibrateConfig",
    "PredictConfig",
    "MeasureConfig",
    "ScoreConfig",
    "MEASURE_TAG_PREFIX",
    "CALIBRATE_TAG_PREFIX",
]


MEASURE_TAG_PREFIX = "v14m"  # namespaces of the measurement: dtfm-v14m<setting>r<repeat>-*
CALIBRATE_TAG_PREFIX = "v4c"  # namespaces of the in-situ calibration


@dataclass
class _ComputeProfileStep(RunConfig):
    """Validation step 1, either way: the settings file in, a compute profile out."""

    settings: str | None = option(None, "the settings file (JSON)")
    out: str | None = option(None, "the profile (null: results_dir/compute_profile.json)")
    only: list[str] | None = option(None, "setting names (null: all)")
    nice: int = option(0, "niceness increment (as the measurement's)", ge=-20, le=19)

    def check(self) -> None:
        super().check()
        require("settings", self.settings, "the settings file")
        check_file("settings", self.settings)


@dataclass
@register_mode("profile", "repro.studies.validation.profile:run")
class ProfileConfig(_ComputeProfileStep):
    """Validation step 1: a compute profile of every stage shape, in a run of its own."""

    repeats: int = option(6, "timed repeats per stage", ge=1)
    max_procs: int | None = option(None, "profile processes at once (null: all)", ge=1)
    merge: bool = option(False, "keep the profile's entries, profile only shapes it lacks")


@dataclass
@register_mode("calibrate", "repro.studies.validation.calibrate:run")
class CalibrateConfig(_ComputeProfileStep):
    """Validation step 1, in situ: one short run per setting on its emulated links (root)."""

    merge: bool = option(False, "keep the profile's entries, run only the new ones")
    tag_prefix: str = option(CALIBRATE_TAG_PREFIX, "namespace tag prefix of this driver")
    timeout_s: float = option(300.0, "wall-clock limit of one calibration run", gt=0)


@dataclass
@register_mode("predict", "repro.studies.validation.predict:run")
class PredictConfig(RunConfig):
    """Validation step 2: the simulator's registered predictions (commit them before measuring)."""

    settings: str | None = option(None, "the settings file (JSON)")
    profile: str | None = option(None, "the compute profile (JSON)")
    out: str | None = option(None, "the predictions (null: results_dir/predictions.json)")
    only: list[str] | None = option(None, "setting names (null: all)")
    schedule_trials: int = option(300, "GA trials for the scheduled layout", ge=1)

    def check(self) -> None:
        super().check()
        for key in ("settings", "profile"):
            require(key, getattr(self, key), f"the {key} file")
            check_file(key, getattr(self, key))


@dataclass
@register_mode("measure", "repro.studies.validation.measure:run")
class MeasureConfig(RunConfig):
    """Validation step 3: the registered settings on emulated links, repeated (root)."""

    predictions: str | None = option(None, "the registered predictions (JSON)")
    out: str | None = option(None, "the measured rows (null: results_dir/measured.csv)")
    repeats: int = option(3, "fresh emulated networks per setting", ge=1)
    only: list[str] | None = option(None, "setting names (null: all)")
    deadline: str | None = option(None, "HH:MM UTC: start no setting after it")
    timeout_s: float = option(300.0, "wall-clock limit of one run", gt=0)
    nice: int = option(0, "niceness increment for the driver and its processes", ge=-20, le=19)
    tag_prefix: str = option(
        MEASURE_TAG_PREFIX, "namespace tag prefix (cleanup touches only these)"
    )
    cleanup_only: bool = option(False, "remove this driver's leftovers of a killed run, then exit")

    def check(self) -> None:
        super().check()
        if not self.cleanup_only:
            require("predictions", self.predictions, "the predictions file")
            check_file("predictions", self.predictions)
        if self.deadline is not None:
            import re

            if not re.fullmatch(r"([01]\d|2[0-3]):[0-5]\d", self.deadline):
                raise ConfigError(f"deadline={self.deadline!r}: expected HH:MM (UTC)")


@dataclass
@register_mode("score", "repro.studies.validation.score:run")
class ScoreConfig(RunConfig):
    """Validation step 4: score registered predictions against the measurements."""

    predictions: str | None = option(None, "the registered predictions (JSON)")
    measured: str | None = option(None, "the measured rows (CSV)")

    def check(self) -> None:
        super().check()
        for key in ("predictions", "measured"):
            require(key, getattr(self, key), f"the {key} file")
            check_file(key, getattr(self, key))
