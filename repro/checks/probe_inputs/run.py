"""Run every bad or edge input of the config/results review on two commits; write a table.

    python repro/run.py mode=probe_inputs results_dir=results/config    # 370986d vs HEAD
    python repro/run.py mode=probe_inputs before=57a7390 results_dir=results/config
    python repro/run.py mode=probe_inputs before=REV after=REV results_dir=DIR
    python repro/run.py mode=probe_inputs results_dir=results/config lock_dir=DIR

On a machine shared under the team's locks, ``lock_dir`` names the folder of
``dtfm-cpu.lock`` and ``dtfm-netns.lock``: each probe holds the CPU lock shared while it runs,
an emulating probe the namespace lock (exclusive) first.

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

from repro.checks.probe_inputs.config import ProbeInputsConfig
from repro.checks.probe_inputs.hostile import (  # noqa: F401 (TOPOLOGY: the tests write its files)
    HOSTILE,
    TOPOLOGY,
    Probe,
    _r,
    setup,
)
from repro.checks.probe_inputs.probe_runs import NotRun, after, around, signal_step
from repro.checks.tree import materialise, short_rev
from system.lifeline import cancel, exit_on_signals, on_death
from system.markdown import md_cell
from system.results import atomic_write_text, has_stored_rows, read_rows

PY = sys.executable
# the entry of the old layout, which Probe.old_steps are spelled for: a tree without it (a
# newer "before") runs the probes' own steps
OLD_ENTRY = "repro/schedule.py"


def _s(*args: str) -> list[str]:
    """The old code's scheduling script."""
    return [PY, "repro/schedule.py", *args]


