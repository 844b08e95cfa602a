"""The results store: one typed row per run, kept in ``<study>/runs.parquet`` and its parts.

A study folder holds:

* ``runs.parquet`` -- the consolidated table, committed with the study. Append-only: readers see
  the newest row of each setting (:func:`read_rows`), or every row ever written with
  ``history=True``.
* ``parts/*.parquet`` -- rows written since the last compaction, one immutable file per
  :func:`write_rows` call (temporary file, ``fsync``, rename; no lock, so parallel sweep jobs on
  one machine or a shared filesystem never wait for each other). Part names start with the
  write's time in nanoseconds, so sorted names are write order; the newest row of a setting is
  chosen by ``timestamp_utc``.
* ``runs.csv`` -- the newest row of each setting as text, rebuilt by every compaction. A folder
  with ``runs.csv`` and no ``runs.parquet`` is read from it (:func:`_table_file`).
* ``.lock`` -- the lock (``fcntl.flock``) a compaction holds (:func:`compact`, :func:`collect`).

**Reads** (:func:`read_rows`, :func:`run_ids`) merge the table with every part, listing the parts
first (a part deleted meanwhile was folded into the table read next). Every read opens a file once
and reads that handle (:func:`_opened`): a compaction replaces ``runs.parquet`` by a rename and an
open handle keeps the version it opened, whereas reading by path can mix one version's footer
with the next one's data. Readers take no lock, so they never wait and need no write access.
**Compaction** folds the parts into ``runs.parquet`` under the lock, ``fsync``-ing the new table
before deleting the parts it holds, and removes temporary files older than
:data:`STALE_TMP_AGE_S` (writers killed before their rename). A row's key is
``(run_id, timestamp_utc)``; a part's row already in the table is dropped on read, so a crash
between the two steps counts no row twice. A single run compacts after its write; a sweep's jobs
only write parts (:func:`deferred_collect`) and the sweep compacts once at the end.

The row itself (columns, types, ``setting_id``, ``run_id``, ``model_version``) is defined in
:mod:`system.schema`. No pandas at module level (the functions that build tables load it).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import fcntl
import functools
import json
import logging
import math
import os
import re
import secrets
import shutil
import socket
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextvars import ContextVar
from pathlib import Path

# the schema's public names are re-exported: writers import make_row and COLUMNS from here
from system.schema import (  # noqa: F401
    _DTYPES,
    BASELINE_SYSTEMS,
    COLUMNS,
    CORE_COLUMNS,
    MODEL_SOURCES,
    RENAMED,
    SCHEMA_VERSION,
    SIMULATED_SYSTEMS,
    STATUSES,
    TRAINED_SYSTEMS,
    _coerce,
    _frame,
    _is_missing,
    _kind_of_extra,
    _rename,
    make_row,
    make_rows,
    model_version,
    run_id_for,
)

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
    "make_rows",
    "write_rows",
    "read_rows",
    "count_rows",
    "run_ids",
    "current_run_ids",
    "current_of",
    "run_id_sets",
    "has_row",
    "has_stored_rows",
    "collect",
    "compact",
    "compacting",
    "read_parts_ahead",
    "fold_here",
    "deferred_collect",
    "PARTS",
    "STALE_TMP_AGE_S",
    "study_lock",
    "BASELINE_SYSTEMS",
    "SIMULATED_SYSTEMS",
    "TRAINED_SYSTEMS",
    "atomic_write",
    "atomic_write_text",
    "atomic_write_bytes",
    "path_in",
    "write_set",
]


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


def _umask() -> int:
    """This process's umask, read without changing it (``os.umask`` sets it for every thread
    while it is read); 0o022, the usual default, where /proc does not say."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    return 0o022


def _new_file_mode(path: Path) -> int:
    """The mode a replaced ``path`` keeps, or what ``open(path, "w")`` would give a new one
    (0o666 less the umask: 0644 with the usual umask, readable by a team sharing a folder)."""
    try:
        return path.stat().st_mode & 0o7777
    except OSError:
        return 0o666 & ~_umask()


def _named(e: OSError, path: Path) -> OSError:
    """``e`` again, its message naming the file that could not be written (one line)."""
    why = e.strerror or str(e).splitlines()[0]
    return type(e)(e.errno, f"could not write {path}: {why}") if e.errno else e


