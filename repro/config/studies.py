"""The studies: benchmarks, attribution, sensitivity, the scheduler's studies, the registered
validation's steps and the checks that need a GPU. Each is a mode of ``repro/run.py``."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from repro.config.base import RunConfig, register_mode
from repro.config.modes import (
    Backend,
    CaseOptions,
    LinkSharing,
    ModelName,
    ModelOptions,
    WorkloadName,
    check_emulated_links,
    load_case,
)
from repro.config.options import ConfigError, choice, option
from system.cases import PAPER_CASES, canonical_case
from system.external import SOURCES
from system.external.sailor.check import check_inputs as check_sailor_inputs
from system.external.sailor.framework import DP_COLLECTIVES as SAILOR_COLLECTIVES
from system.external.sailor.predict import DATA_FILES
from system.simulator.sharing import DEFAULT_LINK_SHARING
from system.workload import PAPER_BATCH_SIZES

__all__ = [
    "AttributionConfig",
    "SensitivityConfig",
    "SchedulerWorthConfig",
    "SchedulerAblationConfig",
    "ReplanConfig",
    "BenchSchedulerConfig",
    "BenchHeteroConfig",
    "BenchRuntimeConfig",
    "BenchStoreConfig",
    "BenchSweepConfig",
    "GpuCheckConfig",
    "ProbeInputsConfig",
    "ProfileConfig",
    "CalibrateConfig",
    "PredictConfig",
    "MeasureConfig",
    "ScoreConfig",
    "ExternalConfig",
    "QualityConfig",
    "QUALITY_SYSTEMS",
    "QUALITY_REFERENCE",
]

MEASURE_TAG_PREFIX = "v14m"  # namespaces of the measurement: dtfm-v14m<setting>r<repeat>-*
CALIBRATE_TAG_PREFIX = "v4c"  # namespaces of the in-situ calibration
# mode=quality's systems (repro/studies/quality.py): RunSpec options of our runtime, or None
# for a real baseline (its own worker)
QUALITY_SYSTEMS: dict[str, dict | None] = {
    "ours": {},
    "ours_pipe_q4": dict(pipe_compress="quantize", pipe_fwd_bits=4, pipe_bwd_bits=8),
    "ours_aq_sgd": dict(pipe_compress="aq_sgd", pipe_fwd_bits=4, pipe_bwd_bits=8),
    "ours_dp_topk": dict(dp_compress="topk", dp_ratio=0.05, dp_bits=8),
    "ring_dp_topk": dict(dp_compress="topk", dp_ratio=0.05, dp_bits=8, dp_mode="ring"),
    "diloco_h4": dict(local_sgd="diloco", diloco_inner_steps=4),
    "diloco_h16": dict(local_sgd="diloco", diloco_inner_steps=16),
    "megatron": None,
    "deepspeed": None,
}
QUALITY_REFERENCE = "ours"  # the uncompressed run that sets each case's target loss


QualitySystem = choice("QualitySystem", QUALITY_SYSTEMS, module=__name__)
BenchSection = choice(
    "BenchSection", ("plateau", "gaps", "quality", "scaling", "scale"), module=__name__
)


def _check_cases(key: str, cases: list[str]) -> list[str]:
    out = [canonical_case(c) for c in cases]
    if not out:
        raise ConfigError(f"{key}=[]: name at least one case")
    for c in out:
        load_case(c, "paper")
    return out


def _required(key: str, value, what: str) -> None:
    if value is None or not str(value).strip():
        raise ConfigError(f"{key}: give {what}")


def _file(key: str, value: str | None) -> None:
    if value is not None and not Path(value).is_file():
        raise ConfigError(f"{key}={value!r}: no such file")


# ---- simulator studies -------------------------------------------------------------------------
@dataclass
@register_mode("attribution", "repro.studies.attribution:run")
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
        self.cases = _check_cases("cases", self.cases)


@dataclass
@register_mode("scheduler_worth", "repro.studies.scheduler_worth:run")
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
                _file("sailor_dir", str(Path(self.sailor_dir) / name))
            # the multi-zone setting is the table's last: its fits are read now, not after the
            # other settings have run
            from system.external.sailor.bandwidth import multizone_cluster

            try:
                multizone_cluster(self.sailor_dir)
            except (ValueError, OSError) as e:
                raise ConfigError(f"sailor_dir={self.sailor_dir!r}: {e}") from None


@dataclass
@register_mode("sensitivity", "repro.studies.sensitivity:run")
class SensitivityConfig(RunConfig):
    """How the case-5 claims move with the simulator's untested assumptions, one at a time."""


