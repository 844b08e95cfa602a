"""The results store's part files: lock-free writes, merged reads, crash-safe compaction."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import time
from pathlib import Path

import pandas as pd
import pytest

from system.results import (
    PARTS,
    STALE_TMP_AGE_S,
    compact,
    deferred_collect,
    make_row,
    read_rows,
    run_ids,
    write_rows,
)

KEY = {"mode": "simulate", "case": "5", "system": "ours"}
WRITES = 12  # per writer process


def _parts(d: Path) -> list[Path]:
    return sorted((d / PARTS).glob("*.parquet")) if (d / PARTS).is_dir() else []


def _keys(df: pd.DataFrame) -> list[tuple[str, str]]:
    return sorted(zip(df.run_id.astype(str), df.timestamp_utc.astype(str), strict=True))


def _rows(n: int, **key) -> list[dict]:
    return [make_row({**KEY, **key, "repeat": r}, iter_time_s=1.0 + r) for r in range(n)]


def _writer(args: tuple[str, int]) -> list[str]:
    """A sweep job's writes: parts only, and every fourth write compacts (as a sweep's end or
    a single run would) while the other process keeps writing."""
    folder, worker = args
    ids = []
    for i in range(WRITES):
        row = make_row({**KEY, "worker": worker, "i": i}, iter_time_s=float(i))
        write_rows(folder, [row], collect_after=i % 4 == 3)
        ids.append(row["run_id"])
    return ids


@pytest.mark.slow
def test_two_writer_processes_lose_and_duplicate_no_row(tmp_path):
    with mp.get_context("spawn").Pool(2) as pool:
        written = pool.map(_writer, [(str(tmp_path), 0), (str(tmp_path), 1)])
    expected = {i for ids in written for i in ids}
    assert len(expected) == 2 * WRITES
    for stage in ("before the last compaction", "after it"):
        df = read_rows(tmp_path, history=True)
        assert len(df) == 2 * WRITES, stage
        assert set(df.run_id) == expected and not df.run_id.duplicated().any(), stage
        compact(tmp_path)
    assert not _parts(tmp_path)
    assert len(pd.read_parquet(tmp_path / "runs.parquet")) == 2 * WRITES
    assert len(pd.read_csv(tmp_path / "runs.csv")) == 2 * WRITES


def test_sweep_jobs_write_parts_and_the_ledger_sees_them(tmp_path):
    with deferred_collect():
        write_rows(tmp_path, _rows(3))
    assert len(_parts(tmp_path)) == 1
    assert not (tmp_path / "runs.parquet").exists() and not (tmp_path / "runs.csv").exists()
    assert run_ids(tmp_path) == set(read_rows(tmp_path).run_id) and len(run_ids(tmp_path)) == 3
    write_rows(tmp_path, _rows(1, system="megatron"))  # outside a sweep: compacts
    assert not _parts(tmp_path) and len(pd.read_csv(tmp_path / "runs.csv")) == 4
    table = (tmp_path / "runs.parquet").stat().st_mtime_ns
    with deferred_collect():  # a sweep job never rewrites the study's table
        write_rows(tmp_path, _rows(2, system="deepspeed"))
    assert (tmp_path / "runs.parquet").stat().st_mtime_ns == table
    assert len(_parts(tmp_path)) == 1 and len(run_ids(tmp_path)) == 6


def test_parts_only_consolidated_only_and_both_read_the_same(tmp_path):
    first, second = _rows(3), _rows(2, system="deepspeed")
    newer = [make_row({**KEY, "repeat": 0}, iter_time_s=9.0)]  # supersedes first[0]
    for r in (first, second, newer):
        write_rows(tmp_path / "parts_only", r, collect_after=False)
        write_rows(tmp_path / "consolidated", r, collect_after=True)
    write_rows(tmp_path / "both", first, collect_after=True)
    write_rows(tmp_path / "both", second, collect_after=False)
    write_rows(tmp_path / "both", newer, collect_after=False)
    assert not (tmp_path / "parts_only" / "runs.parquet").exists()
    assert not _parts(tmp_path / "consolidated") and len(_parts(tmp_path / "both")) == 2

    def view(name, history):
        df = read_rows(tmp_path / name, history=history)
        return df.drop(columns=["run_id", "timestamp_utc"]).reset_index(drop=True)

    for history, n in ((False, 5), (True, 6)):
        ref = view("parts_only", history)
        assert len(ref) == n
        pd.testing.assert_frame_equal(view("consolidated", history), ref)
        pd.testing.assert_frame_equal(view("both", history), ref)
    latest = read_rows(tmp_path / "both")
    ours0 = (latest.system == "ours") & (latest.repeat == 0)
    assert latest.loc[ours0, "iter_time_s"].tolist() == [9.0]  # the newest row wins


def test_compaction_is_idempotent(tmp_path):
    write_rows(tmp_path, _rows(3), collect_after=False)
    write_rows(tmp_path, _rows(2, system="megatron"), collect_after=False)
    compact(tmp_path)
    pq, csv = tmp_path / "runs.parquet", tmp_path / "runs.csv"
    table, stamps = pd.read_parquet(pq), (pq.stat().st_mtime_ns, csv.stat().st_mtime_ns)
    compact(tmp_path)  # nothing new: nothing rewritten
    assert (pq.stat().st_mtime_ns, csv.stat().st_mtime_ns) == stamps
    pd.testing.assert_frame_equal(pd.read_parquet(pq), table)
    assert len(table) == 5 and not _parts(tmp_path)


def test_a_crash_between_the_table_and_the_part_deletion_duplicates_nothing(tmp_path, monkeypatch):
    write_rows(tmp_path, _rows(2), collect_after=True)
    write_rows(tmp_path, _rows(3, system="megatron"), collect_after=False)
    write_rows(tmp_path, _rows(1, system="deepspeed"), collect_after=False)
    before = _keys(read_rows(tmp_path, history=True))
    real_unlink = Path.unlink

    def killed(self, *a, **k):  # the process dies as it starts deleting the folded parts
        if self.parent.name == PARTS:
            raise KeyboardInterrupt
        return real_unlink(self, *a, **k)

    monkeypatch.setattr(Path, "unlink", killed)
    with pytest.raises(KeyboardInterrupt):
        compact(tmp_path)
    monkeypatch.undo()
    assert len(_parts(tmp_path)) == 2  # left behind ...
    assert len(pd.read_parquet(tmp_path / "runs.parquet")) == 6  # ... and already in the table
    assert _keys(read_rows(tmp_path, history=True)) == before  # read once, not twice
    assert len(run_ids(tmp_path)) == 6
    compact(tmp_path)  # the next compaction finishes the job
    assert not _parts(tmp_path) and _keys(read_rows(tmp_path, history=True)) == before
    assert len(pd.read_parquet(tmp_path / "runs.parquet")) == 6


def test_a_reader_racing_a_compaction_sees_every_row_once(tmp_path):
    """A reader lists the parts, a compaction folds and deletes them, then the reader reads:
    the deleted parts are skipped and their rows come from the new table."""
    from system.results import _load
    from system.results import _parts as listed

    write_rows(tmp_path, _rows(2), collect_after=False)
    write_rows(tmp_path, _rows(2, system="megatron"), collect_after=False)
    stale = listed(tmp_path)
    compact(tmp_path)
    records = _load(tmp_path, stale)
    assert len(records) == 4 and len({(r["run_id"], r["timestamp_utc"]) for r in records}) == 4


def test_a_bad_value_writes_no_part_and_a_broken_part_is_named(tmp_path):
    with pytest.raises(ValueError, match="num_layers"):
        write_rows(tmp_path, [make_row(KEY, num_layers="many")], collect_after=False)
    assert not _parts(tmp_path) and not (tmp_path / "runs.parquet").exists()
    write_rows(tmp_path, _rows(1), collect_after=False)
    (tmp_path / PARTS / f"{0:020d}-broken.parquet").write_bytes(b"not parquet")
    with pytest.raises(ValueError, match="broken.parquet is unreadable"):
        read_rows(tmp_path)


def test_a_write_leaves_no_temporary_file(tmp_path):
    write_rows(tmp_path, _rows(2), collect_after=False)
    compact(tmp_path)
    left = [p for p in tmp_path.rglob("*") if p.name.endswith(".tmp")]
    assert not left and os.listdir(tmp_path / PARTS) == []


def _age(f: Path, age_s: float) -> None:
    """Set ``f``'s modification time ``age_s`` into the past (as if its writer stopped then)."""
    then = time.time() - age_s
    os.utime(f, (then, then))


