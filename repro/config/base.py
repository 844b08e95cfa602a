"""The keys every mode shares (:class:`RunConfig`), the mode registry and :func:`validate`.

A mode is one dataclass deriving from :class:`RunConfig`, registered with
:func:`register_mode`; Hydra composes ``conf/config.yaml`` with the registered class of the
chosen ``mode`` (a config group, :func:`store_schemas`), so a key another mode owns, a wrong
type or an enum value outside its choices stops at composition with Hydra's message naming the
key. :func:`validate` then builds the dataclass: its field ranges and its :meth:`check` run,
and a bad value is one :class:`ConfigError` line naming the key, before any work.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import os
import re
import sys
import typing
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from repro.config.options import (
    ConfigError,
    Options,
    choice,
    cpu_cores,
    describe_type,
    group,
    option,
)
from repro.hydra_fast import store_schema
from system.limits import (
    DEFAULT_MAX_DEVICES,
    DEFAULT_MAX_RANDOM_LAYOUTS,
    DEFAULT_MAX_REPEATS,
    DEFAULT_MAX_SEARCH_S,
    DEFAULT_MAX_TRIALS,
    LimitError,
    check_repeats,
    check_train_memory,
    over_limit,
)

__all__ = [
    "Logger",
    "WandbMode",
    "WandbConfig",
    "WorkflowConfig",
    "LimitsConfig",
    "RunConfig",
    "ModeSpec",
    "MODES",
    "register_mode",
    "validate",
    "as_dict",
    "default_of",
    "store_schemas",
    "default_results_dir",
    "mode_help",
    "discover_modes",
]

Logger = choice("Logger", ("none", "wandb"), module=__name__)
WandbMode = choice("WandbMode", ("offline", "online", "disabled"), module=__name__)


# wandb's names of a project and an entity (team or user): no '/', '\\', '#', '?', '%', ':'
WANDB_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")
# Folders wandb writes outside its run folder (staged Table files, read-only; its artifact
# cache; downloaded artifacts): a study keeps them under its wandb folder (repro.report.wandb_log)
WANDB_FOLDER_VARS = ("WANDB_DATA_DIR", "WANDB_CACHE_DIR", "WANDB_ARTIFACT_DIR")


@dataclass
class WandbConfig(Options):
    """The wandb mirror of a study (``logger=wandb``)."""

    KEY = "wandb"
    project: str = option("dtfm-repro", "wandb project")
    entity: str | None = option(None, "your wandb team or user (mode=online)")
    mode: WandbMode = option(WandbMode.offline, "offline needs no account; WANDB_MODE wins")
    dir: str | None = option(
        None, "folder of the wandb/ run folders, inside results_dir (null: results_dir)"
    )

    def effective_mode(self) -> str:
        """``WANDB_MODE`` if set, else ``mode``; a ConfigError naming the variable when it is
        not one of the modes."""
        mode = os.environ.get("WANDB_MODE") or str(self.mode)
        if mode not in {m.value for m in WandbMode}:
            raise ConfigError(f"WANDB_MODE={mode!r}: expected one of {', '.join(WandbMode)}")
        return mode

    def check_for(self, results_dir: str) -> None:
        """The mirror of a study in ``results_dir`` can run: its mode, names and folders (all
        under ``results_dir``, writable)."""
        self.effective_mode()
        for key, name in (("project", self.project), ("entity", self.entity)):
            if name is not None and not WANDB_NAME.fullmatch(name):
                raise ConfigError(
                    f"wandb.{key}={name!r}: a wandb name (letters, digits, '_.-', at most 128)"
                )
        home = Path(results_dir).resolve()
        folders = [("wandb.dir", self.dir)] if self.dir is not None else []
        folders += [(v, os.environ[v]) for v in WANDB_FOLDER_VARS if os.environ.get(v)]
        for key, value in folders:
            if not Path(value).resolve().is_relative_to(home):
                raise ConfigError(
                    f"{key}={value!r}: outside results_dir={results_dir!r}; wandb's files stay "
                    "with the study's rows"
                )
            _check_folder(key, value)


@dataclass
class WorkflowConfig(Options):
    """What a sweep does around its jobs, and the report's settings."""

    KEY = "workflow"
    skip_finished: bool = option(True, "a restarted sweep skips the jobs that finished")
    report: bool = option(True, "build REPORT.md (variance, claims, figures) after the jobs")
    tolerance: float = option(
        0.25, "claims: relative tolerance around the paper's ranges", ge=0, lt=1
    )
    ablation_csv: str | None = option(
        "results/scheduler/ablation.csv", "scheduler ablation table for Fig. 4 and its claim"
    )

    def check(self) -> None:
        super().check()
        path = self.ablation_csv
        if path is not None and Path(path).exists() and not Path(path).is_file():
            raise ConfigError(f"workflow.ablation_csv={path!r}: not a file")


