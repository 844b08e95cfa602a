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


@pytest.mark.parametrize("given_id", [None, "fixed-id"])
def test_make_rows_are_make_row_s_rows_of_each_value(given_id):
    """Rows made together, differing in one key, are the rows made one by one: the same ids,
    columns and values (all but the time they were made)."""
    from system.schema import make_rows, rows_of_config

    key = {**KEY, "case": "debug", "case_sha256": "00ff", "layers": 24, "config": {"b": [1, 2.5]}}
    values = dict(iter_time_s=1.5, stages=[[0, 1]], note='x \u00e9 "quoted"', run_id=given_id)
    with rows_of_config("abc123"):
        together = make_rows(key, "repeat", range(3), **values)
        alone = [make_row({**key, "repeat": r}, **values) for r in range(3)]
    for a, b in zip(together, alone, strict=True):
        assert list(a) == list(b)  # the same columns, in the same order
        assert {k: v for k, v in a.items() if k != "timestamp_utc"} == {
            k: v for k, v in b.items() if k != "timestamp_utc"
        }
    assert len({r["run_id"] for r in together}) == (1 if given_id else 3)
    assert len({r["setting_id"] for r in together}) == 3
    with pytest.raises(ValueError, match="case"):
        make_rows(key, "case", ["5", "debug"])


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


@pytest.mark.slow
def test_concurrent_writers_lose_no_rows(tmp_path):
    with mp.get_context("spawn").Pool(2) as pool:
        pool.map(_writer, [(str(tmp_path), 0), (str(tmp_path), 1)])
    assert len(read_rows(tmp_path)) == 30


def test_a_file_as_results_folder_is_one_clear_error(tmp_path):
    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(NotADirectoryError, match="is a file"):
        write_rows(f, [make_row(KEY)])


@pytest.mark.slow
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


def test_written_files_are_readable_by_the_team(tmp_path):
    """Atomic writes give a file the mode an ordinary write would (0644 under umask 022), not
    the temporary file's 0600: a study on a shared filesystem is read by others."""
    import os
    import stat

    from system.results import atomic_write_text

    old = os.umask(0o022)
    try:
        write_rows(tmp_path, [make_row(KEY, iter_time_s=1.0)])
        atomic_write_text(tmp_path / "summary.md", "x\n")
        files = [p for p in tmp_path.rglob("*") if p.is_file() and p.name != ".lock"]
        assert {p.name for p in files} >= {"runs.parquet", "runs.csv", "summary.md"}
        for p in files:
            assert stat.S_IMODE(p.stat().st_mode) == 0o644, p
        (tmp_path / "summary.md").chmod(0o664)  # a replaced file keeps its mode
        atomic_write_text(tmp_path / "summary.md", "y\n")
        assert stat.S_IMODE((tmp_path / "summary.md").stat().st_mode) == 0o664
    finally:
        os.umask(old)


@pytest.mark.parametrize("where", ["runs.parquet", "parts/0001-x.parquet"])
@pytest.mark.parametrize("content", ["corrupt", "wrong schema"])
def test_a_bad_table_is_one_line_naming_the_file(tmp_path, where, content):
    f = tmp_path / where
    f.parent.mkdir(parents=True, exist_ok=True)
    if content == "corrupt":
        f.write_bytes(b"PAR1 not really parquet")
    else:
        pd.DataFrame({"setting": ["a"], "iter_time_s": [1.0]}).to_parquet(f)
    from system.results import run_ids

    for read in (read_rows, run_ids, collect):
        with pytest.raises(ValueError) as e:
            read(tmp_path)
        msg = str(e.value)
        assert str(f) in msg and "\n" not in msg, msg
        assert ("unreadable" if content == "corrupt" else "no run_id column") in msg


def test_a_full_disk_is_one_line_naming_the_file_and_loses_no_row(tmpfs):
    from repro.checks.probe_inputs.probe_runs import fill

    full_disk = tmpfs("small")
    write_rows(full_disk, [make_row(KEY, iter_time_s=1.0)])
    before = read_rows(full_disk, history=True)
    fill(full_disk)
    with pytest.raises(OSError) as e:
        write_rows(full_disk, [make_row({**KEY, "repeat": 1}, iter_time_s=2.0)])
    msg = str(e.value)
    assert e.value.errno == 28 and "could not write" in msg and str(full_disk) in msg, msg
    assert "\n" not in msg
    assert not [p for p in full_disk.rglob("*.tmp")]
    (full_disk / "filler").unlink()
    after = read_rows(full_disk, history=True)
    assert after.run_id.tolist() == before.run_id.tolist()


