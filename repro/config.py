"""The typed configuration of every entry point: one dataclass per mode, checked before any work.

Hydra composes ``conf/config.yaml`` on top of :class:`RunConfig` and every mode's own keys
(:func:`composed_schema`, registered in Hydra's ConfigStore as ``config_schema``), so an unknown
key or a value of the wrong type (``layers=24.9``, ``scheduler=genetic`` instead of
``scheduler.name=genetic``) stops at composition with Hydra's message naming the key.
:func:`validate` then builds the mode's own dataclass (``SimulateConfig``,
``TrainConfig``, ...; each ``__post_init__`` checks ranges, choices, the case and the limits of
this machine) and raises one :class:`ConfigError` line naming the key and what is wrong.

Adding a config key is one field (type, default, comment) in the one dataclass that owns it,
and its check in that class's ``__post_init__``; nothing else lists keys (``conf/config.yaml``
holds none, Hydra composes against :func:`composed_schema`):

* a key of every mode: :class:`RunConfig` (e.g. ``seed``);
* a key of one mode: that mode's class, e.g. ``baseline_placement: str = "launch"`` in
  :class:`SimulateConfig` (``python repro/run.py baseline_placement=topology``; any other mode
  refuses it unless left at its default);
* a search key for both ``repro/run.py`` (``scheduler.objective=...``) and
  ``repro/schedule.py`` (``objective=...``): :class:`SearchOptions`, e.g.
  ``objective: str = "comm"``;
* a group: a nested dataclass field (as :class:`LimitsConfig` under ``limits``).

Adding a mode (``mode=predict``) is one class deriving from :class:`RunConfig` in this file,
decorated with ``@register_mode("predict", module="repro.modes.predict")``, plus that module's
``run(cfg) -> dict`` (rows through :func:`system.results.make_row` / ``write_rows``; a new
results column is one line in ``system/schema.py`` ``COLUMNS``). ``repro/run.py``, the sweep
pre-check, the ``system=`` choices (the class's ``systems``) and the default results folder
(``results/adhoc/predict``) follow from the registry.

Scripts that are not Hydra apps (``repro/schedule.py``, ``repro/train.py``) parse their
``key=value`` arguments with :func:`parse_cli` into their own dataclass, with the same errors.

One module (~750 lines): one dataclass per mode plus the shared checks and the mode registry;
splitting by mode would scatter the checks every mode shares and the one list of keys.
"""

from __future__ import annotations

import dataclasses
import math
import os
import typing
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from system.results import SIMULATED_SYSTEMS, TRAINED_SYSTEMS

__all__ = [
    "ConfigError",
    "check_layout",
    "ModeSpec",
    "MODES",
    "register_mode",
    "RunConfig",
    "SearchOptions",
    "SimulateConfig",
    "EmulateConfig",
    "TrainConfig",
    "LimitsConfig",
    "validate",
    "parse_cli",
    "script_args",
    "int_list",
    "store_schemas",
    "composed_schema",
    "cpu_cores",
]

# Choices, spelled once (the mode-specific system sets live on the mode classes).
SYSTEMS = ("all", *SIMULATED_SYSTEMS)  # all = every system the mode runs
SCHEDULER_NAMES = ("genetic", "genetic_kl", "kl", "random")
CASE_VARIANTS = ("paper", "dtfm_code")
LOGGERS = ("none", "wandb")
WANDB_MODES = ("offline", "online", "disabled")
LAYOUTS = ("identity", "random")
DP_MODES = ("sharded_ps", "allreduce")
DEVICES = ("cpu", "cuda")
EMULATE_LAYOUTS = ("scheduled", "random", "identity")
VERIFY_ACTIONS = ("raise", "warn")
EMULATION_BACKENDS = ("auto", "netem", "nfqueue")


class ConfigError(ValueError):
    """Bad configuration: the message names the key, the value and what is wrong."""