@dataclass
class LimitsConfig(Options):
    """What one machine can hold; raise a limit explicitly to go past it. Every limit is checked
    before any work, with one line naming the value, the key and the override
    (:func:`system.limits.over_limit`)."""

    KEY = "limits"
    max_local_ranks: int | None = option(
        None, "processes started on this machine (null: 4 per CPU core)", ge=1
    )
    max_micro_batches: int = option(
        32768, "micro-batches per iteration (each is simulated or computed)", ge=1
    )
    max_devices: int = option(
        DEFAULT_MAX_DEVICES,
        "devices of a topology file (link matrices grow with their square)",
        ge=1,
    )
    max_repeats: int = option(DEFAULT_MAX_REPEATS, "repeats of one setting (a row each)", ge=1)
    max_memory_gib: float | None = option(
        None,
        "host memory of a training run's ranks (null: 80% of this machine's memory)",
        gt=0,
    )
    max_search_s: float = option(
        DEFAULT_MAX_SEARCH_S, "wall time of one layout search (its time_limit_s)", gt=0
    )
    max_trials: int = option(
        DEFAULT_MAX_TRIALS, "trials, population and patience of one layout search", ge=1
    )
    max_random_layouts: int = option(
        DEFAULT_MAX_RANDOM_LAYOUTS, "random layouts drawn and simulated per setting", ge=1
    )

    def local_ranks(self) -> int:
        return self.max_local_ranks if self.max_local_ranks is not None else 4 * cpu_cores()

    def check_ranks(self, ranks: int, what: str) -> None:
        limit, key = self.local_ranks(), "limits.max_local_ranks"
        if ranks > limit:
            raise ConfigError(
                str(
                    over_limit(
                        f"{what} = {ranks} processes on this machine's {cpu_cores()} CPU core(s)",
                        ranks,
                        key,
                        limit,
                    )
                )
            )

    def check_micro_batches(self, batch: int, micro_batch_size: int) -> None:
        n = batch // micro_batch_size
        if n > self.max_micro_batches:
            raise ConfigError(
                str(
                    over_limit(
                        f"batch={batch} with micro_batch_size={micro_batch_size} is {n} "
                        "micro-batches per iteration",
                        n,
                        "limits.max_micro_batches",
                        self.max_micro_batches,
                        "each is simulated or computed",
                    )
                )
            )

    def check_repeats(self, repeats: int) -> None:
        try:
            check_repeats(repeats, limit=self.max_repeats)
        except LimitError as e:
            raise ConfigError(str(e)) from None

    def check_search(self, prefix: str, budget) -> None:
        """The budget of a layout search (``budget``'s ``trials``, ``population``,
        ``patience_trials``, ``time_limit_s`` and ``random_layouts``, those it has and are set;
        ``prefix``: their keys' block, e.g. ``scheduler.``) is within these limits."""
        search = "a search runs until its trials, patience or time limit ends it"
        for name, key, limit, why in (
            ("trials", "limits.max_trials", self.max_trials, search),
            ("population", "limits.max_trials", self.max_trials, "each member is a layout held"),
            ("patience_trials", "limits.max_trials", self.max_trials, search),
            ("time_limit_s", "limits.max_search_s", self.max_search_s, search),
            (
                "random_layouts",
                "limits.max_random_layouts",
                self.max_random_layouts,
                "each is held and simulated",
            ),
        ):
            value = getattr(budget, name, None)
            if value is not None and value > limit:
                shown = f"{value:g}" if isinstance(value, float) else str(value)
                line = over_limit(f"{prefix}{name}={shown}", shown, key, limit, why)
                raise ConfigError(str(line))

    def check_memory(self, model, *, pp: int, dp: int, micro_batch_size: int, batch: int) -> None:
        """The ranks of a CPU training run of ``model`` fit this machine's memory."""
        try:
            check_train_memory(
                model,
                pp=pp,
                dp=dp,
                micro_batch_size=micro_batch_size,
                micro_batches=max(1, batch // (dp * micro_batch_size)),
                limit_gib=self.max_memory_gib,
            )
        except LimitError as e:
            raise ConfigError(str(e)) from None


STUDY_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}")


