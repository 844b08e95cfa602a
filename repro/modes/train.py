"""``mode=train``: real training on this machine's CPUs (gloo) or GPUs (NCCL).

``system=ours`` runs our runtime (repro/modes/train_ours.py); ``system=megatron`` and
``system=deepspeed`` run the real baselines (repro/modes/train_baseline.py).
"""

from __future__ import annotations

import importlib

from omegaconf import DictConfig

SYSTEMS = {"ours": "train_ours", "megatron": "train_baseline", "deepspeed": "train_baseline"}


def run(cfg: DictConfig) -> dict:
    system = "ours" if str(cfg.system) == "all" else str(cfg.system)
    if system not in SYSTEMS:
        raise ValueError(f"mode=train: unknown system {system!r}; known: {', '.join(SYSTEMS)}")
    return importlib.import_module(f"repro.modes.{SYSTEMS[system]}").run(cfg)