def test_the_git_state_of_a_run_takes_no_lock(tmp_path):
    """A stale index would be rewritten (under .git/index.lock) by a plain ``git status``; the
    run's read of the git state leaves it alone, so it never collides with a commit."""
    import os
    import subprocess

    from system.schema import git_state

    def git(*args):
        subprocess.run(["git", *args], cwd=tmp_path, check=True, capture_output=True)

    git("init", "-q")
    (tmp_path / "a.txt").write_text("a\n")
    git("add", "a.txt")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "a")
    index = tmp_path / ".git" / "index"
    os.utime(tmp_path / "a.txt", (1, 1))  # the index's stat data is now stale
    before = index.stat().st_mtime_ns
    sha, dirty = git_state(tmp_path)
    assert len(sha) >= 7 and dirty is False
    assert index.stat().st_mtime_ns == before, "git status rewrote the index (took its lock)"
    (tmp_path / ".git" / "index.lock").write_text("")  # a commit in progress elsewhere
    assert git_state(tmp_path) == (sha, False)


@pytest.mark.parametrize("name", ["/abs/x.json", "../x.json", "a/../../x.json", ".", ""])
def test_a_results_file_name_cannot_leave_the_folder(tmp_path, name):
    from system.results import path_in

    with pytest.raises(ValueError, match="is not a file name inside the results folder"):
        path_in(tmp_path / "R", name)
    assert path_in(tmp_path / "R", "case5-genetic.json") == tmp_path / "R" / "case5-genetic.json"


def test_current_of_answers_as_the_whole_study_does(tmp_path, monkeypatch):
    """A sweep job asks only for its own settings: the same newest rows as current_run_ids finds
    over the whole study, across the table and parts, a setting written again and ties."""
    import system.results as store
    from system.results import current_of, current_run_ids, deferred_collect

    def rows(n, version, stamp=None):
        out = []
        for i in range(n):
            r = make_row({**KEY, "repeat": i}, iter_time_s=float(version))
            r["run_id"] = run_id_for({**KEY, "repeat": i, "v": version})
            if stamp is not None:
                r["timestamp_utc"] = stamp
            out.append(r)
        return out

    write_rows(tmp_path, rows(6, 1))  # the table
    with deferred_collect():  # parts, as a sweep's jobs write them
        write_rows(tmp_path, rows(3, 2))  # settings 0-2 written again: newer
        write_rows(tmp_path, rows(2, 3, stamp="1970-01-01T00:00:00+00:00"))  # older stamp
        write_rows(tmp_path, rows(1, 4, stamp="2999-01-01T00:00:00+00:00"))
        write_rows(tmp_path, rows(1, 5, stamp="2999-01-01T00:00:00+00:00"))  # a tie: later wins
    assert store._parts(tmp_path)
    current = current_run_ids(tmp_path)
    every = read_rows(tmp_path, history=True)
    settings = sorted(set(every["setting_id"].astype(str)))
    got = current_of(tmp_path, [*settings, "no-such-setting"])
    assert set(got) == set(settings) and set(got.values()) == current
    assert (
        got[every.loc[every.run_id == rows(1, 5)[0]["run_id"], "setting_id"].iloc[0]]
        == (rows(1, 5)[0]["run_id"])
    )
    assert current_of(tmp_path, settings[:2]) == {s: got[s] for s in settings[:2]}


def test_a_table_just_written_reads_as_the_file_does(tmp_path):
    """A sweep's end writes runs.parquet and its report reads the rows: the rows kept from the
    write equal the file read back, and a change to the file is read, not the kept rows."""
    import system.results as store
    from system.results import compact, deferred_collect

    rows = [make_row({**KEY, "repeat": i}, iter_time_s=1.0 + i, stages=[[i]]) for i in range(5)]
    with deferred_collect():
        write_rows(tmp_path, rows[:3])
        write_rows(tmp_path, rows[3:])
    compact(tmp_path)
    assert str(tmp_path / "runs.parquet") in store._WRITTEN
    kept = read_rows(tmp_path, history=True)
    changed = read_rows(tmp_path, history=True)
    changed.loc[0, "iter_time_s"] = -1.0  # a caller's change stays in its frame
    again = read_rows(tmp_path)
    store._WRITTEN.clear()
    pd.testing.assert_frame_equal(kept, read_rows(tmp_path, history=True))
    pd.testing.assert_frame_equal(again, read_rows(tmp_path))
    write_rows(tmp_path, [make_row({**KEY, "repeat": 9}, iter_time_s=9.0)])  # rewrites the table
    kept_again = read_rows(tmp_path, history=True)
    store._WRITTEN.clear()
    pd.testing.assert_frame_equal(kept_again, read_rows(tmp_path, history=True))
    assert len(kept_again) == 6 and (kept_again.iter_time_s > 0).all()