def check_study(study) -> None:
    """ConfigError unless ``study`` is a plain folder name (:data:`STUDY_NAME`)."""
    if not isinstance(study, str) or not STUDY_NAME.fullmatch(study):
        raise ConfigError(
            f"study={study!r}: a plain name (letters, digits, '_.-', not starting "
            "with '.' or '-'): it names the folders results/<study> and outputs/<study>"
        )


def default_results_dir(study: str, mode: str) -> str:
    """``results/<study>``; ad-hoc runs go to ``results/adhoc/<mode>`` so modes never mix."""
    return f"results/adhoc/{mode}" if study == "adhoc" else f"results/{study}"


def _check_folder(key: str, value: str) -> None:
    """A usable folder: not empty, not a file, its first existing ancestor writable."""
    if not value.strip():
        raise ConfigError(f"{key}='': give a folder (or leave it unset for the mode's default)")
    q = Path(value)
    if q.exists() and not q.is_dir():
        raise ConfigError(f"{key}={value!r}: is a file, not a folder")
    while not q.exists():
        q = q.parent
    if not q.is_dir():
        raise ConfigError(f"{key}={value!r}: {q} is a file, not a folder")
    if not os.access(q, os.W_OK):
        raise ConfigError(f"{key}={value!r}: {q} is not writable")


@dataclass
class RunConfig(Options):
    """Keys of every mode. ``python repro/run.py mode=NAME --help`` lists a mode's own."""

    mode: str = option("", "the mode to run (a config group: mode=NAME)")
    study: str = option("adhoc", "the study's name: results go to results/<study>")
    results_dir: str | None = option(
        None, "the results folder (null: results/<study>, or results/adhoc/<mode>)"
    )
    seed: int = option(0, "seed of every random choice", ge=0, le=2**63 - 1)
    logger: Logger = option(Logger.none, "wandb: one wandb run per configuration")
    wandb: WandbConfig = group(WandbConfig, "wandb.*")
    workflow: WorkflowConfig = group(WorkflowConfig, "workflow.*")
    limits: LimitsConfig = group(LimitsConfig, "limits.*")

    def check(self) -> None:
        super().check()
        if self.mode not in MODES or not isinstance(self, MODES[self.mode].schema):
            raise ConfigError(f"mode={self.mode!r}: expected one of {', '.join(sorted(MODES))}")
        check_study(self.study)
        if self.results_dir is None:
            self.results_dir = default_results_dir(self.study, self.mode)
        _check_folder("results_dir", self.results_dir)
        if self.logger == Logger.wandb:
            self.wandb.check_for(self.results_dir)
        self.limits.check_search("", self)  # a study's own budget (trials, random_layouts, ...)
        scheduler = getattr(self, "scheduler", None)
        if isinstance(scheduler, Options):
            self.limits.check_search("scheduler.", scheduler)


# ---- the registry ------------------------------------------------------------------------------
@dataclass(frozen=True)
class ModeSpec:
    """A registered mode: its config class, what runs it and whether it writes result rows."""

    name: str
    schema: type
    runner: str  # "package.module:function"
    rows: bool  # writes rows into results_dir (a ledger entry per job, a report after it)
    # "package.module:function" that a serial sweep of the mode calls with its jobs before the
    # first: work shared across jobs started on the idle core; returns the function stopping it
    prefetch: str | None = None
    # "package.module:function" (no arguments) that a launcher's worker process calls before its
    # first job: loads and compiles what the mode's first job would (see repro.sweep._check_part)
    warm: str | None = None

    @property
    def summary(self) -> str:
        return (self.schema.__doc__ or "").strip().splitlines()[0]

    def function(self, which: str = "runner") -> Callable:
        module, _, name = getattr(self, which).partition(":")
        return getattr(importlib.import_module(module), name or "run")


MODES: dict[str, ModeSpec] = {}