def cpu_cores() -> int:
    """CPU cores this process may use (its affinity mask, else the machine's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        return os.cpu_count() or 1


# ---- checks ------------------------------------------------------------------------------------
def _choice(key: str, value, choices: Sequence[str]) -> None:
    if value not in choices:
        raise ConfigError(f"{key}={value!r}: expected one of {', '.join(choices)}")


def _at_least(key: str, value, low, *, optional: bool = True, hint: str = "") -> None:
    if value is None and optional:
        return
    if value is None or value < low:
        null = " (or null for the default)" if optional else ""
        raise ConfigError(f"{key}={value!r}: must be >= {low}{null}{hint}")


def _positive(key: str, value, *, optional: bool = True) -> None:
    if value is None and optional:
        return
    if value is None or not value > 0:
        raise ConfigError(f"{key}={value!r}: must be > 0")


def _results_dir(key: str, value: str) -> None:
    """A usable folder: not empty, not a file, its first existing ancestor writable."""
    if not str(value).strip():
        raise ConfigError(f"{key}='': give a folder (or leave it unset for the mode's default)")
    p = Path(value)
    if p.exists() and not p.is_dir():
        raise ConfigError(f"{key}={value!r}: is a file, not a folder")
    q = p
    while not q.exists():
        q = q.parent
    if not q.is_dir():
        raise ConfigError(f"{key}={value!r}: {q} is a file, not a folder")
    if not os.access(q, os.W_OK):
        raise ConfigError(f"{key}={value!r}: {q} is not writable")


def check_layout(case: str, num_devices: int, pp: int | None, dp: int | None) -> None:
    """``pp`` and ``dp`` (None = the scheduler picks) must fit the case's device count."""
    for key, v in (("pp", pp), ("dp", dp)):
        if v is not None and num_devices % v:
            raise ConfigError(f"{key}={v} does not divide case {case}'s {num_devices} devices")
    if pp and dp and pp * dp != num_devices:
        raise ConfigError(
            f"pp={pp} x dp={dp} = {pp * dp}, but case {case} has {num_devices} devices"
        )


def _cluster(case: str, variant: str):
    from system.cases import get_case

    try:
        return get_case(case, variant)
    except (ValueError, FileNotFoundError) as e:
        raise ConfigError(f"case={case!r}: {e}") from None


# ---- groups ------------------------------------------------------------------------------------
@dataclass
class SearchOptions:
    """Knobs of the layout search, shared by ``repro/run.py`` (``scheduler.*``) and
    ``repro/schedule.py`` (top-level keys): a search key added here reaches both."""

    trials: int | None = None  # GA trials (null = the caller's default budget)
    population: int | None = None  # GA population (null = default)
    time_limit_s: float | None = None  # wall-time cap per schedule() call

    def __post_init__(self) -> None:
        prefix = "scheduler." if isinstance(self, SchedulerConfig) else ""
        _at_least(f"{prefix}trials", self.trials, 1)
        _at_least(f"{prefix}population", self.population, 2)
        _positive(f"{prefix}time_limit_s", self.time_limit_s)


@dataclass
class SchedulerConfig(SearchOptions):
    # simulate: null budget keys = a small budget (4 trials, population 4, 1 s per layout),
    # recorded in every row
    name: str = "genetic"  # genetic | genetic_kl (kl) | random

    def __post_init__(self) -> None:
        super().__post_init__()
        _choice("scheduler.name", self.name, SCHEDULER_NAMES)


@dataclass
class RuntimeConfig:  # system/runtime: mode=train system=ours
    layout: str = "identity"  # identity | random rank map when no assignment file is given
    assignment: str | None = None  # scheduler output JSON {"stages": [[...], ...]}
    dp_mode: str = "sharded_ps"  # sharded_ps | allreduce
    checkpointing: bool = False  # recompute block activations in backward (rows: recompute)
    lr: float = 0.003
    device: str = "cpu"  # cpu (gloo) | cuda (NCCL; amp=true for fp16 + loss scaling)
    amp: bool = False
    timeout_s: float = 600.0  # wall-clock limit of one run (all ranks killed after it)

    def __post_init__(self) -> None:
        _choice("runtime.layout", self.layout, LAYOUTS)
        _choice("runtime.dp_mode", self.dp_mode, DP_MODES)
        _choice("runtime.device", self.device, DEVICES)
        _positive("runtime.lr", self.lr, optional=False)
        _positive("runtime.timeout_s", self.timeout_s, optional=False)
        if self.assignment is not None and not Path(self.assignment).is_file():
            raise ConfigError(f"runtime.assignment={self.assignment!r}: no such file")


