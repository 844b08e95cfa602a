"""Output sets written whole (:func:`system.results.write_set`): the new set replaces the old
one, files the new run does not make go, a failing run leaves the old set as it was."""

from __future__ import annotations

import multiprocessing as mp
import time
from pathlib import Path

import pytest

from system.results import write_set


def _files(d: Path) -> dict[str, str]:
    return {p.name: p.read_text() for p in d.iterdir() if p.is_file() and p.name[0] != "."}


def _write(d: Path, files: dict[str, str], **kw) -> None:
    with write_set(d, **kw) as stage:
        for n, text in files.items():
            (stage / n).write_text(text)


def test_new_set_replaces_old_and_drops_its_leftovers(tmp_path):
    (tmp_path / "notes.md").write_text("mine")  # not a member: never touched
    _write(tmp_path, {"REPORT.md": "r1", "errors.csv": "e1", "fig.png": "f1"})
    assert _files(tmp_path) == {
        "notes.md": "mine",
        "REPORT.md": "r1",
        "errors.csv": "e1",
        "fig.png": "f1",
    }
    _write(tmp_path, {"REPORT.md": "r2", "predictions.csv": "p2"})
    assert _files(tmp_path) == {"notes.md": "mine", "REPORT.md": "r2", "predictions.csv": "p2"}
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".report.new-")]


def test_owns_removes_a_legacy_member_without_a_manifest(tmp_path):
    (tmp_path / "errors.csv").write_text("old run")  # written before sets had a manifest
    (tmp_path / "notes.md").write_text("mine")
    _write(tmp_path, {"REPORT.md": "r"}, owns=("REPORT.md", "errors.csv"))
    assert _files(tmp_path) == {"REPORT.md": "r", "notes.md": "mine"}


def test_failing_run_leaves_the_old_set_untouched(tmp_path):
    _write(tmp_path, {"REPORT.md": "r1", "errors.csv": "e1"})
    with pytest.raises(OverflowError), write_set(tmp_path) as stage:
        (stage / "errors.csv").write_text("inf")
        raise OverflowError("a plan's time overflows")
    assert _files(tmp_path) == {"REPORT.md": "r1", "errors.csv": "e1"}
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".report.new-")]


def test_sets_of_other_names_do_not_touch_each_other(tmp_path):
    _write(tmp_path, {"REPORT.md": "r"}, name="report")
    _write(tmp_path, {"sensitivity.md": "s1", "sensitivity.csv": "c"}, name="sensitivity")
    _write(tmp_path, {"sensitivity.md": "s2"}, name="sensitivity")
    assert _files(tmp_path) == {"REPORT.md": "r", "sensitivity.md": "s2"}


def test_store_files_are_never_members_nor_deleted(tmp_path):
    (tmp_path / "runs.parquet").write_text("table")
    (tmp_path / ".report.set").write_text('["runs.parquet", "../x", ".lock", "a.csv"]')
    (tmp_path / "a.csv").write_text("old")
    _write(tmp_path, {"REPORT.md": "r"}, owns=("runs.csv",))
    assert _files(tmp_path) == {"runs.parquet": "table", "REPORT.md": "r"}
    with pytest.raises(ValueError, match="runs.parquet is the store's file"):
        _write(tmp_path, {"runs.parquet": "x"})
    assert (tmp_path / "runs.parquet").read_text() == "table"
    with pytest.raises(ValueError, match="plain name"):
        _write(tmp_path, {}, name="../up")


def _writer(d: str, tag: str, n: int) -> None:
    for i in range(n):
        files = {"REPORT.md": f"{tag}{i}", "a.csv": f"{tag}{i}"}
        if i % 2:
            files["b.csv"] = f"{tag}{i}"
        with write_set(d) as stage:
            for name, text in files.items():
                (stage / name).write_text(text)
                time.sleep(0.001)


def test_concurrent_writers_end_with_one_whole_set(tmp_path):
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_writer, args=(str(tmp_path), t, 15)) for t in "xy"]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    files = _files(tmp_path)
    assert len(set(files.values())) == 1, files  # every file from the same write
    assert set(files) in ({"REPORT.md", "a.csv"}, {"REPORT.md", "a.csv", "b.csv"})


def test_study_report_is_one_set(tmp_path, monkeypatch):
    """A study's report replaces the last one whole (a stale figure goes) and a report that
    fails halfway leaves the last one as it was."""
    import repro.report.build as build
    from system.results import write_rows
    from tests.unit._workflow_rows import synthetic_rows

    write_rows(tmp_path, synthetic_rows(cases=("5",), noise=0.0, seed=1))
    (tmp_path / "fig4.png").write_bytes(b"a figure of an older report")
    build.build_report(tmp_path)
    assert not (tmp_path / "fig4.png").exists()
    before = {n: (tmp_path / n).read_bytes() for n in build.REPORT_FILES if (tmp_path / n).exists()}
    assert {"REPORT.md", "claims.csv", "variance.csv", "best.csv", "fig3.png"} <= set(before)

    def broken(*a, **k):
        raise RuntimeError("the summary failed")

    monkeypatch.setattr(build, "_summary_and_fig3", broken)
    (tmp_path / "REPORT.md").write_text("the last report")
    before["REPORT.md"] = b"the last report"
    with pytest.raises(RuntimeError, match="the summary failed"):
        build.build_report(tmp_path)
    after = {n: (tmp_path / n).read_bytes() for n in build.REPORT_FILES if (tmp_path / n).exists()}
    assert after == before