def atomic_write(path: str | Path, write, *, durable: bool = False) -> None:
    """``write(tmp_path)`` then rename over ``path``; the temporary name is unique.

    The file gets the mode an ordinary write would give it (:func:`_new_file_mode`), not the
    temporary file's private 0600. ``durable``: ``fsync`` the file before the rename and the
    folder after it, so the new content survives a crash of the machine once this returns.
    """
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as e:
        raise _named(e, path) from e
    os.close(fd)
    try:
        write(tmp)
        os.chmod(tmp, _new_file_mode(path))
        if durable:
            with open(tmp, "rb+") as f:
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as e:  # a full disk, a quota, a read-only folder: one line naming the file
        Path(tmp).unlink(missing_ok=True)
        raise _named(e, path) from e
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    if durable:
        _fsync_dir(path.parent)


def path_in(results_dir: str | Path, *parts: str) -> Path:
    """``results_dir / parts``, or a ValueError when it would leave ``results_dir`` (an
    absolute part, ``..``, a symlink out): every results file of a run stays in its folder."""
    base = Path(results_dir)
    out = base.joinpath(*parts)
    root = base.resolve()
    if not out.resolve().is_relative_to(root) or out.resolve() == root:
        raise ValueError(f"{'/'.join(parts)!r} is not a file name inside the results folder {base}")
    return out


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


# ---- output sets -------------------------------------------------------------------------------
# A set's staging folder is ".<name>.new-<random>" inside the folder it goes to; one a killed
# writer left is deleted by the next write of the same set once it is this old (a live writer
# finishes its set in minutes at most).
STALE_SET_AGE_S = 3600.0
# the store's own files: never a member of an output set, never deleted as a stale one
_STORE_FILES = frozenset({"runs.parquet", "runs.csv", "parts", "rows", "jobs"})
SET_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}")


def _set_manifest(folder: Path, name: str) -> Path:
    return folder / f".{name}.set"


def _previous_set(folder: Path, name: str) -> set[str]:
    """The file names the set's last write put in ``folder`` (its manifest), none if unknown."""
    try:
        names = json.loads(_set_manifest(folder, name).read_text())
    except (OSError, ValueError):
        return set()
    return {
        n
        for n in names
        if isinstance(n, str) and "/" not in n and n[:1] not in ("", ".") and n not in _STORE_FILES
    }


def _remove_stale_staging(folder: Path, name: str) -> None:
    now_s = time.time()
    for old in folder.glob(f".{name}.new-*"):
        try:
            if now_s - old.stat().st_mtime > STALE_SET_AGE_S:
                shutil.rmtree(old, ignore_errors=True)
        except FileNotFoundError:
            continue


@contextlib.contextmanager
def write_set(
    folder: str | Path, *, name: str = "report", owns: Iterable[str] = ()
) -> Iterator[Path]:
    """Write a set of output files whole: ``with write_set(folder, name=...) as stage:`` yields a
    fresh, empty staging folder inside ``folder``; write every file of the set into ``stage``
    under its final name. When the block ends without an exception the set replaces the
    previous one in ``folder``: each file is renamed into place (one atomic rename per file, the
    ``.md`` files last, so a report appears after the tables it links), then every file of the
    previous set that the new one lacks is deleted. The previous set is the file names of
    ``owns`` together with those the set's last write recorded in ``folder/.<name>.set``, so a
    file the new run does not make (an ``errors.csv`` of a run without measurements) never
    stays beside the new files. An exception in the block deletes the staging folder and leaves
    ``folder`` as it was: a failing run never touches the previous set.

    Why a staging folder and renames rather than swapping a whole folder: a set shares its
    folder with other files (a study's ``runs.parquet``, notes, other modes' sets), and the
    committed results keep their files at fixed paths. Readers therefore see the previous set
    until the set is complete, then, within the few renames of the swap, the new one; two writes
    of the same set (``name``) swap one after the other (under the lock ``.<name>.set.lock``), so
    the folder never ends with a mix of two runs' files. A process killed during the renames
    leaves a mix that the next write of the set replaces whole. Only plain files are a set's
    members; ``name`` is a plain name (it names the staging folder, lock and manifest)."""
    if not SET_NAME.fullmatch(name):
        raise ValueError(f"output set name {name!r}: a plain name (letters, digits, '_.-')")
    d = _folder(Path(folder))
    try:
        d.mkdir(parents=True, exist_ok=True)
        stage = Path(tempfile.mkdtemp(dir=d, prefix=f".{name}.new-"))
    except OSError as e:
        raise _named(e, d) from e
    try:
        yield stage
        members = sorted(stage.iterdir(), key=lambda p: (p.suffix == ".md", p.name))
        odd = [p.name for p in members if p.is_symlink() or not p.is_file()]
        if odd:
            raise ValueError(f"output set {name!r}: {', '.join(odd)} in {stage} is not a file")
        with study_lock(d, f".{name}.set.lock"):
            new = {p.name for p in members}
            clash = sorted(new & _STORE_FILES)
            if clash:
                raise ValueError(f"output set {name!r}: {', '.join(clash)} is the store's file")
            stale = (_previous_set(d, name) | (set(owns) - _STORE_FILES)) - new
            for p in members:
                os.replace(p, d / p.name)
            for n in sorted(stale):
                target = d / n
                if target.is_file() and not target.is_symlink():
                    target.unlink(missing_ok=True)
            atomic_write_text(_set_manifest(d, name), json.dumps(sorted(new)) + "\n")
            _fsync_dir(d)
            _remove_stale_staging(d, name)
    finally:
        shutil.rmtree(stage, ignore_errors=True)


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
# A compaction deletes a temporary file in parts/ (".<part name>.<random>.tmp", left by a writer
# killed between creating it and the rename) once it has not been modified for this long. Why a
# live writer loses nothing: write_rows creates, writes, fsyncs and renames the file in one call
# that takes seconds, so a file untouched for an hour belongs to a dead writer, with a margin far
# above the clock difference between the host that set the mtime (the file server, on a shared
# filesystem) and the compacting host. Even a writer stalled for longer (a suspended job) loses
# no row silently: its fsync or rename finds the file gone and write_rows raises. The age alone
# decides because the host and pid in the name cannot: another host's processes are invisible
# here, a container sharing the host name has its own pid namespace, and pids are reused.
STALE_TMP_AGE_S = 3600.0
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