def register_mode(
    name: str,
    runner: str | None = None,
    *,
    rows: bool = False,
    prefetch: str | None = None,
    warm: str | None = None,
):
    """Class decorator, placed below ``@dataclass``: ``name`` is a mode, configured by the class
    and run by ``runner`` (``"package.module:function"``, the function taking the class; none:
    ``run`` of the ``run.py`` beside the class's ``config.py``); ``rows``: it stores result rows;
    ``prefetch``, ``warm``: :attr:`ModeSpec.prefetch`, :attr:`ModeSpec.warm`."""

    def wrap(cls):
        if "__dataclass_fields__" in cls.__dict__:
            raise TypeError(f"@register_mode({name!r}) goes below @dataclass")
        cls.__annotations__ = {**cls.__dict__.get("__annotations__", {}), "mode": str}
        cls.mode = dataclasses.field(default=name, metadata={"help": "this mode"})
        MODES[name] = ModeSpec(name, cls, runner or _beside(cls, name), rows, prefetch, warm)
        if _STORED:
            _store_mode(MODES[name])
        return cls

    return wrap


def _beside(cls: type, name: str) -> str:
    """``"<package>.run:run"`` for a class defined in ``<package>.config``."""
    package, _, module = cls.__module__.rpartition(".")
    if module != "config":
        raise TypeError(
            f"@register_mode({name!r}): give the runner (the class is not in a mode's config.py)"
        )
    return f"{package}.run:run"


# Where the modes' options live, relative to the ``repro`` package: every ``config.py`` of a
# mode's folder, and the reports' (one file for the modes of ``repro/report``)
MODE_CONFIGS = (
    "modes/*/config.py",
    "report/config.py",
    "studies/*/config.py",
    "checks/*/config.py",
)


def discover_modes() -> None:
    """Import every mode's ``config.py`` (:data:`MODE_CONFIGS`), each registering its modes
    (called once, by ``repro/__init__.py``); the modes' run code is imported only when a mode
    runs (:meth:`ModeSpec.function`)."""
    root = Path(__file__).resolve().parents[1]
    for path in [p for pattern in MODE_CONFIGS for p in sorted(root.glob(pattern))]:
        parts = path.relative_to(root.parent).with_suffix("").parts
        importlib.import_module(".".join(parts))


_STORED = False  # store_schemas ran: a mode registered later is stored as it registers


def store_schemas() -> None:
    """Register the shared schema (``config_schema``) and every mode (group ``mode``) with
    Hydra's ConfigStore (:func:`repro.hydra_fast.store_schema`); ``conf/config.yaml`` composes
    them. A mode registered afterwards (a test's, or one made at run time) is stored when it
    registers."""
    global _STORED
    store_schema("config_schema", RunConfig)
    for spec in MODES.values():
        _store_mode(spec)
    _STORED = True


def _store_mode(spec: ModeSpec) -> None:
    store_schema(spec.name, spec.schema, group="mode", package="_global_")


# ---- building the typed config -----------------------------------------------------------------
def _one_line(e: Exception) -> str:
    text = str(e).strip().splitlines()
    msg = text[0] if text else type(e).__name__
    key = next(
        (ln.split(":", 1)[1].strip() for ln in text if ln.strip().startswith("full_key:")), None
    )
    return f"{key}: {msg}" if key and key not in msg else msg


def _plain(cfg: DictConfig | dict) -> dict:
    try:
        if isinstance(cfg, DictConfig):
            c = OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)
        else:
            c = dict(cfg)
    except OmegaConfBaseException as e:
        raise ConfigError(_one_line(e)) from None
    c.pop("hydra", None)
    return c


def validate(cfg: DictConfig | dict | RunConfig) -> RunConfig:
    """The checked config of ``cfg``'s mode (its registered dataclass); a Hydra config, a dict
    (``mode`` defaults to simulate) or an already built config (returned as it is)."""
    if isinstance(cfg, RunConfig):
        return cfg
    raw = _plain(cfg)
    mode = raw.setdefault("mode", "simulate")
    if mode not in MODES:
        raise ConfigError(f"mode={mode!r}: expected one of {', '.join(sorted(MODES))}")
    try:
        return OmegaConf.to_object(OmegaConf.merge(_structured(MODES[mode].schema), raw))
    except ConfigError:
        raise
    except OmegaConfBaseException as e:
        cause = e.__cause__ or e.__context__
        if isinstance(cause, ConfigError):
            raise cause from None
        raise ConfigError(_one_line(e)) from None


@functools.cache
def _structured(schema: type) -> DictConfig:
    """The structured config of a mode's dataclass, made once (merging copies it, never
    changes it)."""
    return OmegaConf.structured(schema)


def default_of(cls: type, name: str):
    """The default of option ``name`` of the dataclass ``cls``."""
    f = next(f for f in dataclasses.fields(cls) if f.name == name)
    return f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default


