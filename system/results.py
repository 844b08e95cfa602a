"""The results store: one typed row per run, kept in ``<study>/runs.parquet`` and its parts.

A study folder holds:

* ``runs.parquet`` -- the consolidated table, committed with the study. Append-only: rows are
  added and never dropped; readers see the newest row of each setting (:func:`read_rows`), or
  every row ever written with ``history=True``.
* ``parts/*.parquet`` -- rows written since the last compaction, one immutable file per
  :func:`write_rows` call. A write types its rows, writes them to a fresh part (temporary file,
  ``fsync``, rename) and takes no lock, so its cost does not grow with the study and parallel
  sweep jobs (joblib workers, Slurm jobs on a shared filesystem) never wait for each other.
  Part names start with the write's time in nanoseconds, so sorted names are write order
  (across hosts as far as their clocks agree; the newest row is chosen by ``timestamp_utc``).
* ``runs.csv`` -- the newest row of each setting as text for people and diffs, rebuilt by
  every compaction.
* ``.lock`` -- the folder lock (``fcntl.flock``) held by a compaction (:func:`compact`,
  :func:`collect`).

**Reads** (:func:`read_rows`, :func:`run_ids`) merge the consolidated table with every part.
**Compaction** folds the parts into ``runs.parquet`` and rebuilds ``runs.csv`` under the lock:
the new table is written and ``fsync``-ed before the parts it holds are deleted. A crash after
the table is written and before its parts are gone leaves rows that exist twice; a row's key is
``(run_id, timestamp_utc)``, and a part's row whose key the consolidated table already holds is
dropped on read, so no row is ever counted twice and compacting again is harmless. Readers list
and read the parts before the consolidated table: a part deleted meanwhile was folded into the
table they read next. A single run compacts after its write (so ``runs.csv`` is current); a
sweep's jobs only write parts (:func:`deferred_collect`) and the sweep compacts once at the end.

**Schema.** :data:`COLUMNS` fixes one name and one type per concept (``final_loss``, not
``loss_last``; ``predicted_iter_time_s``, not ``sim_iter_time_s``; ``recompute``, not
``checkpointing``); :data:`RENAMED` maps the old spellings, so rows written by older code and
the parquet files of schema version 1 read back under the new names. Adding a column is one line
in :data:`COLUMNS`. A field not in the schema is still stored (as a float when every value is a
number, else as JSON text) and logged once, so a new field never breaks a run; the tests check
that the modes write declared fields only.

**Identity.** ``setting_id`` hashes the settings that identify a run (``key`` of
:func:`make_row`); ``run_id`` hashes them together with ``model_version``, a fingerprint of the
performance model's source (:func:`model_version`). A rerun with unchanged code finds its
``run_id`` and adds nothing; a rerun after a model change adds new rows that supersede the old
ones in every report, while the old ones stay in the file.

Why a source fingerprint and not a hand-bumped ``MODEL_VERSION`` constant: a constant is only as
good as the memory of whoever edits the simulator (the stale-row bug this replaces was exactly a
key that ignored the code), and a test fingerprinting the model to force the bump would need the
same hash anyway. Hashing the parsed syntax tree with docstrings removed (:mod:`ast`) ignores
comments, docstrings and formatting, so only code or data changes make a new version.

The core imports no pandas at module level (pandas is loaded by the functions that build tables).

One module (~920 lines): the schema, the model fingerprint and the store's reads and writes
are the one contract every row obeys; its readers and writers must agree on all three.
"""

from __future__ import annotations

import ast
import contextlib
import datetime as _dt
import fcntl
import functools
import hashlib
import json
import logging
import math
import os
import re
import secrets
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterable, Iterator, Mapping
from contextvars import ContextVar
from pathlib import Path

log = logging.getLogger(__name__)

__all__ = [
    "SCHEMA_VERSION",
    "COLUMNS",
    "CORE_COLUMNS",
    "RENAMED",
    "MODEL_SOURCES",
    "model_version",
    "run_id_for",
    "make_row",
    "write_rows",
    "read_rows",
    "run_ids",
    "has_row",
    "has_stored_rows",
    "collect",
    "compact",
    "deferred_collect",
    "PARTS",
    "study_lock",
    "BASELINE_SYSTEMS",
    "SIMULATED_SYSTEMS",
    "TRAINED_SYSTEMS",
    "atomic_write",
    "atomic_write_text",
    "atomic_write_bytes",
]