_CSV_WARNED: set[str] = set()


def _table_file(d: Path) -> Path:
    """The file that holds the study's consolidated rows: ``runs.parquet``; where only its text
    view ``runs.csv`` is left (the table deleted, or a folder copied without it) the text view
    stands in, so the study is neither stuck nor silently emptied: every read takes its rows
    (the newest row of each setting; the superseded ones went with the table) and the next
    compaction writes ``runs.parquet`` from them and the parts."""
    pq = d / "runs.parquet"
    csv = d / "runs.csv"
    if pq.exists() or not csv.is_file():
        return pq
    if str(d) not in _CSV_WARNED:
        _CSV_WARNED.add(str(d))
        log.warning(
            "%s has runs.csv but no runs.parquet: its rows are read from runs.csv (the newest "
            "row of each setting) and runs.parquet is rebuilt from them",
            d,
        )
    return csv


def _csv_frame(fh, f: Path, columns: list[str] | None = None):
    """A ``runs.csv`` read back in the schema's types (text columns kept as text: a run id of
    digits keeps its leading zeros); only ``columns`` when given."""
    import pyarrow as pa
    import pyarrow.csv as pacsv

    arrow = {"str": pa.string(), "json": pa.string(), "recompute": pa.string()}
    arrow |= {"int": pa.int64(), "float": pa.float64(), "bool": pa.bool_()}
    try:
        table = pacsv.read_csv(
            fh,
            convert_options=pacsv.ConvertOptions(
                column_types={c: arrow[k] for c, k in COLUMNS.items()},
                strings_can_be_null=True,
                include_columns=columns,
            ),
        )
    except (pa.ArrowInvalid, KeyError) as e:
        lines = str(e).strip().splitlines() or [type(e).__name__]
        raise ValueError(f"results text view {f} is unreadable: {lines[0]}") from e
    return table.to_pandas()


@contextlib.contextmanager
def _opened(f: Path, what: str = "results table") -> Iterator:
    """``f`` opened once for reading (FileNotFoundError when it is gone). Every read of a
    table goes through one handle: a compaction replacing the file meanwhile (a rename) leaves
    the handle on the file it opened, where reading by path could read the footer of one file
    and the data of the next."""
    try:
        fh = open(f, "rb")
    except FileNotFoundError:
        raise
    except OSError as e:  # a folder named like a table, no permission
        raise ValueError(f"{what} {f} is unreadable: {e.strerror or e}") from e
    with fh:
        yield fh


def _read_table(f: Path, *, columns: list[str] | None = None, what: str = "results table"):
    """``f`` as a DataFrame (only ``columns`` when given), read through one handle
    (:func:`_opened`); a one-line ValueError naming the file when it is not a readable parquet
    file or not a results table (no ``run_id`` column)."""
    with _opened(f, what) as fh:
        return _read_handle(fh, f, columns=columns, what=what)