@dataclass
class EmulateOptions:  # repro/modes/emulate.py, system/emulation (needs root)
    devices: list[int] | None = None  # device ids of the case; null = first of each region
    max_devices: int = 8  # cap for the default device pick
    bandwidth_scale: float = 0.1  # every bandwidth x this (the NFQUEUE delayer tops ~1.1 Gbit/s)
    delay_scale: float = 1.0  # every one-way delay x this
    layouts: list[str] = field(default_factory=lambda: ["scheduled", "random"])
    random_layouts: int = 2  # random layouts per setting
    verify_pairs: int = 6  # sampled links checked (RTT + capacity) before the runs
    verify_tolerance: float = 0.1  # relative
    on_verify_fail: str = "raise"  # raise | warn
    backend: str = "auto"  # auto | netem | nfqueue
    hidden_size: int = 256  # scaled model (model=debug): compute/communication ratio in rows
    seq_length: int = 64
    vocab_size: int = 128
    timeout_s: float = 600.0  # per emulated run
    schedule_trials: int = 300  # GA trials for the scheduled layout
    warmup_iters: int = 2  # iterations left out of the medians
    # system=megatron|deepspeed: where global rank r runs (baselines/placement.py): launch =
    # device r (the paper's protocol); topology = each point's topology-aware rank map
    baseline_placement: str = "launch"

    def __post_init__(self) -> None:
        for k in ("max_devices", "hidden_size", "seq_length", "vocab_size", "schedule_trials"):
            _at_least(f"emulate.{k}", getattr(self, k), 1, optional=False)
        for k in ("random_layouts", "verify_pairs", "warmup_iters"):
            _at_least(f"emulate.{k}", getattr(self, k), 0, optional=False)
        for k in ("bandwidth_scale", "delay_scale", "timeout_s"):
            _positive(f"emulate.{k}", getattr(self, k), optional=False)
        for name in self.layouts:
            _choice("emulate.layouts[]", name, EMULATE_LAYOUTS)
        _choice("emulate.on_verify_fail", self.on_verify_fail, VERIFY_ACTIONS)
        _choice("emulate.backend", self.backend, EMULATION_BACKENDS)
        _choice("emulate.baseline_placement", self.baseline_placement, ("launch", "topology"))


@dataclass
class WandbConfig:
    project: str = "dtfm-repro"
    entity: str | None = None  # your wandb team/user when mode=online
    mode: str = "offline"  # offline (no account, no network) | online | disabled; WANDB_MODE wins
    dir: str | None = None  # wandb/ run folders go here (null = results_dir)

    def __post_init__(self) -> None:
        _choice("wandb.mode", self.mode, WANDB_MODES)


@dataclass
class WorkflowConfig:
    skip_finished: bool = True  # a restarted multirun skips jobs whose resolved config finished
    report: bool = True  # build REPORT.md (+ variance, claims, figures) when a multirun ends
    tolerance: float = 0.25  # claims: relative tolerance around the paper's ranges
    ablation_csv: str | None = "results/scheduler/ablation.csv"  # Fig. 4 / KL claim table

    def __post_init__(self) -> None:
        _at_least("workflow.tolerance", self.tolerance, 0.0, optional=False)


@dataclass
class LimitsConfig:
    """What one machine can hold; raise a limit explicitly to go past it."""

    # ranks started on this machine (train/emulate: tp*pp*dp; grid: grid_devices);
    # null = 4 per CPU core (a CPU rank of the debug model needs a fraction of a core)
    max_local_ranks: int | None = None
    # micro-batches per iteration (global batch / micro-batch size): the simulator replays each
    # one as events and a CPU run computes each one; 8 x the paper's largest (4096 at size 1)
    max_micro_batches: int = 32768

    def __post_init__(self) -> None:
        _at_least("limits.max_local_ranks", self.max_local_ranks, 1)
        _at_least("limits.max_micro_batches", self.max_micro_batches, 1, optional=False)

    def local_ranks(self) -> int:
        return self.max_local_ranks if self.max_local_ranks is not None else 4 * cpu_cores()

    def check_ranks(self, ranks: int, what: str, key: str = "limits.max_local_ranks") -> None:
        limit = self.local_ranks()
        if ranks > limit:
            cores = cpu_cores()
            raise ConfigError(
                f"{what} = {ranks} processes on this machine's {cores} CPU core(s): over "
                f"{key}={limit} (set {key}={ranks} to run anyway)"
            )

    def check_micro_batches(
        self, batch: int, micro_batch_size: int, key: str = "limits.max_micro_batches"
    ) -> None:
        n = batch // micro_batch_size
        if n > self.max_micro_batches:
            raise ConfigError(
                f"batch={batch} with micro_batch_size={micro_batch_size} is {n} micro-batches per "
                f"iteration: over {key}={self.max_micro_batches} (each is simulated or "
                f"computed; set {key}={n} to run anyway)"
            )


