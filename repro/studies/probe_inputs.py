"""Run every bad or edge input of the config/results review on two commits; write a table.

    python repro/run.py mode=probe_inputs results_dir=results/config    # 9287ca2 vs HEAD
    python repro/run.py mode=probe_inputs before=REV after=REV results_dir=DIR

Each side is a fresh copy of the commit (``git archive``) in a temporary folder, so default
results folders and committed studies are those of a clone; every command runs there with
``PYTHONPATH`` set to that copy and ``OMP_NUM_THREADS=1``, under a timeout. The table records
the exit code (``timeout`` when killed) and the last line the command printed on stderr (or
stdout). Inputs that would start hundreds of processes on the old code are not run there; the
table says so. A probe whose command was spelled differently before (``repro/schedule.py``,
now ``mode=schedule``) names the old spelling in ``old_steps``.

"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from repro.config import ProbeInputsConfig
from system.results import atomic_write_text, has_stored_rows, read_rows

ROOT = Path(__file__).resolve().parents[2]
PY = sys.executable

# A four-device topology file with two slots: the cross-region bandwidth and an extra field on
# one pair (the unit tests of the config errors write the same bad files).
TOPOLOGY = """name: t
devices: [A, A, B, B]
pairs:
  - {region_a: A, region_b: B, delay_ms: 10, bandwidth_gbps: %s}
  - {region_a: A, region_b: A, delay_ms: 0.1, bandwidth_gbps: 10%s}
  - {region_a: B, region_b: B, delay_ms: 0.1, bandwidth_gbps: 10}
"""


@dataclass
class Probe:
    name: str
    steps: list[list[str]]  # each a command line (run.py etc.), run in order
    timeout_s: float = 120
    not_before: str = ""  # reason not to run it on the old code
    old_steps: list[list[str]] | None = None  # the steps' spelling on the old code
    concurrent: bool = False  # run the steps at the same time
    edit: str = ""  # a model edit applied before the last step
    note: str = ""
    inspect: str = ""  # a results folder to describe afterwards (rows stored, REPORT.md)


def _r(*args: str) -> list[str]:
    return [PY, "repro/run.py", *args]


def _s(*args: str) -> list[str]:
    """The old code's scheduling script."""
    return [PY, "repro/schedule.py", *args]


DBG = ["case=debug", "model=debug"]
SMALL_SWEEP = ["-m", "sweep=smoke", *DBG, "system=ours", "workflow.ablation_csv=null"]

