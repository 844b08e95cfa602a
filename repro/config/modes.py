"""The modes that run a model: simulate, schedule, train and emulate, and the options they share.

Shared blocks of options are mixins (:class:`CaseOptions`, :class:`ModelOptions`,
:class:`LayoutOptions`, :class:`LocalRunOptions`) and groups (``scheduler.*``, ``runtime.*``); a
mode's class lists the mixins it takes, so a mode has exactly the keys it uses.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from baselines.placement import Placement
from repro.config.base import RunConfig, default_of, register_mode
from repro.config.options import ConfigError, Options, choice, group, option
from system.cases import PAPER_CASES, VARIANTS, canonical_case
from system.config_search import CONFIG_SETS
from system.emulation.netns import BACKENDS
from system.emulation.verify import ON_FAIL
from system.results import SIMULATED_SYSTEMS, TRAINED_SYSTEMS
from system.runtime.spec import DEVICES, DP_MODES, LAYOUTS, MAX_LR
from system.scheduler.api import OBJECTIVES, SCHEDULERS
from system.simulator.collective import DP_REQUESTS
from system.simulator.comm import TRANSPORTS
from system.simulator.sharing import DEFAULT_LINK_SHARING, LINK_SHARING
from system.workload import MODELS, PAPER_BATCH_SIZES, PAPER_LAYERS, WORKLOADS

__all__ = [
    "CaseVariant",
    "ModelName",
    "SchedulerName",
    "Objective",
    "SimulatedSystem",
    "TrainedSystem",
    "LinkSharing",
    "Transport",
    "DpCollective",
    "EmulateLayout",
    "default_layout",
    "CaseOptions",
    "ModelOptions",
    "LayoutOptions",
    "SchedulerOptions",
    "RuntimeOptions",
    "LocalRunOptions",
    "SimulateConfig",
    "ScheduleConfig",
    "TrainConfig",
    "EmulateConfig",
    "check_emulated_links",
]

CaseVariant = choice("CaseVariant", VARIANTS, module=__name__)
ModelName = choice("ModelName", MODELS, module=__name__)
WorkloadName = choice("WorkloadName", WORKLOADS, module=__name__)
SchedulerName = choice("SchedulerName", SCHEDULERS, module=__name__)
Objective = choice("Objective", OBJECTIVES, module=__name__)
SimulatedSystem = choice("SimulatedSystem", ("all", *SIMULATED_SYSTEMS), module=__name__)
TrainedSystem = choice("TrainedSystem", TRAINED_SYSTEMS, module=__name__)
LinkSharing = choice("LinkSharing", LINK_SHARING, module=__name__)
Transport = choice("Transport", TRANSPORTS, module=__name__)
DpCollective = choice("DpCollective", DP_REQUESTS, module=__name__)
DpMode = choice("DpMode", DP_MODES, module=__name__)
RankLayout = choice("RankLayout", LAYOUTS, module=__name__)
Device = choice("Device", DEVICES, module=__name__)
Tables = choice("Tables", ("compact", "wide"), module=__name__)
OursConfigs = choice("OursConfigs", CONFIG_SETS, module=__name__)
EmulateLayout = choice("EmulateLayout", ("scheduled", "random", "identity"), module=__name__)
Backend = choice("Backend", BACKENDS, module=__name__)
OnFail = choice("OnFail", ON_FAIL, module=__name__)


def default_layout(num_devices: int) -> tuple[int, int]:
    """(pp, dp) when neither is given: the divisor of the device count nearest its square root
    as pp, ties to the smaller (64 -> 8 x 8, 8 -> 2 x 4, 128 -> 8 x 16), so pp stays small
    enough to divide the paper's layer counts.

    >>> default_layout(64), default_layout(8), default_layout(12), default_layout(1)
    ((8, 8), (2, 4), (3, 4), (1, 1))
    """
    from system.config_search import paper_pp

    pp = paper_pp(num_devices)
    return pp, num_devices // pp


def fill_layout(num_devices: int, pp: int | None, dp: int | None) -> tuple[int, int]:
    """``pp`` and ``dp`` with the one missing derived from the other (both: the default)."""
    if pp is None and dp is None:
        return default_layout(num_devices)
    if pp is None:
        return num_devices // dp, dp
    return pp, dp if dp is not None else num_devices // pp


def check_layout(where: str, num_devices: int, pp: int | None, dp: int | None) -> None:
    """``pp`` and ``dp`` (None = derived) fit ``num_devices`` devices of ``where``."""
    for key, v in (("pp", pp), ("dp", dp)):
        if v is not None and num_devices % v:
            raise ConfigError(f"{key}={v} does not divide {where}'s {num_devices} devices")
    if pp and dp and pp * dp != num_devices:
        raise ConfigError(f"pp={pp} x dp={dp} = {pp * dp}, but {where} has {num_devices} devices")


def load_case(case: str, variant: str, max_devices: int | None = None):
    """The cluster of ``case`` (a ConfigError naming it when there is none, or when a topology
    file has more than ``max_devices`` devices)."""
    from system.cases import get_case

    try:
        return get_case(case, variant, max_devices=max_devices)
    except (ValueError, FileNotFoundError) as e:
        raise ConfigError(f"case={case!r}: {e}") from None


# ---- shared options ----------------------------------------------------------------------------
@dataclass
class CaseOptions(Options):
    """The network: one case."""

    case: str = option(
        "5", "paper case 1..5, an alias (worldwide = 5), debug, mixed, or a topology .yaml/.json"
    )
    case_variant: CaseVariant = option(CaseVariant.paper, "dtfm_code: the authors' code's numbers")

    def check(self) -> None:
        super().check()
        self.case = self._canonical(self.case)
        for case in self.cases():
            load_case(case, self.case_variant, self.limits.max_devices)

    def _canonical(self, case) -> Any:
        if case is None or isinstance(case, (bool, float, dict, list, tuple)):
            raise ConfigError(f"case={case!r}: expected 1..5, an alias, debug, mixed or a file")
        return canonical_case(case)

    def cases(self) -> list[str]:
        """The cases this run covers."""
        return [self.case]

    def cluster(self):
        """The case's :class:`system.cluster.Cluster`."""
        return load_case(self.case, self.case_variant, self.limits.max_devices)