# ---- the shared config -------------------------------------------------------------------------
@dataclass
class RunConfig:
    """Keys every mode reads. ``python repro/run.py --cfg job`` prints the composed values."""

    study: str = "adhoc"  # results go to results_dir (default: results/<study>, per mode for adhoc)
    mode: str = "simulate"  # a registered mode: simulate | emulate | train | ...
    # paper numbering 1..5, debug, an alias (worldwide), a topology file (.yaml/.json); a list
    # or "all" in simulate
    case: Any = "5"
    case_variant: str = "paper"  # paper | dtfm_code (the authors' code's numbers)
    system: str = "all"  # simulate: all | ours | ours_random | megatron | deepspeed; train: one
    model: str = "gpt3_xl"  # system/workload.py MODELS: gpt3_xl | debug
    layers: int | None = None  # model.num_layers; null = the paper's {24, 32, 40} in simulate
    batch: int | None = None  # global batch (sequences); null = the mode's default
    micro_batch_size: int = 1  # sequences per micro-batch
    seed: int = 0
    repeats: int = 1  # repeats per setting (random layouts: a different layout each)
    # results/<study>, or results/adhoc/<mode> for ad-hoc runs (null: the same)
    results_dir: str | None = "${default_results_dir:${study},${mode}}"
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    pp: int | None = None  # pipeline stages (null = the mode's default layout)
    dp: int | None = None  # data-parallel replicas (null = the mode's default layout)
    tp: int = 1  # tensor parallel (baselines only)
    zero: int | None = None  # DeepSpeed ZeRO stage 0..3 (baselines only)
    iters: int = 3  # training iterations
    metrics_out: str | None = None  # optional JSON with per-iteration metrics
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)
    emulate: EmulateOptions = field(default_factory=EmulateOptions)
    grid: bool = False  # system=megatron|deepspeed: run the grid search instead of one point
    grid_devices: int | None = None  # grid: ranks to search over (null = tp*pp*dp)
    grid_micro_batch_sizes: list[int] | None = None  # grid: micro-batch sizes (null = all)
    baseline_timeout_s: float = 600.0  # wall-clock limit per baseline run
    baseline_recompute: bool = False  # full activation recomputation in the baselines
    logger: str = "none"  # none | wandb (one wandb run per configuration)
    wandb: WandbConfig = field(default_factory=WandbConfig)
    workflow: WorkflowConfig = field(default_factory=WorkflowConfig)
    limits: LimitsConfig = field(default_factory=LimitsConfig)

    systems: ClassVar[tuple] = SYSTEMS  # the mode's systems (a class constant, not a key)

    def __post_init__(self) -> None:
        _choice("mode", self.mode, tuple(MODES))
        _choice("system", self.system, self.mode_systems())
        _choice("case_variant", self.case_variant, CASE_VARIANTS)
        _choice("logger", self.logger, LOGGERS)
        if not str(self.study).strip() or "/" in str(self.study):
            raise ConfigError(f"study={self.study!r}: a non-empty name without '/'")
        from system.workload import MODELS

        _choice("model", self.model, tuple(MODELS))
        for k in ("layers", "batch", "pp", "dp", "grid_devices"):
            _at_least(k, getattr(self, k), 1)
        for k in ("micro_batch_size", "tp", "repeats", "iters"):
            _at_least(k, getattr(self, k), 1, optional=False)
        _at_least("seed", self.seed, 0, optional=False)
        _positive("baseline_timeout_s", self.baseline_timeout_s, optional=False)
        if self.zero is not None and self.zero not in (0, 1, 2, 3):
            raise ConfigError(f"zero={self.zero!r}: expected 0, 1, 2 or 3 (or null)")
        for m in self.grid_micro_batch_sizes or []:
            _at_least("grid_micro_batch_sizes[]", m, 1, optional=False)
        self.case = self._normalise_case(self.case)
        if self.results_dir is None:
            self.results_dir = default_results_dir(self.study, self.mode)
        _results_dir("results_dir", self.results_dir)
        if self.batch is not None:
            self.limits.check_micro_batches(self.batch, self.micro_batch_size)

    @classmethod
    def mode_systems(cls) -> tuple:
        return cls.systems

    def _normalise_case(self, case):
        cases = list(case) if isinstance(case, (list, tuple)) else [case]
        if not cases or any(c is None or isinstance(c, (bool, float, dict)) for c in cases):
            raise ConfigError(f"case={case!r}: expected 1..5, debug, an alias or a topology file")
        cases = [str(c) for c in cases]
        if isinstance(case, (list, tuple)):
            raise ConfigError(f"case={cases}: mode={self.mode} takes one case")
        return cases[0]

    def cluster(self):
        """The case's :class:`system.cluster.Cluster` (ConfigError on a bad case)."""
        return _cluster(str(self.case), self.case_variant)