def test_compaction_deletes_only_stale_temporary_files(tmp_path):
    write_rows(tmp_path, _rows(2), collect_after=False)
    name = f".{time.time_ns():020d}-otherhost-4242-0badcafe.parquet"
    stale, fresh = tmp_path / PARTS / f"{name}.k1q2.tmp", tmp_path / PARTS / f"{name}.z9x8.tmp"
    table_tmp = tmp_path / ".runs.parquet.a1b2.tmp"  # a compaction killed mid-write (fresh)
    other = tmp_path / ".REPORT.md.c3d4.tmp"  # not the store's: never touched
    for f in (stale, fresh, table_tmp, other):
        f.write_bytes(b"PAR1 half written")
    _age(stale, STALE_TMP_AGE_S + 60)
    _age(fresh, STALE_TMP_AGE_S - 60)  # old, but its writer could still be renaming it
    compact(tmp_path)
    assert not stale.exists() and not table_tmp.exists()
    assert fresh.exists() and other.exists()
    assert not _parts(tmp_path) and len(read_rows(tmp_path)) == 2  # the part was folded in


def _write_and_hang(folder: str, ready: str) -> None:
    """A sweep job's write that stops after writing its part's temporary file, before the
    fsync and rename (the test kills it there)."""
    real = pd.DataFrame.to_parquet

    def write_then_hang(self, path, *args, **kwargs):
        real(self, path, *args, **kwargs)
        Path(ready).write_text(str(path))
        time.sleep(30)  # killed long before; bounded if the test died first

    pd.DataFrame.to_parquet = write_then_hang
    write_rows(folder, _rows(2), collect_after=False)