PROBES = [
    Probe(
        "simulate, then a CPU train run, then simulate again (default folders)",
        [
            _r("case=5", "layers=40", "batch=1024"),
            _r("mode=train", "system=ours", "model=debug", "pp=2", "dp=2", "iters=3"),
            _r("case=5", "layers=40", "batch=1024"),
        ],
        timeout_s=300,
    ),
    Probe(
        "rerun after a simulator change (V100 fraction 0.30 -> 0.25)",
        [_r(*DBG, "results_dir=R/stale"), _r(*DBG, "results_dir=R/stale")],
        edit="hardware",
        note="message: rows written by the second run",
    ),
    Probe("pp=0", [_r(*DBG, "pp=0", "results_dir=R/a")]),
    Probe("dp=0", [_r(*DBG, "dp=0", "results_dir=R/a")]),
    Probe("layers=24.9", [_r(*DBG, "layers=24.9", "results_dir=R/a")]),
    Probe("results_dir=''", [_r(*DBG, "results_dir=")]),
    Probe("logger=bogus", [_r(*DBG, "logger=bogus", "results_dir=R/a")]),
    Probe("scheduler=genetic", [_r(*DBG, "scheduler=genetic", "results_dir=R/a")]),
    Probe("results_dir=<a file>", [_r(*DBG, "results_dir=R/file")]),
    Probe("case=5 pp=3", [_r("case=5", "layers=24", "batch=1024", "pp=3", "results_dir=R/a")]),
    Probe(
        "case=<topology with an extra cell>",
        [_r("case=R/extra.yaml", "model=debug", "results_dir=R/a")],
    ),
    Probe(
        "case=<topology with bandwidth_gbps: true>",
        [_r("case=R/bool.yaml", "model=debug", "results_dir=R/a")],
    ),
    Probe(
        "pair table CSV with an extra cell (system.cases.read_pair_table)",
        [[PY, "-c", "from system.cases import read_pair_table as r; print(r('R/extra.csv'))"]],
    ),
    Probe(
        "pair table with bandwidth_gbps: true (system.cases.read_pair_table)",
        [[PY, "-c", "from system.cases import read_pair_table as r; print(r('R/pairs.yaml'))"]],
    ),
    Probe("batch=1e9", [_r(*DBG, "batch=1e9", "results_dir=R/a")], timeout_s=20),
    Probe("batch=1000000000", [_r(*DBG, "batch=1000000000", "results_dir=R/a")], timeout_s=20),
    Probe(
        "run.py mode=train pp=2 dp=100 batch=200",
        [_r("mode=train", "system=ours", "model=debug", "pp=2", "dp=100", "batch=200")],
        not_before="would start 200 torch processes on this 2-core machine",
    ),
    Probe(
        "sweep with one bad point: -m sweep=smoke case=1,9,2",
        [
            _r(
                "-m",
                "sweep=smoke",
                "case=1,9,2",
                "batch=1024",
                "results_dir=R/sw1",
                "hydra.sweep.dir=R/mr1",
            )
        ],
        timeout_s=300,
        inspect="R/sw1",
    ),
    Probe(
        "sweep whose report fails (workflow.ablation_csv is a folder)",
        [
            _r(
                *SMALL_SWEEP[:-1],
                "batch=16",
                "workflow.ablation_csv=R/adir",
                "results_dir=R/sw2",
                "hydra.sweep.dir=R/mr2",
            )
        ],
        timeout_s=300,
        inspect="R/sw2",
    ),
    Probe(
        "two sweeps into one folder at once",
        [
            _r(*SMALL_SWEEP, "batch=16,32", "results_dir=R/sw3", "hydra.sweep.dir=R/mr3a"),
            _r(*SMALL_SWEEP, "batch=16,32", "results_dir=R/sw3", "hydra.sweep.dir=R/mr3b"),
        ],
        concurrent=True,
        timeout_s=300,
        note="message: jobs ran/skipped of each",
    ),
    Probe(
        "schedule one case, the README's arguments (no time limit given)",
        [_r("mode=schedule", "case=5", "scheduler.name=genetic", "seed=0", "out=R/F.json")],
        old_steps=[_s("case=5", "scheduler=genetic", "seed=0", "out=R/F.json")],
        timeout_s=60,
    ),
    Probe(
        "schedule ... verbose=true (not a terminal)",
        [_r("mode=schedule", "case=5", "out=R/G.json", "verbose=true")],
        old_steps=[_s("case=5", "out=R/G.json", "verbose=true")],
        timeout_s=60,
        note="message: progress lines printed",
    ),
    Probe("schedule case=9", [_r("mode=schedule", "case=9")], old_steps=[_s("case=9")]),
    Probe(
        "schedule time_limit_s=x",
        [_r("mode=schedule", "scheduler.time_limit_s=x")],
        old_steps=[_s("time_limit_s=x")],
    ),
    Probe(
        "schedule pp=3",
        [_r("mode=schedule", "pp=3", "scheduler.time_limit_s=1")],
        old_steps=[_s("pp=3", "time_limit_s=1")],
    ),
    Probe(
        "a fresh clone rebuilds results/smoke's report from committed files",
        [_r("mode=report", "results_dir=results/smoke", "workflow.ablation_csv=none.csv")],
        old_steps=[[PY, "-m", "repro.report", "results/smoke", "--ablation", "none.csv"]],
        timeout_s=120,
        note="message: the report's row count",
    ),
    Probe(
        "collect results/smoke (fresh clone)",
        [_r("mode=collect", "results_dir=results/smoke")],
        old_steps=[[PY, "-m", "repro.collect", "results/smoke"]],
    ),
]


