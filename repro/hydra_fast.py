"""Every use of Hydra's (and OmegaConf's) private API, in one place: the sweep's speed layer.

Hydra composes every job of a sweep twice, walks the whole defaults list for each, deep-copies
the ConfigStore per composition and pickles it into every job a launcher ships, and rescans its
plugins before every job a worker runs. What here shortens each of these:

- :class:`SweepComposer` composes the defaults once per choice of config groups and applies a
  job's value overrides after (installed as the config loader's ``load_sweep_config``);
  :class:`ShippedLoad` is its stand-in in a launcher's worker process;
- :func:`scan_plugins_once` keeps a worker's first plugin scan;
- :func:`store_schema` stores a mode's schema as a node the ConfigStore's copies share and
  whose pickle names its class;
- :class:`SharedStore` shares values between a sweep's worker processes (signed pickles).

It also answers the questions the rest of the code asks the running Hydra (:func:`is_multirun`,
:func:`output_dir`, :func:`config_loader`). No other module imports ``hydra._internal``,
``hydra.core`` or ``hydra.types``; :data:`HYDRA_INTERNALS` lists what this one relies on, and
``tests/config/test_hydra_layer.py`` fails naming the first of them a Hydra upgrade removed or
changed.
"""

from __future__ import annotations

import copy
import hashlib
import hmac
import os
import pickle
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hydra.core.config_store import ConfigNode, ConfigStore
from omegaconf import DictConfig, OmegaConf

__all__ = [
    "HYDRA_INTERNALS",
    "SweepComposer",
    "SharedStore",
    "SHARED",
    "ShippedLoad",
    "SweepLoad",
    "config_loader",
    "hydra_state",
    "is_multirun",
    "job_overrides",
    "output_dir",
    "scan_plugins_once",
    "shared_store",
    "store_schema",
    "sweep_overrides",
]

# What this module relies on: (module, attribute path, the parameters it is called with, or None
# for an attribute that is not called). A name missing, or a parameter missing or renamed, is a
# Hydra upgrade this layer has to follow.
HYDRA_INTERNALS: tuple[tuple[str, str, tuple[str, ...] | None], ...] = (
    ("hydra.core.config_store", "ConfigNode", ("name", "node", "group", "package", "provider")),
    ("hydra.core.config_store", "ConfigStore.instance", ()),
    ("hydra.core.config_store", "ConfigStore.store", ("self", "name", "node", "group", "package")),
    ("hydra.core.config_store", "ConfigStore.load", ("self", "config_path")),
    ("hydra.core.override_parser.overrides_parser", "OverridesParser.create", ()),
    (
        "hydra.core.override_parser.overrides_parser",
        "OverridesParser.parse_overrides",
        ("self", "overrides"),
    ),
    ("hydra.core.override_parser.types", "Override.get_key_element", ("self",)),
    ("hydra.core.override_parser.types", "Override.is_sweep_override", ("self",)),
    ("hydra.core.override_parser.types", "Override.sweep_string_iterator", ("self",)),
    ("hydra.core.override_parser.types", "Override.is_hydra_override", ("self",)),
    ("hydra.core.override_parser.types", "Override.value", ("self",)),
    ("hydra.core.override_parser.types", "Override.key_or_group", None),
    ("hydra.core.override_parser.types", "Override.input_line", None),
    (
        "hydra._internal.core_plugins.basic_sweeper",
        "BasicSweeper.split_arguments",
        ("overrides", "max_batch_size"),
    ),
    (
        "hydra._internal.config_loader_impl",
        "ConfigLoaderImpl.load_configuration",
        ("self", "config_name", "overrides", "run_mode"),
    ),
    (
        "hydra._internal.config_loader_impl",
        "ConfigLoaderImpl.load_sweep_config",
        ("self", "master_config", "sweep_overrides"),
    ),
    (
        "hydra._internal.config_loader_impl",
        "ConfigLoaderImpl._parse_overrides_and_create_caching_repo",
        ("self", "config_name", "overrides"),
    ),
    (
        "hydra._internal.config_loader_impl",
        "ConfigLoaderImpl._apply_overrides_to_config",
        ("overrides", "cfg"),
    ),
    (
        "hydra._internal.config_loader_impl",
        "get_overrides_dirname",
        ("overrides", "exclude_keys", "item_sep", "kv_sep"),
    ),
    (
        "hydra._internal.config_repository",
        "CachingConfigRepository.group_exists",
        ("self", "config_path"),
    ),
    ("hydra._internal.hydra", "Hydra.__init__", ("self", "task_name", "config_loader")),
    ("hydra.core.global_hydra", "GlobalHydra.instance", ()),
    ("hydra.core.hydra_config", "HydraConfig.get", ()),
    ("hydra.core.hydra_config", "HydraConfig.initialized", ()),
    ("hydra.core.plugins", "Plugins._scan_all_plugins", ("modules",)),
    ("hydra.core.singleton", "Singleton.get_state", ()),
    ("hydra.core.singleton", "Singleton.set_state", ("state",)),
    ("hydra.core.utils", "setup_globals", ()),
    ("hydra.types", "RunMode.RUN", None),
    ("hydra.types", "RunMode.MULTIRUN", None),
    ("omegaconf", "OmegaConf.copy_cache", ("from_config", "to_config")),
    ("omegaconf", "OmegaConf.masked_copy", ("conf", "keys")),
)


