"""Tidy results: one row per run, written atomically, collected into runs.csv / runs.parquet.

Each run writes ``<results_dir>/rows/<run_id>.json`` (write to a temporary file, then rename, so
a crash never leaves half a row). :func:`collect` rebuilds ``runs.csv`` and ``runs.parquet`` from
all row files, again atomically. ``run_id`` is a stable hash of what identifies the run (its
resolved settings and repeat index), so a sweep started again can skip rows it already has.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import logging
import os
import subprocess
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path

import pandas as pd

log = logging.getLogger(__name__)

__all__ = ["SCHEMA_VERSION", "CORE_COLUMNS", "run_id_for", "make_row", "write_rows", "collect",
           "read_rows", "atomic_write_text", "has_row"]

SCHEMA_VERSION = 1
# Columns every row has (others may be added freely; never rename silently, bump the version).
CORE_COLUMNS = (
    "run_id", "study", "timestamp_utc", "git_sha", "git_dirty", "schema_version", "status",
    "mode", "system", "case", "num_devices", "num_layers", "global_batch_size",
    "micro_batch_size", "tp", "pp", "dp", "iter_time_s", "pflops",
)


def _git_state() -> tuple[str, bool]:
    root = Path(__file__).resolve().parents[1]
    try:
        sha = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True,
                             text=True, timeout=5).stdout.strip()
        dirty = bool(subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                                    cwd=root, capture_output=True, text=True, timeout=5).stdout.strip())
        return sha or "unknown", dirty
    except (OSError, subprocess.SubprocessError):
        return "unknown", False


_GIT = None


def run_id_for(key: Mapping) -> str:
    """Stable 16-hex id of a run from the settings that identify it (order-insensitive)."""
    blob = json.dumps(dict(key), sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def make_row(key: Mapping, **values) -> dict:
    """A row: identity columns + ``key`` (the identifying settings) + measured ``values``."""
    global _GIT
    if _GIT is None:
        _GIT = _git_state()
    row = {c: None for c in CORE_COLUMNS}
    row.update(dict(key))
    row.update(values)
    row["run_id"] = values.get("run_id") or run_id_for(key)
    row["timestamp_utc"] = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    row["git_sha"], row["git_dirty"] = _GIT
    row["schema_version"] = SCHEMA_VERSION
    row.setdefault("status", "ok")
    if row["status"] is None:
        row["status"] = "ok"
    return row


def atomic_write_text(path: str | Path, text: str) -> None:
    """Write ``text`` to ``path`` via a temporary file in the same folder and a rename."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _atomic_frame(df: pd.DataFrame, path: Path, kind: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        if kind == "csv":
            df.to_csv(tmp, index=False)
        else:
            df.to_parquet(tmp, index=False)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def has_row(results_dir: str | Path, run_id: str) -> bool:
    return (Path(results_dir) / "rows" / f"{run_id}.json").exists()


def write_rows(results_dir: str | Path, rows: Iterable[Mapping], *, collect_after: bool = True) -> Path:
    """Write each row to ``rows/<run_id>.json`` and rebuild the tables; returns runs.csv's path."""
    d = Path(results_dir)
    for row in rows:
        atomic_write_text(d / "rows" / f"{row['run_id']}.json", json.dumps(row, default=_jsonable) + "\n")
    return collect(d) if collect_after else d / "runs.csv"


def _jsonable(x):
    try:
        import numpy as np

        if isinstance(x, np.generic):
            return x.item()
        if isinstance(x, np.ndarray):
            return x.tolist()
    except ImportError:  # pragma: no cover
        pass
    return str(x)


def read_rows(results_dir: str | Path) -> pd.DataFrame:
    """All rows under ``results_dir/rows`` as a DataFrame (core columns first)."""
    files = sorted((Path(results_dir) / "rows").glob("*.json"))
    recs = [json.loads(f.read_text()) for f in files]
    df = pd.DataFrame.from_records(recs)
    if df.empty:
        return pd.DataFrame(columns=list(CORE_COLUMNS))
    extra = [c for c in df.columns if c not in CORE_COLUMNS]
    for c in CORE_COLUMNS:
        if c not in df.columns:
            df[c] = None
    return df[list(CORE_COLUMNS) + extra].sort_values(["timestamp_utc", "run_id"], kind="stable")


def collect(results_dir: str | Path) -> Path:
    """Rebuild ``runs.csv`` and ``runs.parquet`` from the row files; returns runs.csv's path."""
    d = Path(results_dir)
    df = read_rows(d)
    d.mkdir(parents=True, exist_ok=True)
    _atomic_frame(df, d / "runs.csv", "csv")
    # parquet needs one type per column: JSON-encode columns holding lists/dicts
    pq = df.copy()
    for c in pq.columns:
        if pq[c].map(lambda v: isinstance(v, (list, dict))).any():
            pq[c] = pq[c].map(lambda v: json.dumps(v) if isinstance(v, (list, dict)) else v)
    _atomic_frame(pq.convert_dtypes(), d / "runs.parquet", "parquet")
    log.info("collected %d rows into %s", len(df), d / "runs.csv")
    return d / "runs.csv"