SCHEMA_VERSION = 2
ROOT = Path(__file__).resolve().parents[1]

# ---- schema ------------------------------------------------------------------------------------
# kind: "str" | "int" | "float" | "bool" | "json" (a list or dict, stored as JSON text)
_IDENTITY = {
    "run_id": "str",
    "setting_id": "str",
    "model_version": "str",
    "study": "str",
    "timestamp_utc": "str",
    "git_sha": "str",
    "git_dirty": "bool",
    "schema_version": "int",
    "status": "str",
    "error": "str",
}
_SETTING = {
    "mode": "str",
    "system": "str",
    "case": "str",
    "case_variant": "str",
    "model": "str",
    "num_devices": "int",
    "devices": "json",
    "num_layers": "int",
    "hidden_size": "int",
    "seq_length": "int",
    "vocab_size": "int",
    "global_batch_size": "int",
    "micro_batch_size": "int",
    "tp": "int",
    "pp": "int",
    "dp": "int",
    "zero": "int",
    "seed": "int",
    "repeat": "int",
    "iters": "int",
    "warmup_iters": "int",
    "device": "str",
    "layout": "json",
    "layout_seed": "json",
    "stages": "json",
    "dp_mode": "str",
    "recompute": "recompute",  # activation recomputation: full | selective | none
    "grid": "bool",
    "start": "str",
    "variant": "str",
    "config": "str",
    "is_best": "bool",
    "scheduler": "str",
    "scheduler_budget": "str",
    "world_size": "int",
    # baselines' rank map (baselines/placement.py): launch | topology (ours: scheduled | random)
    "placement": "str",
    # what a simulated repeat is: "deterministic copy" or "random layout" (ours_random)
    "repeat_kind": "str",
    "rank_map": "json",
    "placement_how": "str",
    # sensitivity knobs of the performance model, in a row only when changed from the default
    "compute_efficiency": "float",
    "link_sharing": "str",
    "baseline_transport": "str",
}
_MEASURED = {
    "iter_time_s": "float",
    "iter_times_s": "json",
    "pflops": "float",
    "tflops": "float",
    "tflops_per_device": "float",
    "tokens_per_s": "float",
    "mfu": "float",
    "memory_gib": "float",
    "compute_time_s": "float",
    "comm_time_s": "float",
    "comm_wait_time_s": "float",
    "dp_time_s": "float",
    "micro_batches": "int",
    "losses": "json",
    "loss_first": "float",
    "final_loss": "float",
    "wall_s": "float",
    "predicted_iter_time_s": "float",
    "sim_error": "float",
    "search_time_s": "float",
    "best_cost_s": "float",
    "search_trials": "int",
}
_SIMULATOR = {  # the simulator's breakdown (SimResult.breakdown, prefixed sim_)
    "sim_pipeline_s": "float",
    "sim_dp_sync_s": "float",
    "sim_dp_span_max_s": "float",
    "sim_optimizer_s": "float",
    "sim_rounds": "int",
    "sim_micro_batches": "int",
    "sim_micro_steps": "int",
    "sim_fwd_s": "float",
    "sim_bwd_s": "float",
    "sim_pp_link_max_s": "float",
    "sim_fwd_slot_max_s": "float",
    "sim_tp_allreduce_s": "float",
    "sim_grad_norm_s": "float",
    "sim_zero1_gather_s": "float",
    "sim_zero3_comm_per_step_s": "float",
    "sim_variant": "str",
    "sim_dp_s": "float",
    "sim_dp_span_s": "float",
    "sim_grad_norm_algo": "str",
    "sim_tied_embedding_s": "float",
}
_EMULATION = {
    "emu_bandwidth_scale": "float",
    "emu_delay_scale": "float",
    "emu_max_rate_gbps": "float",
    "emu_num_devices": "int",
    "emu_frame_overhead": "float",
    "emu_backend": "str",
    "emu_tcp_congestion_control": "str",
    "measured_dp_s": "float",
    "measured_wait_s": "float",
    "measured_compute_s": "float",
    "compute_fwd_s": "json",
    "compute_bwd_s": "json",
    "compute_opt_s": "json",
    "compute_share": "float",
    "verify_ok": "bool",
    "verify_max_rtt_err": "float",
    "verify_max_bw_err": "float",
    "verify_max_tcp_err": "float",
    "verify_file": "str",
    "verify_pairs": "json",
    "delayer_stats": "json",
    "delayer_mean_late_ms": "float",
    "delayer_max_late_ms": "float",
    "scaled_bandwidth_gbps": "json",
    "scaled_delay_ms": "json",
    "iter_time_after_first_s": "float",
    "load_avg_1m_start": "float",  # the machine's 1-minute load average when the run started
    "load_avg_1m_end": "float",  # ... and when it ended (2 shared cores: the cause of spreads)
}
COLUMNS: dict[str, str] = {**_IDENTITY, **_SETTING, **_MEASURED, **_SIMULATOR, **_EMULATION}
# Columns every table has, in this order (others follow in first-seen order).
CORE_COLUMNS = (
    "run_id",
    "setting_id",
    "model_version",
    "study",
    "timestamp_utc",
    "git_sha",
    "git_dirty",
    "schema_version",
    "status",
    "mode",
    "system",
    "case",
    "num_devices",
    "num_layers",
    "global_batch_size",
    "micro_batch_size",
    "tp",
    "pp",
    "dp",
    "iter_time_s",
    "pflops",
)
# Old spelling -> the schema's (read and write both translate).
RENAMED = {
    "loss_last": "final_loss",
    "sim_iter_time_s": "predicted_iter_time_s",
    "checkpointing": "recompute",
}
# skipped: a topology-placement point whose rank map is launch order (the launch row stands)
STATUSES = ("ok", "error", "timeout", "oom", "invalid", "skipped")
# Values of the ``system`` column, spelled once: the two baselines (launched by baselines/), our
# system, and ours with uniformly random layouts (the paper's "random" bars; simulated only).
BASELINE_SYSTEMS = ("megatron", "deepspeed")
TRAINED_SYSTEMS = ("ours", *BASELINE_SYSTEMS)
SIMULATED_SYSTEMS = ("ours", "ours_random", *BASELINE_SYSTEMS)

