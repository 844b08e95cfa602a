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

__all__ = ["run", "main", "entry", "setup_logging", "log_level", "tolerate_encoding"]

CONF = str(Path(__file__).resolve().parents[1] / "conf")

# Errors of input or environment: one line, exit 2 (a bug elsewhere keeps its traceback). OSError
# covers the environment: a full disk, a read-only folder, a missing or unreadable file.
USER_ERRORS = (ConfigError, ValueError, OSError, RuntimeError)
# The entry process's id, in the name of its Hydra folder (conf/config.yaml): two runs started in
# the same second get two folders; a sweep's jobs (joblib, Slurm) inherit it with the environment.
RUN_TAG = "DTFM_RUN_TAG"


LOG_LEVEL = "DTFM_LOG_LEVEL"  # the root logger's level (default INFO)


def log_level(level: str | None = None) -> str:
    """``level``, else ``DTFM_LOG_LEVEL``, else INFO; a ValueError naming the variable when it
    is not one of logging's level names."""
    given = level or os.environ.get(LOG_LEVEL) or "INFO"
    names = [n for n in logging.getLevelNamesMapping() if n not in ("NOTSET", "WARN", "FATAL")]
    if given.upper() not in names:
        raise ValueError(f"{LOG_LEVEL}={given!r}: expected one of {', '.join(names)}")
    return given.upper()


def setup_logging(level: str | None = None) -> None:
    """One rich logging handler on the root logger (Hydra installs its own; they go)."""
    from rich.logging import RichHandler

    root = logging.getLogger()
    if not any(isinstance(h, RichHandler) for h in root.handlers):
        for h in list(root.handlers):
            root.removeHandler(h)
        root.addHandler(RichHandler(show_path=False, rich_tracebacks=False, markup=False))
    root.setLevel(log_level(level))


def tolerate_encoding() -> str | None:
    """Let stdout and stderr replace what their encoding cannot show (the tables print '×',
    '—', Greek letters) instead of failing a run after its rows are stored; returns the one
    warning line to show when stdout's encoding cannot show them, else None."""
    warning = None
    for stream in (sys.stdout, sys.stderr):
        encoding = getattr(stream, "encoding", None) or "ascii"
        try:
            "×—α".encode(encoding)
        except (UnicodeEncodeError, LookupError):
            if hasattr(stream, "reconfigure"):
                stream.reconfigure(errors="replace")
            if stream is sys.stdout:
                warning = (
                    f"warning: stdout's encoding {encoding} cannot show every character of the "
                    "tables: they print as '?' (set PYTHONIOENCODING=utf-8 to see them)"
                )
    return warning


def run(cfg: DictConfig | dict | RunConfig, *, multirun: bool = False) -> dict:
    """Validate ``cfg`` for its mode and run the mode as a job (:func:`repro.sweep.run_job`);
    returns the mode's summary dict. A single run of a mode that writes rows then builds the
    study's report, as a sweep does at its end (:func:`repro.sweep.finish_study`)."""
    from repro.sweep import finish_study, run_job

    typed = validate(cfg)
    spec = MODES[typed.mode]
    out = run_job(typed, spec.function(), multirun=multirun, ledger=spec.rows)
    if spec.rows and not multirun:
        finish_study(typed)
    return out


@hydra.main(config_path=CONF, config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> None:
    from repro.hydra_fast import is_multirun
    from repro.sweep import record_failure

    setup_logging()
    multirun = is_multirun()
    typed = None
    try:
        typed = validate(cfg)
        run(typed, multirun=multirun)
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


def entry() -> None:
    """The command line: checks what Hydra needs before it starts, then :func:`main`."""
    os.environ[RUN_TAG] = str(os.getpid())
    args = sys.argv[1:]
    warning = tolerate_encoding()
    if warning:
        print(warning, file=sys.stderr)
    try:
        log_level()
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    own_dir = any(a.startswith(("hydra.run.dir=", "hydra.sweep.dir=")) for a in args)
    if not own_dir and not os.access(os.getcwd(), os.W_OK) and "--help" not in args:
        print(
            f"error: the working folder {os.getcwd()} is not writable; Hydra keeps each run's "
            "log and config in outputs/ there: run from a writable folder or set "
            "hydra.run.dir=DIR (hydra.sweep.dir=DIR for -m)",
            file=sys.stderr,
        )
        sys.exit(2)
    main()


if __name__ == "__main__":
    entry()