@pytest.mark.slow
def test_a_writer_killed_before_its_rename_leaves_a_tmp_that_compaction_removes(tmp_path):
    ready = tmp_path / "ready.txt"
    proc = mp.get_context("spawn").Process(
        target=_write_and_hang, args=(str(tmp_path / "study"), str(ready))
    )
    proc.start()
    try:
        deadline = time.monotonic() + 60  # a spawned interpreter imports pandas first
        while not ready.exists() and proc.is_alive() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert ready.exists(), f"the writer never reached its rename (exit code {proc.exitcode})"
    finally:
        proc.kill()  # SIGKILL: no except/finally of the writer runs
        proc.join(timeout=10)
    assert proc.exitcode == -signal.SIGKILL
    tmp = Path(ready.read_text())
    assert tmp.parent == tmp_path / "study" / PARTS and tmp.name.endswith(".tmp")
    assert tmp.exists() and tmp.stat().st_size > 0 and not _parts(tmp_path / "study")
    compact(tmp_path / "study")
    assert tmp.exists()  # just written: its writer could be alive as far as the rule can tell
    _age(tmp, STALE_TMP_AGE_S + 1)
    compact(tmp_path / "study")
    assert not tmp.exists() and os.listdir(tmp_path / "study" / PARTS) == []
    assert len(read_rows(tmp_path / "study")) == 0  # the killed write stored nothing


def test_a_writer_whose_tmp_was_deleted_raises(tmp_path, monkeypatch):
    """What a writer stalled past STALE_TMP_AGE_S sees if a compaction deletes its file."""
    real = pd.DataFrame.to_parquet

    def write_then_lose(self, path, *args, **kwargs):
        real(self, path, *args, **kwargs)
        Path(path).unlink()

    monkeypatch.setattr(pd.DataFrame, "to_parquet", write_then_lose)
    with pytest.raises(FileNotFoundError):
        write_rows(tmp_path, _rows(1), collect_after=False)
    assert not _parts(tmp_path)


def _mixed_study(d: Path) -> None:
    """Parts with different columns, extra (unschema'd) fields, superseded rows, and a table."""
    write_rows(d, _rows(3), collect_after=True)
    write_rows(
        d, [make_row({**KEY, "repeat": 1}, iter_time_s=7.0, note="rerun")], collect_after=False
    )
    write_rows(
        d,
        [make_row({**KEY, "system": "megatron"}, tp=2, stages=[[0, 1]], knob=0.5)],
        collect_after=False,
    )
    write_rows(d, [make_row({**KEY, "system": "deepspeed"}, knob=1, zero=3)], collect_after=False)


def _newest_per_setting(records: list[dict]) -> list[dict]:
    """The reference: the newest row of each setting (by timestamp, then position), one Python
    dict at a time."""
    best: dict[str, tuple[str, int]] = {}
    for i, r in enumerate(records):
        k = r.get("setting_id") or r["run_id"]
        t = str(r.get("timestamp_utc") or "")
        if k not in best or (t, i) >= best[k]:
            best[k] = (t, i)
    return [records[i] for i in sorted(i for _, i in best.values())]


@pytest.mark.slow  # reads the committed smoke study (8,268 rows) twice per case
@pytest.mark.parametrize("history", [True, False])
def test_the_frame_reader_matches_the_row_by_row_reader(tmp_path, history):
    """read_rows concatenates typed frames; the reference builds one Python dict per row
    (what the store did before): both give the same frame, on a mixed study and on the
    committed smoke study split into parts."""
    from system.results import _load, _view

    studies = [tmp_path / "mixed"]
    _mixed_study(studies[0])
    table = pd.read_parquet(Path(__file__).resolve().parents[2] / "results/smoke/runs.parquet")
    studies.append(tmp_path / "smoke")
    for start in range(0, len(table), 3000):
        write_rows(
            studies[1], table.iloc[start : start + 3000].to_dict("records"), collect_after=False
        )
    for d in studies:
        records = _load(d)
        ref = _view(records if history else _newest_per_setting(records))
        ref = ref.sort_values(["timestamp_utc", "run_id"], kind="stable").reset_index(drop=True)
        pd.testing.assert_frame_equal(read_rows(d, history=history), ref)
