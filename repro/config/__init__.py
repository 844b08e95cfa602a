"""The typed configuration of ``repro/run.py``: the shared option machinery and the mode registry.

- :mod:`~repro.config.options`: how an option is declared (:func:`option`: type, default,
  help, range) and checked (:class:`Options`);
- :mod:`~repro.config.base`: the keys every mode shares (:class:`RunConfig`), the mode
  registry (:func:`register_mode`, :data:`MODES`) and :func:`validate`;
- :mod:`~repro.config.shared`: option blocks several modes take (case, model, layout, the
  scheduler's search, local runs) and the enums of their values.

A mode's own options live beside its code, in the ``config.py`` of its folder
(``repro/modes/<name>/``, ``repro/studies/<name>/``, ``repro/checks/<name>/``; the reports' in
``repro/report/config.py``). Those files import this package, which imports none of them: the
``repro`` package's ``__init__`` imports them (:func:`~repro.config.base.discover_modes`), so
importing anything of ``repro`` registers every mode before Hydra composes.
"""

from repro.config.base import (
    MODES,
    LimitsConfig,
    ModeSpec,
    RunConfig,
    as_dict,
    default_of,
    default_results_dir,
    discover_modes,
    mode_help,
    register_mode,
    store_schemas,
    validate,
)
from repro.config.options import ConfigError, Options, choice, cpu_cores, group, option

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
    "default_of",
    "default_results_dir",
    "discover_modes",
    "group",
    "mode_help",
    "option",
    "register_mode",
    "store_schemas",
    "validate",
]
