"""``mode=external`` on hostile inputs: each is refused up front with one line naming the file
and what is wrong (the entry's exit 2), and the previous output set stays as it was; a run's
files replace the previous run's whole.

Each bad input is built in ``tmp_path`` from a copy of Sailor's shared data and two of its
clariden OPT-350 plans (both measured, TP 4 on 4-GPU GH200 nodes).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from repro.run import USER_ERRORS, run
from tests.external._tiny import plan, write_data, write_plan
from tests.external.test_sailor_importers import SHARED

ROOT = Path(__file__).resolve().parents[2]
PLAN = "clariden/OPT-350/N2/plan_config_N2_D1.json"
PLANS = (PLAN, "clariden/OPT-350/N4/plan_config_N4_D2.json")
Z = "us-central1-a"
OLD = {"REPORT.md": "old report\n", "predictions.csv": "old\n", "errors.csv": "old\n"}


@pytest.fixture
def data(tmp_path) -> Path:
    """A copy of the shared data files and two clariden plans; the old set in ``out``."""
    if not SHARED.is_dir():
        pytest.skip("Sailor's shared data is not present")
    d = tmp_path / "data"
    d.mkdir()
    for f in SHARED.glob("*.json"):
        shutil.copyfile(f, d / f.name)
    for rel in PLANS:
        (d / "plans" / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(SHARED / "plans" / rel, d / "plans" / rel)
    out = tmp_path / "out"
    out.mkdir()
    for name, text in OLD.items():
        (out / name).write_text(text)
    return d


def _edit(path: Path, change) -> None:
    d = json.loads(path.read_text())
    change(d)
    path.write_text(json.dumps(d))


def _renamed_model(d):
    _edit(d / "training_config_opt_350.json", lambda c: c.update(model="OPT-351"))


def _llm_info_one_layer_short(d):
    _edit(d / "llm_info.json", lambda c: c["OPT-350"]["4"].pop("25"))


def _real_1e308(d):
    _edit(d / "plans" / PLAN, lambda c: c.update(real=1e308))


def _red_grads_negative(d):
    _edit(d / "plans" / PLAN, lambda c: c.update(red_grads=-0.01))


def _tied_embedding_without_rows(d):
    rel = "clariden/GPT-NEO/N2/plan_config_N2_D1.json"  # GPT-Neo ties its head to the embedding
    (d / "plans" / rel).parent.mkdir(parents=True)
    shutil.copyfile(SHARED / "plans" / rel, d / "plans" / rel)
    _edit(d / "llm_info.json", lambda c: c["GPT-Neo-2.7"]["4"]["0"].update(params_floats=1e6))


def _excluded_plan_with_real_1e308(d):
    def change(c):  # a layer list that does not make up the model: an excluded plan
        c["pipeline_list"][0]["layers_per_stage"][1].pop()
        c["real"] = 1e308

    _edit(d / "plans" / PLAN, change)


def _gpus_40000(d):
    def change(c):
        c["pipeline_list"][0]["tmp_per_stage"][1][0][0][0][1] = 40_000

    _edit(d / "plans" / PLAN, change)


def _linked_to_dev_zero(d):
    os.symlink("/dev/zero", d / "plans" / "clariden/OPT-350/N2/plan_config_zero.json")


def _plan_link_loop(d):
    folder = d / "plans" / "clariden/OPT-350/N2"
    os.symlink("plan_config_b.json", folder / "plan_config_a.json")
    os.symlink("plan_config_a.json", folder / "plan_config_b.json")


def _profile_times_zero(d):
    def change(c):
        for by_tp in c["OPT-350"]["GH-96"].values():
            for layers in by_tp.values():
                for k in layers:
                    layers[k] = [0.0, 0.0, 0.0]

    _edit(d / "profiles_tmp.json", change)


def _fit_negative_inside(d):
    def change(c):  # 3 GB/s at both ends, −1.5 GB/s at 8 MB
        c[Z]["GH-96"]["4"][Z]["GH-96"]["4"] = [[0.5, -3.0, 3.0], 2.3e10]

    _edit(d / "multizone_bandwidths_het.json", change)


def _link_peak_free(d):
    _edit(d / "intra_node_bandwidths.json", lambda c: c["GH-96"]["4"].__setitem__(1, 1e300))


def _intra_empty(d):
    (d / "intra_node_bandwidths.json").write_text("{}")


def _intra_without_the_node(d):
    _edit(d / "intra_node_bandwidths.json", lambda c: c["GH-96"].pop("4"))


def _micro_batches_1e15(d):
    _edit(d / "plans" / PLAN, lambda c: c.update(gbs=10**15))


def _nested_too_deep(d):
    (d / "plans" / PLAN).write_text("[" * 100_000 + "]" * 100_000)


def _plan_over_its_size_cap(d):
    (d / "plans" / PLAN).write_text(" " * (2 * 2**20) + "{}")


def _plan_is_a_folder(d):
    (d / "plans" / "clariden/OPT-350/N2/plan_config_dir.json").mkdir()


def _plan_name_with_newline(d):
    shutil.copyfile(d / "plans" / PLAN, d / "plans" / "clariden/OPT-350/N2/plan_config_a|b\nc.json")


def _data_file_a_fifo(d):
    (d / "llm_info.json").unlink()
    os.mkfifo(d / "llm_info.json")


HOSTILE = [
    (_renamed_model, "training_config_opt_350.json", "no training config names 'OPT-350'"),
    (_llm_info_one_layer_short, "llm_info.json", r"\[OPT-350\]\[4\]: 25 layers, .*=26"),
    (_real_1e308, "plan_config_N2_D1.json", "real: 1e\\+308 is outside the physical range"),
    (_red_grads_negative, "plan_config_N2_D1.json", "red_grads: -0.01 is outside the physical"),
    (_tied_embedding_without_rows, "llm_info.json", r"\[GPT-Neo-2.7\]\[4\]\[0\].params_floats"),
    (_excluded_plan_with_real_1e308, "plan_config_N2_D1.json", "real: 1e\\+308 is outside"),
    (_gpus_40000, "plan_config_N2_D1.json", "40004 devices: over limits.max_devices=1024"),
    (_linked_to_dev_zero, "plan_config_zero.json", "a link to /dev/zero, outside the plans"),
    (_plan_link_loop, "plan_config_a.json", "a link that does not resolve"),
    (_profile_times_zero, "profiles_tmp.json", r"\(fwd_s\): time 0 s; a layer's time must be > 0"),
    (_fit_negative_inside, "multizone_bandwidths_het.json", "fit -1.5 GB/s at 8e\\+06 bytes"),
    (_link_peak_free, "intra_node_bandwidths.json", r"\[GH-96\]\[4\]\[1\]: peak 1e\+300"),
    (_intra_empty, "intra_node_bandwidths.json", "expected a non-empty JSON object"),
    (_intra_without_the_node, "intra_node_bandwidths.json", r"\[GH-96\]\[4\]: no intra-node fit"),
    (_micro_batches_1e15, "plan_config_N2_D1.json", "over limits.max_micro_batches=32768"),
    (_nested_too_deep, "plan_config_N2_D1.json", "JSON nested too deeply"),
    (_plan_over_its_size_cap, "plan_config_N2_D1.json", "bytes, over the limit of 1048576"),
    (_plan_is_a_folder, "plan_config_dir.json", r"not a regular file \(a folder\)"),
    (_plan_name_with_newline, "plan_config_a|b\\nc.json", "a plan's path must be plain names"),
    (_data_file_a_fifo, "llm_info.json", "is not a regular file"),
]


@pytest.mark.parametrize("make,file,problem", HOSTILE, ids=[h[0].__name__[1:] for h in HOSTILE])
def test_a_hostile_input_is_one_line_and_leaves_the_old_set(data, make, file, problem):
    make(data)
    out = data.parent / "out"
    with pytest.raises(USER_ERRORS) as e:
        run({"mode": "external", "plans": str(data / "plans"), "results_dir": str(out)})
    msg = str(e.value)
    assert len(msg.splitlines()) == 1, msg
    assert file in msg and re.search(problem, msg), msg
    assert {p.name: p.read_text() for p in out.iterdir()} == OLD


def test_the_copied_plans_pass_so_each_refusal_is_the_edit(data):
    out = data.parent / "out"
    summary = run({"mode": "external", "plans": str(data / "plans"), "results_dir": str(out)})
    assert summary["plans"] == 2 and summary["excluded"] == []
    assert (out / "REPORT.md").read_text() != OLD["REPORT.md"]


@pytest.mark.slow
def test_a_fifo_named_like_a_plan_is_refused_at_once(data):
    """The command line itself: exit 2, one ``error:`` line, no wait on the FIFO's writer."""
    os.mkfifo(data / "plans" / "clariden/OPT-350/N2/plan_config_fifo.json")
    out = data.parent / "out"
    r = subprocess.run(
        [
            sys.executable,
            str(ROOT / "repro" / "run.py"),
            "mode=external",
            f"plans={data / 'plans'}",
            f"results_dir={out}",
            f"hydra.run.dir={data.parent / 'hydra'}",
        ],
        cwd=data.parent,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"},
    )
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]
    assert r.returncode == 2 and len(lines) == 1, r.stderr[-2000:]
    assert "plan_config_fifo.json: (file): not a regular file (a FIFO)" in lines[0]
    assert {p.name: p.read_text() for p in out.iterdir()} == OLD


