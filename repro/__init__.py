"""The harness over ``system`` and ``baselines``:

- ``run.py`` — the entry (``python repro/run.py mode=NAME key=value ...``), the shared option
  machinery and mode registry (``config/``) and the sweep bookkeeping (``sweep.py``);
- ``modes/`` — the modes that run a model: simulate, schedule, train, emulate, plan;
- ``studies/`` — the science: attribution, sensitivity, the scheduler's studies, the registered
  validation, a peer's runs, the GPU calibration, quality;
- ``checks/`` — checks of the harness itself: benchmarks, the GPU check, the bad-input probes;
- ``report/`` — reports rebuilt from a study's stored rows.

A mode is one folder: ``config.py`` (its options) and ``run.py`` (its work). Importing this
package imports every mode's ``config.py`` and nothing of their work
(:func:`repro.config.base.discover_modes`), so every mode is registered, and stored with Hydra's
ConfigStore, before any of them is composed or run; a ``config.py`` imports only
:mod:`repro.config`, which imports no mode.

Importing ``baselines`` registers the frameworks' pipeline op orders with the simulator's event
replay, so ``simulate_1f1b_ring(schedule="megatron" | "deepspeed")`` resolves everywhere.
"""

import baselines  # noqa: F401
from repro.config.base import discover_modes, store_schemas

discover_modes()
store_schemas()
