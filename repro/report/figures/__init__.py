"""Figures built from the tidy results tables (never from logs): Fig. 3 and Fig. 4 analogues."""

from __future__ import annotations

from pathlib import Path

__all__ = ["save_figure", "load_plotting"]


def load_plotting() -> None:
    """Import matplotlib (its file backend) now, so that the figures do not wait for it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot  # noqa: F401


def save_figure(fig, path: str | Path, dpi: int = 110) -> Path:
    """Save a matplotlib figure atomically (unique temporary file + rename) and close it."""
    import matplotlib.pyplot as plt

    from system.results import atomic_write

    path = Path(path)
    try:  # the temporary name ends in .tmp: the format comes from the target's suffix
        atomic_write(path, lambda tmp: fig.savefig(tmp, dpi=dpi, format=path.suffix.lstrip(".")))
    finally:
        plt.close(fig)
    return path