# ---- modes -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ModeSpec:
    name: str
    schema: type
    module: str

    def runner(self) -> Callable[[DictConfig], dict]:
        import importlib

        return importlib.import_module(self.module).run


MODES: dict[str, ModeSpec] = {}


def default_pp(num_devices: int) -> int:
    """Stages for ours: the divisor of the device count closest to its square root (64 -> 8)."""
    divs = [k for k in range(1, num_devices + 1) if num_devices % k == 0]
    return min(divs, key=lambda k: (abs(k - math.sqrt(num_devices)), k))


def default_results_dir(study: str, mode: str) -> str:
    """``results/<study>``; ad-hoc runs go to ``results/adhoc/<mode>`` so modes never mix."""
    return f"results/adhoc/{mode}" if str(study) == "adhoc" else f"results/{study}"


def register_mode(name: str, *, module: str):
    """Class decorator: ``name`` is a mode, configured by the class, run by ``module.run``."""

    def wrap(cls):
        MODES[name] = ModeSpec(name, cls, module)
        return cls

    return wrap


@register_mode("simulate", module="repro.modes.simulate")
@dataclass
class SimulateConfig(RunConfig):
    """The paper's Fig. 3 experiment in the simulator: cases x layers x batches, all systems."""

    # launch: baselines' ranks in device order (the paper's protocol); topology: also each
    # config's best topology-aware rank map (baselines/placement.py), both protocols reported
    baseline_placement: str = "topology"
    # sensitivity of the performance model (repro/sensitivity.py varies them one at a time):
    compute_efficiency: float | None = None  # fraction of V100 peak; null = 0.30 (hardware.py)
    # pair: every device pair its full bandwidth | device_nic: a device's flows share one NIC |
    # region_pair: flows between two regions share that pair's bandwidth
    link_sharing: str = "pair"
    baseline_transport: str = "nccl"  # nccl (eager sends) | nccl_rendezvous (send waits for recv)

    def _normalise_case(self, case):
        cases = list(case) if isinstance(case, (list, tuple)) else [case]
        if any(c is None or isinstance(c, (bool, float, dict, list)) for c in cases) or not cases:
            raise ConfigError(f"case={case!r}: expected 1..5, all, debug, an alias or a file")
        return [str(c) for c in cases] if isinstance(case, (list, tuple)) else str(case)

    def __post_init__(self) -> None:
        super().__post_init__()
        from system.workload import Workload, get_model

        _choice("baseline_placement", self.baseline_placement, ("launch", "topology"))
        _choice("link_sharing", self.link_sharing, ("pair", "device_nic", "region_pair"))
        _choice("baseline_transport", self.baseline_transport, ("nccl", "nccl_rendezvous"))
        if self.compute_efficiency is not None and not 0 < self.compute_efficiency <= 1:
            raise ConfigError(
                f"compute_efficiency={self.compute_efficiency}: expected a fraction in (0, 1]"
            )
        cases = self.case if isinstance(self.case, list) else [self.case]
        if [c.lower() for c in cases] == ["all"]:
            cases = ["1", "2", "3", "4", "5"]
        paper = self.model == "gpt3_xl"
        layers = [self.layers] if self.layers else ([24, 32, 40] if paper else [None])
        batches = [self.batch] if self.batch else ([1024, 2048, 4096] if paper else [16])
        for b in batches:
            self.limits.check_micro_batches(b, self.micro_batch_size)
        for case in cases:
            n = _cluster(case, self.case_variant).num_devices
            pp, dp = self.pp, self.dp
            if pp is not None and n % pp:
                raise ConfigError(f"pp={pp} does not divide case {case}'s {n} devices")
            if dp is not None and n % dp:
                raise ConfigError(f"dp={dp} does not divide case {case}'s {n} devices")
            if pp is not None and dp is not None and pp * dp != n:
                raise ConfigError(f"pp={pp} x dp={dp} = {pp * dp}, but case {case} has {n} devices")
            if pp is None or dp is None:
                pp = pp or (n // dp if dp else default_pp(n))
                dp = dp or n // pp
            for layer in layers:
                for b in batches:
                    try:
                        w = Workload(
                            model=get_model(self.model, layer),
                            global_batch_size=b,
                            micro_batch_size=self.micro_batch_size,
                        )
                        w.check_layout(pp, dp)
                    except ValueError as e:
                        raise ConfigError(f"case {case}, layers={layer}, batch={b}: {e}") from None


def _check_local_run(cfg: RunConfig) -> None:
    if cfg.grid:
        ranks = cfg.grid_devices or cfg.tp * (cfg.pp or 1) * (cfg.dp or 1)
        cfg.limits.check_ranks(ranks, f"grid over grid_devices={ranks}")
    else:
        pp, dp = cfg.pp or 1, cfg.dp or 1
        cfg.limits.check_ranks(cfg.tp * pp * dp, f"tp*pp*dp = {cfg.tp}*{pp}*{dp}")


@register_mode("train", module="repro.modes.train")
@dataclass
class TrainConfig(RunConfig):
    """Real training on this machine: our runtime or the Megatron/DeepSpeed baselines."""

    systems: ClassVar[tuple] = ("all", *TRAINED_SYSTEMS)  # all = ours

    def __post_init__(self) -> None:
        super().__post_init__()
        self.case = "local"  # this machine's processes, not one of the paper's cases
        if self.runtime.assignment is None:
            _check_local_run(self)
        else:
            from system.scheduler.assignment import Assignment

            try:
                a = Assignment.load(self.runtime.assignment)
            except (ValueError, KeyError, OSError) as e:
                raise ConfigError(f"runtime.assignment={self.runtime.assignment!r}: {e}") from None
            self.limits.check_ranks(a.pp * a.dp, f"runtime.assignment's {a.pp}x{a.dp} ranks")
        batch = self.batch or 8
        if self.system in ("all", "ours") and not self.runtime.assignment:
            pp, dp = self.pp or 1, self.dp or 1
            if batch % (dp * self.micro_batch_size):
                raise ConfigError(
                    f"batch={batch} is not divisible by dp={dp} x "
                    f"micro_batch_size={self.micro_batch_size}"
                )
            from system.workload import get_model

            layers = self.layers or get_model(self.model).num_layers
            if layers % pp:
                raise ConfigError(f"pp={pp} does not divide the model's {layers} layers")


@register_mode("emulate", module="repro.modes.emulate")
@dataclass
class EmulateConfig(RunConfig):
    """Our runtime (or a baseline) on emulated WAN links of a case, beside the prediction."""

    systems: ClassVar[tuple] = ("all", *SIMULATED_SYSTEMS)

    def __post_init__(self) -> None:
        super().__post_init__()
        n_case = self.cluster().num_devices
        devices = self.emulate.devices
        if devices is not None:
            bad = [d for d in devices if not 0 <= d < n_case]
            if bad or len(set(devices)) != len(devices):
                raise ConfigError(
                    f"emulate.devices={devices}: ids must be distinct, in 0..{n_case - 1}"
                )
        n = len(devices) if devices else None
        if self.grid:
            _check_local_run(self)
        elif n is not None:
            self.limits.check_ranks(n, f"emulate.devices ({n} devices)")
        else:
            self.limits.check_ranks(min(self.emulate.max_devices, n_case), "emulate.max_devices")


@register_mode("schedule", module="repro.modes.schedule")
@dataclass
class ScheduleModeConfig(RunConfig):
    """Schedule one case and write the assignment JSON (``repro/schedule.py`` through run.py).

    ``scheduler.*`` sets the search; with ``scheduler.trials`` and ``scheduler.time_limit_s`` null
    it stops on convergence (``patience_trials`` trials without a better layout, 60 s at most),
    so the command returns in seconds.
    """

    systems: ClassVar[tuple] = ("all", "ours")
    workload: str = "dtfm_reference"  # system.workload.WORKLOADS key (tasklet sizes)
    out: str | None = None  # assignment JSON (written atomically); null = results_dir/<case>.json
    greedy_seeds: bool = True  # two greedy layouts in the GA's first population
    verbose: bool = False  # log the search's progress once a second
    patience_trials: int | None = None  # convergence rule; null = the scheduler's default (20)
    objective: str = "comm"  # comm (the paper's TOTAL) | iteration_time (compute by GPU type)

    def __post_init__(self) -> None:
        super().__post_init__()
        from system.workload import WORKLOADS

        _choice("workload", self.workload, tuple(WORKLOADS))
        _at_least("patience_trials", self.patience_trials, 1)
        _choice("objective", self.objective, ("comm", "iteration_time"))
        n = self.cluster().num_devices
        check_layout(self.case, n, self.pp, self.dp)


# ---- entry points ------------------------------------------------------------------------------
def _mode_keys() -> dict[str, tuple[str, Any, Any]]:
    """Keys a mode adds to :class:`RunConfig`: name -> (mode, type, dataclass field)."""
    shared = {f.name for f in dataclasses.fields(RunConfig)}
    out: dict[str, tuple[str, Any, Any]] = {}
    for spec in MODES.values():
        hints = typing.get_type_hints(spec.schema)
        for f in dataclasses.fields(spec.schema):
            if f.name not in shared and f.name not in out:
                out[f.name] = (spec.name, hints[f.name], f)
    return out


def _default(f):
    """A field's default as composed config holds it (a nested dataclass as a plain dict)."""
    value = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
    return dataclasses.asdict(value) if dataclasses.is_dataclass(value) else value


def composed_schema() -> type:
    """What Hydra composes against: :class:`RunConfig` plus every mode's own keys (so a mode's
    key is known at composition; :func:`validate` then refuses it for the other modes)."""
    extra = []
    for name, (_, typ, f) in _mode_keys().items():
        if f.default_factory is not dataclasses.MISSING:
            extra.append((name, typ, field(default_factory=f.default_factory)))
        else:
            extra.append((name, typ, field(default=f.default)))
    return dataclasses.make_dataclass("ComposedConfig", extra, bases=(RunConfig,))


def store_schemas() -> None:
    """Register the composed schema (``config_schema``) and each mode's class with Hydra."""
    from hydra.core.config_store import ConfigStore

    cs = ConfigStore.instance()
    cs.store(name="config_schema", node=composed_schema())
    for spec in MODES.values():
        cs.store(group="schema", name=spec.name, node=spec.schema)


def _one_line(e: Exception) -> str:
    text = str(e).strip().splitlines()
    msg = text[0] if text else type(e).__name__
    key = next(
        (ln.split(":", 1)[1].strip() for ln in text if ln.strip().startswith("full_key:")), None
    )
    return f"{key}: {msg}" if key and key not in msg else msg


def _checked(schema: type, values: dict):
    """``values`` merged onto ``schema``'s defaults, as an instance of ``schema``. A wrong key or
    type is one :class:`ConfigError` line; a ConfigError that the schema's own checks raise
    (``__post_init__``) comes through as it is, not wrapped by OmegaConf."""
    try:
        return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(schema), values))
    except ConfigError:
        raise
    except OmegaConfBaseException as e:
        cause = e.__cause__ or e.__context__
        if isinstance(cause, ConfigError):
            raise cause from None
        raise ConfigError(_one_line(e)) from None