# ---- the running Hydra -------------------------------------------------------------------------
def output_dir() -> str | None:
    try:
        from hydra.core.hydra_config import HydraConfig

        return str(HydraConfig.get().runtime.output_dir)
    except (ImportError, ValueError):  # not under Hydra (tests call run_job directly)
        return None


def is_multirun() -> bool:
    try:
        from hydra.core.hydra_config import HydraConfig
        from hydra.types import RunMode

        return HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN
    except (ImportError, ValueError):
        return False


def config_loader():
    """The running Hydra's config loader (the app's, or the compose API's)."""
    from hydra.core.global_hydra import GlobalHydra

    return GlobalHydra.instance().hydra.config_loader


def hydra_state() -> Any:
    """What a launcher ships with every job (Hydra's singletons: its version base, the job's
    name), for :meth:`ShippedLoad.enter`."""
    from hydra.core.singleton import Singleton

    return Singleton.get_state()


# ---- a mode's schema in the ConfigStore --------------------------------------------------------
class _SchemaNode(ConfigNode):
    """A schema as the ConfigStore keeps it, shared rather than copied.

    Every Hydra composition deep-copies the whole ConfigStore (``CachingConfigRepository``),
    which with one schema per mode costs about a second, and a launcher that runs jobs in other
    processes pickles the ConfigStore into every job. A stored schema is never changed
    (``ConfigStore.load`` hands out a copy of it): copies share it, and its pickle names the
    schema class instead of holding the composed schema, so the receiving process uses its own
    node for the same class (built from the code, as a pickled function is). A class no pickle
    can name (one made at run time) is pickled with its node, whole."""

    schema: type | None = None  # None: a node unpickled by value

    def __deepcopy__(self, memo):
        return self

    def __copy__(self):  # what ConfigStore.load copies (then replaces the copy's node)
        copied = object.__new__(_SchemaNode)
        copied.__dict__.update(self.__dict__)
        return copied

    def __reduce__(self):
        if _importable(self.schema):
            named = (self.name, self.group, self.package, self.provider, self.schema)
            return _unpickled_schema_node, named
        return _SchemaNode, (self.name, self.node, self.group, self.package, self.provider)


def _importable(cls: type | None) -> bool:
    """``cls`` is its module's attribute of its name (a pickle can name it)."""
    found = sys.modules.get(getattr(cls, "__module__", ""))
    for part in getattr(cls, "__qualname__", "<none>").split("."):
        found = getattr(found, part, None)
    return cls is not None and found is cls


# (group, file name) -> this process's stored node of that schema
_SCHEMA_NODES: dict[tuple[str | None, str], _SchemaNode] = {}


def _schema_node(stored: ConfigNode, schema: type) -> _SchemaNode:
    node = _SchemaNode(**vars(stored))
    node.schema = schema
    return node


def _unpickled_schema_node(
    name: str, group: str | None, package: str | None, provider: str | None, schema: type
) -> _SchemaNode:
    """The node a pickled :class:`_SchemaNode` names: this process's own for the same class,
    or one built here for a class it did not store."""
    node = _SCHEMA_NODES.get((group, name))
    if node is not None and node.schema is schema:
        return node
    structured = OmegaConf.structured(schema)
    return _schema_node(ConfigNode(name, structured, group, package, provider), schema)