@dataclass
class Outcome:
    rc: list[str] = field(default_factory=list)
    message: str = ""


def _materialise(rev: str, into: Path) -> None:
    into.mkdir(parents=True)
    archive = subprocess.run(["git", "archive", rev], cwd=ROOT, capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)


def _setup(tree: Path, scratch: Path) -> None:
    scratch.mkdir(exist_ok=True)
    (scratch / "file").write_text("not a folder\n")
    (scratch / "adir").mkdir(exist_ok=True)
    (scratch / "extra.yaml").write_text(TOPOLOGY % ("1", ", note: x"))
    (scratch / "bool.yaml").write_text(TOPOLOGY % ("true", ""))
    (scratch / "extra.csv").write_text("region_a,region_b,delay_ms,bandwidth_gbps\nA,B,10,1,9\n")
    (scratch / "pairs.yaml").write_text(
        "pairs:\n  - {region_a: A, region_b: B, delay_ms: 10, bandwidth_gbps: true}\n"
    )


def _edit_model(tree: Path) -> None:
    hw = tree / "system/simulator/hardware.py"
    hw.write_text(
        hw.read_text().replace(
            "achievable_fraction: float = 0.30", "achievable_fraction: float = 0.25"
        )
    )


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in re.sub(r"\x1b\[[0-9;]*m", "", text).splitlines() if ln.strip()]
    lines = [
        ln
        for ln in lines
        if not ln.startswith(
            ("Set the environment variable HYDRA_FULL", "[", "│", "└", "┏", "┃", "┡", "━")
        )
    ]
    return lines[-1][:220] if lines else ""


def _summary(probe: Probe, outs: list[tuple[str, str, str]]) -> str:
    text = "\n".join(o + "\n" + e for _, o, e in outs)
    if "jobs ran" in text and probe.concurrent:
        found = re.findall(r"(\d+) jobs ran, (\d+) skipped", text)
        return "; ".join(
            f"sweep {i + 1}: {r} ran, {s} skipped" for i, (r, s) in enumerate(found)
        ) or _last_line(outs[-1][2] or outs[-1][1])
    if "rows written" in probe.note:
        m = re.findall(r"\d+ rows \((\d+) new\)", text)
        return f"second run: {m[-1]} new rows" if m else _last_line(outs[-1][2] or outs[-1][1])
    if "progress" in probe.note:
        n = len(re.findall(r"trial \d+: best", text))
        return f"{n} progress lines; " + _last_line(outs[-1][2] or outs[-1][1])
    if "row count" in probe.note:
        m = re.search(r"(\d+) rows", text)
        return (m.group(0) + " in the report; " if m else "") + _last_line(
            outs[-1][2] or outs[-1][1]
        )
    hydra = re.search(r"(Error merging override [^\n]*)\n([^\n]*)", text)
    if hydra:  # Hydra's composition error: the override and what is wrong with it
        return f"{hydra.group(1)}: {hydra.group(2)}"
    if all(rc == "0" for rc, _, _ in outs) and "simulated PFLOPS" in text:
        return "ran to the end (printed the results table, no error)"
    errs = [_last_line(e) for rc, _, e in outs if rc not in ("0",) and _last_line(e)]
    return errs[-1] if errs else _last_line(outs[-1][2] or outs[-1][1])


