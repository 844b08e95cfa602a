"""A study folder holding ``runs.csv`` but no ``runs.parquet`` (the table deleted, or a folder
copied without it): its rows are read from the text view and the table is rebuilt, never a run
that does its work and then fails on the missing table."""

from __future__ import annotations

import pandas as pd

from repro.config import validate
from repro.report.build import collect
from system.results import (
    PARTS,
    current_of,
    current_run_ids,
    has_stored_rows,
    make_row,
    read_rows,
    run_ids,
    write_rows,
)
from tests.unit._workflow_rows import synthetic_rows


def test_rows_of_runs_csv_read_back_as_the_table_held_them(tmp_path):
    rows = synthetic_rows(cases=("5",), noise=0.05, seed=2)
    rows.append(make_row({"mode": "simulate", "case": "5", "system": "ours"}, run_id="0012"))
    write_rows(tmp_path, rows)
    before = read_rows(tmp_path)
    (tmp_path / "runs.parquet").unlink()
    after = read_rows(tmp_path)
    pd.testing.assert_frame_equal(after, before, check_dtype=True)
    assert "0012" in run_ids(tmp_path) and "0012" in current_run_ids(tmp_path)
    setting = before.loc[before.run_id == "0012", "setting_id"].iloc[0]
    assert current_of(tmp_path, [setting]) == {setting: "0012"}
    assert has_stored_rows(tmp_path)


def test_a_run_into_a_csv_only_folder_stores_its_rows_and_rebuilds_the_table(tmp_path):
    write_rows(tmp_path, synthetic_rows(cases=("5",), noise=0.0, seed=1))
    old = set(read_rows(tmp_path).run_id)
    (tmp_path / "runs.parquet").unlink()
    new = make_row({"mode": "simulate", "case": "1", "system": "ours"}, iter_time_s=2.0)
    write_rows(tmp_path, [new])  # a single run: its part, then the compaction
    assert (tmp_path / "runs.parquet").is_file()
    assert not list((tmp_path / PARTS).glob("*.parquet"))  # folded, not piling up
    assert set(read_rows(tmp_path).run_id) == old | {new["run_id"]}
    assert len(pd.read_csv(tmp_path / "runs.csv")) == len(old) + 1


def test_collect_folds_the_parts_of_a_csv_only_folder(tmp_path):
    write_rows(tmp_path, synthetic_rows(cases=("5",), noise=0.0, seed=1))
    old = set(read_rows(tmp_path).run_id)
    (tmp_path / "runs.parquet").unlink()
    new = make_row({"mode": "simulate", "case": "1", "system": "ours"}, iter_time_s=2.0)
    write_rows(tmp_path, [new], collect_after=False)
    collect(validate({"mode": "collect", "results_dir": str(tmp_path)}))
    assert set(pd.read_parquet(tmp_path / "runs.parquet").run_id) == old | {new["run_id"]}
    assert not list((tmp_path / PARTS).glob("*.parquet"))
