"""Console setup for entry points: one rich logging handler, installed once, and the
``key=value`` arguments of the benchmark scripts."""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence

__all__ = ["setup_logging", "console", "parse_key_values"]

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


def parse_key_values(argv: Sequence[str], defaults: Mapping[str, str]) -> dict[str, str] | None:
    """``defaults`` updated by ``key=value`` arguments; None (after logging why) on a bad one.

    >>> parse_key_values(["seeds=0,1"], {"seeds": "0", "cases": "5"})
    {'seeds': '0,1', 'cases': '5'}
    >>> parse_key_values(["seed=1"], {"seeds": "0"}) is None
    True
    """
    cfg = dict(defaults)
    for arg in argv:
        key, _, value = arg.partition("=")
        if key not in defaults or not value:
            logging.getLogger(__name__).error(
                "argument %r: expected key=value with key in %s", arg, ", ".join(defaults)
            )
            return None
        cfg[key] = value
    return cfg
