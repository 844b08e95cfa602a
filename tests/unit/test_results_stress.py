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
DURATION_S = 20.0
JOIN_S = 300.0  # a process still running this long after the deadline is a hang


def _writer(d: str, w: int, stop_at: float, out: str) -> None:
    """Write rows until ``stop_at``: six writers of eight compact after each write (a single
    run), two only add parts (a sweep's job, at most 20 a second: each compaction reads every
    part, so more would leave few compactions in the time); each asks what is stored first, as
    a run does."""
    os.environ["OMP_NUM_THREADS"] = "1"
    from system.results import current_of, deferred_collect, make_row, write_rows

    written, errors = [], []
    i = 0
    while time.time() < stop_at and i < 100_000:
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
                time.sleep(0.05)
            else:
                write_rows(d, rows)
            written += [r["run_id"] for r in rows]
        except Exception:  # noqa: BLE001 - every failure is counted, none may happen
            errors.append(traceback.format_exc(limit=3))
        i += 1
    Path(out).write_text("\n".join(written) + "\n\x00\n" + "\n---\n".join(errors))


def _reader(d: str, stop_at: float, out: str) -> None:
    """Read the study every way the harness does until ``stop_at``; count reads, failures and
    how many versions of runs.parquet it saw (each a compaction that replaced the table)."""
    os.environ["OMP_NUM_THREADS"] = "1"
    from system.results import current_of, current_run_ids, read_rows, run_ids

    reads, errors, versions = 0, [], set()
    table = Path(d) / "runs.parquet"
    while time.time() < stop_at and reads < 1_000_000:
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
            reads += 1
        except Exception:  # noqa: BLE001 - every failure is counted, none may happen
            errors.append(traceback.format_exc(limit=3))
    Path(out).write_text(f"{reads} {len(versions)}\n" + "\n---\n".join(errors))


@pytest.mark.slow
def test_writers_and_a_reader_on_one_study(tmp_path):
    from system.results import compact, current_run_ids, read_rows

    d = tmp_path / "study"
    ctx = mp.get_context("spawn")
    stop_at = time.time() + DURATION_S + 5.0  # the processes start within the 5 s margin
    outs = [tmp_path / f"writer{w}.txt" for w in range(WRITERS)]
    procs = [
        ctx.Process(target=_writer, args=(str(d), w, stop_at, str(outs[w]))) for w in range(WRITERS)
    ]
    reader_out = tmp_path / "reader.txt"
    procs.append(ctx.Process(target=_reader, args=(str(d), stop_at, str(reader_out))))
    for p in procs:
        p.start()
    try:
        for p in procs:
            p.join(max(1.0, stop_at + JOIN_S - time.time()))
            assert p.exitcode == 0, f"{p.name} exit code {p.exitcode}"
    finally:
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
    assert reads >= 10 and versions >= 5, (reads, versions)  # it did race with compactions
    assert len(written) >= 2 * WRITERS and len(set(written)) == len(written)
    compact(d)
    stored = read_rows(d, history=True)
    assert set(written) == set(stored["run_id"].astype(str))
    assert len(stored) == len(written)
    assert set(written) == current_run_ids(d)  # every row is its setting's newest
