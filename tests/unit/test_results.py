"""The results store: typed append-only runs.parquet, model-versioned run ids, folder lock."""

from __future__ import annotations

import multiprocessing as mp
import shutil
from pathlib import Path

import pandas as pd
import pytest

from system.results import (
    CORE_COLUMNS,
    collect,
    has_row,
    make_row,
    model_version,
    read_rows,
    run_id_for,
    write_rows,
)

ROOT = Path(__file__).resolve().parents[2]
KEY = {"mode": "simulate", "case": "5", "system": "ours", "repeat": 0}


def test_rows_round_trip_and_newest_wins(tmp_path):
    row = make_row(KEY, iter_time_s=1.5, pflops=2.0, stages=[[0, 1]])
    assert row["setting_id"] == run_id_for(dict(reversed(list(KEY.items()))))
    assert row["run_id"] == run_id_for({**KEY, "model_version": model_version()})
    write_rows(tmp_path, [row])
    write_rows(tmp_path, [make_row(KEY, iter_time_s=1.4, pflops=2.1)])  # same setting: newer wins
    df = pd.read_csv(tmp_path / "runs.csv")
    assert len(df) == 1 and df.iter_time_s.iloc[0] == 1.4
    assert list(df.columns[: len(CORE_COLUMNS)]) == list(CORE_COLUMNS)
    assert has_row(tmp_path, row["run_id"])
    assert len(pd.read_parquet(tmp_path / "runs.parquet")) == 2  # append-only: both kept
    assert len(read_rows(tmp_path, history=True)) == 2 and len(read_rows(tmp_path)) == 1
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_empty_study_collects_to_header_only(tmp_path):
    collect(tmp_path)
    assert read_rows(tmp_path).empty
    assert pd.read_csv(tmp_path / "runs.csv").columns.tolist() == list(CORE_COLUMNS)


def test_train_row_then_simulate_rows_share_a_folder(tmp_path):
    """A local train row (lists, case given as an int) and simulate rows in one table."""
    train = make_row(
        {"mode": "train", "system": "ours", "case": 5, "stages": [[0, 1], [2, 3]]},
        losses=[6.0, 5.5],
        final_loss=5.5,
        iter_time_s=0.1,
    )
    write_rows(tmp_path, [train])
    write_rows(tmp_path, [make_row(KEY, iter_time_s=2.0, config="tp1/pp8/dp8")])
    write_rows(tmp_path, [make_row({**KEY, "repeat": 1}, iter_time_s=2.1)])
    df = read_rows(tmp_path)
    assert len(df) == 3 and str(df.case.dtype) == "string" and set(df.case) == {"5"}
    pq = pd.read_parquet(tmp_path / "runs.parquet")
    assert str(pq.num_layers.dtype) == "Int64" and str(pq.iter_time_s.dtype) == "Float64"
    assert len(pd.read_csv(tmp_path / "runs.csv")) == len(pq)


def test_one_spelling_per_concept():
    row = make_row({"mode": "train", "checkpointing": True}, loss_last=4.0, sim_iter_time_s=1.0)
    assert row["recompute"] is True and row["final_loss"] == 4.0
    assert row["predicted_iter_time_s"] == 1.0
    assert not {"checkpointing", "loss_last", "sim_iter_time_s"} & set(row)


@pytest.mark.parametrize(
    "field,value",
    [("num_layers", 24.9), ("iter_time_s", "fast"), ("verify_ok", "yes"), ("tp", [1, 2])],
)
def test_a_badly_typed_value_names_its_column_and_writes_nothing(tmp_path, field, value):
    with pytest.raises(ValueError, match=field):
        write_rows(tmp_path / "s", [make_row(KEY, **{field: value})])
    assert not (tmp_path / "s" / "runs.parquet").exists()


def test_schema_1_tables_read_back_under_the_new_names(tmp_path):
    old = pd.DataFrame(
        {
            "run_id": ["a", "b"],
            "study": ["x", "x"],
            "timestamp_utc": ["t1", "t2"],
            "schema_version": [1, 1],
            "status": ["ok", "ok"],
            "mode": ["emulate", "train"],
            "case": ["5", "local"],
            "sim_iter_time_s": [1.0, None],
            "loss_last": [None, 3.0],
        }
    )
    old.to_parquet(tmp_path / "runs.parquet")
    df = read_rows(tmp_path)
    assert df.predicted_iter_time_s.tolist()[0] == 1.0 and df.final_loss.tolist()[1] == 3.0
    assert (df.setting_id == df.run_id).all() and set(df.model_version) == {"unknown"}
    write_rows(tmp_path, [make_row(KEY, iter_time_s=1.0)])  # appending keeps the old rows
    assert len(read_rows(tmp_path)) == 3


# The paper study holds ~42k rows (about 5 s to type and deduplicate on one core): slow tier; the
# smaller studies check the same reader on the same schema in the fast tier.
@pytest.mark.parametrize(
    "study",
    [
        pytest.param("paper", marks=pytest.mark.slow),
        "smoke",
        "emulation",
        "baselines/emulated",
    ],
)
def test_committed_studies_read_back(study):
    path = ROOT / "results" / study
    if not (path / "runs.parquet").exists():
        pytest.skip(f"{path} has no runs.parquet")
    df = read_rows(path)
    assert len(df) == len(pd.read_parquet(path / "runs.parquet")) and str(df.case.dtype) == "string"


def test_model_version_follows_code_not_comments(tmp_path):
    for rel in ("system/simulator/hardware.py", "system/workload.py"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / rel, tmp_path / rel)
    first = model_version.__wrapped__(str(tmp_path))
    hw = tmp_path / "system/simulator/hardware.py"
    text = hw.read_text()
    assert text.startswith('"""')
    hw.write_text('"""Reworded. ' + text[3:].replace("\n", "\n# a comment\n", 1))
    assert model_version.__wrapped__(str(tmp_path)) == first
    hw.write_text(hw.read_text() + "\nEXTRA_CONSTANT = 1\n")
    assert model_version.__wrapped__(str(tmp_path)) != first


def _writer(args):
    folder, worker = args
    for i in range(15):
        write_rows(folder, [make_row({"worker": worker, "i": i}, iter_time_s=float(i))])


def test_concurrent_writers_lose_no_rows(tmp_path):
    with mp.get_context("spawn").Pool(2) as pool:
        pool.map(_writer, [(str(tmp_path), 0), (str(tmp_path), 1)])
    assert len(read_rows(tmp_path)) == 30


def test_a_file_as_results_folder_is_one_clear_error(tmp_path):
    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(NotADirectoryError, match="is a file"):
        write_rows(f, [make_row(KEY)])


def test_a_fresh_clone_rebuilds_the_report_from_runs_parquet_alone(tmp_path):
    from repro.report.build import build_report

    src = ROOT / "results" / "smoke" / "runs.parquet"
    if not src.exists():
        pytest.skip("results/smoke/runs.parquet is not committed")
    shutil.copy(src, tmp_path / "runs.parquet")  # what a clone has: no rows/, no jobs/
    paths = build_report(tmp_path, ablation_path=None, study="smoke")
    text = paths.report.read_text()
    assert f"{len(pd.read_parquet(src))} rows" in text


def test_a_held_lock_times_out_with_its_name(tmp_path):
    from system.results import study_lock

    with study_lock(tmp_path), pytest.raises(TimeoutError, match=r"\.lock is held"):
        with study_lock(tmp_path, timeout_s=0.2):
            pass
