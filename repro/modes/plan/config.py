"""``mode=plan``'s options: the planner (system/planner) on one fleet."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from repro.config.base import RunConfig, register_mode
from repro.config.options import ConfigError, choice, option
from repro.config.shared import CaseOptions, LinkSharing, ModelName
from system.planner.search import DEFAULT_BUDGET_DEVICE_SIMS, OBJECTIVES
from system.simulator.sharing import DEFAULT_LINK_SHARING

__all__ = ["PlanConfig", "PlanFramework", "PlanObjective"]

PlanObjective = choice("PlanObjective", OBJECTIVES, module=__name__)
# the runtime a plan is made for: ours (our simulator) or Sailor's training framework (the
# project's model of it, system/external/sailor/framework.py)
PlanFramework = choice("PlanFramework", ("ours", "sailor"), module=__name__)


@dataclass
@register_mode("plan")
class PlanConfig(CaseOptions, RunConfig):
    """Plan ours on a fleet: devices, shape, layer split, micro-batch, schedule, placement."""

    model: ModelName = option(ModelName.gpt3_xl, "system/workload.py MODELS")
    layers: int | None = option(None, "number of layers (null: the model's)", ge=1)
    batch: int = option(1024, "global batch in sequences", ge=1)
    objective: PlanObjective = option(
        PlanObjective.throughput, "throughput: shortest iteration; cost: fewest dollars each"
    )
    max_iter_time_s: float | None = option(
        None, "objective=cost: the longest iteration allowed (null: any)", gt=0
    )
    time_limit_s: float = option(50.0, "wall-clock limit of the search", gt=0, le=3600)
    budget_device_sims: int | None = option(
        DEFAULT_BUDGET_DEVICE_SIMS,
        "framework=ours: the search's work budget in device-simulations (a simulation "
        "charges its devices and messages, system/planner/search.py Planner.work; the same "
        "budget gives the same plan on any machine, the time limit then only a safety stop); "
        "null: the phases end by the clock",
        ge=1,
        le=10**10,
    )
    profiles: str | None = option(
        None,
        "a folder of Sailor-format profiles (profiles_tmp.json, training_config_*.json) for "
        "compute per GPU type; null: every type at peak x the shared efficiency",
    )
    link_sharing: LinkSharing = option(
        LinkSharing(DEFAULT_LINK_SHARING), "how concurrent flows share links (the simulator's)"
    )
    runnable_only: bool = option(
        False, "plan only what our runtime runs (GPipe, full or no recomputation, even split)"
    )
    local_search: bool = option(True, "swap moves on the best placement while time allows")
    framework: PlanFramework = option(
        PlanFramework.ours,
        "ours: plans for our runtime, timed by our simulator; sailor: plans for Sailor's "
        "training framework (tp inside a host, FP32, DeepSpeed 1F1B), timed and memory-checked "
        "by its model (system/planner/sailor_target.py); needs profiles= Sailor's data folder",
    )
    out: str | None = option(None, "the plan's JSON file (null: results_dir/plan-<case>.json)")

    def check(self) -> None:
        super().check()
        if self.max_iter_time_s is not None and str(self.objective) != "cost":
            raise ConfigError("max_iter_time_s: applies to objective=cost only")
        sailor = str(self.framework) == "sailor"
        if sailor and self.budget_device_sims != DEFAULT_BUDGET_DEVICE_SIMS:
            raise ConfigError("budget_device_sims: applies to framework=ours only")
        if self.profiles is not None:
            need = Path(self.profiles) / "profiles_tmp.json"
            if not need.is_file():
                raise ConfigError(f"profiles={self.profiles!r}: no profiles_tmp.json in it")
        if sailor:
            from system.external.sailor.predict import DATA_FILES

            if self.profiles is None:
                raise ConfigError("framework=sailor: needs profiles= a folder of Sailor's data")
            missing = [n for n in DATA_FILES if not (Path(self.profiles) / n).is_file()]
            if missing:
                raise ConfigError(f"profiles={self.profiles!r}: lacks {', '.join(missing)}")
            if self.runnable_only:
                raise ConfigError("runnable_only: applies to framework=ours only")
        if self.out is not None and (not self.out.strip() or self.out.endswith("/")):
            raise ConfigError(f"out={self.out!r}: not a file path")