# The performance model: whatever can change a simulated number (globs relative to the repo).
MODEL_SOURCES = (
    "system/cluster.py",
    "system/cases.py",
    "system/assignment.py",
    "system/gpus.py",
    "system/workload.py",
    "system/data/*.csv",
    "system/cost/*.py",
    "system/scheduler/*.py",
    "system/simulator/**/*.py",
    "baselines/space.py",
    "baselines/placement.py",
    "baselines/*/perf.py",
    "baselines/*/schedule.py",
    "baselines/worker.py",
)


# ---- identity ----------------------------------------------------------------------------------
def _source_digest(path: Path) -> bytes:
    """A file's content as the model sees it: Python without comments/docstrings, else bytes."""
    raw = path.read_bytes()
    if path.suffix != ".py":
        return raw
    tree = ast.parse(raw)
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (
            isinstance(body, list)
            and body
            and isinstance(body[0], ast.Expr)
            and isinstance(body[0].value, ast.Constant)
            and isinstance(body[0].value.value, str)
        ):
            node.body = body[1:] or [ast.Pass()]
    return ast.dump(tree, annotate_fields=False).encode()


@functools.cache
def model_version(root: str | None = None) -> str:
    """12-hex fingerprint of :data:`MODEL_SOURCES` under ``root`` (default: this checkout)."""
    base = Path(root) if root else ROOT
    files = sorted({p for pattern in MODEL_SOURCES for p in base.glob(pattern) if p.is_file()})
    h = hashlib.sha256()
    for p in files:
        h.update(p.relative_to(base).as_posix().encode() + b"\0" + _source_digest(p) + b"\0")
    return h.hexdigest()[:12]