def _plain(cfg) -> dict:
    if isinstance(cfg, DictConfig):
        c = OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)
    else:
        c = dict(cfg)
    c.pop("hydra", None)
    return c


def validate(cfg: DictConfig | dict) -> DictConfig:
    """The checked config of ``cfg.mode`` (a DictConfig backed by that mode's dataclass)."""
    try:
        raw = _plain(cfg)
    except OmegaConfBaseException as e:
        raise ConfigError(_one_line(e)) from None
    mode = raw.get("mode", "simulate")
    if mode not in MODES:
        raise ConfigError(f"mode={mode!r}: expected one of {', '.join(MODES)}")
    schema = MODES[mode].schema
    own = {f.name for f in dataclasses.fields(schema)}
    foreign = _mode_keys()
    for key in [k for k in raw if k not in own]:
        if key not in foreign:
            raise ConfigError(f"{key}: unknown key")
        owner, _, f = foreign[key]
        if raw[key] != _default(f):
            raise ConfigError(
                f"{key}={raw[key]!r}: a mode={owner} key; mode={mode} does not take it"
            )
        del raw[key]
    return OmegaConf.structured(_checked(schema, raw))


@dataclass
class ReplanOptions:  # repro/modes/replan.py: a spot pre-emption trace, warm vs scratch plans
    events: int = 8  # trace events (devices leave or come back)
    step_devices: int = 16  # devices per event (a multiple of dp)
    interval_s: float = 3600.0  # simulated seconds between events
    time_limit_s: float = 1.0  # warm re-planning budget per event
    dp: int = 8  # replicas kept fixed; pp = present devices / dp

    def __post_init__(self) -> None:
        for k in ("events", "step_devices", "dp"):
            _at_least(f"replan.{k}", getattr(self, k), 1, optional=False)
        for k in ("interval_s", "time_limit_s"):
            _positive(f"replan.{k}", getattr(self, k), optional=False)
        if self.step_devices % self.dp:
            raise ConfigError(
                f"replan.step_devices={self.step_devices} must be a multiple of replan.dp={self.dp}"
            )


