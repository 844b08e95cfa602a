"""The harness over ``system`` and ``baselines``, in four places:

- ``run.py`` — the entry (``python repro/run.py mode=NAME key=value ...``), with its typed
  configuration (``config/``) and the sweep bookkeeping (``sweep.py``);
- ``modes/`` — the modes that run a model: simulate, schedule, train, emulate;
- ``studies/`` — benchmarks, attribution, sensitivity, the scheduler's studies, the registered
  validation, the GPU check;
- ``report/`` — reports rebuilt from a study's stored rows.

Importing ``baselines`` registers the frameworks' pipeline op orders with the simulator's event
replay, so ``simulate_1f1b_ring(schedule="megatron" | "deepspeed")`` resolves everywhere.
"""

import baselines  # noqa: F401