@dataclass
class ModelOptions(Options):
    """The model and its batch."""

    model: ModelName = option(ModelName.gpt3_xl, "system/workload.py MODELS")
    layers: int | None = option(None, "number of layers (null: the model's or the mode's)", ge=1)
    batch: int | None = option(None, "global batch in sequences (null: the mode's default)", ge=1)
    micro_batch_size: int = option(1, "sequences per micro-batch", ge=1)

    def check(self) -> None:
        super().check()
        if self.batch is not None:
            self.limits.check_micro_batches(self.batch, self.micro_batch_size)

    def model_layers(self) -> int:
        from system.workload import get_model

        return self.layers or get_model(self.model).num_layers


@dataclass
class LayoutOptions(Options):
    """The parallel layout (null: derived, :func:`default_layout`)."""

    pp: int | None = option(None, "pipeline stages (null: from dp, or the default layout)", ge=1)
    dp: int | None = option(None, "data-parallel replicas (null: from pp, or the default)", ge=1)


@dataclass
class SchedulerOptions(Options):
    """The layout search of ours (paper §3.4)."""

    KEY = "scheduler"
    name: SchedulerName = option(SchedulerName.genetic, "the search method")
    trials: int | None = option(None, "GA trials (null: the mode's budget)", ge=1)
    population: int | None = option(None, "GA population (null: the mode's budget)", ge=2)
    time_limit_s: float | None = option(None, "wall-time cap of one search", gt=0)
    patience_trials: int | None = option(
        None, "stop after this many trials without a better layout (null: 20)", ge=1
    )
    greedy_seeds: bool = option(True, "two greedy layouts in the GA's first population")
    objective: Objective = option(
        Objective.comm, "comm: the paper's TOTAL; iteration_time adds compute by GPU type"
    )

    def search_kwargs(self, workload=None, **budget) -> dict:
        """Keyword arguments of :func:`system.scheduler.schedule` for this search: a budget
        option left null takes ``budget``'s value (the mode's); the iteration_time objective
        gets ``workload`` (it prices compute by GPU type), the comm objective needs none."""
        given = {"trials": self.trials, "population": self.population}
        given["time_limit_s"] = self.time_limit_s
        return dict(
            method=str(self.name),
            **{k: budget.get(k) if v is None else v for k, v in given.items()},
            greedy_seeds=self.greedy_seeds,
            patience_trials=self.patience_trials,
            objective=str(self.objective),
            workload=workload if self.objective == Objective.iteration_time else None,
        )