@dataclass
@register_mode("scheduler_ablation", "repro.studies.scheduler_ablation:run")
class SchedulerAblationConfig(RunConfig):
    """Fig. 4 data: best TOTAL vs trials for the tailored local search, Kernighan-Lin, random."""

    cases: list[str] = option(list(PAPER_CASES), "the cases")
    seeds: list[int] = option([0, 1, 2], "search seeds", ge=0)
    trials: int = option(10, "GA trials per run", ge=1)
    population: int = option(16, "GA population", ge=2)
    random_layouts: int = option(5000, "random layouts per seed (the random baseline)", ge=1)

    def check(self) -> None:
        super().check()
        self.cases = _check_cases("cases", self.cases)


@dataclass
@register_mode("replan", "repro.studies.replan:run")
class ReplanConfig(ModelOptions, CaseOptions, RunConfig):
    """Replay a spot pre-emption trace on a case, re-planning warm vs from scratch."""

    events: int = option(8, "trace events (devices leave or come back)", ge=1)
    step_devices: int = option(16, "devices per event (a multiple of dp)", ge=1)
    interval_s: float = option(
        3600.0, "simulated seconds between events (at most a year)", gt=0, le=365 * 86400.0
    )
    time_limit_s: float = option(1.0, "warm re-planning budget per event", gt=0, le=3600.0)
    dp: int = option(8, "replicas, kept fixed (pp = present devices / dp)", ge=1)

    def check(self) -> None:
        super().check()
        if self.step_devices % self.dp:
            raise ConfigError(
                f"step_devices={self.step_devices} must be a multiple of dp={self.dp}"
            )
        self._check_trace()

    def _check_trace(self) -> None:
        """Every device count the trace reaches gives a layout the model fits (checked on the
        seeded trace itself, before any planning)."""
        from system.scheduler.replan import spot_trace as trace
        from system.simulator import V100
        from system.simulator.ours import accumulation_rounds
        from system.workload import Workload, get_model

        n = self.cluster().num_devices
        if n % self.dp:
            raise ConfigError(f"dp={self.dp} does not divide case {self.case}'s {n} devices")
        if self.step_devices > n // 2:
            raise ConfigError(
                f"step_devices={self.step_devices}: more than half of case {self.case}'s {n} "
                "devices, so no event could remove or return any (the trace keeps at least half)"
            )
        work = Workload(
            model=get_model(self.model, self.layers),
            global_batch_size=self.global_batch(),
            micro_batch_size=self.micro_batch_size,
        )
        for count in sorted({len(p) for p in trace(n, self.events, self.step_devices, self.seed)}):
            pp = count // self.dp
            where = f"step_devices={self.step_devices}: the trace reaches {count} devices"
            try:
                work.check_layout(pp, self.dp)
            except ValueError as e:
                raise ConfigError(f"{where}: {e}") from None
            if accumulation_rounds(work, pp, self.dp, V100) == 0:
                raise ConfigError(
                    f"{where}: with pp={pp} not one micro-batch of {self.model} "
                    f"({work.model.num_layers} layers) fits a {V100.name}'s memory"
                )

    def global_batch(self) -> int:
        return self.batch or PAPER_BATCH_SIZES[0]


# ---- benchmarks --------------------------------------------------------------------------------
@dataclass
@register_mode("bench_scheduler", "repro.studies.bench.scheduler:run")
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
@register_mode("bench_hetero", "repro.studies.bench.hetero:run")
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
@register_mode("bench_runtime", "repro.studies.bench.runtime:run")
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
@register_mode("bench_store", "repro.studies.bench.store:run")
class BenchStoreConfig(RunConfig):
    """The results store: one job's write as a part vs as a rewrite of the whole table."""

    sizes: list[int] = option([1000, 4000, 8000], "rows already in the study", ge=0)
    job_rows: int = option(654, "rows one job writes", ge=1)
    rounds: int = option(3, "rounds (medians are printed)", ge=1)


Launcher = choice("Launcher", ("serial", "joblib"), module=__name__)