def run_id_for(key: Mapping) -> str:
    """Stable 16-hex id of a mapping (order-insensitive; values as JSON)."""
    blob = json.dumps(dict(key), sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _git_state() -> tuple[str, bool]:
    try:
        run = functools.partial(subprocess.run, cwd=ROOT, capture_output=True, text=True, timeout=5)
        sha = run(["git", "rev-parse", "--short", "HEAD"]).stdout.strip()
        dirty = bool(run(["git", "status", "--porcelain", "--untracked-files=no"]).stdout.strip())
        return sha or "unknown", dirty
    except (OSError, subprocess.SubprocessError):
        return "unknown", False


_GIT: tuple[str, bool] | None = None


def _rename(fields: Mapping) -> dict:
    out = {}
    for k, v in fields.items():
        new = RENAMED.get(k, k)
        if new in out and k != new:  # both spellings given: the schema's wins
            continue
        out[new] = v
    return out


def make_row(key: Mapping, **values) -> dict:
    """A row: identity columns + ``key`` (the settings that identify it) + measured ``values``.

    ``case`` is always text (``"5"``, ``"debug"``, ``"local"``); old field names are renamed.
    """
    global _GIT
    if _GIT is None:
        _GIT = _git_state()
    key = _rename(key)
    if "case" in key and key["case"] is not None:
        key["case"] = str(key["case"])
    row = {c: None for c in CORE_COLUMNS}
    row.update(key)
    row.update(_rename(values))
    mv = model_version()
    row["setting_id"] = run_id_for(key)
    row["model_version"] = mv
    row["run_id"] = values.get("run_id") or run_id_for({**key, "model_version": mv})
    row["timestamp_utc"] = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="microseconds")
    row["git_sha"], row["git_dirty"] = _GIT
    row["schema_version"] = SCHEMA_VERSION
    if row.get("status") is None:
        row["status"] = "ok"
    return row


# ---- typing ------------------------------------------------------------------------------------
def _scalar(v):
    """numpy scalars/arrays to Python; NaN stays a float."""
    if hasattr(v, "item") and getattr(v, "ndim", 1) == 0:
        return v.item()
    if hasattr(v, "tolist"):
        return v.tolist()
    return v


def _is_missing(v) -> bool:
    if v is None:
        return True
    try:
        import pandas as pd

        return v is pd.NA or v is pd.NaT
    except ImportError:  # pragma: no cover
        return False


RECOMPUTE = ("full", "selective", "none")


def _coerce(column: str, kind: str, v):
    """``v`` as the column's kind, or ValueError naming the column and value."""
    v = _scalar(v)
    if _is_missing(v) or (kind != "float" and isinstance(v, float) and math.isnan(v)):
        return None
    if kind == "recompute":  # a train run's on/off flag (and schema-1 booleans) is full or none
        if isinstance(v, bool) or (isinstance(v, int) and v in (0, 1)):
            return "full" if v else "none"
        if v in RECOMPUTE:
            return v
        raise ValueError(f"results column {column!r} holds one of {RECOMPUTE}, got {v!r}")
    bad = ValueError(
        f"results column {column!r} holds {kind} values, got {v!r} ({type(v).__name__})"
    )
    if kind == "json":
        if isinstance(v, str):
            return v
        return json.dumps(v, default=str)
    if isinstance(v, (list, dict, tuple)):
        raise bad
    if kind == "str":
        return str(v)
    if kind == "bool":
        if isinstance(v, bool):
            return v
        if isinstance(v, int) and v in (0, 1):
            return bool(v)
        raise bad
    if kind == "int":
        if isinstance(v, bool):
            raise bad
        if isinstance(v, int):
            return v
        if isinstance(v, float) and math.isfinite(v) and v.is_integer():
            return int(v)
        if isinstance(v, float) and math.isnan(v):
            return None
        raise bad
    if kind == "float":
        if isinstance(v, bool):
            raise bad
        if isinstance(v, (int, float)):
            return float(v)
        if isinstance(v, str):
            try:
                return float(v)
            except ValueError:
                raise bad from None
        raise bad
    raise AssertionError(kind)


_DTYPES = {
    "recompute": "string",
    "str": "string",
    "int": "Int64",
    "float": "Float64",
    "bool": "boolean",
    "json": "string",
}
_WARNED: set[str] = set()


