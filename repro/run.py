"""The entry: ``python repro/run.py [mode=NAME] [key=value ...]`` (also ``python -m repro``).

Hydra composes the chosen mode's typed config (:mod:`repro.config`; ``--help`` lists every mode
and the options of one), :func:`repro.config.validate` checks it (one line naming a bad key,
exit 2, before any work) and the mode runs through the sweep ledger (:func:`repro.sweep.run_job`).
Inside a sweep (``-m sweep=NAME``) a failing job is recorded and the sweep goes on; the sweep's
end (:class:`repro.sweep.WorkflowCallback`) reports and fails the command.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

import hydra
from omegaconf import DictConfig

from repro.config import MODES, ConfigError, RunConfig, validate

log = logging.getLogger("repro.run")

__all__ = ["run", "main", "setup_logging"]

CONF = str(Path(__file__).resolve().parents[1] / "conf")

# Errors of input or environment: one line, exit 2 (a bug elsewhere keeps its traceback).
USER_ERRORS = (ConfigError, ValueError, FileNotFoundError, NotADirectoryError, RuntimeError)


def setup_logging(level: str | None = None) -> None:
    """One rich logging handler on the root logger (Hydra installs its own; they go)."""
    from rich.logging import RichHandler

    root = logging.getLogger()
    for h in list(root.handlers):
        root.removeHandler(h)
    root.addHandler(RichHandler(show_path=False, rich_tracebacks=False, markup=False))
    root.setLevel(level or os.environ.get("DTFM_LOG_LEVEL", "INFO"))


def run(cfg: DictConfig | dict | RunConfig) -> dict:
    """Validate ``cfg`` for its mode and run the mode; returns its summary dict."""
    typed = validate(cfg)
    return dict(MODES[typed.mode].function()(typed) or {})


@hydra.main(config_path=CONF, config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> None:
    from repro.sweep import is_multirun, record_failure, run_job

    setup_logging()
    multirun = is_multirun()
    typed = None
    try:
        typed = validate(cfg)
        run_job(typed, run, multirun=multirun)
    except Exception as e:  # noqa: BLE001 - a sweep records every failure and goes on
        if multirun:
            log.error("job failed: %s: %s", type(e).__name__, e)
            if typed is not None:
                record_failure(typed, e)
            return
        if not isinstance(e, USER_ERRORS):
            raise
        log.error("%s", e)
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
