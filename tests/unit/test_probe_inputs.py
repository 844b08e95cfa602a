"""mode=probe_inputs' description of the results folder a probe left behind."""

from __future__ import annotations

from repro.studies.probe_inputs import _describe
from system.results import PARTS, make_row, write_rows

KEY = {"mode": "simulate", "case": "5", "system": "ours"}


def _rows(n: int, **key) -> list[dict]:
    return [make_row({**KEY, **key, "repeat": r}, iter_time_s=1.0 + r) for r in range(n)]


def test_rows_still_in_parts_are_counted(tmp_path):
    """A probe whose sweep stopped before compacting leaves its rows in parts/ only."""
    assert _describe(tmp_path) == "left 0 rows, REPORT.md: no"
    write_rows(tmp_path, _rows(3), collect_after=False)
    write_rows(tmp_path, _rows(2, system="megatron"), collect_after=False)
    assert (tmp_path / PARTS).is_dir() and not (tmp_path / "runs.parquet").exists()
    assert _describe(tmp_path) == "left 5 rows, REPORT.md: no"


def test_table_and_parts_are_counted_together(tmp_path):
    write_rows(tmp_path, _rows(2), collect_after=True)
    write_rows(tmp_path, _rows(1), collect_after=False)  # a rerun: a newer row, counted too
    (tmp_path / "REPORT.md").write_text("# report\n")
    assert (tmp_path / "runs.parquet").exists() and any((tmp_path / PARTS).iterdir())
    assert _describe(tmp_path) == "left 3 rows, REPORT.md: yes"
