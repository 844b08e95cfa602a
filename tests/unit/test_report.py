"""Local report (REPORT.md, tables, figures) and the wandb mirror, offline into a tmp dir."""

from __future__ import annotations

import doctest

import pandas as pd
import pytest

import repro.report.tables
import repro.report.variance
from repro.config import validate
from repro.report.build import build_report
from system.results import read_rows, write_rows
from tests.unit._workflow_rows import synthetic_rows


def test_doctests_of_the_workflow_modules():
    for mod in (repro.report.tables, repro.report.variance):
        assert doctest.testmod(mod).failed == 0


def test_report_has_claims_variance_and_figures(tmp_path):
    write_rows(tmp_path, synthetic_rows(cases=("1", "5"), noise=0.05, seed=3))
    abl = pd.DataFrame(
        [
            {"case": 5, "method": m, "seed": 0, "trial": t, "best_total_cost_s": 60 - t}
            for m in ("tailored", "kl")
            for t in range(4)
        ]
    )
    abl.to_csv(tmp_path / "ablation.csv", index=False)
    paths = build_report(tmp_path, ablation_path=tmp_path / "ablation.csv")
    text = paths.report.read_text()
    for must in (
        "## Claims of the paper",
        "c5_vs_megatron",
        "fig3.png",
        "results/ablation/fig4.png",  # Fig. 4 is the ablation study's, pointed to from here
        "## Repeats and variance",
        "INCONCLUSIVE",
    ):
        assert must in text
    assert {p.name for p in paths.figures} == {"fig3.png"}
    assert not (tmp_path / "fig4.png").exists()
    assert all(p.stat().st_size > 1000 for p in paths.figures)
    claims = pd.read_csv(paths.claims)
    assert set(claims.verdict) <= {"PASS", "FAIL", "INCONCLUSIVE"} and len(claims) == 13
    var = pd.read_csv(paths.variance)
    assert (var.n_repeats == 3).all() and var.flagged.any()  # 5% noise: some configs over 5%
    assert "Flagged configurations" in text


def _verdicts_in_markdown(text: str) -> dict[tuple[str, str, str], str]:
    """(link sharing, protocol, claim) -> verdict from the claims tables of a markdown file."""
    out, model, protocols = {}, None, []
    for line in text.splitlines():
        if line.startswith("### Link sharing `"):
            model = line.split("`")[1]
        elif line.startswith("| claim |"):
            head = [c.strip() for c in line.strip("|").split("|")]
            protocols = [(i, h.split(":")[0]) for i, h in enumerate(head) if h.endswith("verdict")]
        elif model and protocols and line.startswith("| ") and not line.startswith("|--"):
            cells = [c.strip() for c in line.strip("|").split("|")]
            for i, protocol in protocols:
                out[(model, protocol, cells[0])] = cells[i]
        elif not line.strip():
            protocols = []
    return out


@pytest.mark.slow
def test_claims_csv_claims_md_and_report_are_one_table(tmp_path):
    """Every (model, protocol, claim) verdict of claims.csv is the one claims.md and REPORT.md
    show, including a claim only the ablation table can test."""
    launch = pd.DataFrame(synthetic_rows(cases=("1", "5"), speedup=4.0)).assign(
        placement="launch", link_sharing="tc_class"
    )
    topo = pd.DataFrame(synthetic_rows(cases=("1", "5"), speedup=1.6)).assign(
        placement="topology", link_sharing="tc_class"
    )
    topo = topo[topo.system.isin(["megatron", "deepspeed"])]
    nic = pd.DataFrame(synthetic_rows(cases=("5",), speedup=1.1)).assign(
        placement="launch", link_sharing="nic"
    )
    rows = pd.concat([launch, topo, nic], ignore_index=True)
    # each row its own run (the synthetic keys do not cover placement and link sharing)
    for key in ("run_id", "setting_id"):
        rows[key] = rows[key] + "-" + rows.index.astype(str)
    write_rows(tmp_path, rows.to_dict("records"))
    abl = pd.DataFrame(
        [
            {"case": 5, "method": m, "seed": 0, "trial": 0, "best_total_cost_s": c}
            for m, c in (("tailored", 50.0), ("kl", 60.0))
        ]
    )
    abl.to_csv(tmp_path / "ablation.csv", index=False)
    build_report(tmp_path, ablation_path=tmp_path / "ablation.csv")
    csv = pd.read_csv(tmp_path / "claims.csv")
    want = {
        (r.link_sharing, r.protocol, r.claim_id): r.verdict for r in csv.itertuples(index=False)
    }
    assert {(m, p) for m, p, _ in want} == {
        ("tc_class", "launch"),
        ("tc_class", "topology"),
        ("nic", "launch"),
    }
    assert want[("tc_class", "topology", "local_search_vs_kl")] == "PASS"
    assert want[("tc_class", "launch", "c5_vs_megatron")] == "PASS"
    assert want[("tc_class", "topology", "c5_vs_megatron")] == "FAIL"
    assert want[("nic", "launch", "c5_vs_megatron")] == "FAIL"
    for name in ("claims.md", "REPORT.md"):
        assert _verdicts_in_markdown((tmp_path / name).read_text()) == want, name