def _library_call(function: str, path: str) -> list[str]:
    """A call of ``system.cases.<function>(path)`` that prints what it returns (exit 0) or the
    exception it raises as one line (exit 1): a library function answers bad input by raising,
    and its caller decides how to show it."""
    code = (
        f"import sys\nfrom system.cases import {function} as f\n"
        f"try:\n    print(f({path!r}))\nexcept Exception as e:\n"
        "    sys.exit(f'raises {type(e).__name__}: {e}')\n"
    )
    return [PY, "-c", code]


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
        "pair table CSV with an extra cell (system.cases.read_pair_table: what it returns or "
        "raises)",
        [_library_call("read_pair_table", "R/extra.csv")],
    ),
    Probe(
        "pair table with bandwidth_gbps: true (system.cases.read_pair_table: what it returns or "
        "raises)",
        [_library_call("read_pair_table", "R/pairs.yaml")],
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
PROBES += HOSTILE  # the hostile-input review: files, stores, paths, numbers, signals


@dataclass
class Outcome:
    rc: list[str] = field(default_factory=list)
    message: str = ""


def _edit(tree: Path, scratch: Path, what: str, step: int, steps: int) -> None:
    """The edit before step ``step``: the simulator's V100 fraction (before the last step), or
    the topology file R/edit.yaml: slower (before step 1), back as it was (before step 2)."""
    if what == "hardware" and step == steps - 1:
        hw = tree / "system/simulator/hardware.py"
        hw.write_text(
            hw.read_text().replace(
                "achievable_fraction: float = 0.30", "achievable_fraction: float = 0.25"
            )
        )
    elif what.startswith("topology"):
        bw = "0.01" if step == 1 else "1"
        (scratch / "edit.yaml").write_text(TOPOLOGY % (bw, ""))


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


def _tail(out: tuple[str, str, str]) -> str:
    """The last line a step printed: on stderr, else (nothing there but noise) on stdout."""
    _, stdout, stderr = out
    return _last_line(stderr) or _last_line(stdout)


_EXCEPTION = re.compile(
    r"^(?:[A-Za-z_][\w.]*\.)?[A-Z]\w*(?:Error|Exception|Exit|Interrupt)\b.*$", re.M
)


def _traceback(text: str) -> str | None:
    """``traceback: <the exception line>`` when ``text`` holds a Python traceback."""
    if "Traceback (most recent call last)" not in text:
        return None
    found = _EXCEPTION.findall(re.sub(r"\x1b\[[0-9;]*m", "", text))
    return f"traceback: {found[-1].strip()[:200]}" if found else "traceback"


def _summary(probe: Probe, outs: list[tuple[str, str, str]]) -> str:
    text = "\n".join(o + "\n" + e for _, o, e in outs)
    failed = [e + o for rc, o, e in outs if rc != "0"]
    shown = _traceback(failed[-1]) if failed else None
    if shown:
        return shown
    if "jobs ran" in text and probe.concurrent:
        found = re.findall(r"(\d+) jobs ran, (\d+) skipped", text)
        return "; ".join(
            f"sweep {i + 1}: {r} ran, {s} skipped" for i, (r, s) in enumerate(found)
        ) or _tail(outs[-1])
    if "rows written" in probe.note:
        m = re.findall(r"\d+ rows \((\d+) new\)", text)
        which = "third" if "third" in probe.note else "second"
        return f"{which} run: {m[-1]} new rows" if m else _tail(outs[-1])
    if "progress" in probe.note:
        n = len(re.findall(r"trial \d+: best", text))
        return f"{n} progress lines; " + _tail(outs[-1])
    if "row count" in probe.note:
        m = re.search(r"(\d+) rows", text)
        return (m.group(0) + " in the report; " if m else "") + _tail(outs[-1])
    hydra = re.search(r"(Error merging override [^\n]*)\n([^\n]*)", text)
    if hydra:  # Hydra's composition error: the override and what is wrong with it
        return f"{hydra.group(1)}: {hydra.group(2)}"
    unknown = re.search(r"(Could not override '[^']*'\.)\n(?:To append[^\n]*\n)?([^\n]*)", text)
    if unknown:  # Hydra's error for a key the mode does not have
        return f"{unknown.group(1)} {unknown.group(2)}"
    if all(rc == "0" for rc, _, _ in outs) and "simulated PFLOPS" in text:
        return "ran to the end (printed the results table, no error)"
    errs = [_last_line(e) for rc, _, e in outs if rc not in ("0",) and _last_line(e)]
    return errs[-1] if errs else _tail(outs[-1])


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


def _run_side(
    rev: str, probes: list[Probe], before: bool, lock_dir: str | None = None
) -> dict[str, Outcome]:
    out: dict[str, Outcome] = {}
    base = Path(tempfile.mkdtemp(prefix="probe-"))
    guard = on_death("rmtree", base)  # the copies go even if this process is SIGKILLed
    try:
        with exit_on_signals():  # SIGTERM/SIGHUP: the finally below still runs
            for probe in probes:
                tree = base / f"t{len(out)}"
                materialise(rev, tree)
                scratch = tree / "R"
                setup(scratch)
                res = Outcome()
                if before and probe.not_before:
                    res.rc, res.message = ["not run"], probe.not_before
                else:
                    try:
                        with around(probe, tree, scratch, lock_dir) as ctx:
                            res = _run_probe(probe, ctx, before)
                    except NotRun as e:
                        res.rc, res.message = ["not run"], str(e)
                # no machine paths in the table: the scratch folder reads R, the copy's root .
                res.message = res.message.replace(str(scratch), "R").replace(str(tree), ".")
                out[probe.name] = res
                print(f"[{rev[:7]}] {probe.name}: {res.rc} {res.message}", flush=True)
                shutil.rmtree(tree, ignore_errors=True)
    finally:
        shutil.rmtree(base, ignore_errors=True)
        cancel(guard)
    return out


def _arg(a: str, tree: Path, scratch: Path) -> str:
    """A step's argument in the copy: ``R/`` is the scratch folder, the entry an absolute path
    (a probe may run in another working folder)."""
    if a == "repro/run.py":
        return str(tree / a)
    return a.replace("R/", f"{scratch}/")


def _run_probe(probe: Probe, ctx, before: bool) -> Outcome:
    tree, scratch = ctx.tree, ctx.scratch
    extra = probe.env or {}
    env = {
        **os.environ,
        "PYTHONPATH": str(tree),
        "OMP_NUM_THREADS": "1",
        "WANDB_MODE": "disabled",
        "COLUMNS": "200",
        **{k: v.replace("R/", f"{scratch}/") for k, v in extra.items() if v is not None},
    }
    for k in [k for k, v in extra.items() if v is None]:
        env.pop(k, None)
    old = before and probe.old_steps and (tree / OLD_ENTRY).is_file()
    steps = probe.old_steps if old else probe.steps
    _special(probe.special, scratch)
    cwd = Path(probe.cwd.replace("R/", f"{scratch}/")) if probe.cwd else tree
    cmds = [[_arg(a, tree, scratch) for a in c] for c in steps]
    started_s, t0 = time.time(), time.monotonic()
    res = Outcome()
    if probe.signal:
        rc, what, text = signal_step(probe, cmds[0], cwd, env)
        res.rc, res.message = [rc], f"{what} ({time.monotonic() - t0:.0f} s)"
        return res
    outs = []
    if probe.concurrent:
        procs = [_start(c, cwd, env) for c in cmds]
        outs = [_finish(proc, probe.timeout_s) for proc in procs]
    else:
        for i, c in enumerate(cmds):
            if probe.edit and i >= 1:
                _edit(tree, scratch, probe.edit, i, len(cmds))
            outs.append(_finish(_start(c, cwd, env), probe.timeout_s))
    res.rc = [rc for rc, _, _ in outs]
    res.message = f"{_summary(probe, outs)} ({time.monotonic() - t0:.0f} s)"
    extra = after(probe, ctx, started_s)
    if "hydra folders" in probe.note:
        extra = f"{len(list(cwd.glob('outputs/*/multirun/*')))} Hydra sweep folders"
    if extra:
        res.message += "; " + extra
    if probe.inspect:
        folder = Path(probe.inspect.replace("R/", f"{scratch}/"))
        res.message += "; " + _describe(folder)
        if probe.note in NOTES:
            res.message += "; " + NOTES[probe.note](folder)
    if probe.watch:
        path = Path(probe.watch.replace("R/", f"{scratch}/"))
        path = path if path.is_absolute() else cwd / path
        res.message += f"; {probe.watch} {'CREATED' if path.exists() else 'absent'}"
    return res


def _special(what: str, scratch: Path) -> None:
    """The special file of a probe (:attr:`Probe.special`) in place of a plain one."""
    if not what:
        return
    kind, _, rel = what.partition(":")
    path = Path(rel.replace("R/", f"{scratch}/"))
    path.unlink(missing_ok=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "zero":
        path.symlink_to("/dev/zero")
    else:
        raise ValueError(f"Probe.special={what!r}: expected fifo:PATH or zero:PATH")


def _listing(folder: Path) -> str:
    """The files a results folder holds (its top level) and its part files."""
    if not folder.is_dir():
        return "no folder"
    names = sorted(p.name for p in folder.iterdir() if p.is_file())
    parts = folder / "parts"
    n_parts = len(list(parts.iterdir())) if parts.is_dir() else 0
    return f"files: {', '.join(names) or 'none'}; parts: {n_parts}"


_UNESCAPED_BAR = re.compile(r"(?<!\\)\|")


def _tables(folder: Path) -> str:
    """Whether every row of every Markdown table in the folder's REPORT.md has its header's
    cells (a ``|`` or a line break in a cell splits or cuts a row)."""
    report = folder / "REPORT.md"
    if not report.is_file():
        return "no REPORT.md"
    broken, width = 0, None
    for line in report.read_text().splitlines():
        if not line.startswith("|"):
            if width is not None and line.strip():
                broken += 1  # a row cut by a line break goes on below the table
            width = None
            continue
        cells = len(_UNESCAPED_BAR.split(line.strip())) - 2
        if width is None:
            width = cells
        elif cells != width:
            broken += 1
    return f"REPORT.md tables: {broken} broken rows" if broken else "REPORT.md tables intact"


def _mape(folder: Path) -> str:
    """The first row of the MAPE table of the folder's REPORT.md (ours beside Sailor's)."""
    report = folder / "REPORT.md"
    if not report.is_file():
        return "no REPORT.md"
    lines = report.read_text().splitlines()
    for i, line in enumerate(lines):
        if line.startswith("| set |") and i + 2 < len(lines):
            return "MAPE row: " + lines[i + 2]
    return "no MAPE table in REPORT.md"


NOTES = {"listing": _listing, "tables": _tables, "mape": _mape}


def _describe(folder: Path) -> str:
    """Rows a results folder holds (every row the store reads: ``runs.parquet``, parts not yet
    compacted, row files of the old store) + whether it has REPORT.md."""
    rows = len(read_rows(folder, history=True)) if has_stored_rows(folder) else 0
    report = "yes" if (folder / "REPORT.md").exists() else "no"
    return f"left {rows} rows, REPORT.md: {report}"


def run(cfg: ProbeInputsConfig) -> dict:
    probes = [pr for pr in PROBES if cfg.only is None or cfg.only in pr.name]
    revs = [short_rev(r) for r in (cfg.before, cfg.after)]
    old = _run_side(revs[0], probes, before=True, lock_dir=cfg.lock_dir)
    new = _run_side(revs[1], probes, before=False, lock_dir=cfg.lock_dir)
    lines = [
        f"# Bad and edge inputs: {revs[0]} (before) vs {revs[1]} (after)",
        "",
        "Generated by `python repro/run.py mode=probe_inputs` (each side a fresh `git archive` "
        "copy; exit codes of every step, then the last line printed; seconds in brackets; `R` "
        "is a scratch folder holding the bad files). Exit 2: our one-line error; exit 1 with "
        "`Error merging override` or `Could not override`: Hydra's type and key checks at "
        "composition.",
        "",
        "| input | before: exit | before: message | after: exit | after: message |",
        "|---|---|---|---|---|",
    ]
    for pr in probes:
        b, f = old[pr.name], new[pr.name]
        lines.append(
            f"| {md_cell(pr.name)} | {', '.join(b.rc)} | {md_cell(b.message)} | "
            f"{', '.join(f.rc)} | {md_cell(f.message)} |"
        )
    out = Path(cfg.results_dir) / "inputs.md"
    atomic_write_text(out, "\n".join(lines) + "\n")
    print(f"wrote {out}")
    return {"probes": len(probes), "table": str(out)}