def _kind_of_extra(values: list) -> str:
    vals = [_scalar(v) for v in values if not _is_missing(v)]
    if vals and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in vals):
        return "float"
    if vals and all(isinstance(v, bool) for v in vals):
        return "bool"
    if all(isinstance(v, str) for v in vals):
        return "str"
    return "json"


def _frame(records: list[dict]):
    """A DataFrame with one dtype per column (the schema's, or inferred once for extras)."""
    import pandas as pd

    names: dict[str, None] = dict.fromkeys(CORE_COLUMNS)
    for r in records:
        names.update(dict.fromkeys(r))
    data = {}
    for c in names:
        values = [r.get(c) for r in records]
        kind = COLUMNS.get(c)
        if kind is None:
            kind = _kind_of_extra(values)
            if c not in _WARNED:
                _WARNED.add(c)
                log.warning(
                    "results column %r is not in the schema (system/results.py COLUMNS): "
                    "stored as %s",
                    c,
                    kind,
                )
        data[c] = pd.array([_coerce(c, kind, v) for v in values], dtype=_DTYPES[kind])
    return pd.DataFrame(data, index=pd.RangeIndex(len(records)))


# ---- files -------------------------------------------------------------------------------------
def _fsync_dir(d: Path) -> None:
    """Make a rename in ``d`` durable (a no-op where directories cannot be opened)."""
    try:
        fd = os.open(d, os.O_RDONLY)
    except OSError:  # pragma: no cover - platforms without directory file descriptors
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: str | Path, write, *, durable: bool = False) -> None:
    """``write(tmp_path)`` then rename over ``path``; the temporary name is unique.

    ``durable``: ``fsync`` the file before the rename and the folder after it, so the new
    content survives a crash of the machine once this returns.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        write(tmp)
        if durable:
            with open(tmp, "rb+") as f:
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    if durable:
        _fsync_dir(path.parent)


def atomic_write_text(path: str | Path, text: str) -> None:
    """Write ``text`` to ``path`` via a uniquely named temporary file in its folder + rename."""
    atomic_write(Path(path), lambda tmp: Path(tmp).write_text(text))


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    atomic_write(Path(path), lambda tmp: Path(tmp).write_bytes(data))


@contextlib.contextmanager
def study_lock(
    results_dir: str | Path, name: str = ".lock", timeout_s: float = 300.0
) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``results_dir/name``; wait at most ``timeout_s`` for it.

    The lock goes with the process: a killed holder releases it, so no stale lock remains.
    Raises TimeoutError naming the lock file when another process holds it for longer.
    """
    d = Path(results_dir)
    if d.exists() and not d.is_dir():
        raise NotADirectoryError(f"results folder {d} is a file")
    d.mkdir(parents=True, exist_ok=True)
    with open(d / name, "a") as f:
        deadline = time.monotonic() + timeout_s
        while True:  # bounded by the deadline
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise TimeoutError(
                        f"{d / name} is held by another process for over {timeout_s:.0f} s"
                    ) from None
                time.sleep(0.05)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _upgrade(df):
    """Schema-1 tables (and rows/ JSON of the old store) under schema-2 names and types."""
    df = df.rename(columns={k: v for k, v in RENAMED.items() if k in df and v not in df})
    for old, new in RENAMED.items():  # both spellings present: fill the new one from the old
        if old in df and new in df:
            df[new] = df[new].where(df[new].notna(), df[old])
            df = df.drop(columns=[old])
    if "setting_id" not in df:
        df["setting_id"] = df["run_id"]  # schema 1's run_id hashed the same key, without a version
    if "model_version" not in df:
        df["model_version"] = "unknown"
    records = [
        {k: v for k, v in r.items() if not _is_missing_val(v)} for r in df.to_dict("records")
    ]
    for r in records:
        if r.get("case") is not None:
            r["case"] = str(r["case"])
    return records


def _is_missing_val(v) -> bool:
    if isinstance(v, float) and math.isnan(v):
        return True
    return _is_missing(v)


PARTS = "parts"  # the folder of a study's part files
_HOST = re.sub(r"[^A-Za-z0-9.-]", "_", socket.gethostname()) or "host"
# Set while a sweep job runs (:func:`deferred_collect`): writes add parts, the sweep compacts.
_DEFER: ContextVar[bool] = ContextVar("results_deferred_collect", default=False)


