"""Option blocks several modes share, and the checks behind them.

Shared blocks of options are mixins (:class:`CaseOptions`, :class:`ModelOptions`,
:class:`LayoutOptions`, :class:`LocalRunOptions`) and a group (``scheduler.*``); a mode's class
(its folder's ``config.py``) lists the mixins it takes, so a mode has exactly the keys it uses.
The enums of values more than one mode takes (:data:`ModelName`, :data:`LinkSharing`, ...) and
the layout helpers (:func:`default_layout`, :func:`fill_layout`, :func:`check_layout`) live here
too.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from repro.config.base import default_of
from repro.config.options import ConfigError, Options, choice, option
from system.cases import VARIANTS, canonical_case
from system.emulation.netns import BACKENDS
from system.results import TRAINED_SYSTEMS
from system.scheduler.api import OBJECTIVES, SCHEDULERS
from system.simulator.sharing import LINK_SHARING
from system.workload import MODELS, WORKLOADS

__all__ = [
    "CaseVariant",
    "ModelName",
    "WorkloadName",
    "SchedulerName",
    "Objective",
    "TrainedSystem",
    "LinkSharing",
    "Backend",
    "EmulateLayout",
    "default_layout",
    "fill_layout",
    "check_layout",
    "load_case",
    "check_cases",
    "require",
    "check_file",
    "CaseOptions",
    "ModelOptions",
    "LayoutOptions",
    "SchedulerOptions",
    "LocalRunOptions",
    "check_local_ranks",
    "check_emulated_links",
    "SPEC_KEYS",
    "runtime_spec",
]

CaseVariant = choice("CaseVariant", VARIANTS, module=__name__)
ModelName = choice("ModelName", MODELS, module=__name__)
WorkloadName = choice("WorkloadName", WORKLOADS, module=__name__)
SchedulerName = choice("SchedulerName", SCHEDULERS, module=__name__)
Objective = choice("Objective", OBJECTIVES, module=__name__)
TrainedSystem = choice("TrainedSystem", TRAINED_SYSTEMS, module=__name__)
LinkSharing = choice("LinkSharing", LINK_SHARING, module=__name__)
Backend = choice("Backend", BACKENDS, module=__name__)
# the methods of the time-to-quality study (mode=quality_curves; a row's system, read by the
# reports), the reference first; each one's settings: repro/studies/quality_curves/methods.py
QUALITY_METHODS = ("ours", "pipe_q", "aq_sgd", "dp_topk", "diloco_h4", "diloco_h16", "diloco_h64")
# the systems of the emulated quality study (mode=quality; a row's system, read by the reports),
# the reference first; each one's settings: repro/studies/quality/config.py
QUALITY_STUDY_SYSTEMS = (
    "ours",
    "ours_pipe_q4",
    "ours_aq_sgd",
    "ours_dp_topk",
    "ring_dp_topk",
    "diloco_h4",
    "diloco_h16",
    "megatron",
    "deepspeed",
)
# the layouts mode=emulate runs ours on (a row's system is ours_<layout>, read by the reports)
EmulateLayout = choice("EmulateLayout", ("scheduled", "random", "identity"), module=__name__)


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


def check_cases(key: str, cases: list[str]) -> list[str]:
    """``cases`` (option ``key``) as canonical case names, each one that loads; at least one."""
    out = [canonical_case(c) for c in cases]
    if not out:
        raise ConfigError(f"{key}=[]: name at least one case")
    for c in out:
        load_case(c, "paper")
    return out


def require(key: str, value, what: str) -> None:
    """ConfigError naming ``key`` when ``value`` (``what``) is not given."""
    if value is None or not str(value).strip():
        raise ConfigError(f"{key}: give {what}")


def check_file(key: str, value: str | None) -> None:
    """ConfigError naming ``key`` when the file ``value`` (if given) does not exist."""
    if value is not None and not Path(value).is_file():
        raise ConfigError(f"{key}={value!r}: no such file")


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


def check_local_ranks(cfg, ranks: int) -> None:
    """The ranks of a local run (``tp*pp*dp``) fit ``cfg.limits``."""
    cfg.limits.check_ranks(ranks, f"tp*pp*dp = {cfg.tp}*{cfg.pp or 1}*{cfg.dp or 1}")


# A mode's keys that name a field of our runtime's RunSpec the same way
SPEC_KEYS = (
    "model",
    "layers",
    "hidden_size",
    "seq_length",
    "vocab_size",
    "pp",
    "dp",
    "micro_batch_size",
    "iters",
    "seed",
    "warmup_iters",
)


def runtime_spec(cfg, **fields):
    """The :class:`system.runtime.spec.RunSpec` of a mode's config: each of :data:`SPEC_KEYS`
    the config has, as it is (the model by name), then ``fields`` (what the mode decides
    itself: the layout it resolved, the global batch, the start, ...), which win."""
    from system.runtime.spec import RunSpec

    taken = {k: getattr(cfg, k) for k in SPEC_KEYS if hasattr(cfg, k)}
    if "model" in taken:
        taken["model"] = str(taken["model"])
    return RunSpec(**{**taken, **fields})


def check_emulated_links(cluster, bandwidth_scale: float, delay_scale: float) -> None:
    """The scaled links of ``cluster`` are ones tc can shape: a pure check (nothing is built),
    one ConfigError naming the scales and the first link out of range."""
    from system.emulation.plan import make_plan

    try:
        make_plan(cluster, bandwidth_scale=bandwidth_scale, delay_scale=delay_scale, tag="check")
    except ValueError as e:
        raise ConfigError(f"bandwidth_scale/delay_scale: {e}") from None
