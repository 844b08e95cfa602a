"""Sweeps: finished jobs are skipped by typed config; a sweep killed half-way loses nothing.

Every test here shares the smoke sweep composed once per module (:func:`_composed`) and the
stand-in task that writes its rows.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib.util
import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
from hydra import compose, initialize_config_dir

from repro.config import validate
from repro.sweep import finished_job, job_key, ledger_path, record_failure, run_job
from system.results import collect, make_row, read_rows, write_rows
from tests.unit._workflow_rows import TWO_DEBUG_JOBS

ROOT = Path(__file__).resolve().parents[2]
HAS_SIMULATE = importlib.util.find_spec("repro.modes.simulate.run") is not None
N_SMOKE = 10  # jobs in conf/sweep/smoke.yaml (checked in test_smoke_has_ten_jobs)


@functools.lru_cache(maxsize=8)
def _composed(overrides: tuple[str, ...], jobs: int | None = None):
    """The first ``jobs`` (default all) jobs of the smoke sweep with ``overrides``, typed."""
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        base = compose("config", overrides=["sweep=smoke"], return_hydra_config=True)
        params = {k: str(v).split(",") for k, v in base.hydra.sweeper.params.items()}
        return [
            validate(
                compose(
                    "config",
                    overrides=[
                        "sweep=smoke",
                        "results_dir=PLACEHOLDER",
                        *overrides,
                        *(f"{k}={v}" for k, v in zip(params, combo, strict=True)),
                    ],
                )
            )
            for combo in itertools.islice(itertools.product(*params.values()), jobs)
        ]


def _configs(tmp_path, overrides=(), jobs=None):
    """The smoke sweep's jobs, as Hydra composes and the entry types them (one per job)."""
    return [
        dataclasses.replace(c, results_dir=str(tmp_path)) for c in _composed(tuple(overrides), jobs)
    ]


def _fake_task(calls):
    """A stand-in mode: writes one row per repeat, like the simulate mode does."""

    def task(cfg):
        calls.append(job_key(cfg))
        rows = [
            make_row(
                {
                    "mode": cfg.mode,
                    "case": cfg.case[0],
                    # simulate's rows name one system each ("all" is a choice, not a system)
                    "system": "ours" if str(cfg.system) == "all" else str(cfg.system),
                    "num_layers": cfg.layers,
                    "global_batch_size": cfg.batch,
                    "repeat": r,
                },
                iter_time_s=1.0 + r,
                study=cfg.study,
            )
            for r in range(cfg.repeats)
        ]
        write_rows(cfg.results_dir, rows, collect_after=False)
        return {"rows": len(rows)}

    return task


@pytest.mark.slow
def test_job_key_ignores_reporting_keys_only(tmp_path):
    a = _configs(tmp_path)[0]  # the whole sweep, composed once for the module
    (b,) = _configs(tmp_path, ["logger=wandb", "workflow.tolerance=0.1"], jobs=1)
    (c,) = _configs(tmp_path, ["seed=1"], jobs=1)
    assert job_key(a) == job_key(b) != job_key(c)


@pytest.mark.slow
def test_interrupted_sweep_restarts_without_loss_or_duplicates(tmp_path):
    jobs = _configs(tmp_path)
    calls: list[str] = []
    task = _fake_task(calls)
    done: list[dict] = []  # run_job's summaries: "skipped" says whether the job ran
    half = len(jobs) // 2

    def dies_half_way(cfg):
        if len(calls) == half:  # killed while running this job: its rows half-written, no ledger
            write_rows(
                cfg.results_dir,
                [make_row({"partial": True, "case": cfg.case[0]})],
                collect_after=False,
            )
            raise KeyboardInterrupt
        return task(cfg)

    with pytest.raises(KeyboardInterrupt):
        for cfg in jobs:
            done.append(run_job(cfg, dies_half_way, multirun=True))
    assert sum(not d["skipped"] for d in done) == half
    calls.clear()
    done.clear()
    for cfg in jobs:
        done.append(run_job(cfg, task, multirun=True))
    skipped = sum(d["skipped"] for d in done)
    assert skipped == half and len(done) - skipped == len(jobs) - half
    assert len(calls) == len(jobs) - half
    collect(tmp_path)
    df = pd.read_csv(tmp_path / "runs.csv")
    full = df[df.get("partial").isna()] if "partial" in df else df
    assert len(full) == len(jobs) * 3 and not full.run_id.duplicated().any()
    # a third pass runs nothing and changes nothing
    third = [run_job(cfg, task, multirun=True) for cfg in jobs]
    assert all(d["skipped"] for d in third) and len(read_rows(tmp_path)) == len(df)


