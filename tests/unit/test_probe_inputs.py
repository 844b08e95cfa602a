"""mode=probe_inputs' description of the results folder a probe left behind."""

from __future__ import annotations

from repro.checks.probe_inputs.run import _describe
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


def test_every_file_a_hostile_probe_reads_is_written(tmp_path):
    """A probe naming a scratch file that setup() does not write would test a missing file
    instead of the bad one; only the probes about missing things name absent files."""
    import re

    from repro.checks.probe_inputs.hostile import HOSTILE, setup

    setup(tmp_path)
    absent = {"missing.yaml", "none.json", "nope", "tc"}  # and the probes' results folders:
    absent |= {"a", "b", "e", "g", "m", "p", "q", "s", "t", "w"}
    absent |= {"cw", "k", "qk", "x", "xo", "xf", "xm", "xp", "xn"}  # second pass
    for probe in HOSTILE:
        for step in probe.steps:
            for arg in step:
                for name in re.findall(r"R/([\w.]+)", arg):
                    if name in absent or name.startswith(("sw", "ro", "full", "INJECTED")):
                        continue
                    assert (tmp_path / name).exists(), (probe.name, name)


def test_a_traceback_shows_as_its_exception_line():
    from repro.checks.probe_inputs.run import _traceback

    text = (
        'Traceback (most recent call last):\n  File "x.py", line 1, in <module>\n'
        "yaml.constructor.ConstructorError: could not determine a constructor\n"
        '  in "x", line 1, column 10\n    ^\n'
    )
    assert _traceback(text) == (
        "traceback: yaml.constructor.ConstructorError: could not determine a constructor"
    )
    assert _traceback("error: one line\n") is None


def test_hydra_refusing_an_unknown_key_shows_the_key_and_the_mode():
    """Hydra's key check prints its reason above four lines of context; the table shows the
    reason, not the last context line."""
    from repro.checks.probe_inputs.hostile import Probe
    from repro.checks.probe_inputs.run import _summary

    err = (
        "Could not override 'tp'.\nTo append to your config use +tp=2\n"
        "Key 'tp' not in 'SimulateConfig'\n    full_key: tp\n    object_type=SimulateConfig\n\n"
        "Set the environment variable HYDRA_FULL_ERROR=1 for a complete stack trace.\n"
    )
    got = _summary(Probe("simulate tp=2", [["x"]]), [("1", "", err)])
    assert got == "Could not override 'tp'. Key 'tp' not in 'SimulateConfig'"


def test_a_terminated_probe_run_removes_its_copies(tmp_path, monkeypatch):
    """SIGTERM while a side is being probed: SystemExit, and no probe-* folder left behind."""
    import os
    import signal
    import tempfile

    import pytest

    from repro.checks.probe_inputs import run as pi

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))

    def materialise(rev, into):
        into.mkdir(parents=True)
        (into / "file").write_text("a copy\n")
        os.kill(os.getpid(), signal.SIGTERM)  # as `kill PID` would, in the middle of the side

    monkeypatch.setattr(pi, "materialise", materialise)
    monkeypatch.setattr(signal, "getsignal", lambda s: signal.SIG_DFL)  # as in a plain shell
    with pytest.raises(SystemExit) as e:
        pi._run_side("HEAD", pi.PROBES[:1], before=False)
    assert e.value.code == 128 + signal.SIGTERM
    assert not list(tmp_path.glob("probe-*"))


def test_report_tables_are_checked_for_rows_a_cell_split_or_cut(tmp_path):
    from repro.checks.probe_inputs.run import _tables

    assert _tables(tmp_path) == "no REPORT.md"
    good = "# r\n\n| a | b |\n|---|---|\n| x\\|y | 1 |\n\ntext\n"
    (tmp_path / "REPORT.md").write_text(good)
    assert _tables(tmp_path) == "REPORT.md tables intact"
    (tmp_path / "REPORT.md").write_text(good.replace("x\\|y", "x|y"))  # a row split
    assert _tables(tmp_path) == "REPORT.md tables: 1 broken rows"
    (tmp_path / "REPORT.md").write_text(good.replace("x\\|y", "x\ny"))  # a row cut in two
    assert _tables(tmp_path) == "REPORT.md tables: 2 broken rows"


def test_special_files_and_listings(tmp_path):
    import stat

    from repro.checks.probe_inputs.run import _listing, _special

    _special("fifo:R/a/p.json", tmp_path)
    assert stat.S_ISFIFO((tmp_path / "a" / "p.json").lstat().st_mode)
    _special("zero:R/a/z.json", tmp_path)
    assert (tmp_path / "a" / "z.json").readlink().as_posix() == "/dev/zero"
    (tmp_path / "a" / "parts").mkdir()
    (tmp_path / "a" / "parts" / "1.parquet").write_text("")
    (tmp_path / "a" / "runs.csv").write_text("")
    assert _listing(tmp_path / "a") == "files: runs.csv; parts: 1"