def store_schema(
    name: str, schema: type, *, group: str | None = None, package: str | None = None
) -> None:
    """``ConfigStore.store`` of ``schema`` as ``name`` (in ``group``), kept as a
    :class:`_SchemaNode`."""
    cs = ConfigStore.instance()
    cs.store(group=group, name=name, node=schema, package=package)
    file = f"{name}.yaml"
    folder = cs.repo if group is None else cs.repo[group]
    folder[file] = _SCHEMA_NODES[(group, file)] = _schema_node(folder[file], schema)


# ---- composing a sweep's jobs ------------------------------------------------------------------
def sweep_overrides(config: DictConfig) -> list:
    """The basic sweeper's overrides: sweep-file params, then the command line (which wins)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    params = dict(config.hydra.sweeper.get("params") or {})
    lines = [f"{k}={v}" for k, v in params.items()] + list(config.hydra.overrides.task)
    by_key = {o.get_key_element(): o for o in OverridesParser.create().parse_overrides(lines)}
    return list(by_key.values())


def job_overrides(config: DictConfig) -> list[list[str]]:
    """One override list per job, in the basic sweeper's order."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper

    batches = BasicSweeper.split_arguments(sweep_overrides(config), None)
    return [list(job) for batch in batches for job in batch]


class SweepComposer:
    """The configs of a sweep's jobs as Hydra's ``load_sweep_config`` composes them, each job once.

    Hydra composes every job twice (the sweeper checks that each can be composed, then the
    launcher composes it to run it), and each composition walks the whole defaults list again,
    though a sweep mostly varies plain values. Here the defaults are composed once per distinct
    choice of config groups (with the sweep's Hydra overrides), then a job's value overrides are
    applied and Hydra's bookkeeping of them redone: the override lists, ``override_dirname``, and
    (when a job's config is handed out) the master config's resolver cache. Which override names
    a group is decided as Hydra decides it (the config repository's groups; a dict value is
    always a value). Every job's config is kept, and each call returns a fresh copy. Tests
    compare jobs of the sweep files with Hydra's own composition.

    :meth:`install` puts it in place of the config loader's ``load_sweep_config`` for the rest
    of the sweep (the basic launcher composes in this process; the sweeper's check always does).
    """

    def __init__(self, loader, master: DictConfig) -> None:
        from hydra.core.override_parser.overrides_parser import OverridesParser

        self.loader, self.master = loader, master
        self.config_name = master.hydra.job.config_name
        self._parser = OverridesParser.create()
        self._repo = None
        self._bases: dict[tuple[str, ...], DictConfig] = {}
        self._jobs: dict[tuple[str, ...], DictConfig] = {}

    def _is_group(self, override) -> bool:
        if self._repo is None:  # the search path is the sweep's: its Hydra overrides decide it
            hydra_lines = list(self.master.hydra.overrides.hydra)
            _, self._repo = self.loader._parse_overrides_and_create_caching_repo(
                self.config_name, hydra_lines
            )
        return not isinstance(override.value(), dict) and self._repo.group_exists(
            override.key_or_group
        )

    def _compose(self, lines: tuple[str, ...]) -> DictConfig:
        from hydra._internal.config_loader_impl import ConfigLoaderImpl, get_overrides_dirname
        from hydra.types import RunMode

        parsed = self._parser.parse_overrides(list(lines))
        fixed = tuple(o.input_line for o in parsed if o.is_hydra_override() or self._is_group(o))
        if fixed not in self._bases:
            self._bases[fixed] = self.loader.load_configuration(
                config_name=self.config_name, overrides=list(fixed), run_mode=RunMode.RUN
            )
        cfg = copy.deepcopy(self._bases[fixed])
        # every value override, the sweep's Hydra ones again too, in order, as Hydra applies them
        values = [o for o in parsed if not self._is_group(o)]
        ConfigLoaderImpl._apply_overrides_to_config(values, cfg)
        task = [o for o in parsed if not o.is_hydra_override()]
        cfg.hydra.overrides.hydra = [o.input_line for o in parsed if o.is_hydra_override()]
        cfg.hydra.overrides.task = [o.input_line for o in task]
        names = cfg.hydra.job.config.override_dirname
        cfg.hydra.job.override_dirname = get_overrides_dirname(
            overrides=task,
            kv_sep=names.kv_sep,
            item_sep=names.item_sep,
            exclude_keys=names.exclude_keys,
        )
        return cfg

    def _lines(self, overrides: list[str]) -> tuple[str, ...]:
        return (*self.master.hydra.overrides.hydra, *overrides)

    def _kept(self, overrides: list[str]) -> DictConfig:
        lines = self._lines(overrides)
        if lines not in self._jobs:
            self._jobs[lines] = self._compose(lines)
        return self._jobs[lines]

    def kept(self, jobs: list[list[str]]) -> dict[tuple[str, ...], DictConfig]:
        """The configs composed so far of ``jobs`` (override lists), for :meth:`keep`."""
        lines = [self._lines(o) for o in jobs]
        return {k: self._jobs[k] for k in lines if k in self._jobs}

    def keep(self, composed: dict[tuple[str, ...], DictConfig]) -> None:
        """Take the jobs' configs another composer of this sweep made (:meth:`kept`)."""
        self._jobs.update(composed)

    def job(self, overrides: list[str], *, last: bool = False) -> DictConfig:
        """One job's config (with its ``hydra`` node), as ``load_sweep_config`` returns it: with
        the master config's resolver cache as it is now (the sweep folder's ``${now:...}``,
        resolved when the sweeper starts, is the same in every job). ``last``: no later call
        asks for this job (a launcher's worker runs each job once), so the kept config itself
        is handed out instead of a copy."""
        from omegaconf import OmegaConf

        if last:
            lines = self._lines(overrides)
            cfg = self._jobs.pop(lines, None)
            cfg = self._compose(lines) if cfg is None else cfg
        else:
            cfg = copy.deepcopy(self._kept(overrides))
        OmegaConf.copy_cache(from_config=self.master, to_config=cfg)
        return cfg

    def task(self, overrides: list[str]) -> DictConfig:
        """One job's task config: :meth:`job` without the ``hydra`` node, as a job sees it (a
        copy of the task's keys only: the ``hydra`` node is most of a config)."""
        from omegaconf import OmegaConf

        cfg = self._kept(overrides)
        return OmegaConf.masked_copy(cfg, [k for k in cfg if k != "hydra"])

    def install(self, *, once: bool = False) -> Callable[[], None]:
        """Answer the config loader's ``load_sweep_config`` calls for this sweep; returns the
        function that takes it away again. ``once``: each job is asked for once here (a launcher
        that composes the jobs in other processes leaves only the sweeper's check to this one):
        the kept configs are handed out themselves (:meth:`job`'s ``last``)."""
        self.loader.load_sweep_config = SweepLoad(self, once=once)

        def remove() -> None:
            self.loader.__dict__.pop("load_sweep_config", None)

        return remove