@dataclass
class RuntimeOptions(Options):
    """Our runtime's knobs (system/runtime)."""

    KEY = "runtime"
    layout: RankLayout = option(RankLayout.identity, "rank map when no assignment file is given")
    assignment: str | None = option(None, "a schedule's JSON {stages: [[...], ...]}")
    dp_mode: DpMode = option(DpMode.sharded_ps, "gradient exchange")
    checkpointing: bool = option(False, "recompute block activations in backward")
    lr: float = option(0.003, "learning rate (ours and the baselines)", gt=0, le=MAX_LR)
    device: Device = option(Device.cpu, "cpu (gloo) | cuda (NCCL)")
    amp: bool = option(False, "fp16 autocast + loss scaling (device=cuda)")

    def check(self) -> None:
        super().check()
        from pathlib import Path

        if self.assignment is not None and not Path(self.assignment).is_file():
            raise ConfigError(f"runtime.assignment={self.assignment!r}: no such file")


@dataclass
class LocalRunOptions(Options):
    """Real training runs on this machine (ours and the baselines): mode=train, mode=emulate."""

    system: TrainedSystem = option(TrainedSystem.ours, "ours (our runtime) or a real baseline")
    iters: int = option(3, "training iterations", ge=1)
    tp: int = option(1, "tensor-parallel degree (baselines)", ge=1)
    zero: int | None = option(
        None, "DeepSpeed ZeRO stage (null: 3 without a pipeline, else 1)", ge=0, le=3
    )
    grid: bool = option(False, "baselines: run the configuration grid instead of one point")
    grid_micro_batch_sizes: list[int] | None = option(
        None, "grid: micro-batch sizes (null: all)", ge=1
    )
    baseline_recompute: bool = option(False, "baselines: full activation recomputation")
    timeout_s: float = option(
        600.0, "wall-clock limit of one run (all its ranks killed after it)", gt=0
    )

    def check(self) -> None:
        super().check()
        _check_applies(self)


# Options of a local run that only one kind of system reads: given with the other, they would be
# ignored without a word, so they are an error (a group counts when any of its keys is set).
BASELINE_ONLY = (
    "tp",
    "zero",
    "grid",
    "grid_micro_batch_sizes",
    "grid_devices",
    "baseline_recompute",
    "baseline_placements",
)
OURS_ONLY = ("metrics_out", "trace", "log_dir", "layouts", "random_layouts", "scheduler")
RUNTIME_OURS_ONLY = ("layout", "assignment", "dp_mode", "checkpointing", "amp")


def _check_applies(cfg) -> None:
    """An option set away from its default that ``cfg.system`` does not read is an error."""
    ours = cfg.system == TrainedSystem.ours
    names = [(n, cfg, n) for n in (BASELINE_ONLY if ours else OURS_ONLY)]
    if not ours and hasattr(cfg, "runtime"):
        names += [(f"runtime.{n}", cfg.runtime, n) for n in RUNTIME_OURS_ONLY]
    if cfg.system == TrainedSystem.megatron:
        names.append(("zero", cfg, "zero"))
    for key, obj, name in names:
        if not hasattr(obj, name):
            continue
        value = getattr(obj, name)
        if value != default_of(type(obj), name) or (key == "zero" and value is not None):
            who = (
                "system=deepspeed"
                if key == "zero"
                else "the baselines (system=megatron|deepspeed)"
                if ours
                else "system=ours"
            )
            shown = ".*" if dataclasses.is_dataclass(value) else f"={_shown(value)}"
            raise ConfigError(
                f"{key}{shown}: applies to {who} only, not system={cfg.system} (leave it unset)"
            )


def _shown(value) -> str:
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(str(v) for v in value) + "]"
    return str(value).lower() if isinstance(value, bool) else str(value)


