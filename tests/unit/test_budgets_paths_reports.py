"""Budgets, paths, the environment and hand-edited tables: one error line before any work.

Search budgets (trials, population, patience, time limit, random layouts) are bounded by
``limits.*`` with the same override as every limit; a study's input files are read before its
first setting; the study name and every path are checked before Hydra makes its run folder; the
wandb mirror keeps its files with the study and its failures, like an encoding stdout cannot
show, are one warning after the rows are stored; a report refuses rows no mode writes.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from hydra import compose, initialize_config_dir

import repro.config  # noqa: F401  (the schema conf/config.yaml names)
from repro.config import validate

ROOT = Path(__file__).resolve().parents[2]
DBG = ("case=debug", "model=debug")


def _cfg(*overrides):
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        return compose("config", overrides=list(overrides))


def _entry(args, cwd, env=None, timeout=240) -> subprocess.CompletedProcess:
    """``python repro/run.py ARGS`` in ``cwd`` (a fresh interpreter, this checkout's code)."""
    full = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", **(env or {})}
    full = {k: v for k, v in full.items() if v is not None}  # None: the variable unset
    return subprocess.run(
        [sys.executable, str(ROOT / "repro/run.py"), *args],
        cwd=cwd,
        env=full,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


# ---- budgets -----------------------------------------------------------------------------------
BUDGETS = [
    (("scheduler.trials=1000000000",), "scheduler.trials=1000000000: over limits.max_trials"),
    (("scheduler.population=1000000000",), "scheduler.population=1000000000: over limits"),
    (("scheduler.patience_trials=1000000000",), "over limits.max_trials=100000"),
    (("scheduler.time_limit_s=1e300",), "scheduler.time_limit_s=1e+300: over limits.max_search_s"),
    (("mode=schedule", "scheduler.time_limit_s=1e300"), "set limits.max_search_s=1e+300 to run"),
    (("mode=scheduler_worth", "random_layouts=100000000"), "over limits.max_random_layouts"),
    (("mode=scheduler_worth", "trials=1000000000"), "trials=1000000000: over limits.max_trials"),
    (("mode=scheduler_worth", "patience_trials=1000000000"), "over limits.max_trials"),
    (("mode=scheduler_worth", "time_limit_s=1e300"), "time_limit_s=1e+300: over limits"),
    (("mode=scheduler_ablation", "random_layouts=100000000"), "over limits.max_random_layouts"),
]


@pytest.mark.parametrize("overrides,message", BUDGETS, ids=[" ".join(b[0]) for b in BUDGETS])
def test_an_unbounded_search_budget_is_one_line_naming_the_limit(tmp_path, overrides, message):
    with pytest.raises(ValueError) as err:
        validate(_cfg(*overrides, f"results_dir={tmp_path}/out"))
    assert message in str(err.value), str(err.value)
    assert "to run anyway" in str(err.value) and len(str(err.value).splitlines()) == 1
    assert not (tmp_path / "out").exists()


def test_a_search_budget_limit_can_be_raised_explicitly(tmp_path):
    cfg = validate(
        _cfg(
            "scheduler.trials=1000000000",
            "scheduler.time_limit_s=1e300",
            "limits.max_trials=1000000000",
            "limits.max_search_s=1e300",
            f"results_dir={tmp_path}",
        )
    )
    assert cfg.scheduler.trials == 10**9 and cfg.scheduler.time_limit_s == 1e300
    # the defaults of every study stay within the limits
    for mode in ("scheduler_worth", "scheduler_ablation", "bench_scheduler", "replan"):
        validate(_cfg(f"mode={mode}", f"results_dir={tmp_path}"))


def test_scheduler_worth_reads_sailor_fits_before_any_setting(tmp_path):
    """A malformed fit failed only after every other setting had run (minutes)."""
    sailor = tmp_path / "sailor"
    sailor.mkdir()
    (sailor / "multizone_bandwidths_het.json").write_text('{"us-central1-a": [')
    (sailor / "intra_node_bandwidths.json").write_text("{}")
    with pytest.raises(ValueError) as err:
        validate(_cfg("mode=scheduler_worth", f"sailor_dir={sailor}", f"results_dir={tmp_path}"))
    assert "multizone_bandwidths_het.json" in str(err.value)
    assert len(str(err.value).splitlines()) == 1


def test_scheduler_worth_builds_every_setting_before_the_first_runs(tmp_path, monkeypatch):
    from repro.studies.scheduler_worth import run as sw

    ran = []
    first = next(iter(sw.settings(None, (0,))))

    def settings(sailor_dir, seeds):
        yield first
        raise ValueError("the last setting's input is bad")

    monkeypatch.setattr(sw, "settings", settings)
    monkeypatch.setattr(sw, "compare", lambda *a, **k: ran.append(a))
    cfg = validate(_cfg("mode=scheduler_worth", f"results_dir={tmp_path}"))
    with pytest.raises(ValueError, match="last setting"):
        sw.run(cfg)
    assert ran == []


# ---- paths and the environment -----------------------------------------------------------------
@pytest.mark.slow
def test_wandb_names_modes_and_folders_are_checked_with_the_config(tmp_path, monkeypatch):
    out = f"results_dir={tmp_path}/r"
    for overrides, message in (
        (("wandb.project=a/b",), "wandb.project='a/b': a wandb name"),
        (("wandb.entity=me:1",), "wandb.entity='me:1'"),
        ((f"wandb.dir={tmp_path}/elsewhere",), "outside results_dir"),
        ((f"wandb.dir={tmp_path}/r/../x",), "outside results_dir"),
    ):
        with pytest.raises(ValueError) as err:
            validate(_cfg(*DBG, "logger=wandb", *overrides, out))
        assert message in str(err.value) and len(str(err.value).splitlines()) == 1
    validate(_cfg(*DBG, "logger=wandb", f"wandb.dir={tmp_path}/r/w", out))  # inside: fine
    validate(_cfg(*DBG, "wandb.project=a/b", out))  # no mirror, no check
    monkeypatch.setenv("WANDB_MODE", "bogus")
    with pytest.raises(ValueError, match="WANDB_MODE='bogus': expected one of offline"):
        validate(_cfg(*DBG, "logger=wandb", out))
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DATA_DIR", str(tmp_path / "home" / ".local/share/wandb"))
    with pytest.raises(ValueError, match="WANDB_DATA_DIR=.*outside results_dir"):
        validate(_cfg(*DBG, "logger=wandb", out))


def test_log_level_names_are_checked():
    from repro.run import log_level

    assert log_level("debug") == "DEBUG"
    with pytest.raises(ValueError, match="DTFM_LOG_LEVEL='BOGUS': expected one of CRITICAL"):
        log_level("BOGUS")


def test_markdown_cells_cannot_split_a_row():
    from repro.report.tables import markdown_table
    from system.markdown import md_cell

    assert md_cell("a|b\nc\r\nd\\") == "a\\|b c d\\\\"
    table = markdown_table(pd.DataFrame({"plan": ["x|y\nz", "ok"], "s": [1.0, 2.0]}))
    lines = table.splitlines()
    assert len(lines) == 4 and [ln.count(" | ") for ln in lines] == [1, 0, 1, 1]


def test_the_external_report_escapes_plan_and_set_names(monkeypatch):
    from repro.studies.external import report

    frame = {
        "plan": "p|1\nq",
        "real_s": 1.0,
        "predicted_iter_time_s": 1.1,
        "signed_error_pct": 10.0,
        "abs_error_pct": 10.0,
        "sailor_simulator_s": None,
        "sailor_signed_error_pct": None,
        "measured_red_grads_s": 0.5,
        "predicted_red_grads_s": 0.25,
        "red_grads_signed_error_pct": -50.0,
        "dp_algorithm": "ring",
        "round_rows": False,
    }
    totals = {
        "set": "s|et",
        "plans": 1,
        "excluded": 0,
        "mape_pct": 10.0,
        "max_abs_error_pct": 10.0,
        "mean_signed_error_pct": 10.0,
        "sailor_mape_pct": None,
        "sailor_max_abs_error_pct": None,
        "red_grads_plans": 1,
        "red_grads_mape_pct": 50.0,
        "red_grads_dp_plans": 1,
        "red_grads_dp_mape_pct": 50.0,
        "red_grads_dp_median_ratio": 2.0,
    }
    monkeypatch.setattr(report, "errors_frame", lambda rows: pd.DataFrame([frame]))
    monkeypatch.setattr(report, "mape_table", lambda rows: pd.DataFrame([totals]))
    monkeypatch.setattr(report, "warnings_frame", lambda rows: pd.DataFrame())
    text = report.render_report([], command="x", figure=None)
    row = next(ln for ln in text.splitlines() if ln.startswith("| p\\"))
    assert row.startswith("| p\\|1 q | 1 |") and row.count(" | ") == 6
    assert any(ln.startswith("| s\\|et | 1 | 0 |") for ln in text.splitlines())
    # the logged reduction's tables: the set and the plan escaped too
    assert any(ln.startswith("| s\\|et | 1 | 50.0% |") for ln in text.splitlines())
    assert any(ln.startswith("| p\\|1 q | ring |") for ln in text.splitlines())


@pytest.mark.slow  # fresh interpreters
def test_a_bad_study_path_or_environment_creates_nothing(tmp_path):
    """Hydra made outputs/<study>/<run>/ (for study=../../x anywhere) before the study was
    checked; now every refusal is one line, exit 2, and the working folder stays empty."""
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    cases = [
        (["study=../../escaped", *DBG], {}, "study='../../escaped': a plain name"),
        (["-m", "study=../up", *DBG, "batch=16,32"], {}, "study='../up'"),
        ([*DBG, "pp=0", f"results_dir={tmp_path}/r"], {}, "pp=0: must be >= 1"),
        ([*DBG, f"results_dir={tmp_path}/r"], {"DTFM_LOG_LEVEL": "BOGUS"}, "DTFM_LOG_LEVEL"),
        (
            [*DBG, "logger=wandb", f"results_dir={tmp_path}/r"],
            {"WANDB_MODE": "bogus"},
            "WANDB_MODE='bogus'",
        ),
    ]
    for args, env, message in cases:
        p = _entry(args, cwd, env, timeout=120)
        errors = [ln for ln in p.stderr.splitlines() if ln.strip()]
        assert p.returncode == 2, (args, p.stdout, p.stderr)
        assert len(errors) == 1 and errors[0].startswith("error: ") and message in errors[0], (
            args,
            p.stderr,
        )
        assert list(cwd.iterdir()) == [], (args, list(cwd.rglob("*")))
    assert not (tmp_path / "escaped").exists() and not (tmp_path / "r").exists()


@pytest.mark.slow  # a fresh interpreter and a simulation
def test_a_stdout_without_unicode_warns_once_and_writes_the_report(tmp_path):
    """Case 5's table prints the paper's ranges ('3.8–4.8×'): an ascii stdout failed it after
    the rows were stored, with no REPORT.md."""
    p = _entry(
        ["case=5", "layers=24", "batch=1024", "system=ours", f"results_dir={tmp_path}/r"],
        tmp_path,
        {"PYTHONIOENCODING": "ascii", "COLUMNS": "120"},
    )
    assert p.returncode == 0, p.stderr[-2000:]
    assert "Traceback" not in p.stderr + p.stdout
    assert p.stderr.count("warning: stdout's encoding ascii cannot show") == 1
    assert (tmp_path / "r" / "REPORT.md").is_file()


def _closed_port() -> int:
    """A loopback port nothing listens on (bound, then closed)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow  # a fresh interpreter, a simulation and wandb's connection timeout
def test_an_unreachable_wandb_server_is_one_warning_after_the_rows(tmp_path):
    pytest.importorskip("wandb")
    home = tmp_path / "home"
    home.mkdir()
    env = {
        "HOME": str(home),
        "WANDB_BASE_URL": f"http://127.0.0.1:{_closed_port()}",
        "WANDB_API_KEY": "x" * 40,
        "WANDB_INIT_TIMEOUT": "3",
        "WANDB_MODE": None,
        "COLUMNS": "300",
    }
    args = [*DBG, "system=ours", "logger=wandb", "wandb.mode=online", f"results_dir={tmp_path}/r"]
    p = _entry(args, tmp_path, env, timeout=240)
    out = p.stdout + p.stderr
    assert p.returncode == 0, out[-3000:]
    assert "Traceback" not in out
    assert out.count("wandb mirror failed") == 1, out[-3000:]
    assert (tmp_path / "r" / "REPORT.md").is_file() and (tmp_path / "r" / "runs.parquet").is_file()


@pytest.mark.slow  # a fresh interpreter, a simulation and wandb offline
def test_offline_wandb_writes_only_under_the_study(tmp_path):
    """wandb staged its Table files (read-only) under ~/.local/share/wandb."""
    pytest.importorskip("wandb")
    home = tmp_path / "home"
    home.mkdir()
    env = {"HOME": str(home), "WANDB_MODE": "offline", "WANDB_SILENT": "true"}
    for v in ("WANDB_DATA_DIR", "WANDB_CACHE_DIR", "WANDB_ARTIFACT_DIR", "WANDB_DIR"):
        env[v] = None
    p = _entry([*DBG, "system=ours", "logger=wandb", f"results_dir={tmp_path}/r"], tmp_path, env)
    assert p.returncode == 0, (p.stdout + p.stderr)[-3000:]
    assert [q for q in home.rglob("*") if "wandb" in q.name] == []
    assert list((tmp_path / "r" / "wandb").glob("offline-run-*"))
    assert (tmp_path / "r" / "wandb" / "data").is_dir()


# ---- hand-edited tables ------------------------------------------------------------------------
def _study(folder: Path) -> None:
    from system.results import make_row, write_rows

    key = {"mode": "simulate", "case": "5", "num_layers": 24, "global_batch_size": 1024}
    rows = [
        make_row({**key, "system": s}, iter_time_s=t, pflops=1.0 / t)
        for s, t in (("ours", 10.0), ("megatron", 20.0))
    ]
    write_rows(folder, rows, collect_after=True)


def _edit(folder: Path, **changes) -> None:
    table = pd.read_parquet(folder / "runs.parquet")
    for column, value in changes.items():
        table.loc[table.index[-1], column] = value
    table.to_parquet(folder / "runs.parquet")


def _report(folder: Path):
    from repro.run import run

    return run(_cfg("mode=report", f"results_dir={folder}", "workflow.ablation_csv=null"))


@pytest.mark.parametrize(
    "changes,message",
    [
        ({"iter_time_s": -5.0}, "iter_time_s not a positive finite number"),
        ({"iter_time_s": float("inf")}, "iter_time_s=inf"),
        ({"pflops": float("-inf")}, "pflops not a non-negative finite number"),
        ({"system": "ours_v2"}, "system 'ours_v2', which no mode writes"),
    ],
)
def test_a_report_refuses_rows_no_mode_writes(tmp_path, changes, message):
    _study(tmp_path)
    _report(tmp_path)  # as stored: fine
    (tmp_path / "REPORT.md").unlink()
    _edit(tmp_path, **changes)
    with pytest.raises(ValueError) as err:
        _report(tmp_path)
    assert message in str(err.value) and str(tmp_path / "runs.parquet") in str(err.value)
    assert len(str(err.value).splitlines()) == 1
    assert not (tmp_path / "REPORT.md").exists()


@pytest.mark.parametrize(
    "text,message",
    [("[1, 2]", "holds one JSON object, not a list"), ('{"run_id": ', "unreadable")],
)
def test_a_bad_row_file_of_the_old_store_is_named(tmp_path, text, message):
    from system.results import read_rows

    _study(tmp_path)
    (tmp_path / "rows").mkdir()
    (tmp_path / "rows" / "old.json").write_text(text)
    with pytest.raises(ValueError) as err:
        read_rows(tmp_path)
    assert str(tmp_path / "rows" / "old.json") in str(err.value) and message in str(err.value)
    (tmp_path / "rows" / "old.json").write_text(json.dumps({"run_id": "x", "case": "5"}))
    assert len(read_rows(tmp_path)) >= 2
