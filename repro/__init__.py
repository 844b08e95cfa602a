"""Experiments, reports and the Hydra entry point over ``system`` and ``baselines``.

Importing ``baselines`` registers the frameworks' pipeline op orders with the simulator's event
replay, so ``simulate_1f1b_ring(schedule="megatron" | "deepspeed")`` resolves in every script.
"""

import baselines  # noqa: F401