def _start(cmd: list[str], tree: Path, env: dict[str, str]) -> subprocess.Popen:
    """Start one probe command in the copy ``tree``, in its own process group."""
    return subprocess.Popen(
        cmd,
        cwd=tree,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def _finish(proc: subprocess.Popen, timeout_s: float) -> tuple[str, str, str]:
    """(exit code or ``timeout N s``, stdout, stderr); the whole group is killed on timeout."""
    try:
        o, e = proc.communicate(timeout=timeout_s)
        return str(proc.returncode), o, e
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        o, e = proc.communicate()
        return f"timeout {timeout_s:.0f} s", o, e


def _run_side(rev: str, probes: list[Probe], before: bool) -> dict[str, Outcome]:
    out: dict[str, Outcome] = {}
    base = Path(tempfile.mkdtemp(prefix="probe-"))
    try:
        for probe in probes:
            tree = base / f"t{len(out)}"
            _materialise(rev, tree)
            scratch = tree / "R"
            _setup(tree, scratch)
            env = {
                **os.environ,
                "PYTHONPATH": str(tree),
                "OMP_NUM_THREADS": "1",
                "WANDB_MODE": "disabled",
                "COLUMNS": "200",
            }
            res = Outcome()
            if before and probe.not_before:
                res.rc, res.message = ["not run"], probe.not_before
                out[probe.name] = res
                continue
            steps = probe.old_steps if before and probe.old_steps else probe.steps
            cmds = [[a.replace("R/", f"{scratch}/") if "R/" in a else a for a in c] for c in steps]
            outs = []
            t0 = time.monotonic()
            if probe.concurrent:
                procs = [_start(c, tree, env) for c in cmds]
                outs = [_finish(proc, probe.timeout_s) for proc in procs]
            else:
                for i, c in enumerate(cmds):
                    if probe.edit and i == len(cmds) - 1:
                        _edit_model(tree)
                    outs.append(_finish(_start(c, tree, env), probe.timeout_s))
            res.rc = [rc for rc, _, _ in outs]
            res.message = f"{_summary(probe, outs)} ({time.monotonic() - t0:.0f} s)"
            if probe.inspect:
                res.message += "; " + _describe(Path(probe.inspect.replace("R/", f"{scratch}/")))
            # no machine paths in the table: the scratch folder reads R, the copy's root .
            res.message = res.message.replace(str(scratch), "R").replace(str(tree), ".")
            out[probe.name] = res
            print(f"[{rev[:7]}] {probe.name}: {res.rc} {res.message}", flush=True)
            shutil.rmtree(tree, ignore_errors=True)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    return out


def _describe(folder: Path) -> str:
    """Rows a results folder holds (every row the store reads: ``runs.parquet``, parts not yet
    compacted, row files of the old store) + whether it has REPORT.md."""
    rows = len(read_rows(folder, history=True)) if has_stored_rows(folder) else 0
    report = "yes" if (folder / "REPORT.md").exists() else "no"
    return f"left {rows} rows, REPORT.md: {report}"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def run(cfg: ProbeInputsConfig) -> dict:
    probes = [pr for pr in PROBES if cfg.only is None or cfg.only in pr.name]
    revs = [
        subprocess.run(
            ["git", "rev-parse", "--short", r], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout.strip()
        for r in (cfg.before, cfg.after)
    ]
    before = _run_side(revs[0], probes, before=True)
    after = _run_side(revs[1], probes, before=False)
    lines = [
        f"# Bad and edge inputs: {revs[0]} (before) vs {revs[1]} (after)",
        "",
        "Generated by `python repro/run.py mode=probe_inputs` (each side a fresh `git archive` "
        "copy; exit codes of every step, then the last line printed; seconds in brackets; `R` "
        "is a scratch folder holding the bad files). Exit 2: our one-line error; exit 1 with "
        "`Error merging override`: Hydra's type check at composition.",
        "",
        "| input | before: exit | before: message | after: exit | after: message |",
        "|---|---|---|---|---|",
    ]
    for pr in probes:
        b, f = before[pr.name], after[pr.name]
        lines.append(
            f"| {_cell(pr.name)} | {', '.join(b.rc)} | {_cell(b.message)} | "
            f"{', '.join(f.rc)} | {_cell(f.message)} |"
        )
    out = Path(cfg.results_dir) / "inputs.md"
    atomic_write_text(out, "\n".join(lines) + "\n")
    print(f"wrote {out}")
    return {"probes": len(probes), "table": str(out)}
