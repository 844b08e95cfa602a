"""Hostile inputs at the entry: one line (exit 2) before any work, files only where they belong.

The config-level checks run through :func:`repro.config.validate` (no subprocess); what only the
entry can show (exit codes, folders written, Hydra's folder) runs ``repro/run.py`` itself.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from repro.config import validate

ROOT = Path(__file__).resolve().parents[2]
BAD_YAML = "name: x\ndevices: [a, b\n"
PY_TAG = "devices: !!python/object/apply:os.system ['true']\npairs: []\n"


def _entry(*args: str, cwd: Path, timeout_s: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(ROOT / "repro" / "run.py"), *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        env={**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"},
    )


def _one_error_line(out: subprocess.CompletedProcess) -> str:
    lines = [ln for ln in out.stderr.splitlines() if ln.startswith("error:")]
    assert out.returncode == 2 and len(lines) == 1, (out.returncode, out.stderr[-2000:])
    return lines[0]


@pytest.mark.parametrize(
    "overrides,message",
    [
        ({"seed": 2**63}, "seed=9223372036854775808: must be <= 9223372036854775807"),
        ({"workflow": {"tolerance": float("nan")}}, "workflow.tolerance=nan: must be a finite"),
        ({"study": ".."}, "study='..': a plain name"),
        ({"study": "."}, "study='.': a plain name"),
        ({"repeats": 1_000_000}, "repeats=1000000: over limits.max_repeats=1000"),
        (
            {"mode": "train", "runtime": {"lr": 1e30}},
            "runtime.lr=1e+30: must be <= 10.0",
        ),
        ({"mode": "train", "tp": 2}, "tp=2: applies to the baselines"),
        ({"mode": "train", "zero": 1}, "zero=1: applies to system=deepspeed only"),
        (
            {"mode": "train", "system": "megatron", "zero": 1},
            "zero=1: applies to system=deepspeed only, not system=megatron",
        ),
        (
            {"mode": "train", "system": "megatron", "runtime": {"dp_mode": "allreduce"}},
            "runtime.dp_mode=allreduce: applies to system=ours only",
        ),
        (
            {"mode": "train", "layers": 100_000},
            "needs about 209.1 GiB for its 1 rank on this machine: over limits.max_memory_gib",
        ),
        ({"mode": "replan", "case": "debug"}, "step_devices=16: more than half of case debug"),
        (
            {"mode": "replan", "case": "5", "model": "gpt3_xl", "step_devices": 8, "events": 1},
            "the trace reaches 56 devices: num_layers=24 is not divisible into pp=7",
        ),
        ({"mode": "replan", "interval_s": float("inf")}, "interval_s=inf: must be a finite"),
        (
            {"mode": "emulate", "bandwidth_scale": 1e-12},
            "emulated link 0->1: 0.000795827 bit/s",
        ),
        ({"mode": "emulate", "delay_scale": 1e6}, "delay_scale=1000000.0: must be <= 100"),
    ],
)
def test_bad_values_are_one_line_before_any_work(overrides, message):
    with_case = overrides.get("mode", "simulate") in ("simulate", "emulate", "replan")
    cfg = {**({"case": "debug", "model": "debug"} if with_case else {}), **overrides}
    with pytest.raises(ValueError) as e:
        validate(cfg)
    assert message in str(e.value) and "\n" not in str(e.value), str(e.value)


def test_bad_topology_files_and_limits_through_the_config(tmp_path):
    for name, text, message in (
        ("bad.yaml", BAD_YAML, "not a valid YAML document"),
        ("tag.yaml", PY_TAG, "could not determine a constructor"),
        ("big.yaml", "devices: [" + ", ".join(["a"] * 2000) + "]\npairs: []\n", "over limits"),
    ):
        (tmp_path / name).write_text(text)
        with pytest.raises(ValueError, match=message):
            validate({"case": str(tmp_path / name), "model": "debug"})
    p = tmp_path / "metrics"
    p.mkdir()
    with pytest.raises(ValueError, match="metrics_out=.*names a folder"):
        validate({"mode": "train", "metrics_out": str(p)})


def _error_here(mode: str, results_dir: Path, monkeypatch) -> str:
    """What the command line would print for ``mode=MODE results_dir=...``, run in this
    process: the error the entry turns into its one ``error:`` line (exit 2)."""
    from repro.run import USER_ERRORS, run

    monkeypatch.chdir(results_dir.parent)
    with pytest.raises(USER_ERRORS) as e:
        run({"mode": mode, "results_dir": results_dir.name})
    assert len(str(e.value).splitlines()) == 1, str(e.value)
    return f"error: {e.value}"


@pytest.mark.parametrize("mode", ["report", "collect", "emulation_report"])
def test_a_report_of_a_folder_without_rows_fails(tmp_path, mode, monkeypatch):
    (tmp_path / "empty").mkdir()
    if mode == "report":  # the command line once; the same error in this process otherwise
        line = _one_error_line(_entry(f"mode={mode}", "results_dir=empty", cwd=tmp_path))
    else:
        line = _error_here(mode, tmp_path / "empty", monkeypatch)
    assert "no rows" in line
    assert not (tmp_path / "empty" / "REPORT.md").exists()


@pytest.mark.parametrize("mode", ["report", "collect"])
@pytest.mark.parametrize("what", ["corrupt", "wrong schema"])
def test_a_report_of_a_bad_table_names_the_file(tmp_path, mode, what, monkeypatch):
    import pandas as pd

    d = tmp_path / "study"
    d.mkdir()
    if what == "corrupt":
        (d / "runs.parquet").write_bytes(b"not parquet")
    else:
        pd.DataFrame({"setting": ["a"]}).to_parquet(d / "runs.parquet")
    if (mode, what) == ("collect", "corrupt"):  # the command line once
        line = _one_error_line(_entry(f"mode={mode}", "results_dir=study", cwd=tmp_path))
    else:
        line = _error_here(mode, d, monkeypatch)
    assert "study/runs.parquet" in line
    assert ("unreadable" if what == "corrupt" else "no run_id column") in line


@pytest.mark.slow  # two scheduler runs, each a process of its own
def test_a_path_case_writes_inside_the_results_folder_only(tmp_path):
    """``case=/abs/path.yaml`` once wrote ``R/case/abs/path.yaml-...json`` and a ``../`` case
    left ``R``; the schedule's file is named by the file's stem and content."""
    topo = tmp_path / "deep" / "up" / "t.yaml"
    topo.parent.mkdir(parents=True)
    topo.write_text(
        "devices: [A, A, B, B]\npairs:\n"
        "  - {region_a: A, region_b: B, delay_ms: 10, bandwidth_gbps: 1}\n"
        "  - {region_a: A, region_b: A, delay_ms: 0.1, bandwidth_gbps: 10}\n"
        "  - {region_a: B, region_b: B, delay_ms: 0.1, bandwidth_gbps: 10}\n"
    )
    (tmp_path / "sub").mkdir()
    sneaky = f"{tmp_path}/sub/../deep/./up/t.yaml"
    for case in (str(topo), sneaky):
        out = _entry(
            "mode=schedule", f"case={case}", "scheduler.trials=2", "results_dir=R", cwd=tmp_path
        )
        assert out.returncode == 0, out.stderr[-2000:]
    files = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*.json"))
    assert [
        f for f in files if f.parts[0] != "R" or len(f.parts) != 2 and f.parts[1] != "jobs"
    ] == []
    (only,) = [f for f in files if f.parts[1] != "jobs"]
    assert only.name.startswith("caset-") and only.name.endswith("-genetic-seed0.json")


@pytest.mark.slow
def test_study_dot_dot_writes_nothing_outside_results(tmp_path):
    line = _one_error_line(_entry("study=..", "case=debug", "model=debug", cwd=tmp_path))
    assert "a plain name" in line
    assert not list(tmp_path.rglob("runs.parquet"))


@pytest.mark.slow  # two whole sweeps side by side
def test_two_sweeps_started_in_the_same_second_get_their_own_hydra_folders(tmp_path):
    args = [
        sys.executable,
        str(ROOT / "repro" / "run.py"),
        "-m",
        "sweep=smoke",
        "case=debug",
        "model=debug",
        "system=ours",
        "batch=16,32",
        "results_dir=S",
        "workflow.ablation_csv=null",
    ]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    procs = [
        subprocess.Popen(
            args, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        for _ in range(2)
    ]
    outs = [p.communicate(timeout=300)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    folders = list((tmp_path / "outputs" / "smoke" / "multirun").iterdir())
    assert len(folders) == 2, folders
    ran = [int(o.split(" jobs ran")[0].rsplit(" ", 1)[1]) for o in outs]
    skipped = [int(o.split(" skipped")[0].rsplit(" ", 1)[1]) for o in outs]
    # each job ran once: what one sweep ran, the other waited for and found finished (which
    # sweep takes which job is a race of their locks)
    assert sum(ran) == 2 and [r + s for r, s in zip(ran, skipped, strict=True)] == [2, 2], outs


@pytest.fixture
def read_only_folder(tmpfs):
    from repro.checks.probe_inputs.probe_runs import read_only

    d = tmpfs("ro")
    read_only(d)
    return d


def test_a_working_folder_hydra_cannot_write_is_one_line(read_only_folder, tmp_path):
    line = _one_error_line(
        _entry("case=debug", "model=debug", f"results_dir={tmp_path / 'R'}", cwd=read_only_folder)
    )
    assert "is not writable" in line and "hydra.run.dir" in line
    assert not (tmp_path / "R").exists()


@pytest.mark.slow
def test_a_read_only_results_folder_is_one_line_before_any_work(read_only_folder, tmp_path):
    t0 = time.monotonic()
    line = _one_error_line(
        _entry("case=debug", "model=debug", f"results_dir={read_only_folder}", cwd=tmp_path)
    )
    assert "is not writable" in line and time.monotonic() - t0 < 60