def _read_handle(fh, f: Path, *, columns: list[str] | None = None, what: str = "results table"):
    """:func:`_read_table` of the open file ``fh`` (``f``: its name, for messages)."""
    import pandas as pd

    try:
        if f.suffix == ".csv":  # runs.csv standing in for a missing table (_table_file)
            df = _csv_frame(fh, f, columns)
        else:
            df = pd.read_parquet(fh, columns=columns)
    except (OSError, ValueError, KeyError) as e:  # pyarrow's ArrowInvalid is a ValueError
        lines = str(e).strip().splitlines() or [type(e).__name__]
        if columns and "run_id" in columns and "run_id" in lines[0]:
            raise ValueError(f"{what} {f} is not a results table: it has no run_id column") from e
        raise ValueError(f"{what} {f} is unreadable: {lines[0]}") from e
    if "run_id" not in df.columns:
        names = ", ".join(map(str, df.columns[:8])) or "none"
        raise ValueError(
            f"{what} {f} is not a results table: it has no run_id column (columns: {names})"
        )
    return df


# Parts read ahead of their fold (:func:`read_parts_ahead`), or kept by the process that wrote
# them (:func:`fold_here`), by path: (stamp, frame).
_AHEAD: dict[str, tuple[tuple[int, int, int], object]] = {}
# The studies (resolved folders) whose parts this process writes and then folds itself.
_FOLDS_HERE: set[str] = set()


def _read_part(f: Path):
    """A part as a DataFrame, or None when a compaction deleted it after it was listed."""
    ahead = _AHEAD.pop(str(f), None)
    if ahead is not None and ahead[0] == _stamp_of(f):
        return ahead[1]
    try:
        return _read_table(f, what="results part")
    except FileNotFoundError:
        return None


@contextlib.contextmanager
def fold_here(results_dirs: Iterable[str | Path]) -> Iterator[None]:
    """While inside, :func:`write_rows` keeps the frame of each part it writes to one of
    ``results_dirs`` for the next fold (:func:`compact`), which then does not read back what
    this process has just written: for a process whose jobs write parts that it compacts
    itself (a serial sweep). A kept part is used only while the file still has the stamp it
    had when written."""
    dirs = {str(Path(d).resolve()) for d in results_dirs} - _FOLDS_HERE
    _FOLDS_HERE.update(dirs)
    try:
        yield
    finally:
        _FOLDS_HERE.difference_update(dirs)


def read_parts_ahead(results_dir: str | Path) -> int:
    """Read the study's parts this process has not read yet and keep them for the next fold
    (:func:`compact`): for a process that waits while others write parts (a sweep's launcher's
    workers). A part is kept with its stamp (inode, mtime, size) and used only while the file
    still has it. Returns how many parts it read."""
    d = Path(results_dir)
    n = 0
    for f in _parts(d):
        stamp = _stamp_of(f)
        have = _AHEAD.get(str(f))
        if stamp is None or (have is not None and have[0] == stamp):
            continue
        df = _read_part(f)
        if df is not None and _stamp_of(f) == stamp:
            _AHEAD[str(f)] = (stamp, df)
            n += 1
    return n


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
    pq = _table_file(d)
    if pq.exists():
        records += _upgrade(_read_table(pq))
    if from_parts:
        folded = {_row_key(r) for r in records}  # copies left by a compaction cut short
        from_parts = [r for r in from_parts if _row_key(r) not in folded]
    legacy = sorted((d / "rows").glob("*.json")) if (d / "rows").is_dir() else []
    if legacy:
        known = {r["run_id"] for r in records + from_parts}
        old = [_legacy_row(f) for f in legacy]
        old = [r for r in old if r.get("run_id") not in known]
        if old:
            records += _upgrade(pd.DataFrame.from_records([_rename(r) for r in old]))
    return records + from_parts


def _legacy_row(path: Path) -> dict:
    """One row file of the old store (a JSON object); a ValueError naming the file otherwise."""
    try:
        row = json.loads(path.read_text())
    except (OSError, ValueError) as e:  # unreadable, not UTF-8, not JSON
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise ValueError(f"{path}: a row file of the old store, unreadable: {first}") from None
    if not isinstance(row, dict):
        raise ValueError(
            f"{path}: a row file of the old store holds one JSON object, not a {type(row).__name__}"
        )
    return row


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
        and all(str(t) == _DTYPES[COLUMNS[c]] for c, t in df.dtypes.items() if c in COLUMNS)
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


# The table this process last wrote per study, by the written file's stamp (inode, mtime,
# size): a sweep's end folds its parts into runs.parquet and its report reads the rows at once.
_WRITTEN: dict[str, tuple[tuple[int, int, int], object]] = {}


def _stamp_of(f: Path) -> tuple[int, int, int] | None:
    try:
        st = f.stat()
    except FileNotFoundError:
        return None
    return st.st_ino, st.st_mtime_ns, st.st_size


