"""One sweep job's write into the results store, as a part vs as a rewrite of the whole table.

    python repro/run.py mode=bench_store             # studies of 1,000 / 4,000 / 8,000 rows
    python repro/run.py mode=bench_store sizes=[2000,16000] job_rows=654 rounds=3

For each study size, a study folder holding that many rows in ``runs.parquet`` receives one
job's rows (``job_rows``, the rows of one ``sweep=smoke`` job) two ways, side by side: as a
sweep job writes them (one part file, no lock: :func:`system.results.deferred_collect`) and
followed by a compaction, which rewrites ``runs.parquet`` and ``runs.csv`` under the study lock
(what each job would pay if every write rewrote the table). The rows are synthetic simulate
rows with the smoke study's columns. Prints the median seconds of each and their ratio; the
part's cost should not grow with the study.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from pathlib import Path

from repro.checks.bench.config import BenchStoreConfig

__all__ = ["run"]


def _rows(n: int, offset: int) -> list[dict]:
    from system.results import make_row

    return [
        make_row(
            {"mode": "simulate", "case": str(i % 5 + 1), "system": "ours", "repeat": offset + i},
            iter_time_s=1.0 + i * 1e-3,
            pflops=2.0,
            stages=[[0, 1], [2, 3]],
            config="tp1/pp8/dp8",
        )
        for i in range(n)
    ]


def run(cfg: BenchStoreConfig) -> dict:
    from system.results import compact, deferred_collect, write_rows

    print(f"{os.cpu_count()} cores, load average before: {os.getloadavg()[0]:.2f}")
    print(f"{'study_rows':>10} {'job_rows':>8} {'part_s':>8} {'rewrite_s':>9} {'ratio':>6}")
    with tempfile.TemporaryDirectory(prefix="dtfm-bench-store-") as tmp:
        for size in cfg.sizes:
            part_s, rewrite_s = [], []
            for r in range(cfg.rounds):
                d = Path(tmp) / f"s{size}-{r}"
                write_rows(d, _rows(size, 0))  # the study: one table, no parts
                job = _rows(cfg.job_rows, size)
                t0 = time.perf_counter()
                with deferred_collect():
                    write_rows(d, job)
                t1 = time.perf_counter()
                compact(d)
                t2 = time.perf_counter()
                part_s.append(t1 - t0)
                rewrite_s.append(t2 - t0)
            p, w = statistics.median(part_s), statistics.median(rewrite_s)
            print(f"{size:>10} {cfg.job_rows:>8} {p:8.3f} {w:9.3f} {w / p:5.1f}x")
    print(f"load average after: {os.getloadavg()[0]:.2f}")
    return {}