def _folder(d: Path) -> Path:
    if d.exists() and not d.is_dir():
        raise NotADirectoryError(f"results folder {d} is a file")
    return d


def _parts(d: Path) -> list[Path]:
    """The study's part files, oldest first (names start with the write time in ns)."""
    folder = d / PARTS
    if not folder.is_dir():
        return []
    # a write's temporary file starts with "." and ends with ".tmp": not a part yet
    return sorted(p for p in folder.iterdir() if p.suffix == ".parquet" and p.name[0] != ".")


def _read_part(f: Path):
    """A part as a DataFrame, or None when a compaction deleted it after it was listed."""
    import pandas as pd

    try:
        return pd.read_parquet(f)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:  # pyarrow's ArrowInvalid is a ValueError
        raise ValueError(f"results part {f} is unreadable: {e}") from e


def _row_key(r: Mapping) -> tuple[str, str]:
    """What identifies one written row: its run id and the microsecond it was made."""
    return str(r.get("run_id")), str(r.get("timestamp_utc") or "")


def _load(d: Path, parts: list[Path] | None = None) -> list[dict]:
    """Every stored row of a study, oldest first: ``runs.parquet``, the old store's rows/
    JSON, then ``parts`` (default: every part now) less the rows the table already holds.
    One dict per row: the path for old-schema tables and rows/ (:func:`_table` is the fast
    path for tables in the current schema, and gives the same frame)."""
    import pandas as pd

    # Parts first: a part deleted after this read was folded into the table read below.
    from_parts: list[dict] = []
    for f in _parts(d) if parts is None else parts:
        df = _read_part(f)
        if df is not None:
            from_parts += _upgrade(df)
    records: list[dict] = []
    pq = d / "runs.parquet"
    if pq.exists():
        records += _upgrade(pd.read_parquet(pq))
    if from_parts:
        folded = {_row_key(r) for r in records}  # copies left by a compaction cut short
        from_parts = [r for r in from_parts if _row_key(r) not in folded]
    legacy = sorted((d / "rows").glob("*.json")) if (d / "rows").is_dir() else []
    if legacy:
        known = {r["run_id"] for r in records + from_parts}
        old = [json.loads(f.read_text()) for f in legacy]
        old = [r for r in old if r.get("run_id") not in known]
        if old:
            records += _upgrade(pd.DataFrame.from_records([_rename(r) for r in old]))
    return records + from_parts


def _latest(records: list[dict]) -> list[dict]:
    """The newest row of each setting (by timestamp, then position)."""
    best: dict[str, tuple[str, int]] = {}
    for i, r in enumerate(records):
        k = r.get("setting_id") or r["run_id"]
        t = str(r.get("timestamp_utc") or "")
        if k not in best or (t, i) >= best[k]:
            best[k] = (t, i)
    keep = sorted(i for _, i in best.values())
    return [records[i] for i in keep]


def _view(records: list[dict]):
    df = _frame(records)
    extra = [c for c in df.columns if c not in CORE_COLUMNS]
    return df[list(CORE_COLUMNS) + extra]


def _as_typed(df):
    """A table read from a file in this schema's types: as read when every schema column has
    its dtype and no old spelling is left (a table this code wrote), else upgraded row by row
    (:func:`_upgrade`)."""
    names = set(df.columns)
    current = (
        {"setting_id", "model_version"} <= names
        and not names & set(RENAMED)
        and all(str(df[c].dtype) == _DTYPES[COLUMNS[c]] for c in names if c in COLUMNS)
    )
    return df if current else _frame(_upgrade(df))