def _table(d: Path, parts: list[Path] | None = None):
    """Every stored row of a study as one typed frame, oldest first: what :func:`_load` reads,
    without a Python object per value for tables in the current schema. A table this process
    wrote and nobody changed since is not read back (a shallow copy: pandas copies on write)."""
    import pandas as pd

    if (d / "rows").is_dir():  # the old store's row files: the records path
        return _view(_load(d, parts))
    pq = d / "runs.parquet"
    written = _WRITTEN.get(str(pq))
    if written is not None and not (_parts(d) if parts is None else parts):
        if _stamp_of(pq) == written[0]:
            return written[1].copy(deep=False)
    # Parts first: a part deleted after this read was folded into the table read below.
    from_parts = [_read_part(f) for f in (_parts(d) if parts is None else parts)]
    from_parts = [_as_typed(df) for df in from_parts if df is not None and len(df)]
    frames = []
    table = _table_file(d)
    if table.exists():
        frames.append(_as_typed(_read_table(table)))
    if from_parts and frames:
        folded = set(_keys_of(frames[0]))  # copies left by a compaction cut short
        from_parts = [df[[k not in folded for k in _keys_of(df)]] for df in from_parts]
    frames += from_parts
    if not frames:
        return _view([])
    names = list(dict.fromkeys(c for df in frames for c in df.columns))
    aligned = [_with_columns(df, names) for df in frames]
    return _tidy(pd.concat(aligned, ignore_index=True) if len(aligned) > 1 else aligned[0])


def _with_columns(df, names: list[str]):
    """``df`` with the columns ``names``, in that order: one it lacks is all missing, of the
    schema's dtype (an extra column: float64, filled as NaN)."""
    import pandas as pd

    lacks = [c for c in names if c not in df.columns]
    if not lacks:
        return df[names]
    missing = {
        c: pd.Series(index=df.index, dtype=_DTYPES[COLUMNS[c]] if c in COLUMNS else "float64")
        for c in lacks
    }
    return pd.concat([df, pd.DataFrame(missing, index=df.index)], axis=1)[names]


def _setting_keys(df):
    """Each row's setting: its ``setting_id`` (a table of schema 1 has none: its run id)."""
    return df["setting_id"].fillna(df["run_id"]).astype(str)


def _latest_of(df):
    """The newest row of each setting (by timestamp, then position)."""
    import pandas as pd

    settings = _setting_keys(df)
    if not settings.duplicated().any():  # one row per setting: each is its setting's newest
        return _tidy(df)
    order = pd.DataFrame(
        {
            "k": settings.to_numpy(),
            "t": df["timestamp_utc"].fillna("").astype(str).to_numpy(),
            "i": range(len(df)),
        }
    )
    keep = order.sort_values(["t", "i"]).drop_duplicates("k", keep="last")["i"].sort_values()
    return _tidy(df.iloc[keep.to_numpy()].reset_index(drop=True))


def read_rows(
    results_dir: str | Path, *, history: bool = False, columns: Iterable[str] | None = None
):
    """The study's rows as a typed DataFrame: the newest per setting, or all with ``history``;
    of ``columns`` only (those the study has, in its order) when given. Parts not yet compacted
    are read too."""
    table = _table(Path(results_dir))
    df = table if history else _latest_of(table)
    if columns is not None:  # before the sort, which copies every column it is given
        wanted = {*columns, "timestamp_utc", "run_id"}
        df = df[[c for c in df.columns if c in wanted]]
    df = df.take(_time_order(df)).reset_index(drop=True)
    if columns is not None:
        wanted = set(columns)
        df = df[[c for c in df.columns if c in wanted]]
    return df


def _time_order(df):
    """The positions of ``df``'s rows by ``timestamp_utc``, then ``run_id`` (a stable sort,
    missing values last): Arrow sorts the two text columns as one table, in a fraction of the
    time pandas takes to sort by two keys."""
    import pyarrow as pa
    import pyarrow.compute as pc

    keys = pa.table(
        {k: pa.array(df[k].array, type=pa.string()) for k in ("timestamp_utc", "run_id")}
    )
    return pc.sort_indices(
        keys, sort_keys=[("timestamp_utc", "ascending"), ("run_id", "ascending")]
    ).to_numpy()