# ---- modes -------------------------------------------------------------------------------------
@dataclass
@register_mode(
    "simulate", "repro.modes.simulate:run", rows=True, prefetch="repro.modes.simulate:prefetch"
)
class SimulateConfig(LayoutOptions, ModelOptions, CaseOptions, RunConfig):
    """The paper's Fig. 3 experiment in the performance simulator: every system, no GPU."""

    case: Any = option("5", "a case, a list of cases, or all (1..5); aliases as their number")
    system: SimulatedSystem = option(SimulatedSystem.all, "all, or one system")
    repeats: int = option(1, "repeats per setting (ours_random: at least 3 random layouts)", ge=1)
    scheduler: SchedulerOptions = group(
        SchedulerOptions, "scheduler.* (null budget: 4 trials, population 4, 1 s)"
    )
    baseline_placements: list[Placement] = option(
        [Placement.launch, Placement.topology],
        "the baselines' rank placements: launch (the paper's protocol), topology (fair)",
    )
    compute_efficiency: float | None = option(
        None, "fraction of V100 peak (null: the hardware model's 0.30)", gt=0, le=1
    )
    link_sharing: LinkSharing = option(
        LinkSharing(DEFAULT_LINK_SHARING),
        "how concurrent flows share links: pair | nic | region | flow | tc_class (the paper's "
        "tc emulation, the default; system/simulator/sharing.py)",
    )
    baseline_transport: Transport = option(Transport.nccl, "the baselines' transport model")
    dp_collective: DpCollective = option(
        DpCollective.auto,
        "the baselines' DP collective: auto (NCCL's own pick, its tuner), ring | tree | "
        "two_level (Megatron) forced, fastest (the fastest under the link model: what a user "
        "forces with NCCL_ALGO after measuring)",
    )
    baseline_features: bool = option(
        True,
        "the baselines' framework features in their grids: Megatron's interleaved 1F1B and "
        "distributed optimizer with overlapped gradient reduce-scatter / parameter all-gather, "
        "DeepSpeed ZeRO-1's overlap_comm (false: the grids without them)",
    )
    ours_configs: OursConfigs = option(
        OursConfigs.runnable,
        "ours' configuration search: runnable (only what system/runtime runs: GPipe, full or no "
        "recomputation) or all (1F1B and selective recomputation too: the design space)",
    )
    tables: Tables = option(Tables.compact, "console: one 100-column table, or the wide ones")
    plan: str | None = option(
        None, "a plan.json of mode=plan: simulate that plan on its fleet (case) instead"
    )

    def _canonical(self, case) -> list[str]:
        items = list(case) if isinstance(case, (list, tuple)) else [case]
        if not items or any(c is None or isinstance(c, (bool, float, dict, list)) for c in items):
            raise ConfigError(f"case={case!r}: expected 1..5, all, debug, an alias or a file")
        if [str(c).lower() for c in items] == ["all"]:
            return list(PAPER_CASES)
        return list(dict.fromkeys(canonical_case(c) for c in items))  # each case once

    def cases(self) -> list[str]:
        return list(self.case)

    def check(self) -> None:
        super().check()
        if self.plan is not None:
            from system.planner.record import check_plan, read_plan

            if len(self.cases()) != 1:
                raise ConfigError(f"plan={self.plan!r}: give the plan's one fleet as case")
            try:
                check_plan(
                    read_plan(self.plan), self.cases()[0], str(self.model), self.layers, self.batch
                )
            except ValueError as e:
                raise ConfigError(f"plan={self.plan!r}: {e}") from None
            return
        if not self.baseline_placements:
            raise ConfigError("baseline_placements=[]: name launch, topology or both")
        self.baseline_placements = list(dict.fromkeys(self.baseline_placements))
        self.limits.check_repeats(self.repeats)
        for case in self.cases():
            n = load_case(case, self.case_variant, self.limits.max_devices).num_devices
            check_layout(f"case {case}", n, self.pp, self.dp)
            pp, dp = fill_layout(n, self.pp, self.dp)
            for layers, batch in self.grid():
                self._check_setting(case, layers, batch, pp, dp)

    def settings(self) -> list[tuple[str, int, int]]:
        """Every (case, layers, batch) this run simulates."""
        return [(c, layers, batch) for c in self.cases() for layers, batch in self.grid()]

    def grid(self) -> list[tuple[int, int]]:
        """(layers, batch) pairs: the given ones, else the paper's for gpt3_xl."""
        paper = self.model == ModelName.gpt3_xl
        layers = (
            [self.layers] if self.layers else list(PAPER_LAYERS if paper else [self.model_layers()])
        )
        batches = [self.batch] if self.batch else list(PAPER_BATCH_SIZES if paper else [16])
        return [(layer, b) for layer in layers for b in batches]

    def _check_setting(self, case: str, layers: int, batch: int, pp: int, dp: int) -> None:
        from system.workload import Workload, get_model

        self.limits.check_micro_batches(batch, self.micro_batch_size)
        try:
            Workload(
                model=get_model(self.model, layers),
                global_batch_size=batch,
                micro_batch_size=self.micro_batch_size,
            ).check_layout(pp, dp)
        except ValueError as e:
            raise ConfigError(f"case {case}, layers={layers}, batch={batch}: {e}") from None