@register_mode("replan", module="repro.modes.replan")
@dataclass
class ReplanModeConfig(RunConfig):
    """Replay a pre-emption trace on ``case``, re-planning warm from the last plan and from
    scratch after each event (``repro/modes/replan.py``); ``batch`` null means 1024."""

    systems: ClassVar[tuple] = ("all", "ours")
    replan: ReplanOptions = field(default_factory=ReplanOptions)


@dataclass
class PredictOptions:  # repro/modes/predict.py, repro/validation/: registered predictions
    settings: str = "results/validation/settings.json"  # the settings to predict
    profile: str = "results/validation/compute_profile.json"  # calibrated compute per stage shape
    out: str | None = None  # null = results_dir/predictions.json
    only: list[str] | None = None  # setting names; null = all
    schedule_trials: int = 300  # GA trials for the scheduled layout

    def __post_init__(self) -> None:
        _at_least("predict.schedule_trials", self.schedule_trials, 1, optional=False)


@register_mode("predict", module="repro.modes.predict")
@dataclass
class PredictModeConfig(RunConfig):
    """Write the simulator's registered predictions for a list of emulated settings, from a
    compute profile measured in a separate run (``repro/validation/``); commit the file before
    the runs that score it."""

    predict: PredictOptions = field(default_factory=PredictOptions)


