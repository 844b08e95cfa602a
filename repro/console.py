"""Console setup for entry points: one rich logging handler, installed once."""

from __future__ import annotations

import logging
import os

__all__ = ["setup_logging", "console"]

_DONE = False


def console():
    from rich.console import Console

    return Console(stderr=False, highlight=False)


def setup_logging(level: str | None = None) -> None:
    global _DONE
    if _DONE:
        return
    from rich.logging import RichHandler

    lvl = level or os.environ.get("DTFM_LOG_LEVEL", "INFO")
    root = logging.getLogger()
    for h in list(root.handlers):  # Hydra installs its own handlers; keep one
        root.removeHandler(h)
    root.addHandler(RichHandler(show_path=False, rich_tracebacks=False, markup=False))
    root.setLevel(lvl)
    _DONE = True