def _tidy(df):
    """The records path's view of a typed frame, column by column: columns empty in every row
    dropped (core columns kept), core columns first, then the others in order of their first
    value, an extra column's kind inferred from all its values (as :func:`_frame` does)."""
    import pandas as pd

    extra = [c for c in df.columns if c not in CORE_COLUMNS]
    filled = df[extra].notna()
    extra = [c for c in extra if filled[c].any()]
    first = {c: int(filled[c].to_numpy().argmax()) for c in extra}
    extra.sort(key=lambda c: first[c])  # stable: file order among columns first filled together
    data = {}
    for c in (*CORE_COLUMNS, *extra):
        col = df[c] if c in df else pd.Series(pd.NA, index=df.index, dtype=object)
        kind = COLUMNS.get(c)
        if kind is None:
            values = [None if _is_missing_val(v) else v for v in col.tolist()]
            kind = _kind_of_extra(values)
            data[c] = pd.array([_coerce(c, kind, v) for v in values], dtype=_DTYPES[kind])
        elif str(col.dtype) != _DTYPES[kind]:
            data[c] = pd.array([_coerce(c, kind, v) for v in col.tolist()], dtype=_DTYPES[kind])
        else:
            data[c] = col.array
    return pd.DataFrame(data, index=pd.RangeIndex(len(df)))


def _keys_of(df) -> list[tuple[str, str]]:
    stamps = df["timestamp_utc"].fillna("").astype(str)
    return list(zip(df["run_id"].astype(str), stamps, strict=True))


def _table(d: Path, parts: list[Path] | None = None):
    """Every stored row of a study as one typed frame, oldest first: what :func:`_load` reads,
    without a Python object per value for tables in the current schema."""
    import pandas as pd

    if (d / "rows").is_dir():  # the old store's row files: the records path
        return _view(_load(d, parts))
    # Parts first: a part deleted after this read was folded into the table read below.
    from_parts = [_read_part(f) for f in (_parts(d) if parts is None else parts)]
    from_parts = [_as_typed(df) for df in from_parts if df is not None and len(df)]
    frames = []
    pq = d / "runs.parquet"
    if pq.exists():
        frames.append(_as_typed(pd.read_parquet(pq)))
    if from_parts and frames:
        folded = set(_keys_of(frames[0]))  # copies left by a compaction cut short
        from_parts = [df[[k not in folded for k in _keys_of(df)]] for df in from_parts]
    frames += from_parts
    if not frames:
        return _view([])
    typed = {c: _DTYPES[k] for c, k in COLUMNS.items()}
    names = dict.fromkeys(c for df in frames for c in df.columns)
    aligned = [
        df.reindex(columns=list(names)).astype(
            {c: typed[c] for c in names if c in typed and c not in df}
        )
        for df in frames
    ]
    return _tidy(pd.concat(aligned, ignore_index=True) if len(aligned) > 1 else aligned[0])


def _latest_of(df):
    """The newest row of each setting (by timestamp, then position), as :func:`_latest`."""
    import pandas as pd

    order = pd.DataFrame(
        {
            "k": df["setting_id"].fillna(df["run_id"]).astype(str).to_numpy(),
            "t": df["timestamp_utc"].fillna("").astype(str).to_numpy(),
            "i": range(len(df)),
        }
    )
    keep = order.sort_values(["t", "i"]).drop_duplicates("k", keep="last")["i"].sort_values()
    return _tidy(df.iloc[keep.to_numpy()].reset_index(drop=True))


def read_rows(results_dir: str | Path, *, history: bool = False):
    """The study's rows as a typed DataFrame: the newest per setting, or all with ``history``.
    Parts not yet compacted are read too."""
    table = _table(Path(results_dir))
    df = table if history else _latest_of(table)
    return df.sort_values(["timestamp_utc", "run_id"], kind="stable").reset_index(drop=True)


@functools.lru_cache(maxsize=4096)
def _ids_in(path: str, stamp: tuple[int, int, int]) -> frozenset[str]:
    """The run ids of one parquet file; ``stamp`` (inode, mtime, size) keys the cache, so a
    replaced table is read again and an immutable part only once."""
    import pandas as pd

    return frozenset(pd.read_parquet(path, columns=["run_id"])["run_id"].dropna().astype(str))


def _file_ids(f: Path) -> frozenset[str]:
    try:
        st = f.stat()
        return _ids_in(str(f), (st.st_ino, st.st_mtime_ns, st.st_size))
    except FileNotFoundError:  # a part folded into runs.parquet meanwhile (read after)
        return frozenset()


def run_ids(results_dir: str | Path) -> set[str]:
    """Every ``run_id`` stored in the study (any model version), parts included. Reads the
    ``run_id`` column only, once per file version: a sweep job asks before and after it runs."""
    d = Path(results_dir)
    ids: set[str] = set()
    for f in _parts(d):  # parts first, as in _load
        ids |= _file_ids(f)
    ids |= _file_ids(d / "runs.parquet")
    if (d / "rows").is_dir():  # the old store's row files
        ids |= {r["run_id"] for r in _load(d)}
    return ids


