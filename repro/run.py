"""Main entry: ``python repro/run.py case=5 layers=40`` (Hydra; the only ``@hydra.main``).

``main()`` checks the config (:func:`repro.config.validate`: one line naming a bad key, exit 2,
before any work), then runs the mode through the sweep ledger (:func:`repro.collect.run_job`).
Inside a sweep a failing job is recorded in the ledger and the sweep goes on; the sweep's end
(:mod:`repro.callbacks`) reports and fails the command. ``run(cfg)`` does the work and is what
tests call. Modes are registered in :data:`repro.config.MODES` (``repro/modes/<mode>.py``).
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the checkout importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import hydra  # noqa: E402
from omegaconf import DictConfig  # noqa: E402

from repro.config import MODES, ConfigError, validate  # noqa: E402  (registers the schemas)

log = logging.getLogger("repro.run")

__all__ = ["MODES", "run", "dispatch", "main"]

# Errors of input or environment: one line, exit 2 (a bug elsewhere keeps its traceback).
USER_ERRORS = (ConfigError, ValueError, FileNotFoundError, NotADirectoryError, RuntimeError)


def dispatch(cfg: DictConfig) -> dict:
    """Run an already validated config's mode; returns its summary dict."""
    return MODES[str(cfg.mode)].runner()(cfg)


def run(cfg: DictConfig) -> dict:
    """Validate ``cfg`` for its mode and run it; returns the mode's summary dict."""
    return dispatch(validate(cfg))


@hydra.main(config_path="../conf", config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> None:
    from repro.collect import is_multirun, record_failure, run_job
    from repro.console import setup_logging

    setup_logging()
    multirun = is_multirun()
    try:
        typed = validate(cfg)
        run_job(typed, dispatch, multirun=multirun)
    except Exception as e:  # noqa: BLE001 - a sweep records every failure and goes on
        if multirun:
            log.error("job failed: %s: %s", type(e).__name__, e)
            record_failure(cfg, e)
            return
        if not isinstance(e, USER_ERRORS):
            raise
        log.error("%s", e)
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
