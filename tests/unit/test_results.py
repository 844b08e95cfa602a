"""Tidy rows: atomic writes, stable run ids, collection into csv + parquet."""

from __future__ import annotations

import pandas as pd

from system.results import CORE_COLUMNS, collect, has_row, make_row, read_rows, run_id_for, write_rows


def test_rows_round_trip_and_dedupe(tmp_path):
    key = {"mode": "simulate", "case": "5", "system": "ours", "repeat": 0}
    row = make_row(key, iter_time_s=1.5, pflops=2.0, stages=[[0, 1]])
    assert row["run_id"] == run_id_for(dict(reversed(list(key.items()))))
    write_rows(tmp_path, [row])
    write_rows(tmp_path, [make_row(key, iter_time_s=1.4, pflops=2.1)])  # same key: replaces
    df = pd.read_csv(tmp_path / "runs.csv")
    assert len(df) == 1 and df.iter_time_s.iloc[0] == 1.4
    assert list(df.columns[: len(CORE_COLUMNS)]) == list(CORE_COLUMNS)
    assert has_row(tmp_path, row["run_id"])
    assert len(pd.read_parquet(tmp_path / "runs.parquet")) == 1
    assert not list(tmp_path.glob(".*.tmp")) and not list((tmp_path / "rows").glob(".*"))


def test_empty_study_collects_to_header_only(tmp_path):
    collect(tmp_path)
    assert read_rows(tmp_path).empty
    assert pd.read_csv(tmp_path / "runs.csv").columns.tolist() == list(CORE_COLUMNS)