def has_row(results_dir: str | Path, run_id: str) -> bool:
    return run_id in run_ids(results_dir)


def has_stored_rows(results_dir: str | Path) -> bool:
    """Whether the study has a table, a part or old row files (anything to collect)."""
    d = Path(results_dir)
    return (d / "runs.parquet").exists() or bool(_parts(d)) or (d / "rows").is_dir()


def _write_tables(d: Path, full) -> Path:
    atomic_write(d / "runs.parquet", lambda tmp: full.to_parquet(tmp, index=False), durable=True)
    latest = _latest_of(full)
    atomic_write(d / "runs.csv", lambda tmp: latest.to_csv(tmp, index=False))
    return d / "runs.csv"


@contextlib.contextmanager
def deferred_collect() -> Iterator[None]:
    """While inside, :func:`write_rows` only adds parts (a sweep job: the sweep compacts)."""
    token = _DEFER.set(True)
    try:
        yield
    finally:
        _DEFER.reset(token)


def write_rows(
    results_dir: str | Path, rows: Iterable[Mapping], *, collect_after: bool | None = None
) -> Path:
    """Store ``rows`` as one new part of the study; returns the path of ``runs.csv``.

    Rows are typed first, so a bad value raises before anything is written. The part is
    written without the study lock (its name is unique). ``collect_after``: compact afterwards
    (default: yes, unless inside :func:`deferred_collect`), so ``runs.csv`` shows the rows.
    A row whose ``run_id`` is already stored replaces nothing: it is added and wins as the
    newest. No rows and no table yet: the header-only tables are written.
    """
    d = _folder(Path(results_dir))
    rows = [dict(r) for r in rows]
    frame = _view(rows)  # type check before writing
    if rows:
        name = f"{time.time_ns():020d}-{_HOST}-{os.getpid()}-{secrets.token_hex(4)}.parquet"
        atomic_write(d / PARTS / name, lambda tmp: frame.to_parquet(tmp, index=False), durable=True)
        log.info("%s: +%d rows", d / PARTS / name, len(rows))
    if collect_after is None:
        collect_after = not _DEFER.get()
    if collect_after or not has_stored_rows(d):
        return compact(d)
    return d / "runs.csv"


def _current_schema(pq: Path) -> bool:
    """Whether a table has this schema's identity columns and none of the old spellings
    (reads the file's footer only)."""
    import pyarrow.parquet as papq

    names = set(papq.read_schema(pq).names)
    return {"setting_id", "model_version"} <= names and not names & set(RENAMED)


def _fold(d: Path, *, force: bool) -> Path:
    """Under the study lock: fold the current parts into the tables, then delete them."""
    with study_lock(d):
        parts = _parts(d)
        pq, csv = d / "runs.parquet", d / "runs.csv"
        current = (
            pq.exists()
            and csv.exists()
            and csv.stat().st_mtime_ns >= pq.stat().st_mtime_ns
            and not (d / "rows").is_dir()
            and _current_schema(pq)
        )
        if parts or force or not current:
            full = _table(d, parts)
            log.info("%s: %d rows stored, %d parts folded in", pq, len(full), len(parts))
            _write_tables(d, full)  # runs.parquet durable before any part goes
        for f in parts:
            f.unlink(missing_ok=True)
        return csv


def compact(results_dir: str | Path) -> Path:
    """Fold the study's parts into ``runs.parquet`` and rebuild ``runs.csv`` (under the folder
    lock); nothing is rewritten when there are no parts and the tables are current. Returns
    the path of ``runs.csv``. Safe to repeat, and safe after a compaction cut short."""
    return _fold(_folder(Path(results_dir)), force=False)


def collect(results_dir: str | Path) -> Path:
    """Rewrite ``runs.parquet`` (schema upgraded, parts and old ``rows/*.json`` folded in) +
    ``runs.csv``; returns the path of ``runs.csv``."""
    return _fold(_folder(Path(results_dir)), force=True)
