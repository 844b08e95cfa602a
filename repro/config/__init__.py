"""The typed configuration of ``repro/run.py``: one dataclass per mode, checked before any work.

- :mod:`~repro.config.options`: how an option is declared (:func:`option`: type, default,
  help, range) and checked (:class:`Options`);
- :mod:`~repro.config.base`: the keys every mode shares (:class:`RunConfig`), the mode
  registry (:func:`register_mode`, :data:`MODES`) and :func:`validate`;
- :mod:`~repro.config.modes`: the modes that run a model (simulate, schedule, train, emulate);
- :mod:`~repro.config.studies`: the studies, benchmarks and validation steps;
- :mod:`~repro.config.reports`: the reports.
"""

from repro.config import modes, plan, reports, studies  # noqa: F401  (each registers its modes)
from repro.config.base import (
    MODES,
    LimitsConfig,
    ModeSpec,
    RunConfig,
    as_dict,
    default_of,
    default_results_dir,
    mode_help,
    register_mode,
    store_schemas,
    validate,
)
from repro.config.modes import (
    EmulateConfig,
    ScheduleConfig,
    SimulateConfig,
    TrainConfig,
    default_layout,
)
from repro.config.options import ConfigError, Options, choice, cpu_cores, group, option
from repro.config.reports import (
    CollectConfig,
    CompareBaselinesConfig,
    EmulationReportConfig,
    ReportConfig,
)
from repro.config.studies import (
    AttributionConfig,
    BenchHeteroConfig,
    BenchRuntimeConfig,
    BenchSchedulerConfig,
    BenchStoreConfig,
    BenchSweepConfig,
    CalibrateConfig,
    ExternalConfig,
    GpuCheckConfig,
    MeasureConfig,
    PredictConfig,
    ProbeInputsConfig,
    ProfileConfig,
    ReplanConfig,
    SchedulerAblationConfig,
    SchedulerWorthConfig,
    ScoreConfig,
    SensitivityConfig,
)
from repro.studies.quality_curves import config as _quality_curves  # noqa: F401

__all__ = [
    "MODES",
    "ConfigError",
    "LimitsConfig",
    "ModeSpec",
    "Options",
    "RunConfig",
    "as_dict",
    "choice",
    "cpu_cores",
    "default_layout",
    "default_of",
    "default_results_dir",
    "group",
    "mode_help",
    "option",
    "register_mode",
    "store_schemas",
    "validate",
    "SimulateConfig",
    "ScheduleConfig",
    "TrainConfig",
    "EmulateConfig",
    "AttributionConfig",
    "SchedulerWorthConfig",
    "SensitivityConfig",
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
    "ReportConfig",
    "CollectConfig",
    "EmulationReportConfig",
    "CompareBaselinesConfig",
]

store_schemas()