@dataclass
@register_mode("bench_sweep", "repro.studies.bench.sweep:run")
class BenchSweepConfig(RunConfig):
    """A sweep's wall time per job (start, simulation, store, report) beside an earlier commit."""

    sweep_name: str = option("smoke", "the sweep timed: conf/sweep/<name>.yaml")
    base: str | None = option(None, "the earlier commit run beside this tree (null: none)")
    launchers: list[Launcher] = option(["serial", "joblib"], "Hydra launchers to time")
    rounds: int = option(1, "rounds; the runs alternate their order", ge=1)
    n_jobs: int | None = option(None, "joblib workers (null: the launcher config's)", ge=1)

    def check(self) -> None:
        super().check()
        conf = Path(__file__).resolve().parents[2] / "conf" / "sweep"
        if not (conf / f"{self.sweep_name}.yaml").is_file():
            known = ", ".join(sorted(p.stem for p in conf.glob("*.yaml")))
            raise ConfigError(f"sweep_name={self.sweep_name!r}: expected one of {known}")


# ---- GPU and inputs ----------------------------------------------------------------------------
@dataclass
@register_mode("gpu_check", "repro.studies.gpu_check:run")
class GpuCheckConfig(RunConfig):
    """Our runtime on CUDA: correctness, mixed precision, throughput; the GPU calibration."""

    check_runtime: bool = option(True, "the correctness and throughput checks")
    calibrate: bool | None = option(None, "the performance model's calibration (null: on a GPU)")
    dry: bool = option(False, "the calibration's code on the CPU with a tiny model")
    calibration_dir: str | None = option(None, "calibration files (null: results_dir)")


@dataclass
@register_mode("probe_inputs", "repro.studies.probe_inputs:run")
class ProbeInputsConfig(RunConfig):
    """Every bad or edge input of the review on two commits; the table of what each did."""

    before: str = option(
        "370986d", "the commit before (the main commit the hostile-input review was run on)"
    )
    after: str = option("HEAD", "the commit after")
    only: str | None = option(None, "run the probes whose name contains this")
    lock_dir: str | None = option(
        None,
        "a shared machine's lock folder: each probe holds dtfm-cpu.lock shared, an emulating "
        "one dtfm-netns.lock exclusive first",
    )


# ---- registered validation (calibrate -> predict -> commit -> measure -> score) ----------------
@dataclass
class _ComputeProfileStep(RunConfig):
    """Validation step 1, either way: the settings file in, a compute profile out."""

    settings: str | None = option(None, "the settings file (JSON)")
    out: str | None = option(None, "the profile (null: results_dir/compute_profile.json)")
    only: list[str] | None = option(None, "setting names (null: all)")
    nice: int = option(0, "niceness increment (as the measurement's)", ge=-20, le=19)

    def check(self) -> None:
        super().check()
        _required("settings", self.settings, "the settings file")
        _file("settings", self.settings)


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
            _required(key, getattr(self, key), f"the {key} file")
            _file(key, getattr(self, key))


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
            _required("predictions", self.predictions, "the predictions file")
            _file("predictions", self.predictions)
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
            _required(key, getattr(self, key), f"the {key} file")
            _file(key, getattr(self, key))


# ---- a peer's published runs ---------------------------------------------------------------------
ExternalSource = choice("ExternalSource", SOURCES, module=__name__)
ExternalCollective = choice("ExternalCollective", SAILOR_COLLECTIVES, module=__name__)


@dataclass
@register_mode("external", "repro.studies.external:run")
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
        _required("plans", self.plans, "the folder of plans")
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


@dataclass
@register_mode("sailor_planner", "repro.studies.sailor_planner:run")
class SailorPlannerConfig(RunConfig):
    """Sailor's planner on its own studies beside ours: every plan under both simulators."""

    data_dir: str | None = option(
        None, "folder of Sailor's data files (profiles, layer sizes, bandwidth fits, configs)"
    )
    gpus_per_host: int = option(4, "GPUs per machine in the fleets (Sailor's studies: 4)", ge=1)

    def check(self) -> None:
        super().check()
        _required("data_dir", self.data_dir, "the folder of Sailor's data files")
        data = Path(self.data_dir)
        missing = [n for n in DATA_FILES if not (data / n).is_file()]
        if missing:
            raise ConfigError(f"data_dir={self.data_dir!r}: lacks {', '.join(missing)}")


