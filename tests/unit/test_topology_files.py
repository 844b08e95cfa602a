"""Topology files as hostile input: rows keyed by their content, one line for every bad file."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from system.cases import get_case, load_topology, read_pair_table
from system.results import make_row, read_rows

ROOT = Path(__file__).resolve().parents[2]
TOPOLOGY = """\
name: three-sites
devices: [Oregon, Oregon, Tokyo, Tokyo]
pairs:
  - {{region_a: Oregon, region_b: Tokyo, delay_ms: 48.5, bandwidth_gbps: {bw}}}
intra_delay_ms: 0.1
intra_bandwidth_gbps: 10
"""


def _simulate(case: Path, results: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [
            sys.executable,
            "repro/run.py",
            f"case={case}",
            "model=debug",
            "system=ours",
            f"results_dir={results}",
            "workflow.report=false",  # the rows are what is checked here
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"},
    )


def _ours(results: Path) -> list[float]:
    rows = read_rows(results)
    return sorted(rows[rows.system == "ours"].iter_time_s.astype(float))


def _simulate_here(case: Path, results: Path) -> None:
    """The same run in this process (its schedule and replay caches live on between runs)."""
    from repro.run import run

    run(
        {
            "mode": "simulate",
            "case": str(case),
            "model": "debug",
            "system": "ours",
            "results_dir": str(results),
            "workflow": {"report": False},
        }
    )


@pytest.mark.slow  # four simulations of a topology file, one of them a process of its own
def test_editing_a_topology_file_gives_new_rows_that_supersede_the_old(tmp_path):
    topo, results = tmp_path / "edit.yaml", tmp_path / "R"
    topo.write_text(TOPOLOGY.format(bw=1))
    first = _simulate(topo, results)  # the command line once; in this process after that
    assert first.returncode == 0, first.stderr[-2000:]
    before = _ours(results)
    history = len(read_rows(results, history=True))
    topo.write_text(TOPOLOGY.format(bw=0.01))  # 100x slower link between the two sites
    _simulate_here(topo, results)
    assert len(read_rows(results, history=True)) > history, "the edited file added no rows"
    after = _ours(results)
    assert after and after[0] > before[0], (before, after)  # the slower link shows
    # the file's own simulation (a fresh store) gives the numbers the shared store now reports
    fresh = tmp_path / "fresh"
    _simulate_here(topo, fresh)
    assert _ours(fresh) == pytest.approx(after)
    # edited back: its rows are stored already, but superseded; the rerun makes them current
    topo.write_text(TOPOLOGY.format(bw=1))
    _simulate_here(topo, results)
    assert _ours(results) == pytest.approx(before)


def test_a_schedule_is_kept_for_a_topology_files_content_not_its_path(tmp_path):
    from repro.config.shared import SchedulerOptions
    from repro.modes.simulate.run import Schedules
    from system.workload import Workload, get_model

    topo, keys = tmp_path / "edit.yaml", []
    work = Workload(model=get_model("debug", 4), global_batch_size=16, micro_batch_size=1)
    for bw in (1, 0.01):
        topo.write_text(TOPOLOGY.format(bw=bw))
        cluster = get_case(str(topo))
        keys.append(Schedules(SchedulerOptions(), 0).call(str(topo), cluster, work, 2, 2)[0])
    assert keys[0] != keys[1]


@pytest.mark.slow  # four sweeps, each a Hydra process of its own
def test_a_sweep_reruns_a_finished_job_whose_topology_file_changed(tmp_path):
    topo, results = tmp_path / "edit.yaml", tmp_path / "R"
    topo.write_text(TOPOLOGY.format(bw=1))

    def sweep() -> str:
        out = subprocess.run(
            [
                sys.executable,
                "repro/run.py",
                "-m",
                "sweep=smoke",
                f"case={topo}",
                "model=debug",
                "system=ours",
                "batch=16",
                f"results_dir={results}",
                f"hydra.sweep.dir={tmp_path / 'mr'}",
                "workflow.ablation_csv=null",
                "workflow.report=false",
            ],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=300,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
        assert out.returncode == 0, out.stderr[-2000:]
        return out.stdout + out.stderr

    assert "1 jobs ran, 0 skipped" in sweep()
    before = _ours(results)
    assert "0 jobs ran, 1 skipped" in sweep()  # unchanged: finished
    topo.write_text(TOPOLOGY.format(bw=0.01))
    assert "1 jobs ran, 0 skipped" in sweep()  # edited: a new job
    assert _ours(results)[0] > before[0]
    topo.write_text(TOPOLOGY.format(bw=1))
    assert "1 jobs ran, 0 skipped" in sweep()  # edited back: its rows were superseded
    assert _ours(results) == pytest.approx(before)


def test_row_key_holds_the_file_digest_as_a_version(tmp_path):
    from system.cases import case_digest

    topo = tmp_path / "t.yaml"
    topo.write_text(TOPOLOGY.format(bw=1))
    get_case(str(topo))
    a = make_row({"mode": "simulate", "case": str(topo)})
    topo.write_text(TOPOLOGY.format(bw=2))
    get_case(str(topo))
    b = make_row({"mode": "simulate", "case": str(topo)})
    assert a["case_sha256"] != b["case_sha256"] and a["run_id"] != b["run_id"]
    assert a["setting_id"] == b["setting_id"]  # same setting: the new row supersedes
    assert case_digest("5") is None and "case_sha256" not in make_row({"case": "5"})


def test_digest_is_of_the_content_the_run_read(tmp_path):
    from system.cases import case_digest

    topo = tmp_path / "t.yaml"
    topo.write_text(TOPOLOGY.format(bw=1))
    c = load_topology(topo)
    read = case_digest(str(topo))
    topo.write_text(TOPOLOGY.format(bw=3))  # edited while the run computes
    assert case_digest(str(topo)) == read == c.meta["source_sha256"]


BAD_FILES = {
    "malformed": ("devices: [a, b\npairs: x\n", "not a valid YAML document"),
    "python tag": ("!!python/object/apply:os.system ['touch /tmp/x']\n", "not a valid YAML"),
    "custom tag": ("devices: !custom [a]\n", "not a valid YAML"),
    "alias": ("devices: &d [Oregon, Tokyo]\nname: *d\n", "alias *d is not allowed"),
    "nested aliases": (  # the "billion laughs" under name: 9 levels of 9 aliases each
        "name:\n  - &a0 [x, x, x, x, x, x, x, x, x]\n"
        + "".join(f"  - &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]\n" for i in range(1, 10))
        + "devices: [a]\npairs: []\n",
        "alias *a0 is not allowed",
    ),
    "deep nesting": ("devices: " + "[" * 5000 + "]" * 5000 + "\n", "nested too deeply"),
    "name with a newline": (
        'name: "innocent\\ntouch /tmp/INJECTED #"\ndevices: [a]\npairs: []\n',
        "is not a plain name",
    ),
    "name with $()": ('name: "x$(reboot)"\ndevices: [a]\npairs: []\n', "is not a plain name"),
    "region with a backtick": ('devices: ["a`id`"]\npairs: []\n', "is not a plain name"),
    "region with a quote": ('devices: ["a\'b"]\npairs: []\n', "is not a plain name"),
    "name with ;": ('name: "a; rm -rf ~"\ndevices: [a]\npairs: []\n', "is not a plain name"),
    "not UTF-8": (b"devices: [\xff]\n", "not UTF-8"),
}


@pytest.mark.parametrize("what", sorted(BAD_FILES))
def test_bad_topology_file_is_one_line_naming_the_file(tmp_path, what):
    text, message = BAD_FILES[what]
    p = tmp_path / "bad.yaml"
    p.write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(ValueError) as e:
        get_case(str(p))
    msg = str(e.value)
    assert message in msg and str(p) in msg and "\n" not in msg, msg


def test_bad_json_topology_and_pair_table_are_one_line(tmp_path):
    p = tmp_path / "bad.json"
    p.write_text('{"devices": [1,')
    with pytest.raises(ValueError, match=r"not valid JSON") as e:
        get_case(str(p))
    assert str(p) in str(e.value) and "\n" not in str(e.value)
    q = tmp_path / "pairs.yaml"
    q.write_text("pairs: &p [1]\nmore: *p\n")
    with pytest.raises(ValueError, match=r"pair table .*alias \*p is not allowed"):
        read_pair_table(q)


def test_too_many_devices_is_refused_before_any_matrix(tmp_path):
    from system.limits import LimitError

    p = tmp_path / "big.yaml"
    p.write_text("devices: [" + ", ".join(["a"] * 10_000) + "]\npairs: []\n")
    with pytest.raises(LimitError, match=r"10000 devices: over limits.max_devices=1024"):
        get_case(str(p))
    with pytest.raises(LimitError, match=r"over limits.max_devices=9999"):
        get_case(str(p), max_devices=9999)


def test_a_file_loaded_again_is_not_parsed_again_unless_its_bytes_changed(tmp_path, monkeypatch):
    """A run's check and its run load one fleet file: the second load is the first's cluster,
    a file edited in between is loaded (and checked) anew, and a lower device limit still
    refuses it."""
    import system.cases as cases
    from system.limits import LimitError

    f = tmp_path / "sites.yaml"
    f.write_text(TOPOLOGY.format(bw=0.6))
    first = load_topology(f)
    parses = []
    real = cases.parse_document
    monkeypatch.setattr(cases, "parse_document", lambda *a, **k: parses.append(1) or real(*a, **k))
    assert load_topology(f) is first and get_case(str(f)) is first and not parses
    f.write_text(TOPOLOGY.format(bw=0.3))
    second = load_topology(f)
    assert parses == [1] and second is not first
    assert second.bandwidth_gbps[0, 2] == 0.3 and first.bandwidth_gbps[0, 2] == 0.6
    with pytest.raises(LimitError, match="over limits.max_devices=3"):
        load_topology(f, max_devices=3)
    f.write_text("devices: [Oregon, nowhere/..]\n")
    with pytest.raises(ValueError, match="sites.yaml"):
        load_topology(f)


@pytest.mark.parametrize("args", [["check", "--devices", "0,1"], ["tc-script", "--out", "O"]])
def test_emulation_cli_refuses_a_bad_topology_file_in_one_line(tmp_path, args):
    p = tmp_path / "bad.yaml"
    p.write_text("devices: !!python/name:os.system []\n")
    hosts = tmp_path / "hosts.txt"
    hosts.write_text("198.18.1.1\n")
    extra = ["--hosts", str(hosts)] if args[0] == "tc-script" else []
    out = subprocess.run(
        [sys.executable, "-m", "system.emulation", *args, "--case", str(p), *extra],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert out.returncode == 2 and out.stderr.count("\n") == 1, out.stderr
    assert out.stderr.startswith("error: topology file") and "not a valid YAML" in out.stderr


@pytest.mark.parametrize("case", ["/abs/x.yaml", "/../../x.yaml", "../up/odd name.json"])
def test_a_file_case_names_files_by_stem_and_content_never_by_path(tmp_path, case):
    from system.cases import case_label

    label = case_label(case)
    assert "/" not in label and not label.startswith(".") and label.endswith("-missing")
    topo = tmp_path / "edit.yaml"
    topo.write_text(TOPOLOGY.format(bw=1))
    first = case_label(str(topo))
    topo.write_text(TOPOLOGY.format(bw=2))
    load_topology(topo)
    assert first.startswith("edit-") and case_label(str(topo)) != first
    assert case_label("worldwide") == "5"