def test_fig4_is_drawn_by_the_study_that_compares_schedulers(tmp_path):
    rows = synthetic_rows(cases=("5",), noise=0.0, seed=1)
    ours = [r for r in rows if r["system"] == "ours"][:3]
    for r, method in zip(ours, ("genetic", "genetic_kl", "random"), strict=True):
        r.update(scheduler=method, best_cost_s=50.0, seed=0)
    write_rows(tmp_path, ours)
    paths = build_report(tmp_path)
    assert {p.name for p in paths.figures} >= {"fig4.png"}
    assert (tmp_path / "fig4.png").stat().st_size > 1000


def test_report_of_an_empty_study(tmp_path):
    (tmp_path / "rows").mkdir()
    paths = build_report(tmp_path)
    assert "No ok rows yet" in paths.report.read_text() and paths.figures == ()


def test_missing_results_dir_is_an_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        build_report(tmp_path / "nope")


@pytest.mark.slow
def test_wandb_offline_one_run_per_configuration(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    from repro.report.wandb_log import log_comparison, log_job

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    write_rows(tmp_path, synthetic_rows(cases=("5",), layers=(24,), batches=(1024,), repeats=2))
    rows = read_rows(tmp_path)
    cfg = validate(
        {
            "study": "t",
            "mode": "simulate",
            "case": "debug",
            "model": "debug",
            "results_dir": str(tmp_path),
            "wandb": {"project": "p", "entity": None, "mode": "offline", "dir": str(tmp_path)},
        }
    )
    names = log_job(cfg, rows)
    assert len(names) == 4  # one per system; megatron's 2 configurations share a run
    paths = build_report(tmp_path)
    assert (
        log_comparison(
            cfg,
            pd.read_csv(paths.best),
            pd.read_csv(paths.variance),
            pd.read_csv(paths.claims),
            paths.figures,
        )
        == "t-report"
    )
    runs = list((tmp_path / "wandb").glob("offline-run-*"))
    assert len(runs) == 5


def test_wandb_disabled_logs_nothing(tmp_path, monkeypatch):
    from repro.report.wandb_log import log_job, wandb_mode

    monkeypatch.setenv("WANDB_MODE", "disabled")
    cfg = validate({"case": "debug", "model": "debug", "results_dir": str(tmp_path)})
    assert wandb_mode(cfg) == "disabled"
    write_rows(tmp_path, synthetic_rows(cases=("5",), layers=(24,), batches=(1024,), repeats=1))
    assert log_job(cfg, read_rows(tmp_path)) == [] and not (tmp_path / "wandb").exists()
    monkeypatch.setenv("WANDB_MODE", "cloud")
    with pytest.raises(ValueError, match="WANDB_MODE"):
        wandb_mode(cfg)
    monkeypatch.delenv("WANDB_MODE")
    with pytest.raises(ValueError, match="wandb.mode: Invalid value 'cloud'"):
        validate({"wandb": {"mode": "cloud"}})


def test_ablation_is_derived_from_scheduled_rows(tmp_path):
    from system.results import make_row

    rows = [
        make_row(
            {
                "case": "5",
                "system": "ours",
                "num_layers": 24,
                "global_batch_size": 1024,
                "scheduler": m,
                "seed": s,
            },
            iter_time_s=10.0,
            best_cost_s=c + s,
            history=[[0, c + 20.0], [10, c + s]],
        )
        for m, c in (("genetic", 40.0), ("genetic_kl", 55.0))
        for s in (0, 1)
    ]
    write_rows(tmp_path, rows)
    paths = build_report(tmp_path, ablation_path=tmp_path / "absent.csv")
    claims = pd.read_csv(paths.claims).set_index("claim_id")
    assert claims.verdict["local_search_vs_kl"] == "PASS"
    assert any(p.name == "fig4.png" for p in paths.figures)


@pytest.mark.slow
def test_wandb_offline_mirrors_an_ordinary_simulate_run(tmp_path):
    """A simulate run's rows hold pandas' NA in nullable columns: the mirror logs them as
    missing values instead of failing on them."""
    pytest.importorskip("wandb")
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    out = subprocess.run(
        [
            sys.executable,
            "repro/run.py",
            "logger=wandb",
            "case=debug",
            "model=debug",
            "system=ours",
            f"results_dir={tmp_path}",
        ],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=300,
        env={
            **os.environ,
            "PYTHONPATH": str(root),
            "WANDB_MODE": "offline",
            "WANDB_SILENT": "true",
        },
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert list((tmp_path / "wandb").glob("offline-run-*"))


def test_an_unreadable_ablation_table_is_one_line_naming_it(tmp_path):
    from repro.report.build import read_ablation

    bad = tmp_path / "ablation.parquet"
    bad.write_bytes(b"PAR1 not parquet")
    with pytest.raises(ValueError) as err:
        read_ablation(bad)
    assert str(bad) in str(err.value) and len(str(err.value).splitlines()) == 1, str(err.value)


@pytest.mark.slow
def test_a_report_made_with_a_helper_process_is_the_one_made_alone(tmp_path, monkeypatch):
    """A large study's summary and Fig. 3 come from a helper process while the claims are
    evaluated: every file is the same, byte for byte, as one process alone writes it."""
    import repro.report.build as build

    rows = synthetic_rows(cases=("1", "5"), noise=0.05, seed=3)
    outputs = {}
    for name, threshold in (("alone", 10**9), ("helper", 0)):
        d = tmp_path / name / "study"  # the folder's name is the report's title
        write_rows(d, rows)
        monkeypatch.setattr(build, "SIDE_PROCESS_ROWS", threshold)
        build_report(d)
        outputs[name] = {
            p.name: p.read_bytes() for p in d.iterdir() if p.suffix in (".md", ".csv", ".png")
        }
    assert {"summary.csv", "fig3.png", "REPORT.md", "claims.md"} <= set(outputs["alone"])
    assert outputs["helper"] == outputs["alone"]


@pytest.mark.slow
def test_the_report_reads_only_the_columns_it_names(tmp_path, monkeypatch):
    """build_report reads REPORT_INPUTS of the study's rows: its files are those made from every
    column (a column the report reads but does not name would change them)."""
    import repro.report.build as build
    from system.results import make_row

    scheduled = [
        make_row(
            {"case": "5", "system": "ours", "num_layers": 24, "global_batch_size": 1024}
            | {"scheduler": m, "seed": s},
            iter_time_s=10.0 + s,
            best_cost_s=c + s,
            history=[[0, c + 20.0], [10, c + s]],
        )
        for m, c in (("genetic", 40.0), ("genetic_kl", 55.0))
        for s in (0, 1)
    ]
    outputs = {}
    for name, read in (("named", build.read_rows), ("every", lambda d, columns: read_rows(d))):
        d = tmp_path / name / "study"
        write_rows(d, [*synthetic_rows(cases=("1", "5"), seed=4), *scheduled])
        monkeypatch.setattr(build, "read_rows", read)
        build_report(d, ablation_path=d / "absent.csv")
        made = [d / f for f in build.REPORT_FILES if f.endswith((".md", ".csv"))]
        outputs[name] = {p.name: p.read_bytes() for p in made if p.exists()}
    assert {"claims.md", "summary.csv", "best.csv", "variance.csv"} <= set(outputs["named"])
    assert outputs["named"] == outputs["every"]
