"""``mode=simulate`` end to end on the debug case and model (seconds), bad input, no torch."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from hydra import compose, initialize_config_dir

from repro.config.shared import default_layout
from repro.run import run as simulate
from system.results import COLUMNS as SCHEMA_COLUMNS

ROOT = Path(__file__).resolve().parents[2]
COLUMNS = [
    "case",
    "system",
    "num_layers",
    "global_batch_size",
    "iter_time_s",
    "pflops",
    "tp",
    "pp",
    "dp",
    "micro_batch_size",
    "memory_gib",
    "compute_time_s",
    "comm_time_s",
    "status",
]


def _cfg(tmp_path, *overrides):
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        return compose(
            "config", overrides=["case=debug", "model=debug", f"results_dir={tmp_path}", *overrides]
        )


@pytest.mark.slow
def test_debug_end_to_end_and_rerun_skips_rows(tmp_path):
    out = simulate(_cfg(tmp_path))
    rows = pd.read_csv(tmp_path / "runs.csv")
    assert set(COLUMNS) <= set(rows.columns)
    assert set(rows.system) == {"ours", "ours_search", "ours_random", "megatron", "deepspeed"}
    # every row names its link-sharing model; the baselines' their DP collective; ours' search
    # its configuration, with the paper's fixed one labelled and one best
    assert set(rows.link_sharing) == {"tc_class"}
    assert (
        rows[rows.system.isin(["megatron", "deepspeed"]) & (rows.status == "ok")]["dp_collective"]
        .notna()
        .all()
    )
    search = rows[rows.system == "ours_search"]
    assert (search.variant == "paper").sum() == 1 and search.is_best.sum() == 1
    assert search[["schedule", "recompute", "micro_batch_size", "pp", "dp"]].notna().all().all()
    best = search[search.is_best].iloc[0]
    # ours is credited only with what its runtime runs (ours_configs=runnable, the default)
    assert set(search.ours_configs) == {"runnable"} and search.runtime_supported.all()
    assert best.iter_time_s <= search[search.variant == "paper"].iter_time_s.iloc[0] + 1e-9
    assert (rows.system == "ours_random").sum() == 3  # three seeded random layouts
    ok = rows[rows.status == "ok"]
    assert (ok.iter_time_s > 0).all() and (ok.pflops > 0).all()
    meg = rows[rows.system == "megatron"]
    assert meg.groupby("placement").is_best.sum().to_dict() == {"launch": 1, "topology": 1}
    for name in ("fig3.png", "summary.csv", "claims.md", "runs.parquet"):
        assert (tmp_path / name).exists(), name
    # the store holds only the results schema's declared columns
    stored = set(pd.read_parquet(tmp_path / "runs.parquet").columns)
    assert stored <= set(SCHEMA_COLUMNS), sorted(stored - set(SCHEMA_COLUMNS))
    assert out["rows"] == len(rows) and out["new_rows"] == len(rows)
    again = simulate(_cfg(tmp_path))
    assert again["new_rows"] == 0 and len(pd.read_csv(tmp_path / "runs.csv")) == len(rows)


@pytest.mark.slow
def test_a_model_change_recomputes_and_supersedes_the_old_rows(tmp_path, monkeypatch):
    import system.schema as schema

    first = simulate(_cfg(tmp_path, "system=ours"))
    monkeypatch.setattr(schema, "model_version", lambda: "another-model")
    again = simulate(_cfg(tmp_path, "system=ours"))
    assert again["new_rows"] == again["rows"] == first["rows"]
    view = pd.read_csv(tmp_path / "runs.csv")
    assert len(view) == first["rows"] and set(view.model_version) == {"another-model"}
    assert len(pd.read_parquet(tmp_path / "runs.parquet")) == 2 * first["rows"]  # append-only


def test_one_system_and_repeats(tmp_path):
    out = simulate(_cfg(tmp_path, "system=ours", "repeats=2"))
    rows = pd.read_csv(tmp_path / "runs.csv")
    assert set(rows.system) == {"ours"} and len(rows) == 2 == out["rows"]
    assert rows.iter_time_s.nunique() == 1  # the scheduled layout is fixed across repeats


@pytest.mark.parametrize(
    "override,match",
    [
        ("case=nope", "unknown case"),
        ("layers=3", "not divisible"),
        ("batch=6", "not divisible"),
    ],
)
def test_bad_input_raises_and_writes_nothing(tmp_path, override, match):
    target = tmp_path / "out"
    with pytest.raises(ValueError, match=match):
        simulate(_cfg(target, override))
    assert not target.exists()


def test_default_layout_is_one_function():
    """Every mode and study that needs a layout takes :func:`repro.config.shared.default_layout`:
    the divisor nearest the square root as pp, so the paper's layer counts divide."""
    assert default_layout(64) == (8, 8) and default_layout(8) == (2, 4)
    assert default_layout(32) == (4, 8) and default_layout(128) == (8, 16)
    assert default_layout(1) == (1, 1)