@dataclass
@register_mode("schedule", "repro.modes.schedule:run")
class ScheduleConfig(LayoutOptions, CaseOptions, RunConfig):
    """Schedule one case (paper §3.4) and write the layout as JSON."""

    scheduler: SchedulerOptions = group(
        SchedulerOptions, "scheduler.* (null budget: until 20 trials bring nothing, 60 s at most)"
    )
    workload: WorkloadName = option(
        WorkloadName.dtfm_reference, "tasklet sizes: system/workload.py WORKLOADS"
    )
    out: str | None = option(
        None, "the JSON file (null: results_dir/case<case>-<method>-seed<seed>.json)"
    )
    verbose: bool = option(False, "show the search's progress")

    def check(self) -> None:
        super().check()
        check_layout(f"case {self.case}", self.cluster().num_devices, self.pp, self.dp)
        if self.out is not None and (not self.out.strip() or self.out.endswith("/")):
            raise ConfigError(f"out={self.out!r}: not a file path")


def _check_local_ranks(cfg, ranks: int) -> None:
    cfg.limits.check_ranks(ranks, f"tp*pp*dp = {cfg.tp}*{cfg.pp or 1}*{cfg.dp or 1}")


@dataclass
@register_mode("train", "repro.modes.train:run", rows=True)
class TrainConfig(LocalRunOptions, LayoutOptions, ModelOptions, RunConfig):
    """Train on this machine's processes: our runtime, or real Megatron / DeepSpeed."""

    model: ModelName = option(ModelName.debug, "system/workload.py MODELS")
    runtime: RuntimeOptions = group(RuntimeOptions, "runtime.*")
    metrics_out: str | None = option(None, "system=ours: a JSON file of per-iteration metrics")
    trace: str | None = option(None, "system=ours: a Chrome trace file of every rank")
    log_dir: str | None = option(None, "system=ours: keep the run's spec.json and rank logs here")
    grid_devices: int | None = option(None, "grid: ranks to search over (null: tp*pp*dp)", ge=1)

    def check(self) -> None:
        super().check()
        if self.runtime.assignment is not None:
            from system.assignment import Assignment

            try:
                a = Assignment.load(self.runtime.assignment)
            except (ValueError, KeyError, OSError) as e:
                raise ConfigError(f"runtime.assignment={self.runtime.assignment!r}: {e}") from None
            self.limits.check_ranks(a.pp * a.dp, f"runtime.assignment's {a.pp}x{a.dp} ranks")
            return
        if self.grid:
            ranks = self.grid_devices or self.tp * (self.pp or 1) * (self.dp or 1)
            self.limits.check_ranks(ranks, f"grid over grid_devices={ranks}")
        else:
            _check_local_ranks(self, self.tp * (self.pp or 1) * (self.dp or 1))
        if self.system == TrainedSystem.ours:
            pp, dp, batch = self.pp or 1, self.dp or 1, self.batch or 8
            if batch % (dp * self.micro_batch_size):
                raise ConfigError(
                    f"batch={batch} is not divisible by dp={dp} x "
                    f"micro_batch_size={self.micro_batch_size}"
                )
            if self.model_layers() % pp:
                raise ConfigError(
                    f"pp={pp} does not divide the model's {self.model_layers()} layers"
                )
        for key in ("metrics_out", "trace"):
            path = getattr(self, key)
            if path is not None and (not path.strip() or Path(path).is_dir()):
                raise ConfigError(f"{key}={path!r}: names a folder, give a file")
        if (
            self.log_dir is not None
            and Path(self.log_dir).exists()
            and not Path(self.log_dir).is_dir()
        ):
            raise ConfigError(f"log_dir={self.log_dir!r}: is a file, not a folder")
        if not self.grid:
            from system.workload import get_model

            self.limits.check_memory(
                get_model(self.model, self.layers),
                pp=self.pp or 1,
                dp=self.tp * (self.dp or 1),
                micro_batch_size=self.micro_batch_size,
                batch=self.batch or 8,
            )