def test_a_job_whose_rows_were_lost_runs_again(tmp_path):
    cfg = _configs(tmp_path)[0]
    calls: list[str] = []
    run_job(cfg, _fake_task(calls), multirun=True)
    rec = finished_job(tmp_path, job_key(cfg))
    assert rec is not None and len(rec["run_ids"]) == 3 and rec["config"]["case"] == cfg.case
    # the study's rows lost (e.g. not committed): the job's part, and any compacted table
    shutil.rmtree(tmp_path / "parts")
    (tmp_path / "runs.parquet").unlink(missing_ok=True)
    assert finished_job(tmp_path, job_key(cfg)) is None
    run_job(cfg, _fake_task(calls), multirun=True)
    assert len(calls) == 2 and len(read_rows(tmp_path)) == 3


def test_a_model_change_reruns_the_job(tmp_path, monkeypatch):
    cfg = _configs(tmp_path)[0]
    calls: list[str] = []
    run_job(cfg, _fake_task(calls), multirun=True)
    run_job(cfg, _fake_task(calls), multirun=True)
    assert len(calls) == 1
    monkeypatch.setattr("repro.sweep.model_version", lambda: "changed-model")
    run_job(cfg, _fake_task(calls), multirun=True)
    assert len(calls) == 2


def test_a_failed_job_is_recorded_and_runs_again(tmp_path):
    cfg = _configs(tmp_path)[0]
    record_failure(cfg, RuntimeError("boom"))
    rec = json.loads(ledger_path(tmp_path, job_key(cfg)).read_text())
    assert rec["status"] == "error" and "boom" in rec["error"]
    from repro.sweep import count_outcomes  # what a sweep's summary counts

    assert count_outcomes(tmp_path, {job_key(cfg): None}, None).failed
    assert finished_job(tmp_path, job_key(cfg)) is None
    calls: list[str] = []
    run_job(cfg, _fake_task(calls), multirun=True)
    assert len(calls) == 1 and finished_job(tmp_path, job_key(cfg)) is not None


def test_every_sweep_point_is_checked_before_the_first_job():
    from repro.sweep import check_jobs

    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose("config", overrides=["sweep=smoke"], return_hydra_config=True)
        cfg.hydra.overrides.task = ["sweep=smoke", "case=1,9,2"]
        bad = check_jobs(cfg)
    assert len(bad) == 2 and all("case=9" in b and "unknown case" in b for b in bad), bad


def test_single_runs_are_never_skipped(tmp_path):
    cfg = _configs(tmp_path)[0]
    calls: list[str] = []
    run_job(cfg, _fake_task(calls), multirun=False)
    run_job(cfg, _fake_task(calls))  # not under Hydra: a single run
    assert len(calls) == 2 and finished_job(tmp_path, job_key(cfg)) is not None


def test_skip_can_be_turned_off(tmp_path):
    cfg = _configs(tmp_path, ["workflow.skip_finished=false"], jobs=1)[0]
    calls: list[str] = []
    run_job(cfg, _fake_task(calls), multirun=True)
    run_job(cfg, _fake_task(calls), multirun=True)
    assert len(calls) == 2 and len(read_rows(tmp_path)) == 3


ENV = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled"}


def _smoke_cmd(results_dir) -> list[str]:
    return [
        sys.executable,
        "repro/run.py",
        "-m",
        "sweep=smoke",
        f"results_dir={results_dir}",
        f"hydra.sweep.dir={results_dir}/mr",
    ]


def _sweep(results_dir, timeout=150):
    return subprocess.run(
        _smoke_cmd(results_dir), cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=timeout
    )


def _start_quietly(cmd: list[str]) -> subprocess.Popen:
    """``cmd`` started in the repository, output discarded, in a session (group) of its own."""
    return subprocess.Popen(
        cmd,
        cwd=ROOT,
        env=ENV,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )


def _kill_after_jobs(results_dir: Path, n_jobs: int, timeout_s: float = 120) -> int:
    """Start the smoke sweep, SIGKILL it once ``n_jobs`` jobs finished; returns how many had."""
    p = _start_quietly(_smoke_cmd(results_dir))
    jobs = results_dir / "jobs"
    deadline = time.monotonic() + timeout_s
    try:
        while len(list(jobs.glob("*.json"))) < n_jobs and time.monotonic() < deadline:
            if p.poll() is not None:
                break
            time.sleep(0.05)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
        p.wait(timeout=30)
    return len(list(jobs.glob("*.json")))


@pytest.mark.slow
@pytest.mark.skipif(not HAS_SIMULATE, reason="needs repro/modes/simulate/run.py (mode=simulate)")
def test_smoke_sweep_killed_resumed_and_rerun(tmp_path):
    """The CI smoke: killed half-way, started again (skips, loses nothing), then once more."""
    done = _kill_after_jobs(tmp_path, 3)
    assert done >= 3, "the sweep died before finishing 3 jobs"
    r = _sweep(tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    assert f"{N_SMOKE - done} jobs ran, {done} skipped" in r.stdout + r.stderr
    for f in ("runs.csv", "runs.parquet", "variance.csv", "claims.csv", "REPORT.md"):
        assert (tmp_path / f).exists(), f
    first = pd.read_csv(tmp_path / "runs.csv")
    assert set(first.case.astype(str)) == {"1", "2", "3", "4", "5"}
    assert not first.run_id.duplicated().any()
    ledger = [json.loads(f.read_text()) for f in (tmp_path / "jobs").glob("*.json")]
    assert len(ledger) == N_SMOKE
    assert {i for rec in ledger for i in rec["run_ids"]} <= set(first.run_id)
    r = _sweep(tmp_path)  # everything finished: nothing runs, no row is added
    assert r.returncode == 0, r.stderr[-3000:]
    assert f"0 jobs ran, {N_SMOKE} skipped" in r.stdout + r.stderr
    assert sorted(pd.read_csv(tmp_path / "runs.csv").run_id) == sorted(first.run_id)


def _children(pid: int, name: str) -> list[int]:
    """The processes whose parent is ``pid`` and whose command line holds ``name``."""
    out = []
    for d in Path("/proc").iterdir():
        try:
            ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            cmd = (d / "cmdline").read_bytes().decode(errors="replace")
        except (OSError, ValueError, IndexError):
            continue
        if ppid == pid and name in cmd:
            out.append(int(d.name))
    return out


@pytest.mark.slow
@pytest.mark.skipif(not HAS_SIMULATE, reason="needs repro/modes/simulate/run.py (mode=simulate)")
@pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads the process table in /proc")
def test_a_joblib_sweep_s_workers_die_with_it_killed_alone(tmp_path):
    """SIGKILL of the sweep's process alone (not its group): its joblib workers go with it."""
    from system.lifeline import pid_alive

    p = _start_quietly([*_smoke_cmd(tmp_path), "hydra/launcher=joblib"])
    try:
        deadline = time.monotonic() + 120
        while not list((tmp_path / "jobs").glob("*.json")) and time.monotonic() < deadline:
            assert p.poll() is None, "the sweep ended before any job finished"
            time.sleep(0.05)
        workers = _children(p.pid, "LokyProcess")
        assert workers, "no joblib worker found"
        os.kill(p.pid, signal.SIGKILL)
        p.wait(timeout=30)
        deadline = time.monotonic() + 20
        while any(map(pid_alive, workers)) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not [w for w in workers if pid_alive(w)], "joblib workers outlived the sweep"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, signal.SIGKILL)
        p.wait(timeout=30)


def test_count_jobs_matches_the_sweep_and_command_line():
    from repro.sweep import count_jobs

    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        paper = compose("config", overrides=["sweep=paper"], return_hydra_config=True)
    assert count_jobs(paper) == 63  # 5 cases x 9 settings, and case 5's 9 under pair and nic
    paper.hydra.overrides.task = ["sweep=paper", "setting=paper_c1,paper_c5", "results_dir=x"]
    assert count_jobs(paper) == 18  # the command line's two settings replace the file's seven


def test_smoke_has_ten_jobs(tmp_path):
    assert len(_configs(tmp_path)) == N_SMOKE