def count_rows(results_dir: str | Path) -> int:
    """How many rows :func:`read_rows` returns (and ``runs.csv`` holds once compacted): one per
    setting stored. Only the settings' keys are counted: of the table this process last wrote,
    while nobody has changed it, else of each file's key columns."""
    import pandas as pd

    d = Path(results_dir)
    if (d / "rows").is_dir():  # the old store's row files: the full read
        return len(read_rows(d))
    parts = _parts(d)
    pq = d / "runs.parquet"
    written = _WRITTEN.get(str(pq))
    if written is not None and not parts and _stamp_of(pq) == written[0]:
        return int(_setting_keys(written[1]).nunique())
    settings = [_file_settings(f) for f in (*parts, _table_file(d))]  # parts first, as _table
    return int(pd.concat(settings, ignore_index=True).nunique())


def _file_settings(f: Path):
    """Each row's setting (:func:`_setting_keys`) in the file ``f``; none when it is gone (a
    part folded into the table read after it)."""
    import pandas as pd

    try:
        with _opened(f) as fh:
            names = set(_schema_names(fh, f))
            fh.seek(0)
            df = _read_handle(fh, f, columns=[c for c in ("run_id", "setting_id") if c in names])
    except FileNotFoundError:
        return pd.Series([], dtype=object)
    return _setting_keys(df) if "setting_id" in df else df["run_id"].astype(str)


# What was read of one version of a file, by (what, path, inode, mtime, size): a replaced table
# is read again, an immutable part only once. The stamp is the open handle's (os.fstat), so
# what is cached under it is what that file holds.
_BY_VERSION: dict[tuple, object] = {}
_BY_VERSION_MAX = 4096


def _per_version(what: str, f: Path, read, empty):
    """``read(handle)`` of the file ``f`` now, cached per file version; ``empty`` when the file
    is gone (a part folded into runs.parquet meanwhile: read after, by every caller)."""
    try:
        with _opened(f) as fh:
            st = os.fstat(fh.fileno())
            key = (what, str(f), st.st_ino, st.st_mtime_ns, st.st_size)
            got = _BY_VERSION.get(key)
            if got is None:
                got = read(fh, f)
                while len(_BY_VERSION) >= _BY_VERSION_MAX:
                    _BY_VERSION.pop(next(iter(_BY_VERSION)), None)
                _BY_VERSION[key] = got
            return got
    except FileNotFoundError:
        return empty


def _ids_of(fh, f: Path) -> frozenset[str]:
    """The run ids of one parquet file."""
    return frozenset(_read_handle(fh, f, columns=["run_id"])["run_id"].dropna().astype(str))


def _file_ids(f: Path) -> frozenset[str]:
    return _per_version("ids", f, _ids_of, frozenset())


def run_id_sets(results_dir: str | Path) -> list[frozenset[str]]:
    """:func:`run_ids` as one set per file, not joined (each read once per file version): what a
    sweep job takes before it runs, at a cost that grows with the files, not the rows."""
    d = Path(results_dir)
    sets = [_file_ids(f) for f in _parts(d)]  # parts first, as in _load
    sets.append(_file_ids(_table_file(d)))
    if (d / "rows").is_dir():  # the old store's row files
        sets.append(frozenset(r["run_id"] for r in _load(d)))
    return sets


def run_ids(results_dir: str | Path) -> set[str]:
    """Every ``run_id`` stored in the study (any model version), parts included. Reads the
    ``run_id`` column only, once per file version."""
    return set().union(*run_id_sets(results_dir))


def _file_keys_of(fh, f: Path) -> list[tuple[str, str, str]]:
    """(run_id, setting_id, timestamp_utc) of every row of one parquet file (cached per file
    version by :func:`_file_keys`); a table of schema 1 (no ``setting_id``) keys each row by its
    run id."""
    names = set(_schema_names(fh, f))
    fh.seek(0)
    cols = [c for c in ("run_id", "setting_id", "timestamp_utc") if c in names]
    df = _read_handle(fh, f, columns=cols)
    run = df["run_id"].astype(str)
    setting = df["setting_id"].fillna(df["run_id"]).astype(str) if "setting_id" in df else run
    stamp_s = (
        df["timestamp_utc"].fillna("").astype(str)
        if "timestamp_utc" in df
        else run.map(lambda _: "")
    )
    return list(zip(run, setting, stamp_s, strict=True))


def current_run_ids(results_dir: str | Path) -> set[str]:
    """The run ids of the rows the study reports: the newest row of each setting (as
    :func:`read_rows`). A run whose ``run_id`` is stored but superseded (its topology file was
    edited and edited back, or its code version came back) is not current: it must be written
    again to be reported, not skipped."""
    d = Path(results_dir)
    if (d / "rows").is_dir():  # the old store's row files: the full read
        return set(read_rows(d)["run_id"].astype(str))

    keys = _file_keys
    # Parts first, as every read here does: a part deleted after this read was folded into the
    # table read next. Ties in time go the way read_rows breaks them (table rows first).
    from_parts = [k for f in _parts(d) for k in keys(f)]
    newest: dict[str, tuple[str, int, str]] = {}
    for order, (run, setting, stamp) in enumerate([*keys(_table_file(d)), *from_parts]):
        if setting not in newest or (stamp, order) >= newest[setting][:2]:
            newest[setting] = (stamp, order, run)
    return {run for _, _, run in newest.values()}


