"""``mode=train``: real training on this machine's CPUs (gloo) or GPUs (NCCL).

``system=ours`` runs our runtime (repro/modes/train_ours.py); ``system=megatron`` and
``system=deepspeed`` run the real baselines (repro/modes/train_baseline.py).
"""

from __future__ import annotations

import importlib

from omegaconf import DictConfig

from system.results import TRAINED_SYSTEMS

# the module that trains each system: our runtime, or a real baseline launch
RUNNERS = {s: "train_ours" if s == "ours" else "train_baseline" for s in TRAINED_SYSTEMS}


def run(cfg: DictConfig) -> dict:
    system = "ours" if str(cfg.system) == "all" else str(cfg.system)
    if system not in RUNNERS:
        known = ", ".join(RUNNERS)
        raise ValueError(f"mode=train: unknown system {system!r}; known: {known}")
    return importlib.import_module(f"repro.modes.{RUNNERS[system]}").run(cfg)