class SweepLoad:
    """The config loader's ``load_sweep_config`` while a :class:`SweepComposer` is installed.
    A launcher that ships the loader to other processes (joblib, Slurm) pickles it: there it is
    a :class:`ShippedLoad` that composes with a composer of its own (the kept configs stay
    here)."""

    def __init__(self, composer: SweepComposer, *, once: bool = False) -> None:
        self.composer, self.once = composer, once
        self.token = os.urandom(8).hex()  # this sweep, as the other processes tell it apart

    def __call__(self, master_config: DictConfig, sweep_overrides: list[str]) -> DictConfig:
        loader = self.composer.loader
        if master_config is not self.composer.master:
            return type(loader).load_sweep_config(loader, master_config, sweep_overrides)
        return self.composer.job(list(sweep_overrides), last=self.once)

    def composer_for(self, master_config: DictConfig) -> SweepComposer:
        """The sweep's composer (a joblib run with one worker calls here, in this process)."""
        return self.composer

    def enter(self, state: Any) -> None:
        """In the submitting process Hydra's state is already the sweep's: nothing to do."""

    def __reduce__(self):
        return ShippedLoad, (self.composer.loader, self.token)


def scan_plugins_once() -> None:
    """In a launcher's worker: scan Hydra's plugins once for the process's life.

    Hydra's joblib launcher restores the submitting process's Hydra state before every job
    (``Singleton.set_state``); that state leaves the plugin registry out, so each job builds it
    again, and the scan executes every plugin module anew (tens of milliseconds a job). The
    installed plugins do not change while a worker runs: the first scan's classes are
    registered again at each later rebuild (into that job's own registries, as before)."""
    from hydra.core.plugins import Plugins

    scan = Plugins.__dict__["_scan_all_plugins"]
    if getattr(scan.__func__, "memo", None) is not None:
        return
    memo: dict[tuple[str, ...], Any] = {}

    def scan_once(modules: list[Any]):
        key = tuple(m.__name__ for m in modules)
        if key not in memo:
            memo[key] = scan.__func__(modules)
        return memo[key]

    scan_once.memo = memo  # type: ignore[attr-defined]
    Plugins._scan_all_plugins = staticmethod(scan_once)