def _file_keys(f: Path) -> list[tuple[str, str, str]]:
    """:func:`_file_keys_of` the file ``f`` now (none when it is gone)."""
    return _per_version("keys", f, _file_keys_of, [])


def _newest_of(fh, f: Path) -> dict[str, tuple[str, int, str]]:
    """Per setting of one parquet file: (timestamp, position, run id) of its newest row, ties to
    the later row."""
    out: dict[str, tuple[str, int, str]] = {}
    for i, (run, setting, stamp_s) in enumerate(_file_keys_of(fh, f)):
        if setting not in out or (stamp_s, i) >= out[setting][:2]:
            out[setting] = (stamp_s, i, run)
    return out


def current_of(results_dir: str | Path, settings) -> dict[str, str]:
    """The run id of the row the study reports for each of ``settings`` (setting ids) that has a
    stored row: the newest, as :func:`current_run_ids` decides. The work grows with the number
    of settings asked and of files in the study, not with its rows: what a sweep job asks of a
    large study."""
    d = Path(results_dir)
    if (d / "rows").is_dir():  # the old store's row files: the full read
        current = current_run_ids(d)
        rows = read_rows(d)
        rows = rows[rows["run_id"].astype(str).isin(current)]
        have = dict(zip(rows["setting_id"].astype(str), rows["run_id"].astype(str), strict=True))
        return {s: have[s] for s in settings if s in have}

    def index(f: Path) -> dict:
        return _per_version("newest", f, _newest_of, {})

    # parts first, then the table, ranked table first: the order current_run_ids reads them in
    parts = [index(f) for f in _parts(d)]
    files = [index(_table_file(d)), *parts]
    wanted = set(settings)
    newest: dict[str, tuple[str, int, int, str]] = {}
    for rank, idx in enumerate(files):
        for s in idx.keys() & wanted:  # a set operation: a fresh sweep's settings are in none
            got = idx[s]
            if s not in newest or (got[0], rank, got[1]) >= newest[s][:3]:
                newest[s] = (got[0], rank, got[1], got[2])
    return {s: v[3] for s, v in newest.items()}


def has_row(results_dir: str | Path, run_id: str) -> bool:
    return run_id in run_ids(results_dir)


def has_stored_rows(results_dir: str | Path) -> bool:
    """Whether the study has a table (or its text view alone), a part or old row files
    (anything to collect)."""
    d = Path(results_dir)
    return _table_file(d).exists() or bool(_parts(d)) or (d / "rows").is_dir()


def _remove_stale_tmp(d: Path) -> int:
    """Under the study lock: delete the temporary files of writers that were killed before
    their rename; returns how many. A part's, once :data:`STALE_TMP_AGE_S` old; a table's
    (``.runs.parquet.*.tmp``, ``.runs.csv.*.tmp``) at once, since only a compaction writes the
    tables, under the lock this one holds, so their writer is dead."""
    now_s = time.time()
    stale = []
    if (d / PARTS).is_dir():
        for f in (d / PARTS).iterdir():
            if not (f.name.startswith(".") and f.name.endswith(".tmp")):
                continue
            try:
                age_s = now_s - f.stat().st_mtime
            except FileNotFoundError:  # renamed into a part (or deleted) since listed
                continue
            if age_s > STALE_TMP_AGE_S:
                stale.append(f)
    stale += [*d.glob(".runs.parquet.*.tmp"), *d.glob(".runs.csv.*.tmp")]
    for f in stale:
        f.unlink(missing_ok=True)
    if stale:
        log.info("%s: %d temporary files of killed writers deleted", d, len(stale))
    return len(stale)


def _write_csv(path: Path, frame) -> None:
    """``frame`` as CSV (pyarrow's writer: the same table as pandas writes, 20x faster)."""
    import pyarrow as pa
    import pyarrow.csv as pacsv

    table = pa.Table.from_pandas(frame, preserve_index=False)
    atomic_write(path, lambda tmp: pacsv.write_csv(table, str(tmp)))


