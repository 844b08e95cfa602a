"""A commit of this repository as a folder of its own, for studies that run two commits."""

from __future__ import annotations

import subprocess
from pathlib import Path

__all__ = ["ROOT", "short_rev", "materialise", "dirty"]

ROOT = Path(__file__).resolve().parents[2]


def short_rev(rev: str) -> str:
    """``rev`` as a short commit id (ValueError naming it when git does not know it)."""
    p = subprocess.run(
        ["git", "rev-parse", "--short", rev], cwd=ROOT, capture_output=True, text=True
    )
    if p.returncode:
        raise ValueError(f"{rev!r} is not a commit of this repository")
    return p.stdout.strip()


def materialise(rev: str, into: Path) -> None:
    """The tree of commit ``rev`` written into the new folder ``into`` (``git archive``)."""
    into.mkdir(parents=True)
    archive = subprocess.run(["git", "archive", rev], cwd=ROOT, capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)


def dirty() -> bool:
    """Whether this tree's tracked files differ from its commit."""
    p = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=no"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    return bool(p.stdout.strip())