# A launcher's worker process (joblib's run many jobs each) keeps the composer of the sweep it
# works for, so it composes the defaults once per choice of groups, as the submitting process
# does; a new sweep's token replaces it.
_SHIPPED: dict[str, SweepComposer] = {}


class ShippedLoad:
    """``load_sweep_config`` of a config loader shipped to a launcher's worker: the master config
    arrives with every job (a fresh copy each time); the composer is the worker's own."""

    def __init__(self, loader, token: str) -> None:
        self.loader, self.token = loader, token

    def composer_for(self, master_config: DictConfig) -> SweepComposer:
        """This process's composer of the sweep, made at the sweep's first call here."""
        composer = _SHIPPED.get(self.token)
        if composer is None:
            scan_plugins_once()
            _SHIPPED.clear()
            composer = _SHIPPED[self.token] = SweepComposer(self.loader, master_config)
        composer.master = master_config  # its Hydra overrides and resolver cache
        return composer

    def __call__(self, master_config: DictConfig, sweep_overrides: list[str]) -> DictConfig:
        return self.composer_for(master_config).job(list(sweep_overrides), last=True)

    def enter(self, state: Any) -> None:
        """Put this worker under the Hydra ``state`` the launcher gives each job
        (:func:`hydra_state`), with the plugins scanned once."""
        from hydra.core.singleton import Singleton
        from hydra.core.utils import setup_globals

        scan_plugins_once()
        setup_globals()
        Singleton.set_state(state)

    def __reduce__(self):
        return ShippedLoad, (self.loader, self.token)


class SharedStore:
    """Values the jobs of one sweep share across the launcher's processes: one file per key in
    ``folder``, a pickle signed with the sweep's secret (HMAC-SHA256), so a file the sweep did
    not write is never unpickled. Written atomically; a missing, torn or foreign file reads as
    absent, and the job computes the value itself."""

    def __init__(self, folder: Path, secret: str) -> None:
        self.folder, self._secret = Path(folder), secret.encode()

    def _path(self, key: str) -> Path:
        return self.folder / f"{hashlib.sha256(key.encode()).hexdigest()[:32]}.pkl"

    def _mac(self, key: str, payload: bytes) -> bytes:
        return hmac.new(self._secret, key.encode() + b"\0" + payload, "sha256").digest()

    def get(self, key: str) -> Any | None:
        try:
            raw = self._path(key).read_bytes()
        except OSError:
            return None
        mac, payload = raw[:32], raw[32:]
        if not hmac.compare_digest(mac, self._mac(key, payload)):
            return None
        return pickle.loads(payload)

    def put(self, key: str, value: Any) -> None:
        from system.results import atomic_write_bytes

        payload = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
        self.folder.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(self._path(key), self._mac(key, payload) + payload)


SHARED = ".shared"  # the sweep folder's subfolder of shared values, removed at the sweep's end


def shared_store(name: str) -> SharedStore | None:
    """The running sweep's store ``name`` in a launcher's worker process (joblib's, a Slurm
    job): its secret is the sweep's token, which reaches a worker inside its jobs (in memory
    under joblib; in submitit's job files, the user's own, under Slurm), never in the store.
    None elsewhere (a single run; the serial launcher's jobs share one process)."""
    token = next(iter(_SHIPPED), None)
    if token is None or not is_multirun():
        return None
    from hydra.core.hydra_config import HydraConfig

    return SharedStore(Path(str(HydraConfig.get().sweep.dir)) / SHARED / name, token)