def parse_cli(schema: type, argv: Sequence[str]):
    """``key=value`` arguments (dotted keys for groups) -> an instance of ``schema``, checked.

    Values are parsed as YAML scalars, as Hydra does (``trials=100`` an int, ``verbose=true`` a
    bool); an unknown key, a wrong type or a failed check is one :class:`ConfigError`.
    """
    import yaml

    pairs = {}
    for arg in argv:
        if "=" not in arg:
            keys = ", ".join(f.name for f in dataclasses.fields(schema))
            raise ConfigError(f"argument {arg!r}: expected key=value (keys: {keys})")
        key, text = arg.split("=", 1)
        try:
            value = yaml.safe_load(text) if text else ""
        except yaml.YAMLError:
            value = text
        key = key.lstrip("-").replace("-", "_")
        names = [f.name for f in dataclasses.fields(schema)]
        if key.split(".")[0] not in names:
            raise ConfigError(f"argument {arg!r}: unknown key {key!r} (keys: {', '.join(names)})")
        pairs[key] = value
    return _checked(schema, _nested(pairs))


def int_list(key: str, text: str, *, low: int = 0) -> list[int]:
    """``"0,1,2"`` -> ``[0, 1, 2]``; a ConfigError names ``key`` when an item is not an int
    >= low."""
    try:
        values = [int(x) for x in str(text).split(",") if x.strip()]
    except ValueError:
        raise ConfigError(f"{key}={text!r}: expected comma-separated integers") from None
    if not values or min(values) < low:
        raise ConfigError(f"{key}={text!r}: expected comma-separated integers >= {low}")
    return values


def script_args(schema: type, argv: Sequence[str] | None) -> dict:
    """A benchmark script's ``key=value`` arguments over its dataclass ``schema``, as a dict:
    the same typed parsing as :func:`parse_cli`; a bad argument prints one ``error:`` line and
    exits with status 2 before any work."""
    import sys

    try:
        parsed = parse_cli(schema, sys.argv[1:] if argv is None else argv)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    return dataclasses.asdict(parsed)


def _nested(pairs: dict) -> dict:
    out: dict = {}
    for k, v in pairs.items():
        node = out
        *path, last = k.split(".")
        for p in path:
            node = node.setdefault(p, {})
        node[last] = v
    return out


store_schemas()
if not OmegaConf.has_resolver("default_results_dir"):
    OmegaConf.register_new_resolver("default_results_dir", default_results_dir)