def check_emulated_links(cluster, bandwidth_scale: float, delay_scale: float) -> None:
    """The scaled links of ``cluster`` are ones tc can shape: a pure check (nothing is built),
    one ConfigError naming the scales and the first link out of range."""
    from system.emulation.plan import make_plan

    try:
        make_plan(cluster, bandwidth_scale=bandwidth_scale, delay_scale=delay_scale, tag="check")
    except ValueError as e:
        raise ConfigError(f"bandwidth_scale/delay_scale: {e}") from None


@dataclass
@register_mode("emulate", "repro.modes.emulate:run", rows=True)
class EmulateConfig(LocalRunOptions, LayoutOptions, ModelOptions, CaseOptions, RunConfig):
    """Train on emulated WAN links of a case (needs root), each run beside its prediction."""

    model: ModelName = option(ModelName.debug, "system/workload.py MODELS")
    devices: list[int] | None = option(
        None, "device ids of the case (null: first of each region)", ge=0
    )
    max_devices: int = option(8, "at most this many devices in the default pick", ge=1)
    bandwidth_scale: float = option(
        0.1, "every bandwidth x this (the delayer tops ~1.1 Gbit/s)", gt=0, le=100
    )
    delay_scale: float = option(1.0, "every one-way delay x this", gt=0, le=100)
    hidden_size: int = option(256, "the emulated model's hidden size", ge=1)
    seq_length: int = option(64, "the emulated model's sequence length", ge=1)
    vocab_size: int = option(128, "the emulated model's vocabulary", ge=1)
    layouts: list[EmulateLayout] = option(
        [EmulateLayout.scheduled, EmulateLayout.random], "system=ours: the layouts run"
    )
    random_layouts: int = option(2, "system=ours: random layouts per setting", ge=0)
    scheduler: SchedulerOptions = group(
        SchedulerOptions, "scheduler.* (null budget: 300 trials, 60 s)"
    )
    baseline_placements: list[Placement] = option(
        [Placement.launch], "baselines: launch (the paper's protocol) and/or topology"
    )
    warmup_iters: int = option(2, "iterations left out of the medians", ge=0)
    verify_pairs: int = option(6, "sampled links checked (RTT, capacity) before the runs", ge=0)
    verify_tolerance: float = option(0.1, "relative error a verified link may have", gt=0)
    on_verify_fail: OnFail = option(OnFail["raise"], "what a link off target does")
    backend: Backend = option(
        Backend.auto, "netem, or the NFQUEUE delayer (auto: netem if present)"
    )

    def check(self) -> None:
        super().check()
        if not self.baseline_placements:
            raise ConfigError("baseline_placements=[]: name launch, topology or both")
        if self.scheduler.objective != Objective.comm:
            raise ConfigError(
                f"scheduler.objective={self.scheduler.objective}: mode=emulate schedules on "
                "the comm objective (its links and tasklet sizes)"
            )
        n_case = self.cluster().num_devices
        if self.devices is not None:
            bad = [d for d in self.devices if d >= n_case]
            if bad or len(set(self.devices)) != len(self.devices):
                raise ConfigError(
                    f"devices={self.devices}: ids must be distinct, in 0..{n_case - 1}"
                )
        n = len(self.devices) if self.devices else min(self.max_devices, n_case)
        check_emulated_links(
            self.cluster().subset(self.picked_devices(self.cluster())),
            self.bandwidth_scale,
            self.delay_scale,
        )
        if self.grid:
            _check_local_ranks(self, self.tp * (self.pp or 1) * (self.dp or 1))
        else:
            self.limits.check_ranks(n, f"{n} emulated devices")
            if self.system == TrainedSystem.ours:
                check_layout(f"the {n} emulated devices", n, self.pp, self.dp)
            from system.workload import get_model

            model = dataclasses.replace(
                get_model(self.model, self.layers),
                hidden_size=self.hidden_size,
                seq_length=self.seq_length,
                vocab_size=self.vocab_size,
            )
            pp, dp = fill_layout(n, self.pp, self.dp)
            self.limits.check_memory(
                model,
                pp=pp,
                dp=dp,
                micro_batch_size=self.micro_batch_size,
                batch=self.batch or 4 * dp,
            )

    def picked_devices(self, cluster) -> list[int]:
        """The emulated devices of ``cluster``: ``devices``, else the first device of each region
        (region order), at most ``max_devices``."""
        if self.devices:
            return list(self.devices)
        first: dict = {}
        for d, r in enumerate(cluster.region_of):
            first.setdefault(r, d)
        return list(first.values())[: self.max_devices]