# ---- beyond the paper --------------------------------------------------------------------------
@dataclass
@register_mode("quality", "repro.studies.quality:run", rows=True)
class QualityConfig(ModelOptions, CaseOptions, RunConfig):
    """Time to a target loss on emulated links: compression, DiLoCo, ours and the baselines."""

    case: str = option("5", "the paper case whose links are emulated (4 and 5 in the sweep)")
    model: ModelName = option(ModelName.debug, "the GPT trained (debug or small on 2 cores)")
    batch: int = option(32, "global batch in sequences", ge=1)
    micro_batch_size: int = option(8, "sequences per micro-batch", ge=1)
    seq_length: int = option(64, "tokens per sequence (characters of the corpus)", ge=1)
    vocab_size: int = option(64, "the model's vocabulary (the corpus has 63 symbols)", ge=1)
    pp: int = option(2, "pipeline stages of ours (and of the baselines)", ge=1)
    dp: int = option(2, "data-parallel replicas (DiLoCo's replicas)", ge=1)
    iters: int = option(64, "training iterations of every system", ge=1)
    lr: float = option(0.005, "AdamW learning rate of every system (DiLoCo: inner)", gt=0)
    train_sequences: int = option(512, "training sequences of the corpus, repeated", ge=1)
    target_iters: int = option(40, "the target is the reference's loss after this many", ge=1)
    window: int = option(8, "losses smoothed by a trailing mean over this many iterations", ge=1)
    snapshot_every: int = option(16, "held-out evaluation every this many iterations", ge=1)
    systems: list[QualitySystem] = option(list(QUALITY_SYSTEMS), "the systems run, in order")
    devices: list[int] | None = option(
        None, "device ids of the case (null: the first of each region)", ge=0
    )
    bandwidth_scale: float = option(0.1, "every bandwidth x this (as mode=emulate)", gt=0, le=100)
    delay_scale: float = option(1.0, "every one-way delay x this", gt=0, le=100)
    backend: Backend = option(Backend.auto, "netem, or the NFQUEUE delayer (auto: netem if any)")
    timeout_s: float = option(900.0, "wall-clock limit of one run (its ranks killed after)", gt=0)

    def check(self) -> None:
        super().check()
        n = self.pp * self.dp
        self.limits.check_ranks(n, f"pp x dp = {self.pp} x {self.dp}")
        n_case = self.cluster().num_devices
        if self.devices is not None and (
            len(self.devices) != n or len(set(self.devices)) != n or max(self.devices) >= n_case
        ):
            raise ConfigError(
                f"devices={self.devices}: {n} distinct ids in 0..{n_case - 1} (pp x dp)"
            )
        if self.target_iters > self.iters:
            raise ConfigError(f"target_iters={self.target_iters} is past iters={self.iters}")
        if self.iters % self.snapshot_every or self.snapshot_every % 16:
            raise ConfigError(
                f"snapshot_every={self.snapshot_every}: a multiple of DiLoCo's H = 16 that "
                f"divides iters={self.iters}"
            )
        if self.batch % (self.dp * self.micro_batch_size):
            raise ConfigError(
                f"batch={self.batch} is not divisible by dp={self.dp} x "
                f"micro_batch_size={self.micro_batch_size}"
            )
        if self.train_sequences < self.batch:
            raise ConfigError(
                f"train_sequences={self.train_sequences}: at least one batch ({self.batch})"
            )
        regions = len(set(self.cluster().region_of))
        if not self.devices and n > regions:
            raise ConfigError(f"case={self.case}: {regions} regions < pp x dp = {n}; give devices")
        if not self.systems:
            raise ConfigError("systems=[]: name at least one system")
        check_emulated_links(
            self.cluster().subset(self.picked_devices()), self.bandwidth_scale, self.delay_scale
        )
        self.limits.check_memory(
            self.model_config(),
            pp=self.pp,
            dp=self.dp,
            micro_batch_size=self.micro_batch_size,
            batch=self.batch,
        )

    def picked_devices(self) -> list[int]:
        """The case's devices the job emulates: ``devices``, else the first device of each
        region (region order), one per rank (pp x dp)."""
        if self.devices:
            return list(self.devices)
        first: dict = {}
        for d, region in enumerate(self.cluster().region_of):
            first.setdefault(region, d)
        return list(first.values())[: self.pp * self.dp]

    def model_config(self):
        """The GPT every system of the job trains (the mode's sequence length and vocabulary)."""
        from system.workload import get_model

        return dataclasses.replace(
            get_model(self.model, self.layers),
            seq_length=self.seq_length,
            vocab_size=self.vocab_size,
        )
