"""Concurrency of the results store as a property: eight writer processes and a reader process
on one study for 20 s. Every read must succeed while compactions replace ``runs.parquet``, and
every row written must be stored at the end (what the README's parallel jobs rely on)."""

from __future__ import annotations

import multiprocessing as mp
import os
import time
import traceback
from pathlib import Path

import pytest

WRITERS = 8
DURATION_S = 20.0  # at least this long, and on until the reader has raced enough compactions
MAX_S = 180.0  # ... but never longer (a machine this slow fails the test, saying why)
START_S = 300.0  # every process imported and ready within this (a loaded machine is slow)
JOIN_S = 300.0  # a process still running this long after being told to stop is a hang
MIN_READS, MIN_VERSIONS, MIN_WRITES = 10, 5, 2


def _writer(d: str, w: int, ready, stop, writes, out: str) -> None:
    """Write rows until ``stop``: six writers of eight compact after each write (a single run),
    two only add parts (a sweep's job, at most 5 a second: each compaction reads every part, so
    more would leave few compactions in the time); each asks what is stored first, as a run
    does."""
    os.environ["OMP_NUM_THREADS"] = "1"
    from system.results import current_of, deferred_collect, make_row, write_rows

    make_row({"mode": "simulate"})  # the model's fingerprint and git state, made once
    ready.wait(START_S)  # all start together, after their imports
    written, errors = [], []
    i = 0
    while not stop.is_set() and i < 100_000:
        rows = [
            make_row(
                {"mode": "simulate", "case": "5", "system": "ours", "seed": w, "repeat": 2 * i + k},
                iter_time_s=1.0 + k,
            )
            for k in range(2)
        ]
        try:
            current_of(d, [r["setting_id"] for r in rows])
            if w % 4 == 3:
                with deferred_collect():
                    write_rows(d, rows)
                time.sleep(0.2)
            else:
                write_rows(d, rows)
            written += [r["run_id"] for r in rows]
            writes[w] += 1
        except Exception:  # noqa: BLE001 - every failure is counted, none may happen
            errors.append(traceback.format_exc(limit=3))
        i += 1
    Path(out).write_text("\n".join(written) + "\n\x00\n" + "\n---\n".join(errors))


def _reader(d: str, ready, stop, progress, out: str) -> None:
    """Read the study every way the harness does, and the table alone for half a second
    between, until ``stop``; count rounds of reads, failures and how many versions of
    runs.parquet it saw (each a compaction that replaced the table)."""
    os.environ["OMP_NUM_THREADS"] = "1"
    from system.results import _read_table, current_of, current_run_ids, read_rows, run_ids

    ready.wait(START_S)
    reads, errors, versions = 0, [], set()
    table = Path(d) / "runs.parquet"
    while not stop.is_set() and reads < 1_000_000:
        try:
            st = table.stat()
            versions.add((st.st_ino, st.st_mtime_ns, st.st_size))
        except FileNotFoundError:
            pass
        try:
            rows = read_rows(d)
            run_ids(d)
            current_run_ids(d)
            current_of(d, list(rows["setting_id"].astype(str)[:5]))
            until = time.monotonic() + 0.5  # the table alone, as often as it can be read
            while time.monotonic() < until and table.exists():
                _read_table(table)
            reads += 1
        except Exception:  # noqa: BLE001 - every failure is counted, none may happen
            errors.append(traceback.format_exc(limit=3))
        progress[0], progress[1] = reads, len(versions)
    Path(out).write_text(f"{reads} {len(versions)}\n" + "\n---\n".join(errors))


@pytest.mark.slow
def test_writers_and_a_reader_on_one_study(tmp_path):
    from system.results import compact, current_run_ids, read_rows

    d = tmp_path / "study"
    ctx = mp.get_context("spawn")
    ready, stop = ctx.Barrier(WRITERS + 2), ctx.Event()
    writes, progress = ctx.Array("i", WRITERS), ctx.Array("i", 2)
    outs = [tmp_path / f"writer{w}.txt" for w in range(WRITERS)]
    procs = [
        ctx.Process(target=_writer, args=(str(d), w, ready, stop, writes, str(outs[w])))
        for w in range(WRITERS)
    ]
    reader_out = tmp_path / "reader.txt"
    procs.append(ctx.Process(target=_reader, args=(str(d), ready, stop, progress, str(reader_out))))
    for p in procs:
        p.start()
    try:
        ready.wait(START_S)
        t0 = time.monotonic()
        while time.monotonic() - t0 < MAX_S:
            enough = progress[0] >= MIN_READS and progress[1] >= MIN_VERSIONS
            if time.monotonic() - t0 >= DURATION_S and enough and min(writes) >= MIN_WRITES:
                break
            time.sleep(0.5)
        ran_s = time.monotonic() - t0
        stop.set()
        for p in procs:
            p.join(JOIN_S)
            assert p.exitcode == 0, f"{p.name} exit code {p.exitcode}"
    finally:
        stop.set()
        for p in procs:
            if p.is_alive():
                p.kill()
    written, failures = [], []
    for out in outs:
        ids, _, errors = out.read_text().partition("\n\x00\n")
        written += ids.split()
        failures += [e for e in errors.split("\n---\n") if e.strip()]
    head, _, errors = reader_out.read_text().partition("\n")
    reads, versions = map(int, head.split())
    failures += [e for e in errors.split("\n---\n") if e.strip()]
    assert not failures, f"{len(failures)} failed operations, the first:\n{failures[0]}"
    # it did race: the reader read while compactions replaced the table, every writer wrote
    assert reads >= MIN_READS and versions >= MIN_VERSIONS, (reads, versions, ran_s)
    assert min(writes) >= MIN_WRITES, (list(writes), ran_s)
    assert len(set(written)) == len(written)
    compact(d)
    stored = read_rows(d, history=True)
    assert set(written) == set(stored["run_id"].astype(str))
    assert len(stored) == len(written)
    assert set(written) == current_run_ids(d)  # every row is its setting's newest