def test_parts_read_ahead_fold_to_the_table_read_without_them(tmp_path):
    """A process waiting for a sweep's workers reads their parts as they come; the fold then
    writes the same table as one that reads every part itself, and a part replaced after it
    was read ahead is read again (its stamp changed), never taken stale."""
    import system.results as store
    from system.results import compact, deferred_collect, read_parts_ahead

    def rows(first, n, t):
        return [make_row({**KEY, "repeat": i}, iter_time_s=t + i) for i in range(first, first + n)]

    for d in ("ahead", "plain"):
        with deferred_collect():
            write_rows(tmp_path / d, rows(0, 3, 1.0))
            write_rows(tmp_path / d, rows(3, 2, 1.0))
    assert read_parts_ahead(tmp_path / "ahead") == 2
    assert read_parts_ahead(tmp_path / "ahead") == 0  # each part once
    first = sorted((tmp_path / "ahead" / store.PARTS).iterdir())[0]
    replaced = pd.read_parquet(first).assign(iter_time_s=7.0)
    replaced.to_parquet(first.with_name(".tmp"))
    first.with_name(".tmp").replace(first)  # a new file under the old name: another stamp
    compact(tmp_path / "ahead")
    compact(tmp_path / "plain")
    store._WRITTEN.clear()
    ahead, plain = read_rows(tmp_path / "ahead"), read_rows(tmp_path / "plain")
    assert sorted(ahead.iter_time_s) == [4.0, 5.0, 7.0, 7.0, 7.0]
    assert sorted(plain.iter_time_s) == [1.0, 2.0, 3.0, 4.0, 5.0]
    assert not store._AHEAD  # the fold took what it read ahead


def test_count_rows_is_what_read_rows_and_runs_csv_hold(tmp_path):
    """The rows a study reports, counted from the settings alone: the newest of each setting
    (a superseded row is not counted), parts not yet compacted included, from the table this
    process wrote or from the files."""
    import system.results as store
    from system.results import compact, count_rows, deferred_collect

    rows = [make_row({**KEY, "repeat": i}, iter_time_s=1.0 + i) for i in range(4)]
    write_rows(tmp_path, rows)
    write_rows(tmp_path, [make_row({**KEY, "repeat": 0}, iter_time_s=9.0)])  # supersedes one
    assert count_rows(tmp_path) == len(read_rows(tmp_path)) == 4
    assert len(pd.read_csv(tmp_path / "runs.csv")) == 4
    store._WRITTEN.clear()  # a process that did not write the table reads its keys
    assert count_rows(tmp_path) == 4
    with deferred_collect():
        write_rows(tmp_path, [make_row({**KEY, "repeat": 7}, iter_time_s=2.0)])
    assert count_rows(tmp_path) == len(read_rows(tmp_path)) == 5  # the part's row too
    compact(tmp_path)
    assert count_rows(tmp_path) == len(pd.read_csv(tmp_path / "runs.csv")) == 5
    assert count_rows(tmp_path / "none") == 0


def test_read_rows_of_some_columns_are_those_of_all(tmp_path):
    rows = [make_row({**KEY, "repeat": i}, iter_time_s=3.0 - i, pflops=i) for i in range(3)]
    write_rows(tmp_path, rows)
    write_rows(tmp_path, [make_row({**KEY, "repeat": 1}, iter_time_s=7.0)])
    every = read_rows(tmp_path)
    some = read_rows(tmp_path, columns=["pflops", "iter_time_s", "no_such_column", "repeat"])
    assert list(some.columns) == [c for c in every.columns if c in some.columns]
    assert set(some.columns) == {"pflops", "iter_time_s", "repeat"}
    pd.testing.assert_frame_equal(some, every[list(some.columns)])


def test_compacting_writes_runs_csv_beside_the_block_under_the_lock(tmp_path):
    """A sweep's end compacts and builds its report at once: in the block the rows are read
    from the new runs.parquet while runs.csv is written, and the folder lock is held until
    both are done; the text view is the one compact writes, even when the block fails."""
    from system.results import compacting, deferred_collect, study_lock

    rows = [make_row({**KEY, "repeat": i}, iter_time_s=1.0 + i) for i in range(4)]
    for d in ("plain", "beside"):
        with deferred_collect():
            write_rows(tmp_path / d, rows)
    collect(tmp_path / "plain")
    with compacting(tmp_path / "beside") as csv:
        assert len(read_rows(tmp_path / "beside")) == 4
        with pytest.raises(TimeoutError), study_lock(tmp_path / "beside", timeout_s=0):
            pass
    assert csv.read_bytes() == (tmp_path / "plain" / "runs.csv").read_bytes()
    with study_lock(tmp_path / "beside", timeout_s=0):  # released
        pass
    write_rows(
        tmp_path / "beside", [make_row({**KEY, "repeat": 9}, iter_time_s=9.0)], collect_after=False
    )
    with pytest.raises(RuntimeError, match="report failed"), compacting(tmp_path / "beside"):
        raise RuntimeError("report failed")
    assert len(pd.read_csv(tmp_path / "beside" / "runs.csv")) == 5