def test_finish_study_collects_and_reports(tmp_path):
    from repro.sweep import finish_study

    cfg = _configs(tmp_path)[0]
    run_job(cfg, _fake_task([]))
    cfg = dataclasses.replace(
        cfg, workflow=dataclasses.replace(cfg.workflow, ablation_csv=str(tmp_path / "none.csv"))
    )
    out = finish_study(cfg, elapsed_s=1.0, sweep_dir="mr")
    assert Path(out["report"]).exists() and len(pd.read_csv(out["runs_csv"])) == 3
    empty = dataclasses.replace(cfg, results_dir=str(tmp_path / "empty"))
    assert finish_study(empty) == {"results_dir": str(tmp_path / "empty")}


def _run(*args, timeout=240):
    return subprocess.run(
        [sys.executable, "repro/run.py", *args],
        cwd=ROOT,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.mark.slow
def test_one_bad_point_stops_the_sweep_before_any_job(tmp_path):
    r = _run(
        "-m",
        "sweep=smoke",
        "case=1,9,2",
        f"results_dir={tmp_path}",
        f"hydra.sweep.dir={tmp_path}/mr",
    )
    assert r.returncode == 2, r.stderr[-2000:]
    assert "case=9" in r.stderr and "nothing ran" in r.stderr
    assert not (tmp_path / "runs.parquet").exists()


@pytest.mark.slow
def test_a_failing_job_is_recorded_the_sweep_reports_and_fails(tmp_path):
    # micro_batch_size=16 of a 24-layer GPT3-XL does not fit in memory: found only when run
    r = _run(
        "-m",
        "sweep=smoke",
        "case=debug",
        "system=ours",
        "repeats=1",
        "layers=24",
        "batch=64",
        "micro_batch_size=1,16",
        "workflow.ablation_csv=null",
        f"results_dir={tmp_path}",
        f"hydra.sweep.dir={tmp_path}/mr",
    )
    assert r.returncode == 1, r.stderr[-2000:]
    assert "1 sweep job(s) failed" in r.stderr
    assert (tmp_path / "REPORT.md").exists() and len(read_rows(tmp_path)) == 1
    ledger = [json.loads(f.read_text()) for f in (tmp_path / "jobs").glob("*.json")]
    assert sorted(rec["status"] for rec in ledger) == ["error", "ok"]


def _smoke_sweep_with_ablation(tmp_path, ablation):
    """A one-job debug sweep whose report reads ``ablation`` as its ablation table."""
    return _run(
        "-m",
        "sweep=smoke",
        "case=debug",
        "model=debug",
        "batch=16",
        "system=ours",
        f"workflow.ablation_csv={ablation}",
        f"results_dir={tmp_path / 's'}",
        f"hydra.sweep.dir={tmp_path}/mr",
    )


@pytest.mark.slow
def test_a_failed_report_fails_the_command(tmp_path):
    """An ablation table that is not one fails the report after the jobs (its content is read
    only then): exit 1 with one line naming the file, no traceback."""
    bad = tmp_path / "ablation.parquet"
    bad.write_bytes(b"PAR1 not parquet")
    r = _smoke_sweep_with_ablation(tmp_path, bad)
    assert r.returncode == 1 and "report failed" in r.stderr, r.stderr[-2000:]
    assert f"ablation table {bad} is unreadable" in r.stderr, r.stderr[-2000:]
    assert "Traceback" not in r.stderr, r.stderr[-2000:]


@pytest.mark.slow
def test_an_ablation_table_that_is_a_folder_stops_the_sweep_before_any_job(tmp_path):
    (tmp_path / "adir").mkdir()
    r = _smoke_sweep_with_ablation(tmp_path, tmp_path / "adir")
    assert r.returncode == 2 and "workflow.ablation_csv=" in r.stderr, r.stderr[-2000:]
    assert "not a file" in r.stderr and not (tmp_path / "s").exists()


@pytest.mark.slow
def test_two_sweeps_into_one_folder_run_each_job_once(tmp_path):
    args = [
        "-m",
        *TWO_DEBUG_JOBS,
        f"results_dir={tmp_path}",
    ]
    procs = [
        subprocess.Popen(
            [sys.executable, "repro/run.py", *args, f"hydra.sweep.dir={tmp_path}/mr{i}"],
            cwd=ROOT,
            env=ENV,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for i in range(2)
    ]
    outs = [p.communicate(timeout=240)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    ran = sum(int(o.split(" jobs ran")[0].split()[-1]) for o in outs)
    assert ran == 2, outs
    assert len(read_rows(tmp_path, history=True)) == len(read_rows(tmp_path))


def test_off_a_terminal_each_job_is_one_line_with_the_time_left(caplog, monkeypatch):
    import logging
    import types

    from repro.sweep import WorkflowCallback

    cb = WorkflowCallback()
    clock = iter([10.0, 30.0])
    monkeypatch.setattr("repro.sweep.time", types.SimpleNamespace(monotonic=lambda: next(clock)))
    cb._t0, cb._total = 0.0, 4
    done = types.SimpleNamespace(status=types.SimpleNamespace(name="COMPLETED"))
    with caplog.at_level(logging.INFO, logger="repro.sweep"):
        cb.on_job_end(None, done)
        cb.on_job_end(None, done)
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        "job 1/4 COMPLETED (10 s elapsed, about 30 s left)",
        "job 2/4 COMPLETED (30 s elapsed, about 30 s left)",
    ]


@pytest.mark.slow
@pytest.mark.parametrize(
    "sweep, extra",
    [
        ("paper", []),
        ("smoke", ["hydra/launcher=joblib", "hydra.sweep.dir=x/y", "study=probe"]),
        ("ablation", ["logger=wandb"]),
    ],
)
def test_the_sweep_composer_gives_every_job_hydras_own_config(sweep, extra):
    """Each job composed once per choice of groups, its values applied after: the same config,
    hydra node included, as Hydra's load_sweep_config; and a job's task config as it sees it."""
    from hydra.core.global_hydra import GlobalHydra
    from omegaconf import OmegaConf

    from repro.hydra_fast import SweepComposer, job_overrides

    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        master = compose("config", overrides=[f"sweep={sweep}", *extra], return_hydra_config=True)
        task = [f"sweep={sweep}", *[o for o in extra if not o.startswith("hydra")]]
        master.hydra.overrides.task = task
        master.hydra.overrides.hydra = [o for o in extra if o.startswith("hydra")]
        loader = GlobalHydra.instance().hydra.config_loader
        composer = SweepComposer(loader, master)
        jobs = job_overrides(master)
        assert jobs
        for overrides in jobs[:: max(1, len(jobs) // 4)]:  # a sample: Hydra's way takes 0.1 s
            hydras = loader.load_sweep_config(master, list(overrides))
            ours = composer.job(list(overrides))
            assert OmegaConf.to_container(ours) == OmegaConf.to_container(hydras), overrides
            assert OmegaConf.is_struct(ours) and OmegaConf.is_struct(hydras)
            ours.hydra.job.id = 7  # a copy per call: the launcher sets its job number
            assert OmegaConf.is_missing(composer.job(list(overrides)).hydra.job, "id")
            task = OmegaConf.to_container(composer.task(list(overrides)))
            assert task == {k: v for k, v in OmegaConf.to_container(hydras).items() if k != "hydra"}
        remove = composer.install()
        try:
            got = loader.load_sweep_config(master_config=master, sweep_overrides=list(jobs[0]))
            assert OmegaConf.to_container(got) == OmegaConf.to_container(composer.job(jobs[0]))
        finally:
            remove()
        assert "load_sweep_config" not in vars(loader)


@pytest.mark.slow
def test_a_shipped_config_loader_composes_as_hydra_does():
    """The joblib and Slurm launchers pickle the config loader into their workers: there it
    composes each job as Hydra does, with a composer of the worker's own, kept for the sweep's
    later jobs (and replaced by another sweep's)."""
    cloudpickle = pytest.importorskip("cloudpickle", reason="the launchers' pickler")
    from hydra.core.global_hydra import GlobalHydra
    from omegaconf import OmegaConf

    from repro import hydra_fast
    from repro.hydra_fast import SweepComposer, job_overrides

    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        master = compose("config", overrides=["sweep=smoke"], return_hydra_config=True)
        master.hydra.overrides.task = ["sweep=smoke"]
        loader = GlobalHydra.instance().hydra.config_loader
        composer = SweepComposer(loader, master)
        remove = composer.install()
        try:
            shipped = cloudpickle.loads(cloudpickle.dumps(loader))
        finally:
            remove()
        jobs = [list(j) for j in job_overrides(master)[:3]]
        assert not hasattr(shipped.load_sweep_config, "composer")
        for job in jobs:
            copy = cloudpickle.loads(cloudpickle.dumps(master))  # each job brings its own
            got = shipped.load_sweep_config(copy, job)
            hydras = type(loader).load_sweep_config(loader, master, job)
            assert OmegaConf.to_container(got) == OmegaConf.to_container(hydras)
        kept = hydra_fast._SHIPPED[shipped.load_sweep_config.token]
        assert len(kept._bases) == 1 and not kept._jobs  # each job's config handed out once
        again = shipped.load_sweep_config(master, jobs[0])  # asked again: composed again
        assert OmegaConf.to_container(again) == OmegaConf.to_container(
            type(loader).load_sweep_config(loader, master, jobs[0])
        )
        remove = SweepComposer(loader, master).install()
        try:
            other = cloudpickle.loads(cloudpickle.dumps(loader))  # another sweep
        finally:
            remove()
        other.load_sweep_config(master, jobs[0])
        assert list(hydra_fast._SHIPPED) == [other.load_sweep_config.token]


def _kept_tokens() -> list[str]:
    from repro import hydra_fast

    return list(hydra_fast._SHIPPED)


@pytest.mark.slow
@pytest.mark.parametrize("extra", [[], ["batch=-1"]])
def test_joblibs_workers_check_a_sweep_and_keep_its_composer_for_the_jobs(extra):
    """Under the joblib launcher the pre-check runs in its worker processes: the same lines
    and typed configs as the check in this process, and the workers that then run the jobs
    (joblib reuses its workers for a Parallel call with the launcher's arguments) already keep
    the sweep's composer; the configs they composed come back for the sweeper's own check."""
    pytest.importorskip("hydra_plugins.hydra_joblib_launcher", reason="needs extra `launchers`")
    from hydra.core.global_hydra import GlobalHydra
    from joblib import Parallel, delayed
    from omegaconf import OmegaConf

    from repro.hydra_fast import SweepComposer, job_overrides
    from repro.sweep import _check, _check_on_workers, joblib_kwargs

    launcher = ["hydra/launcher=joblib", "hydra.launcher.n_jobs=2"]
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        master = compose(
            "config", overrides=["sweep=smoke", *extra, *launcher], return_hydra_config=True
        )
        master.hydra.overrides.task = ["sweep=smoke", *extra]
        master.hydra.overrides.hydra = launcher
        loader = GlobalHydra.instance().hydra.config_loader
        composer = SweepComposer(loader, master)
        want = _check(master, composer)
        remove = SweepComposer(loader, master).install(once=True)
        try:
            load = loader.load_sweep_config
            got = _check_on_workers(master, load)
            kept = Parallel(**joblib_kwargs(master))(delayed(_kept_tokens)() for _ in range(4))
            jobs = job_overrides(master)
            assert len(load.composer._jobs) == len(jobs)  # the workers' configs came back
            for job in jobs:  # the sweeper's check: each job's config once, as Hydra's
                hydras = type(loader).load_sweep_config(loader, master, list(job))
                ours = loader.load_sweep_config(master, list(job))
                assert OmegaConf.to_container(ours) == OmegaConf.to_container(hydras)
            assert not load.composer._jobs
        finally:
            remove()
    assert got == want
    assert bool(want[0]) == bool(extra)  # batch=-1: every job is bad, each with its line
    assert all(tokens == [load.token] for tokens in kept)


def test_joblibs_workers_are_let_go_when_the_jobs_are_done():
    """At the sweep's end joblib's workers exit while the report is built, not when the
    submitting process exits."""
    pytest.importorskip("joblib", reason="needs extra `launchers`")
    import time

    from joblib import Parallel, delayed
    from omegaconf import OmegaConf

    from repro.sweep import _release_workers

    launcher = {"_target_": "x.JoblibLauncher", "n_jobs": 2, "backend": None}
    config = OmegaConf.create({"hydra": {"launcher": launcher}})
    pids = set(Parallel(n_jobs=2, backend="loky")(delayed(os.getpid)() for _ in range(4)))
    assert os.getpid() not in pids
    _release_workers(config)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and any(_alive(p) for p in pids):
        time.sleep(0.05)
    assert not any(_alive(p) for p in pids)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:  # a zombie has exited
            return f.read().split(") ", 1)[1][0] != "Z"
    except FileNotFoundError:  # reaped meanwhile
        return False


def test_a_sweeps_shared_store_returns_only_what_the_sweep_wrote(tmp_path):
    """Values shared between a sweep's processes: read back as written; a file another secret
    signed, a torn file, an edited one or none at all read as absent (the job computes the
    value itself), and nothing from a foreign file is unpickled."""
    from repro.hydra_fast import SharedStore, shared_store

    store = SharedStore(tmp_path / "schedules", "secret-a")
    assert store.get("k") is None
    store.put("k", {"layout": [[0, 1], [2, 3]], "cost_s": 0.1 + 0.2})
    assert store.get("k") == {"layout": [[0, 1], [2, 3]], "cost_s": 0.1 + 0.2}
    assert SharedStore(tmp_path / "schedules", "secret-b").get("k") is None
    (path,) = (tmp_path / "schedules").iterdir()
    raw = path.read_bytes()
    path.write_bytes(raw[:-3])  # torn
    assert store.get("k") is None
    path.write_bytes(raw[:40] + bytes([raw[40] ^ 1]) + raw[41:])  # edited
    assert store.get("k") is None

    class Boom:
        def __reduce__(self):
            return (os.system, ("touch " + str(tmp_path / "ran"),))

    import pickle

    path.write_bytes(b"\0" * 32 + pickle.dumps(Boom()))  # a foreign file: never unpickled
    assert store.get("k") is None and not (tmp_path / "ran").exists()
    assert shared_store("schedules") is None  # not in a launcher's worker


def test_a_shipped_callback_leaves_the_sweeps_machinery_behind():
    """Hydra's context goes to every joblib or Slurm task with the callbacks: the composer's
    configs and the helper's stop functions stay in the submitting process."""
    cloudpickle = pytest.importorskip("cloudpickle", reason="the launchers' pickler")
    from repro.sweep import WorkflowCallback

    cb = WorkflowCallback(progress=False)
    heavy = list(range(200_000))
    cb._stops = [lambda: heavy.clear()]
    cb._studies = {"results/x": (None, {str(i): None for i in range(1000)})}
    shipped = cloudpickle.loads(cloudpickle.dumps(cb))
    assert shipped._stops == [] and shipped._studies == {} and shipped.progress is False
    assert len(cloudpickle.dumps(cb)) < 10_000
    assert cb._stops and cb._studies  # the submitting process keeps its own


@pytest.mark.slow
@pytest.mark.skipif(not HAS_SIMULATE, reason="needs repro/modes/simulate/run.py (mode=simulate)")
def test_every_job_of_a_sweep_lands_in_the_one_sweep_folder(tmp_path):
    """The default sweep folder is named by the time it starts (${now:...}, to the second):
    the pre-check composes every job before the sweeper resolves it, and each job still gets
    that folder (the resolver cache handed over with the job's config), so a sweep of several
    seconds has one folder and counts every job as run."""
    cmd = [sys.executable, str(ROOT / "repro" / "run.py"), "-m", "sweep=smoke", "study=once"]
    cmd.append(f"results_dir={tmp_path / 'results'}")
    r = subprocess.run(cmd, cwd=tmp_path, env=ENV, capture_output=True, text=True, timeout=150)
    assert r.returncode == 0, r.stderr[-3000:]
    assert f"{N_SMOKE} jobs ran, 0 skipped" in r.stdout + r.stderr
    (folder,) = (tmp_path / "outputs" / "once" / "multirun").iterdir()
    assert len([p for p in folder.iterdir() if p.name.isdigit()]) == N_SMOKE


def test_a_worker_scans_hydras_plugins_once_and_registers_the_same_ones():
    """Hydra rebuilds its plugin registry before every job a launcher's worker runs; with the
    scan kept for the worker's life the registry holds the same plugins, and a second install
    keeps the first scan."""
    from hydra.core.plugins import Plugins

    from repro.hydra_fast import scan_plugins_once

    original = Plugins.__dict__["_scan_all_plugins"]
    before = dict(Plugins.instance().class_name_to_class)
    try:
        scan_plugins_once()
        installed = Plugins.__dict__["_scan_all_plugins"]
        scan_plugins_once()
        assert Plugins.__dict__["_scan_all_plugins"] is installed
        plugins = Plugins.instance()
        plugins._initialize()
        first = dict(plugins.class_name_to_class)
        plugins._initialize()
        assert plugins.class_name_to_class == first  # the same class objects, kept
        assert sorted(first) == sorted(before)
        assert len(installed.__func__.memo) == 1
    finally:
        Plugins._scan_all_plugins = original
        Plugins.instance()._initialize()