def as_dict(cfg: RunConfig) -> dict:
    """``cfg`` as plain data (enums as their text): what a ledger entry and a job key hold."""

    def plain(v):
        if isinstance(v, dict):
            return {k: plain(x) for k, x in v.items()}
        if isinstance(v, (list, tuple)):
            return [plain(x) for x in v]
        return str(v) if isinstance(v, str) else v

    return plain(dataclasses.asdict(cfg))


# ---- help --------------------------------------------------------------------------------------
def _options(cls: type, prefix: str = "") -> list[tuple[str, str, str, str]]:
    """(key, type, default, help) of every option of ``cls``, groups flattened."""
    hints = typing.get_type_hints(cls)
    out = []
    for f in dataclasses.fields(cls):
        if not prefix and f.name == "mode":
            continue
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        if dataclasses.is_dataclass(default):
            out += _options(type(default), f"{prefix}{f.name}.")
            continue
        if isinstance(default, list):
            shown = "[" + ",".join(str(x) for x in default) + "]"
        else:
            shown = "null" if default is None else str(default)
        typ = describe_type(hints[f.name])
        out.append((prefix + f.name, typ, shown, f.metadata.get("help", "")))
    return out


SECTIONS = (
    ("repro.modes", "Modes"),
    ("repro.studies", "Studies"),
    ("repro.checks", "Checks of the harness"),
    ("repro.report", "Reports"),
)


def mode_help(mode: str) -> str:
    """The ``--help`` text: every mode in one line, then the options of ``mode``."""
    import textwrap

    width = max(len(n) for n in MODES)
    lines = [
        "python repro/run.py [mode=NAME] [key=value ...]    (the same: python -m repro ...)",
        "python repro/run.py -m sweep=NAME [key=value ...]  (a sweep: one job per setting)",
    ]
    for package, title in SECTIONS:
        lines += ["", f"{title} (mode=NAME; python repro/run.py mode=NAME --help: its options):"]
        lines += [
            f"  {n:<{width}}  {s.summary}"
            for n, s in sorted(MODES.items())
            if s.runner.startswith(package + ".")
        ]
    spec = MODES.get(mode)
    if spec is not None:
        shared = {f.name for f in dataclasses.fields(RunConfig)}
        opts = _options(spec.schema)
        lines += ["", f"Options of mode={mode}: key (type, default): meaning"]
        for title, own in (("", True), ("shared by every mode:", False)):
            if title:
                lines.append(f"  {title}")
            for key, typ, default, text in opts:
                if (key.split(".")[0] not in shared) == own:
                    entry = f"{key} ({typ}, default {default}): {text}"
                    lines += textwrap.wrap(
                        entry, 98, initial_indent="  ", subsequent_indent="      "
                    )
    conf = Path(__file__).resolve().parents[2] / "conf"
    for folder, title in (
        ("sweep", "Sweeps (-m sweep=NAME)"),
        ("setting", "Settings (setting=NAME)"),
    ):
        names = ", ".join(sorted(p.stem for p in (conf / folder).glob("*.yaml")))
        lines += [""] + textwrap.wrap(f"{title}: {names}", 98, subsequent_indent="  ")
    lines += ["", "Hydra's own options: --hydra-help"]
    return "\n".join(lines)


# ---- Hydra's run folder ------------------------------------------------------------------------
def run_folder(kind: str, study, _root_: DictConfig) -> str:
    """The study's part of Hydra's run and sweep folders (``conf/config.yaml``), checked before
    Hydra makes the folder: the study is a plain name, and a single run's whole config is
    validated (:func:`validate`: every key, path and limit), so a bad input creates nothing.
    A bad one is one ``error:`` line and exit 2 (Hydra would report a resolver's error with its
    own lines and exit 1). A sweep's jobs are validated one by one as they run (a failing job
    is recorded and the sweep goes on), so ``kind="sweep"`` checks the study alone."""
    study = str(study)
    try:
        check_study(study)
        if kind == "run":
            raw = OmegaConf.to_container(_root_, resolve=False)
            raw.pop("hydra", None)
            validate(OmegaConf.create(raw))
    except (ConfigError, ValueError, OSError, RuntimeError) as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    return study


if not OmegaConf.has_resolver("repro_help"):
    OmegaConf.register_new_resolver("repro_help", mode_help)
if not OmegaConf.has_resolver("repro_folder"):
    OmegaConf.register_new_resolver("repro_folder", run_folder)