def test_a_second_run_replaces_the_whole_set(tmp_path):
    """A run without measurements after one with: no report, errors or figure of the first run
    stays beside the second's predictions; files that are not the mode's stay."""
    first = write_data(tmp_path / "first")
    write_plan(
        first, "clariden/OPT-350/N2/plan_config_N2_D1.json", plan([[0, 1], [2, 3]], 1, real=0.7)
    )
    second = write_data(tmp_path / "second")
    write_plan(second, "mit/N1/plan_config_N1_D1.json", plan([[0, 1, 2, 3]], 1))
    out = tmp_path / "out"
    out.mkdir()
    (out / "NOTES.md").write_text("kept\n")
    run({"mode": "external", "plans": str(first / "plans"), "results_dir": str(out)})
    assert {"REPORT.md", "errors.csv", "predicted_vs_measured.png"} <= {
        p.name for p in out.iterdir()
    }
    run({"mode": "external", "plans": str(second / "plans"), "results_dir": str(out)})
    visible = sorted(p.name for p in out.iterdir() if not p.name.startswith("."))
    assert visible == ["NOTES.md", "predictions.csv", "warnings.csv"]
    assert pd.read_csv(out / "predictions.csv")["plan"].tolist() == [
        "mit/N1/plan_config_N1_D1.json"
    ]


