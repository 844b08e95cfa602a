"""Figures built from the tidy results tables (never from logs): Fig. 3 and Fig. 4 analogues."""

from __future__ import annotations

from pathlib import Path

__all__ = ["save_figure"]


def save_figure(fig, path: str | Path, dpi: int = 110) -> Path:
    """Save a matplotlib figure atomically (temporary file + rename) and close it."""
    import os
    import tempfile

    import matplotlib.pyplot as plt

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # a unique temporary name: two processes drawing the same figure never share one
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}.", suffix=path.suffix)
    os.close(fd)
    tmp = Path(name)
    try:
        fig.savefig(tmp, dpi=dpi)
        tmp.replace(path)
    finally:
        plt.close(fig)
        tmp.unlink(missing_ok=True)
    return path
