"""Main entry: ``python repro/run.py case=5 layers=40`` (Hydra; the only ``@hydra.main``).

``main()`` turns errors on bad input into one clear message; ``run(cfg)`` does the work and is
what tests call. Each mode lives in ``repro/modes/<mode>.py`` with a ``run(cfg) -> dict``.
"""

from __future__ import annotations

import importlib
import logging
import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the checkout importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import hydra
from omegaconf import DictConfig

MODES = ("simulate", "emulate", "train", "predict")
log = logging.getLogger("repro.run")


def run(cfg: DictConfig) -> dict:
    """Dispatch to the mode's ``run``; returns its summary dict."""
    mode = str(cfg.mode)
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; known: {', '.join(MODES)}")
    module = importlib.import_module(f"repro.modes.{mode}")
    return module.run(cfg)


@hydra.main(config_path="../conf", config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> None:
    from repro.console import setup_logging

    setup_logging()
    try:
        from repro.collect import run_job  # skips a job whose resolved config already finished

        run_job(cfg, run)
    except (ValueError, FileNotFoundError, RuntimeError) as e:
        log.error("%s", e)
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