def _write_table(d: Path, full) -> None:
    pq = d / "runs.parquet"
    _WRITTEN.pop(str(pq), None)
    atomic_write(pq, lambda tmp: full.to_parquet(tmp, index=False), durable=True)
    stamp = _stamp_of(pq)
    if stamp is not None:
        _WRITTEN.clear()  # one study's table kept: the one a report is about to read
        _WRITTEN[str(pq)] = (stamp, full.copy(deep=False))


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
        part = d / PARTS / name
        atomic_write(part, lambda tmp: frame.to_parquet(tmp, index=False), durable=True)
        stamp = _stamp_of(part) if str(d.resolve()) in _FOLDS_HERE else None
        if stamp is not None:
            _AHEAD[str(part)] = (stamp, frame)
        log.info("%s: +%d rows", part, len(rows))
    if collect_after is None:
        collect_after = not _DEFER.get()
    if collect_after or not has_stored_rows(d):
        return compact(d)
    return d / "runs.csv"


def _schema_names(fh, f: Path) -> list[str]:
    """The column names of the open parquet file ``fh`` (its footer only), or of the header of
    a ``runs.csv`` standing in for the table."""
    import pyarrow.parquet as papq

    try:
        if f.suffix == ".csv":
            import csv

            return next(csv.reader([fh.readline().decode("utf-8", "replace")]), [])
        return papq.read_schema(fh).names
    except (OSError, ValueError) as e:  # pyarrow's ArrowInvalid is a ValueError
        lines = str(e).strip().splitlines() or [type(e).__name__]
        raise ValueError(f"results table {f} is unreadable: {lines[0]}") from e


def _current_schema(pq: Path) -> bool:
    """Whether a table has this schema's identity columns and none of the old spellings
    (reads the file's footer only)."""
    with _opened(pq) as fh:
        names = set(_schema_names(fh, pq))
    return {"setting_id", "model_version"} <= names and not names & set(RENAMED)


def _fold(d: Path, *, force: bool) -> Callable[[], None] | None:
    """Under the study lock (the caller's): fold the current parts into ``runs.parquet``, then
    delete them; returns what writes ``runs.csv`` when it is to be rebuilt (the text view, last:
    one older than the table is rebuilt by the next compaction), else None."""
    parts = _parts(d)
    pq, csv = d / "runs.parquet", d / "runs.csv"
    table_current = pq.exists() and not (d / "rows").is_dir() and _current_schema(pq)
    text_current = (
        table_current and csv.exists() and csv.stat().st_mtime_ns >= pq.stat().st_mtime_ns
    )
    text = None
    if parts or force or not table_current:
        full = _table(d, parts)
        log.info("%s: %d rows stored, %d parts folded in", pq, len(full), len(parts))
        _write_table(d, full)  # runs.parquet durable before any part goes
        text = functools.partial(_write_csv, csv, _latest_of(full))
    elif not text_current:  # a fresh clone: runs.csv is rebuilt, runs.parquet kept as is
        text = functools.partial(_write_csv, csv, _latest_of(_table(d)))
    for f in parts:
        f.unlink(missing_ok=True)
    _remove_stale_tmp(d)
    return text


def compact(results_dir: str | Path) -> Path:
    """Fold the study's parts into ``runs.parquet`` and rebuild ``runs.csv`` (under the folder
    lock); nothing is rewritten when there are no parts and the tables are current, and only
    ``runs.csv`` when it alone is missing or older. Returns the path of ``runs.csv``. Safe to
    repeat, and safe after a compaction cut short."""
    return _fold_now(_folder(Path(results_dir)), force=False)


def _fold_now(d: Path, *, force: bool) -> Path:
    """:func:`_fold` under the study lock, ``runs.csv`` written before the lock goes."""
    with study_lock(d):
        text = _fold(d, force=force)
        if text is not None:
            text()
    return d / "runs.csv"


@contextlib.contextmanager
def compacting(results_dir: str | Path) -> Iterator[Path]:
    """:func:`compact`, with ``runs.csv`` written by a thread while the block runs (pyarrow
    writes it without holding the interpreter): what a sweep's end does while its report reads
    the rows, which need only ``runs.parquet``. The folder lock is held until the block has
    ended and ``runs.csv`` is written, so no other compaction finds the tables half made.
    Yields the path of ``runs.csv``."""
    d = _folder(Path(results_dir))
    with study_lock(d):
        text = _fold(d, force=False)
        with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
            written = pool.submit(text) if text is not None else None
            try:
                yield d / "runs.csv"
            finally:
                if written is not None:
                    written.result()  # its error, if any, is the compaction's


def collect(results_dir: str | Path) -> Path:
    """Rewrite ``runs.parquet`` (schema upgraded, parts and old ``rows/*.json`` folded in) +
    ``runs.csv``; returns the path of ``runs.csv``."""
    return _fold_now(_folder(Path(results_dir)), force=True)