@pytest.mark.slow
def test_cli_needs_no_torch(tmp_path):
    code = (
        "import sys, runpy; sys.argv = ['run.py', 'case=debug', 'model=debug', "
        f"'results_dir={tmp_path}', 'hydra.run.dir={tmp_path}/hydra']\n"
        "try:\n    runpy.run_path('repro/run.py', run_name='__main__')\n"
        "except SystemExit as e:\n    assert not e.code, e.code\n"
        "assert 'torch' not in sys.modules, 'simulate imported torch'\n"
    )
    p = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert p.returncode == 0, p.stderr[-2000:]
    assert "ours" in p.stdout and (tmp_path / "runs.csv").exists()


@pytest.mark.slow
def test_the_main_job_prints_within_100_columns(tmp_path):
    """On a non-terminal with COLUMNS=100 no line is wider than 100 characters but a log line's
    path; the wide tables are an option."""
    import os

    env = {**os.environ, "COLUMNS": "100", "OMP_NUM_THREADS": "1"}
    args = ["case=debug", "model=debug", f"results_dir={tmp_path}", f"hydra.run.dir={tmp_path}/h"]
    p = subprocess.run(
        [sys.executable, "repro/run.py", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 0, p.stderr[-2000:]
    wide = [ln for ln in p.stdout.splitlines() if len(ln) > 100 and str(tmp_path) not in ln]
    assert not wide and "ours/Megatron" in p.stdout and "…" not in p.stdout, wide
    p = subprocess.run(
        [sys.executable, "repro/run.py", *args, "tables=wide"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 0 and max(len(ln) for ln in p.stdout.splitlines()) > 100


@pytest.mark.slow
def test_a_prefetched_schedule_is_the_one_a_job_makes(tmp_path):
    """A serial sweep starts its jobs' schedules in a helper process (the idle core): the job
    then stores the same layout it would have made itself."""
    from concurrent.futures import Future

    from repro.config import validate
    from repro.modes.simulate import run as sim

    def layouts(d):
        cfg = validate(_cfg(d, "system=ours", "batch=16"))
        stop = sim.prefetch([cfg]) if d.name == "prefetched" else (lambda: None)
        try:
            assert d.name != "prefetched" or any(
                isinstance(v, Future) for v in sim.SCHEDULE_CACHE.values()
            )
            simulate(cfg)
        finally:
            stop()
        return pd.read_csv(d / "runs.csv").layout.tolist()

    sim.SCHEDULE_CACHE.clear()
    made = layouts(tmp_path / "made")
    sim.SCHEDULE_CACHE.clear()
    assert layouts(tmp_path / "prefetched") == made


def _rows_run_ahead(d, ahead: bool, system: str, cache: dict, cols: list[str]) -> dict:
    """The rows of one batch-16 job of ``system`` into ``d``: run ahead by the serial sweep's
    helper process first (``ahead``; its result waits in ``cache`` until the job takes it) or
    made by the job itself."""
    from repro.config import validate
    from repro.modes.simulate import run as sim

    cfg = validate(_cfg(d, system, "batch=16"))
    stop = sim.prefetch([cfg]) if ahead else (lambda: None)
    try:
        assert ahead == bool(cache)
        simulate(cfg)
        assert not cache  # taken by the job (or dropped with the helper)
    finally:
        stop()
    return pd.read_csv(d / "runs.csv")[cols].to_dict("list")


@pytest.mark.slow
def test_a_search_run_ahead_is_the_one_a_job_makes(tmp_path):
    """A serial sweep also runs its jobs' configuration searches in the helper process: the job
    stores the same configurations and times as when it searches itself (a helper stopped
    before it got there: tests/unit/test_helper.py)."""
    from repro.modes.simulate import run as sim

    def rows(d, ahead):
        cols = ["config", "placement", "schedule", "iter_time_s", "is_best"]
        return _rows_run_ahead(d, ahead, "system=ours_search", sim.SEARCH_CACHE, cols)

    sim.SCHEDULE_CACHE.clear()
    made = rows(tmp_path / "made", False)
    sim.SCHEDULE_CACHE.clear()
    assert rows(tmp_path / "ahead", True) == made
    sim.SCHEDULE_CACHE.clear()


@pytest.mark.slow
def test_baseline_grids_run_ahead_are_the_ones_a_job_makes(tmp_path):
    """A serial sweep also runs its jobs' baseline grids in the helper process: the job stores
    the same rows (every configuration, placement and time, the best marked) as when it runs
    them itself."""
    from repro.modes.simulate import run as sim

    def rows(d, ahead):
        cols = ["config", "placement", "rank_map", "iter_time_s", "is_best", "status"]
        return _rows_run_ahead(d, ahead, "system=megatron", sim.GRID_CACHE, cols)

    made = rows(tmp_path / "made", False)
    assert rows(tmp_path / "ahead", True) == made


def test_the_default_search_runs_its_whole_budget_on_a_slow_machine(monkeypatch):
    """Ours' layout must not depend on the machine's load: on a clock that runs 100 s per
    reading (a very slow machine) the default search still runs all its trials."""
    from repro.config.shared import SchedulerOptions
    from repro.modes.simulate import run as sim
    from system.cases import get_case
    from system.scheduler import genetic
    from system.workload import Workload, get_model

    class Slow:
        now_s = 0.0

        def perf_counter(self) -> float:
            self.now_s += 100.0
            return self.now_s

    monkeypatch.setattr(genetic, "time", Slow())
    work = Workload(model=get_model("debug", 4), global_batch_size=16, micro_batch_size=1)
    got = sim.Schedules(SchedulerOptions(), 0, cache={}).get("debug", get_case("debug"), work, 2, 4)
    assert got.trials == sim.SIM_BUDGET["trials"]


@pytest.mark.slow
def test_nothing_fits_in_memory_raises(tmp_path):
    target = tmp_path / "out"
    with pytest.raises(ValueError, match="fits"):
        simulate(_cfg(target, "model=gpt3_xl", "layers=24", "batch=64", "micro_batch_size=16"))
    assert not target.exists()


def test_case_list(tmp_path):
    """A case named twice (or as an alias and a number) is simulated once."""
    out = simulate(_cfg(tmp_path, "case=[debug,debug]", "system=megatron"))
    assert len(out["summary"]) == 1


def test_an_alias_is_stored_as_its_case(tmp_path):
    """``case=worldwide`` writes rows of case 5 and prints the case-5 claims beside them."""
    out = simulate(
        _cfg(tmp_path, "case=worldwide", "model=gpt3_xl", "layers=24", "batch=1024", "system=ours")
    )
    rows = pd.read_csv(tmp_path / "runs.csv", dtype={"case": str})
    assert set(rows.case) == {"5"}
    (line,) = out["summary"]
    assert line["case"] == "5" and "(best baseline)" not in line["paper_vs_megatron"]


@pytest.mark.slow
def test_every_file_of_a_run_is_rebuilt_from_runs_parquet_alone(tmp_path):
    """A single run and the report of its committed rows write the same files, byte for byte:
    both are the report's (mode=report), built from ``runs.parquet`` alone."""
    import shutil

    simulate(_cfg(tmp_path / "run"))
    fresh = tmp_path / "clone" / "run"  # the same study name (its folder's)
    fresh.mkdir(parents=True)
    shutil.copy(tmp_path / "run" / "runs.parquet", fresh / "runs.parquet")
    simulate({"mode": "report", "results_dir": str(fresh)})
    made = {p.name for p in (tmp_path / "run").iterdir() if p.suffix in (".csv", ".md", ".png")}
    assert {"summary.csv", "claims.md", "fig3.png", "REPORT.md", "runs.csv"} <= made
    assert (fresh / "fig3.png").exists()  # drawn again, not compared
    for name in made - {"fig3.png"}:
        assert (fresh / name).read_text() == (tmp_path / "run" / name).read_text(), name


@pytest.mark.slow
def test_summary_merges_jobs_of_one_setting(tmp_path):
    simulate(_cfg(tmp_path, "system=ours"))
    simulate(_cfg(tmp_path, "system=megatron"))
    s = pd.read_csv(tmp_path / "summary.csv")
    assert len(s) == 1
    assert s.ours_iter_time_s.notna().all() and s.megatron_iter_time_s.notna().all()
    ratio = s.megatron_iter_time_s / s.ours_iter_time_s
    assert s.speedup_vs_megatron.to_numpy() == pytest.approx(ratio.to_numpy())


@pytest.mark.slow
def test_both_protocols_rows_and_summary(tmp_path):
    out = simulate(_cfg(tmp_path, "baseline_placements=[launch,topology]"))
    rows = pd.read_csv(tmp_path / "runs.csv")
    base = rows[rows.system.isin(["megatron", "deepspeed"])]
    assert set(base.placement) == {"launch", "topology"}
    assert base.rank_map.notna().all()
    assert set(rows[rows.system == "ours"].placement) == {"scheduled"}
    s = out["summary"][0]
    assert s["baseline_placement"] == "topology"
    assert s["megatron_iter_time_s"] <= s["megatron_launch_iter_time_s"] + 1e-9
    assert s["speedup_vs_megatron_launch"] == pytest.approx(
        s["megatron_launch_iter_time_s"] / s["ours_iter_time_s"]
    )
    text = (tmp_path / "claims.md").read_text()
    assert "launch: verdict" in text and "topology: verdict" in text


def test_launch_only_and_no_placement(tmp_path):
    simulate(_cfg(tmp_path / "a", "baseline_placements=[launch]", "system=megatron"))
    rows = pd.read_csv(tmp_path / "a" / "runs.csv")
    assert set(rows.placement) == {"launch"}
    with pytest.raises(ValueError, match="baseline_placements"):
        simulate(_cfg(tmp_path / "b", "baseline_placements=[]"))
    assert not (tmp_path / "b").exists()


@pytest.mark.slow
def test_sensitivity_knobs(tmp_path):
    base = simulate(_cfg(tmp_path / "a", "system=megatron", "baseline_placements=[launch]"))
    slow = simulate(
        _cfg(
            tmp_path / "b",
            "system=megatron",
            "baseline_placements=[launch]",
            "compute_efficiency=0.2",
            "link_sharing=region",
            "baseline_transport=nccl_rendezvous",
        )
    )
    t0 = base["summary"][0]["megatron_iter_time_s"]
    assert slow["summary"][0]["megatron_iter_time_s"] > t0
    rows = pd.read_csv(tmp_path / "b" / "runs.csv")
    assert set(rows.link_sharing) == {"region"} and set(rows.compute_efficiency) == {0.2}
    with pytest.raises(ValueError, match="compute_efficiency=1.5: must be <= 1"):
        simulate(_cfg(tmp_path / "c", "compute_efficiency=1.5"))
    assert not (tmp_path / "c").exists()


@pytest.mark.slow
def test_dp_collective_request_is_recorded_and_keys_the_rows(tmp_path):
    kw = ("system=megatron", "baseline_placements=[launch]")
    simulate(_cfg(tmp_path / "auto", *kw))
    simulate(_cfg(tmp_path / "ring", *kw, "dp_collective=ring"))
    simulate(_cfg(tmp_path / "fastest", *kw, "dp_collective=fastest"))
    auto = pd.read_csv(tmp_path / "auto" / "runs.csv")
    ring = pd.read_csv(tmp_path / "ring" / "runs.csv")
    fastest = pd.read_csv(tmp_path / "fastest" / "runs.csv")
    ok = auto[auto.status == "ok"]
    assert set(ok.dp_collective_request) == {"auto"}
    assert ok.dp_nccl_choice.notna().all()  # NCCL's algorithm/protocol per row
    assert set(ok.dp_collective) <= {"ring", "tree", "ring+tree"}
    assert set(ring[ring.status == "ok"].dp_collective) == {"ring"}
    assert set(fastest.dp_collective_request) == {"fastest"}
    # a forced request is part of the key: its rows never pass for auto's
    assert not set(ring.setting_id) & set(auto.setting_id)
    with pytest.raises(Exception, match="dp_collective"):
        _cfg(tmp_path / "bad", "dp_collective=oracle")