def test_a_run_failing_after_its_checks_leaves_the_old_set(tmp_path, monkeypatch):
    import repro.studies.external.run as mode

    d = write_data(tmp_path / "d")
    write_plan(d, "clariden/OPT-350/N2/plan_config_N2_D1.json", plan([[0, 1], [2, 3]], 1, real=0.7))
    out = tmp_path / "out"
    run({"mode": "external", "plans": str(d / "plans"), "results_dir": str(out)})
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    # the second run measures the plan otherwise: every file it wrote would differ
    write_plan(d, "clariden/OPT-350/N2/plan_config_N2_D1.json", plan([[0, 1], [2, 3]], 1, real=0.9))

    def broken(*_a, **_k):
        raise OSError("disk full")

    monkeypatch.setattr(mode, "plot_predicted_vs_measured", broken)
    with pytest.raises(OSError, match="disk full"):
        run({"mode": "external", "plans": str(d / "plans"), "results_dir": str(out)})
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


def test_a_held_out_plans_measurement_is_not_read_even_to_refuse_it(tmp_path):
    """The checks read a held-out (mit) plan through its configuration fields, as the
    prediction does: a measurement field in it is neither checked nor shown."""
    d = write_data(tmp_path / "d")
    write_plan(d, "mit/N1/plan_config_N1_D1.json", plan([[0, 1, 2, 3]], 1, real=-1e308))
    out = tmp_path / "out"
    summary = run({"mode": "external", "plans": str(d / "plans"), "results_dir": str(out)})
    assert summary["plans"] == 1 and summary["excluded"] == [] and summary["mape_pct"] == {}
    assert not (out / "errors.csv").exists()
