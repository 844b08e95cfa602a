"""The options of the harness benchmarks, each a mode (``bench_*``)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from repro.config.base import RunConfig, register_mode
from repro.config.options import ConfigError, choice, option
from repro.config.shared import CaseOptions, ModelName, WorkloadName, require

__all__ = [
    "BenchSchedulerConfig",
    "BenchHeteroConfig",
    "BenchRuntimeConfig",
    "BenchStoreConfig",
    "BenchSweepConfig",
    "BenchPlanSailorConfig",
    "POINTS",
]


BenchSection = choice(
    "BenchSection", ("plateau", "gaps", "quality", "scaling", "scale"), module=__name__
)


@dataclass
@register_mode("bench_scheduler", "repro.checks.bench.scheduler:run")
class BenchSchedulerConfig(RunConfig):
    """Scheduler benchmark: plateaus, certified gaps, quality on cases 4-5, scaling."""

    sections: list[BenchSection] = option(
        ["plateau", "gaps", "quality", "scaling"], "sections to run (scale: hierarchical search)"
    )
    seeds: list[int] = option([0, 1, 2], "seeds of the plateau section", ge=0)
    big_time_limit_s: float = option(30.0, "search time limit at scale", gt=0)
    per_regions: list[int] = option([32, 128], "devices per region at scale (x 8 regions)", ge=1)
    random_layouts: int = option(5000, "random layouts of the quality section", ge=1)
    big_random_layouts: int = option(200, "random layouts at scale", ge=1)
    scale_per_regions: list[int] = option([128, 512], "section scale: devices per region", ge=1)
    scale_time_limit_s: float = option(60.0, "section scale: hierarchical search limit", gt=0)


@dataclass
@register_mode("bench_hetero", "repro.checks.bench.hetero:run")
class BenchHeteroConfig(CaseOptions, RunConfig):
    """Mixed GPU fleet: the iteration_time objective against the paper's comm objective."""

    case: str = option("mixed", "a case with GPU types (mixed: 4 GPU types in 4 regions)")
    workload: WorkloadName = option(WorkloadName.gpt3_xl_b1024, "a model workload")
    seeds: list[int] = option([0, 1], "search seeds", ge=0)

    def check(self) -> None:
        super().check()
        from system.workload import Workload, get_workload

        if not isinstance(get_workload(self.workload), Workload):
            raise ConfigError(f"workload={self.workload!r}: a model workload, not tasklet sizes")


@dataclass
@register_mode("bench_runtime", "repro.checks.bench.runtime:run")
class BenchRuntimeConfig(RunConfig):
    """Pipeline efficiency of our runtime: measured iteration time vs the ideal GPipe time."""

    micro: list[int] = option([4, 8, 16], "micro-batches per iteration, one run each", ge=1)
    table: str = option("bench.csv", "the CSV written into results_dir")
    link_mbps: float | None = option(None, "emulated links of this rate (needs root)", gt=0)
    delay_ms: float = option(0.0, "one-way delay of the emulated links", ge=0)
    model: ModelName = option(ModelName.debug, "system/workload.py MODELS")
    layers: int = option(4, "layers", ge=1)
    hidden_size: int = option(256, "hidden size", ge=1)
    seq_length: int = option(128, "sequence length", ge=1)
    pp: int = option(2, "pipeline stages (one process each; at most the free cores)", ge=1)
    dp: int = option(1, "data-parallel replicas", ge=1)
    micro_batch_size: int = option(1, "sequences per micro-batch", ge=1)
    iters: int = option(6, "iterations per run (the first is left out)", ge=1)

    def check(self) -> None:
        super().check()
        if Path(self.table).name != self.table:
            raise ConfigError(f"table={self.table!r}: a file name (it goes into results_dir)")
        if self.delay_ms and self.link_mbps is None:
            raise ConfigError(f"delay_ms={self.delay_ms}: needs link_mbps (emulated links)")
        self.limits.check_ranks(self.pp * self.dp, f"pp*dp = {self.pp}*{self.dp}")


@dataclass
@register_mode("bench_store", "repro.checks.bench.store:run")
class BenchStoreConfig(RunConfig):
    """The results store: one job's write as a part vs as a rewrite of the whole table."""

    sizes: list[int] = option([1000, 4000, 8000], "rows already in the study", ge=0)
    job_rows: int = option(654, "rows one job writes", ge=1)
    rounds: int = option(3, "rounds (medians are printed)", ge=1)


Launcher = choice("Launcher", ("serial", "joblib"), module=__name__)


@dataclass
@register_mode("bench_sweep", "repro.checks.bench.sweep:run")
class BenchSweepConfig(RunConfig):
    """A sweep's wall time per job (start, simulation, store, report) beside an earlier commit."""

    sweep_name: str = option("smoke", "the sweep timed: conf/sweep/<name>.yaml")
    base: str | None = option(None, "the earlier commit run beside this tree (null: none)")
    launchers: list[Launcher] = option(["serial", "joblib"], "Hydra launchers to time")
    rounds: int = option(1, "rounds; the runs alternate their order", ge=1)
    n_jobs: int | None = option(None, "joblib workers (null: the launcher config's)", ge=1)

    def check(self) -> None:
        super().check()
        conf = Path(__file__).resolve().parents[3] / "conf" / "sweep"
        if not (conf / f"{self.sweep_name}.yaml").is_file():
            known = ", ".join(sorted(p.stem for p in conf.glob("*.yaml")))
            raise ConfigError(f"sweep_name={self.sweep_name!r}: expected one of {known}")


# Sailor's trace points (results/planner/sailor/COMMANDS.md): <study>_<model>_p<k>
POINTS = tuple(
    f"{study}_{model}_p{k}"
    for study in ("het", "geo")
    for model in ("OPT-350", "GPT-Neo-2.7")
    for k in range(3)
)


@dataclass
@register_mode("bench_plan_sailor", "repro.checks.bench.plan_sailor:run")
class BenchPlanSailorConfig(RunConfig):
    """Planning for Sailor's framework on Sailor's trace points beside an earlier commit."""

    base: str = option("HEAD", "the earlier commit run beside this tree")
    rounds: int = option(3, "rounds; the trees alternate their order", ge=1)
    points: list[str] = option([], f"trace points (empty: all {len(POINTS)})")
    profiles: str | None = option(
        None, "folder of Sailor's data files (mode=plan's profiles=): profiles, link fits"
    )

    def check(self) -> None:
        super().check()
        from repro.checks.tree import short_rev

        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._/~^-]{0,99}", self.base):
            raise ConfigError(f"base={self.base!r}: expected a commit, a branch or a tag name")
        try:
            short_rev(self.base)
        except ValueError:
            raise ConfigError(f"base={self.base!r}: not a commit of this repository") from None
        unknown = [p for p in self.points if p not in POINTS]
        if unknown:
            raise ConfigError(f"points={unknown}: expected some of {', '.join(POINTS)}")
        require("profiles", self.profiles, "the folder of Sailor's data files")
        if not Path(self.profiles).is_dir():
            raise ConfigError(f"profiles={self.profiles!r}: no such folder")
