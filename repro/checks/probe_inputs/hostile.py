"""The inputs of the hostile-input review, by family, and the files they need.

:class:`Probe` is one input: the commands that exercise it (``R/`` is a scratch folder, filled by
:func:`setup` with the bad files below) and what to do around them. The families: topology files
(malformed, aliases, custom tags, injected names, sizes, bad numbers), the tc scripts and the
emulation command, corrupt or wrong-schema result stores and reports, paths (cases, studies,
folders that are files, read-only or full), numbers (seeds, rates, scales, tolerances, limits,
options another system does not read) and signals (a training or emulated run stopped by SIGTERM,
SIGHUP or SIGKILL, and what it left: processes, ports, folders, namespaces). The second pass
(:data:`SECOND_PASS`, each name prefixed by its family): concurrent writers into one folder, row
keys that must change with an input, the external mode's inputs and output sets, a folder with
``runs.csv`` but no ``runs.parquet``, search budgets, paths and the environment (Hydra's run
folder, wandb's folders and server, stdout's encoding, the log level) and tables edited by hand.

:mod:`repro.checks.probe_inputs.run` runs each probe on two commits and writes the table;
:mod:`repro.checks.probe_inputs.probe_runs` prepares what a probe needs around its commands.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Probe", "HOSTILE", "SECOND_PASS", "setup", "TOPOLOGY", "MARKER", "EMULATE"]

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
MARKER = "INJECTED"  # a file an injected command would create in the scratch folder


@dataclass
class Probe:
    name: str
    steps: list[list[str]]  # each a command line (run.py etc.), run in order
    timeout_s: float = 120
    not_before: str = ""  # reason not to run it on the old code
    old_steps: list[list[str]] | None = None  # the steps' spelling on the old code
    concurrent: bool = False  # run the steps at the same time
    edit: str = ""  # an edit before the last step: hardware | topology (| topology_back)
    note: str = ""
    inspect: str = ""  # a results folder to describe afterwards (rows stored, REPORT.md)
    signal: str = ""  # SIGTERM | SIGHUP | SIGKILL, sent to the (one) step once its ranks run
    ranks: int = 0  # how many ranks (system.runtime.worker) to wait for before the signal
    netns: bool = False  # builds network namespaces: root, and the namespace lock
    mount: str = ""  # ro (R/ro: a read-only study) | full (R/full: a full 1 MiB tmpfs)
    cwd: str = ""  # run in this folder of the scratch (default: the copy's root)
    env: dict | None = None  # extra environment (a None value: the variable unset)
    dry_run_scripts: str = ""  # a folder of generated tc scripts to dry-run (DTFM_TC=echo)
    special: str = ""  # fifo:R/PATH (a named pipe) or zero:R/PATH (a link to /dev/zero), made
    # just before the steps (a shared scratch holding them would block every walk of R)
    watch: str = ""  # a path (R/... or in the working folder) reported as created or absent


def _r(*args: str) -> list[str]:
    return [PY, "repro/run.py", *args]


def _emu(*args: str) -> list[str]:
    return [PY, "-m", "system.emulation", *args]


DBG = ["case=debug", "model=debug"]
TRAIN = ["mode=train", "system=ours", "model=debug", "batch=8"]
EMULATE = [
    "mode=emulate",
    "case=debug",
    "model=debug",
    "devices=[0,2,4,6]",
    "layouts=[scheduled]",
    "verify_pairs=1",
    "on_verify_fail=warn",
]
HOSTS = ["--hosts", "R/hosts.txt", "--out", "R/tc"]
SWEEP = _r(
    "-m",
    "sweep=smoke",
    *DBG,
    "system=ours",
    "batch=16,32",
    "results_dir=R/sw4",
    "workflow.ablation_csv=null",
)


def _topology(name: str, file: str, timeout_s: float = 120) -> Probe:
    return Probe(
        f"topology file: {name}",
        [_r(f"case=R/{file}", "model=debug", "results_dir=R/a")],
        timeout_s=timeout_s,
    )


def _table(name: str, mode: str, folder: str) -> Probe:
    return Probe(f"mode={mode} on {name}", [_r(f"mode={mode}", f"results_dir={folder}")])


# ---- the files ---------------------------------------------------------------------------------
def _topology_text(name="t", devices=None, pairs=None, **extra) -> str:
    doc = {
        "name": name,
        "devices": devices if devices is not None else ["A", "A", "B", "B"],
        "pairs": pairs
        if pairs is not None
        else [
            {"region_a": "A", "region_b": "B", "delay_ms": 10, "bandwidth_gbps": 1},
            {"region_a": "A", "region_b": "A", "delay_ms": 0.1, "bandwidth_gbps": 10},
            {"region_a": "B", "region_b": "B", "delay_ms": 0.1, "bandwidth_gbps": 10},
        ],
        **extra,
    }
    return json.dumps(doc)


def _pair(**changes) -> list[dict]:
    return [
        {"region_a": "A", "region_b": "B", "delay_ms": 10, "bandwidth_gbps": 1, **changes},
        {"region_a": "A", "region_b": "A", "delay_ms": 0.1, "bandwidth_gbps": 10},
        {"region_a": "B", "region_b": "B", "delay_ms": 0.1, "bandwidth_gbps": 10},
    ]


INJECTIONS = {
    "newline": "innocent\ntouch {m} #",
    "semicolon": "x; touch {m}",
    "command substitution": "x$(touch {m})",
    "backticks": "x`touch {m}`",
    "double quote": 'x"; touch {m}; "',
    "single quote": "x'; touch {m}; '",
}


def setup(scratch: Path) -> None:
    """Write every file the probes read into ``scratch`` (the probes' ``R/``)."""
    scratch.mkdir(exist_ok=True)
    (scratch / "file").write_text("not a folder\n")
    (scratch / "adir").mkdir(exist_ok=True)
    (scratch / "extra.yaml").write_text(TOPOLOGY % ("1", ", note: x"))
    (scratch / "bool.yaml").write_text(TOPOLOGY % ("true", ""))
    (scratch / "extra.csv").write_text("region_a,region_b,delay_ms,bandwidth_gbps\nA,B,10,1,9\n")
    (scratch / "pairs.yaml").write_text(
        "pairs:\n  - {region_a: A, region_b: B, delay_ms: 10, bandwidth_gbps: true}\n"
    )
    marker = scratch / MARKER
    files = {
        "edit.yaml": TOPOLOGY % ("1", ""),
        "malformed.yaml": "name: x\ndevices: [A, B\npairs: []\n",
        "pytag.yaml": f"devices: !!python/object/apply:os.system ['touch {marker}']\npairs: []\n",
        "custom_tag.yaml": "devices: !custom [A, B]\npairs: []\n",
        "alias.yaml": "devices: &d [A, A, B, B]\nname: *d\npairs: []\n",
        "bomb.yaml": "name:\n  - &a0 [x, x, x, x, x, x, x, x, x]\n"
        + "".join(f"  - &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]\n" for i in range(1, 10))
        + "devices: [A, A, B, B]\npairs: []\n",
        "deep.yaml": "devices: " + "[" * 5000 + "]" * 5000 + "\n",
        "notutf8.yaml": None,
        "empty.yaml": "",
        "list.yaml": "- A\n- B\n",
        "devices_str.yaml": _topology_text(devices="A"),
        "devices_empty.yaml": _topology_text(devices=[]),
        "no_pairs.yaml": json.dumps({"devices": ["A", "B"]}),
        "bw0.yaml": _topology_text(pairs=_pair(bandwidth_gbps=0)),
        "bw_neg.yaml": _topology_text(pairs=_pair(bandwidth_gbps=-1)),
        "bw_nan.yaml": "devices: [A, A, B, B]\npairs:\n"
        "  - {region_a: A, region_b: B, delay_ms: 10, bandwidth_gbps: .nan}\n",
        "bw_inf.yaml": "devices: [A, A, B, B]\npairs:\n"
        "  - {region_a: A, region_b: B, delay_ms: 10, bandwidth_gbps: .inf}\n",
        "delay_neg.yaml": _topology_text(pairs=_pair(delay_ms=-5)),
        "delay_text.yaml": _topology_text(pairs=_pair(delay_ms="fast")),
        "unknown_key.yaml": _topology_text(color="red"),
        "twice.yaml": _topology_text(
            pairs=[
                *_pair(),
                {"region_a": "B", "region_b": "A", "delay_ms": 99, "bandwidth_gbps": 1},
            ]
        ),
        "no_link.yaml": _topology_text(devices=["A", "B", "C"]),
        "bad.json": '{"devices": ["A", "B"],',
        "nan.json": '{"devices": ["A", "A"], "pairs": [], "intra_delay_ms": NaN, '
        '"intra_bandwidth_gbps": 1}',
        "huge.yaml": None,
        "big10k.yaml": _topology_text(devices=["A", "B"] * 5000),
        "region_newline.yaml": _topology_text(devices=[f"A\ntouch {marker}", "B"]),
    }
    for name, payload in INJECTIONS.items():
        files[f"inject_{name.replace(' ', '_')}.yaml"] = _topology_text(
            name=payload.format(m=marker)
        )
    for name, text in files.items():
        if text is not None:
            (scratch / name).write_text(text)
    (scratch / "notutf8.yaml").write_bytes(b"devices: [\xff\xfe]\npairs: []\n")
    (scratch / "huge.yaml").write_bytes(b"# padding\n" * (1024 * 1024))  # 10 MiB of comments
    (scratch / "dir.yaml").mkdir(exist_ok=True)
    (scratch / "hosts.txt").write_text("198.18.1.1\n198.18.1.2\n198.18.1.3\n198.18.1.4\n")
    (scratch / "hosts_bad.txt").write_text(f"198.18.1.1\n198.18.1.2; touch {marker}\n")
    (scratch / "assignment_bad.json").write_text('{"stages": [[0, 1], [2]]')
    _stores(scratch)
    _sharing(scratch)
    _external(scratch)
    _edited(scratch)
    (scratch / "home").mkdir(exist_ok=True)  # a HOME for the wandb probes


def _sharing(scratch: Path) -> None:
    """Link-sharing experiment folders: registrations a user edited, measured rows without
    times (the experiment's values are its defaults otherwise)."""
    base = {"case": "debug", "devices": [0, 1, 2, 3], "bandwidth_scale": 0.05}
    registrations = {
        "sharing_repeats": {"experiment": {**base, "repeats": 10**9}},
        "sharing_cap": {"experiment": {**base, "egress_cap_gbps": 1e-9}},
        "sharing_bad": None,
        "sharing_rows": {
            "experiment": base,
            "tolerance": 0.2,
            "predictions": [
                {"exchange": "ring", "capped": False, "model": "pair", "predicted_s": 1.0}
            ],
        },
    }
    for folder, reg in registrations.items():
        (scratch / folder).mkdir(exist_ok=True)
        text = '{"experiment": {' if reg is None else json.dumps(reg)
        (scratch / folder / "predictions.json").write_text(text)
    (scratch / "sharing_rows" / "measured.csv").write_text("exchange,capped\nring,False\n")


def _stores(scratch: Path) -> None:
    """Results folders: empty, a corrupt or wrong-schema table or part, a runs.csv alone."""
    import pandas as pd

    for d in ("empty", "corrupt", "schema", "corrupt_part", "schema_part", "csv_only", "truncated"):
        (scratch / d).mkdir(exist_ok=True)
    (scratch / "corrupt" / "runs.parquet").write_bytes(b"PAR1 this is not parquet")
    pd.DataFrame({"setting": ["a"], "iter_time_s": [1.0]}).to_parquet(
        scratch / "schema" / "runs.parquet"
    )
    for d, payload in (("corrupt_part", None), ("schema_part", "schema")):
        (scratch / d / "parts").mkdir(exist_ok=True)
        part = scratch / d / "parts" / "0001-host-1-abcd.parquet"
        if payload is None:
            part.write_bytes(b"garbage")
        else:
            pd.DataFrame({"x": [1]}).to_parquet(part)
    (scratch / "csv_only" / "runs.csv").write_text("run_id,case\nabc,5\n")
    full = pd.DataFrame({"run_id": [f"r{i}" for i in range(200)], "x": range(200)})
    full.to_parquet(scratch / "truncated" / "runs.parquet")
    data = (scratch / "truncated" / "runs.parquet").read_bytes()
    (scratch / "truncated" / "runs.parquet").write_bytes(data[: len(data) // 2])


# Sailor's data files and one measured plan (the external mode's tests' hand-made set)
SAILOR_FIXTURE = Path(__file__).resolve().parents[3] / "tests" / "external" / "fixtures" / "tiny"
PLAN = "plans/clariden/OPT-350/N2/plan_config_N2_D1.json"


def _external(scratch: Path) -> None:
    """Folders ``R/ext_<name>`` of Sailor's data and plans: the hand-made set as it is
    (``ext_ok``), then one file changed per folder."""
    import shutil

    if not SAILOR_FIXTURE.is_dir():  # pragma: no cover - a checkout without its tests
        return
    ok = scratch / "ext_ok"
    if not ok.exists():
        shutil.copytree(SAILOR_FIXTURE, ok)

    def variant(name: str, edit) -> None:
        d = scratch / f"ext_{name}"
        if d.exists():
            return
        shutil.copytree(ok, d)
        edit(d)

    def json_edit(rel: str, change):
        def edit(d: Path) -> None:
            doc = json.loads((d / rel).read_text())
            (d / rel).write_text(json.dumps(change(doc)))

        return edit

    def plan(**changes):
        return json_edit(PLAN, lambda doc: {**doc, **changes})

    def gpus(n: int):
        def change(doc):
            doc["pipeline_list"][0]["tmp_per_stage"][0][0][0][0][1] = n
            return doc

        return json_edit(PLAN, change)

    def renamed(doc):
        return {**doc, "model": "OPT-351"}

    def one_short(doc):
        for per_gpu in doc["OPT-350"].values():
            per_gpu.pop(max(per_gpu, key=int))
        return doc

    def zero_times(doc):
        for by_tp in doc["OPT-350"]["GH-96"].values():
            for layers in by_tp.values():
                for k in layers:
                    layers[k] = [0.0, 0.0, 0.0]
        return doc

    def fits(coefficients):
        def change(doc):
            doc["us-central1-a"]["GH-96"]["1"]["us-central1-a"]["GH-96"]["1"][0] = coefficients
            return doc

        return change

    def moved(name: str):
        def edit(d: Path) -> None:
            target = d / PLAN.replace("/N2/", f"/{name}/")
            target.parent.mkdir(parents=True)
            (d / PLAN).rename(target)

        return edit

    variant(
        "unmeasured", json_edit(PLAN, lambda doc: {k: v for k, v in doc.items() if k != "real"})
    )
    variant("real_huge", plan(real=1e308))
    variant("gpus_40000", gpus(40000))
    variant("model_renamed", json_edit("training_config_opt_350.json", renamed))
    variant("llm_short", json_edit("llm_info.json", one_short))
    variant("profile_zero", json_edit("profiles_tmp.json", zero_times))
    variant("fit_negative", json_edit("multizone_bandwidths_het.json", fits([0.0, -0.1, 0.5])))
    variant("intra_empty", lambda d: (d / "intra_node_bandwidths.json").write_text("{}"))
    variant("name_pipe", moved("N2|x"))
    variant("name_newline", moved("N2\nx"))
    variant("fifo", lambda d: None)  # the plan becomes a named pipe (Probe.special)
    variant("zero", lambda d: None)  # the plan becomes a link to /dev/zero (Probe.special)
    bad_fits = scratch / "sailor_bad_fits"
    bad_fits.mkdir(exist_ok=True)
    (bad_fits / "multizone_bandwidths_het.json").write_text('{"us-central1-a": [')
    (bad_fits / "intra_node_bandwidths.json").write_text(
        (ok / "intra_node_bandwidths.json").read_text()
    )


def _edited(scratch: Path) -> None:
    """Studies of two simulated rows (ours, megatron) edited by hand: a negative or infinite
    time, a system no mode writes; and row files of the old store that are a list or broken."""
    import logging

    import pandas as pd

    from system.results import make_row, write_rows

    logging.getLogger("system.results").setLevel(logging.WARNING)  # no line per folder made
    key = {"mode": "simulate", "case": "5", "num_layers": 24, "global_batch_size": 1024}
    edits = {
        "edited_negative": {"iter_time_s": -5.0},
        "edited_inf": {"iter_time_s": float("inf")},
        "edited_system": {"system": "ours_v2"},
        "legacy_list": {},
        "legacy_broken": {},
    }
    for name, change in edits.items():
        d = scratch / name
        if d.exists():
            continue
        rows = [
            make_row({**key, "system": s}, iter_time_s=t, pflops=1.0 / t)
            for s, t in (("ours", 10.0), ("megatron", 20.0))
        ]
        write_rows(d, rows, collect_after=True)
        table = pd.read_parquet(d / "runs.parquet")
        for column, value in change.items():
            table.loc[table.index[-1], column] = value
        table.to_parquet(d / "runs.parquet")
        if name.startswith("legacy"):
            (d / "rows").mkdir()
            text = "[1, 2]" if name == "legacy_list" else '{"run_id": '
            (d / "rows" / "old.json").write_text(text)


# ---- the probes --------------------------------------------------------------------------------
TOPOLOGY_FILES = [
    Probe(
        "topology file edited (bandwidth 1 -> 0.01 Gbit/s) and simulated again",
        [_r("case=R/edit.yaml", "model=debug", "results_dir=R/e")] * 2,
        edit="topology",
        note="message: rows written by the second run",
    ),
    Probe(
        "topology file edited, then edited back, simulated a third time",
        [_r("case=R/edit.yaml", "model=debug", "results_dir=R/e")] * 3,
        edit="topology_back",
        note="message: rows written by the third run",
    ),
    *[
        _topology(label, file, timeout_s)
        for label, file, timeout_s in (
            ("malformed YAML", "malformed.yaml", 120),
            ("a Python tag (!!python/object/apply)", "pytag.yaml", 120),
            ("a custom tag (!custom)", "custom_tag.yaml", 120),
            ("a YAML alias", "alias.yaml", 120),
            ("nested aliases under name: (9 levels of 9)", "bomb.yaml", 60),
            ("5000 nested brackets", "deep.yaml", 120),
            ("not UTF-8", "notutf8.yaml", 120),
            ("empty", "empty.yaml", 120),
            ("a list, not a mapping", "list.yaml", 120),
            ("devices a string", "devices_str.yaml", 120),
            ("devices empty", "devices_empty.yaml", 120),
            ("no pairs", "no_pairs.yaml", 120),
            ("bandwidth_gbps: 0", "bw0.yaml", 120),
            ("bandwidth_gbps: -1", "bw_neg.yaml", 120),
            ("bandwidth_gbps: .nan", "bw_nan.yaml", 120),
            ("bandwidth_gbps: .inf", "bw_inf.yaml", 120),
            ("delay_ms: -5", "delay_neg.yaml", 120),
            ("delay_ms: fast", "delay_text.yaml", 120),
            ("an unknown key", "unknown_key.yaml", 120),
            ("a pair given twice with other values", "twice.yaml", 120),
            ("a region without link values", "no_link.yaml", 120),
            ("malformed JSON", "bad.json", 120),
            ("JSON with NaN", "nan.json", 120),
            ("10 MiB", "huge.yaml", 120),
            ("10,000 devices", "big10k.yaml", 120),
            ("a folder named .yaml", "dir.yaml", 120),
            ("missing", "missing.yaml", 120),
            ("a region with a newline and a command", "region_newline.yaml", 120),
        )
    ],
    *[
        Probe(
            f"topology name with a {what} (simulate)",
            [_r(f"case=R/inject_{what.replace(' ', '_')}.yaml", "model=debug", "results_dir=R/a")],
            note="marker",
        )
        for what in INJECTIONS
    ],
]

TC_SCRIPTS = [
    *[
        Probe(
            f"tc-script: topology name with a {what}, then a dry run of the scripts",
            [_emu("tc-script", "--case", f"R/inject_{what.replace(' ', '_')}.yaml", *HOSTS)],
            dry_run_scripts="R/tc",
            note="marker",
        )
        for what in INJECTIONS
    ],
    Probe(
        "tc-script --dev 'eth0; touch R/INJECTED'",
        [
            _emu(
                "tc-script",
                "--case",
                "5",
                "--devices",
                "0,8,24,40",
                *HOSTS,
                "--dev",
                "eth0; touch R/INJECTED",
            )
        ],
        dry_run_scripts="R/tc",
        note="marker",
    ),
    Probe(
        "tc-script with a host list holding a command",
        [
            _emu(
                "tc-script",
                "--case",
                "5",
                "--devices",
                "0,8",
                "--hosts",
                "R/hosts_bad.txt",
                "--out",
                "R/tc",
            )
        ],
        dry_run_scripts="R/tc",
        note="marker",
    ),
    *[
        Probe(
            f"tc-script {flag} {value}",
            [_emu("tc-script", "--case", "5", "--devices", "0,8,24,40", *HOSTS, flag, value)],
        )
        for flag, value in (
            ("--delay-scale", "inf"),
            ("--delay-scale", "nan"),
            ("--delay-scale", "-1"),
            ("--delay-scale", "1e6"),
            ("--bandwidth-scale", "inf"),
            ("--bandwidth-scale", "1e-12"),
            ("--bandwidth-scale", "1e300"),
            ("--bandwidth-scale", "0"),
            ("--mtu", "100000"),
            ("--mtu", "100"),
            ("--mtu", "1500.5"),
            ("--devices", "0,x"),
            ("--devices", "0,99"),
        )
    ],
    Probe("emulation check: malformed YAML", [_emu("check", "--case", "R/malformed.yaml")]),
    Probe(
        "emulation check: a Python tag", [_emu("check", "--case", "R/pytag.yaml")], note="marker"
    ),
    Probe("emulation check --pairs 0", [_emu("check", "--case", "debug", "--pairs", "0")]),
    Probe("emulation cleanup --tag 'x;y'", [_emu("cleanup", "--dry-run", "--tag", "x;y")]),
    *[
        Probe(
            f"link-sharing experiment: {what}",
            [_r("mode=link_sharing", f"step={step}", f"results_dir=R/{folder}")],
            netns=step == "measure",
            old_steps=[_emu("sharing", step, f"R/{folder}")],
        )
        for what, step, folder in (
            ("measure a registration of 10^9 repeats", "measure", "sharing_repeats"),
            ("measure a registration with an egress cap of 1 bit/s", "measure", "sharing_cap"),
            ("verdict on a registration that is not JSON", "verdict", "sharing_bad"),
            ("verdict on measured rows without times", "verdict", "sharing_rows"),
        )
    ],
]

STORES = [
    _table("a missing folder", "report", "R/nope"),
    _table("an empty folder", "report", "R/empty"),
    _table("a corrupt runs.parquet", "report", "R/corrupt"),
    _table("a runs.parquet of another schema", "report", "R/schema"),
    _table("a corrupt part", "report", "R/corrupt_part"),
    _table("a part of another schema", "report", "R/schema_part"),
    _table("a runs.csv without runs.parquet", "report", "R/csv_only"),
    _table("a truncated runs.parquet", "report", "R/truncated"),
    _table("a file", "report", "R/file"),
    _table("a missing folder", "collect", "R/nope"),
    _table("an empty folder", "collect", "R/empty"),
    _table("a corrupt runs.parquet", "collect", "R/corrupt"),
    _table("a runs.parquet of another schema", "collect", "R/schema"),
    _table("a corrupt part", "collect", "R/corrupt_part"),
    _table("a truncated runs.parquet", "collect", "R/truncated"),
    _table("an empty folder", "emulation_report", "R/empty"),
    _table("an empty folder", "compare_baselines", "R/empty"),
    Probe(
        "simulate into a folder with a corrupt runs.parquet", [_r(*DBG, "results_dir=R/corrupt")]
    ),
    Probe(
        "simulate into a folder whose runs.parquet has another schema",
        [_r(*DBG, "results_dir=R/schema")],
    ),
    Probe(
        "mode=report on a read-only study",
        [_r("mode=report", "results_dir=R/ro/study")],
        mount="ro",
    ),
    Probe(
        "mode=collect on a read-only study",
        [_r("mode=collect", "results_dir=R/ro/study")],
        mount="ro",
    ),
    Probe("simulate into a full disk", [_r(*DBG, "results_dir=R/full/study")], mount="full"),
    Probe(
        "simulate from a working folder that is not writable",
        [_r(*DBG, "results_dir=R/a")],
        mount="ro",
        cwd="R/ro",
    ),
]

PATHS = [
    Probe(
        "mode=schedule case=<absolute path of a topology file>",
        [_r("mode=schedule", "case=R/edit.yaml", "scheduler.trials=2", "results_dir=R/s")],
        note="files",
        inspect="R/s",
    ),
    Probe(
        "mode=schedule case=R/adir/../<file> (a path that climbs)",
        [_r("mode=schedule", "case=R/adir/../edit.yaml", "scheduler.trials=2", "results_dir=R/s")],
        note="files",
    ),
    Probe("study=.. (default results folder)", [_r(*DBG, "study=..")], note="files"),
    Probe("study=.", [_r(*DBG, "study=.")], note="files"),
    Probe("study=a/b", [_r(*DBG, "study=a/b")]),
    Probe("study='a b'", [_r(*DBG, "study=a b")]),
    Probe("train metrics_out=<a folder>", [_r(*TRAIN, "metrics_out=R/adir")]),
    Probe("train trace=<a folder>", [_r(*TRAIN, "trace=R/adir")]),
    Probe("train log_dir=<a file>", [_r(*TRAIN, "log_dir=R/file")]),
    Probe("train runtime.assignment=<missing>", [_r(*TRAIN, "runtime.assignment=R/none.json")]),
    Probe(
        "train runtime.assignment=<malformed JSON>",
        [_r(*TRAIN, "runtime.assignment=R/assignment_bad.json")],
    ),
    Probe("schedule out=''", [_r("mode=schedule", "out=")]),
    Probe("schedule out=<a folder>", [_r("mode=schedule", "out=R/adir/", "scheduler.trials=2")]),
    Probe(
        "bench_runtime table=../x.csv",
        [_r("mode=bench_runtime", "table=../x.csv", "results_dir=R/b")],
    ),
    Probe(
        "simulate while .git/index.lock exists (a commit in progress)",
        [_r(*DBG, "results_dir=R/g")],
        note="git",
    ),
]

NUMBERS = [
    Probe("seed=2**63", [_r(*DBG, "seed=9223372036854775808", "results_dir=R/a")]),
    Probe("seed=-1", [_r(*DBG, "seed=-1", "results_dir=R/a")]),
    Probe("workflow.tolerance=nan", [_r(*DBG, "workflow.tolerance=nan", "results_dir=R/a")]),
    Probe("workflow.tolerance=inf", [_r(*DBG, "workflow.tolerance=inf", "results_dir=R/a")]),
    Probe("workflow.tolerance=1.5", [_r(*DBG, "workflow.tolerance=1.5", "results_dir=R/a")]),
    Probe(
        "train runtime.lr=1e30",
        [_r(*TRAIN, "runtime.lr=1e30", "iters=4", "results_dir=R/t")],
        timeout_s=180,
    ),
    Probe("train runtime.lr=nan", [_r(*TRAIN, "runtime.lr=nan", "results_dir=R/t")]),
    Probe("train runtime.lr=0", [_r(*TRAIN, "runtime.lr=0", "results_dir=R/t")]),
    Probe(
        "replan case=debug (defaults)",
        [_r("mode=replan", "case=debug", "results_dir=R/p")],
        timeout_s=180,
    ),
    Probe(
        "replan interval_s=inf", [_r("mode=replan", "case=5", "interval_s=inf", "results_dir=R/p")]
    ),
    Probe(
        "replan step_devices=8 (the trace reaches 56 devices)",
        [_r("mode=replan", "case=5", "step_devices=8", "events=1", "results_dir=R/p")],
        timeout_s=180,
    ),
    Probe(
        "replan time_limit_s=1e9",
        [_r("mode=replan", "case=5", "time_limit_s=1e9", "results_dir=R/p")],
        timeout_s=180,
    ),
    Probe(
        "emulate bandwidth_scale=1e-12",
        [_r(*EMULATE, "bandwidth_scale=1e-12", "results_dir=R/m")],
        netns=True,
    ),
    Probe(
        "emulate bandwidth_scale=1e300",
        [_r(*EMULATE, "bandwidth_scale=1e300", "results_dir=R/m")],
        netns=True,
        timeout_s=300,
    ),
    Probe(
        "emulate delay_scale=1e6", [_r(*EMULATE, "delay_scale=1e6", "results_dir=R/m")], netns=True
    ),
    *[
        Probe(f"quality {arg}", [_r("mode=quality", arg, "results_dir=R/q")], netns=True)
        for arg in (
            "bandwidth_scale=1e300",
            "bandwidth_scale=1e-12",
            "delay_scale=1e6",
            "layers=100000",
        )
    ],
    Probe(
        "emulate delay_scale=nan", [_r(*EMULATE, "delay_scale=nan", "results_dir=R/m")], netns=True
    ),
    Probe("simulate compute_efficiency=0", [_r(*DBG, "compute_efficiency=0", "results_dir=R/a")]),
    Probe(
        "simulate compute_efficiency=nan", [_r(*DBG, "compute_efficiency=nan", "results_dir=R/a")]
    ),
    Probe(
        "simulate repeats=1000000", [_r(*DBG, "repeats=1000000", "results_dir=R/a")], timeout_s=60
    ),
    Probe(
        "train layers=100000",
        [_r(*TRAIN, "layers=100000", "results_dir=R/t")],
        timeout_s=60,
        not_before="builds 100000 layers per rank: hours and all the memory",
    ),
    Probe("train iters=0", [_r(*TRAIN, "iters=0", "results_dir=R/t")]),
    Probe(
        "train without batch (the default batch)",
        [_r("mode=train", "system=ours", "model=debug", "iters=1", "results_dir=R/t")],
        timeout_s=180,
    ),
    Probe("train timeout_s=nan", [_r(*TRAIN, "timeout_s=nan", "results_dir=R/t")]),
    Probe("simulate batch=0", [_r(*DBG, "batch=0", "results_dir=R/a")]),
    Probe("simulate micro_batch_size=0", [_r(*DBG, "micro_batch_size=0", "results_dir=R/a")]),
    Probe("simulate layers=-1", [_r(*DBG, "layers=-1", "results_dir=R/a")]),
    Probe("simulate case=5 pp=1000", [_r("case=5", "pp=1000", "results_dir=R/a")]),
    Probe("simulate system=ours tp=2", [_r(*DBG, "system=ours", "tp=2", "results_dir=R/a")]),
    Probe("train system=ours tp=2", [_r(*TRAIN, "tp=2", "results_dir=R/t")], timeout_s=180),
    Probe("train system=ours zero=1", [_r(*TRAIN, "zero=1", "results_dir=R/t")], timeout_s=180),
    Probe(
        "train system=megatron zero=1",
        [
            _r(
                "mode=train",
                "system=megatron",
                "model=debug",
                "zero=1",
                "iters=1",
                "results_dir=R/t",
            )
        ],
        timeout_s=300,
    ),
    Probe(
        "train system=megatron runtime.dp_mode=allreduce",
        [
            _r(
                "mode=train",
                "system=megatron",
                "model=debug",
                "runtime.dp_mode=allreduce",
                "iters=1",
                "results_dir=R/t",
            )
        ],
        timeout_s=300,
    ),
    Probe(
        "schedule scheduler.time_limit_s=inf", [_r("mode=schedule", "scheduler.time_limit_s=inf")]
    ),
    Probe("schedule scheduler.trials=0", [_r("mode=schedule", "scheduler.trials=0")]),
    Probe("schedule scheduler.population=1", [_r("mode=schedule", "scheduler.population=1")]),
    Probe("limits.max_local_ranks=0", [_r(*DBG, "limits.max_local_ranks=0", "results_dir=R/a")]),
    Probe(
        "two sweeps started in the same second (default Hydra folders)",
        [SWEEP] * 2,
        concurrent=True,
        timeout_s=300,
        note="message: jobs ran/skipped of each; hydra folders",
    ),
    Probe(
        "logger=wandb with WANDB_MODE=offline on an ordinary simulate run",
        [_r(*DBG, "system=ours", "logger=wandb", "results_dir=R/w")],
        env={"WANDB_MODE": "offline", "WANDB_SILENT": "true"},
        timeout_s=180,
    ),
    Probe(
        "WANDB_MODE=bogus with logger=wandb",
        [_r(*DBG, "system=ours", "logger=wandb", "results_dir=R/w")],
        env={"WANDB_MODE": "bogus"},
    ),
]

SIGNALS = [
    *[
        Probe(
            f"{sig} to a mode=train run (pp=2 dp=2, 20000 iterations) once its ranks run",
            [_r(*TRAIN, "pp=2", "dp=2", "iters=20000", "results_dir=R/t")],
            signal=sig,
            ranks=4,
            timeout_s=240,
        )
        for sig in ("SIGTERM", "SIGHUP", "SIGKILL")
    ],
    *[
        Probe(
            f"{sig} to a mode=emulate run (4 devices, 20000 iterations) once its ranks run",
            [_r(*EMULATE, "iters=20000", "results_dir=R/m")],
            signal=sig,
            ranks=4,
            netns=True,
            timeout_s=400,
        )
        for sig in ("SIGTERM", "SIGKILL")
    ],
]


# ---- the second pass: concurrent writers, complete keys, the external mode, budgets, ... -------
def _ext(plans: str, out: str = "R/x") -> list[str]:
    return _r("mode=external", f"plans=R/{plans}/plans", f"results_dir={out}")


OURS = [*DBG, "system=ours"]
WORTH = ["mode=scheduler_worth", "link_sharing=[tc_class]", "spot_seeds=[0]", "random_layouts=1"]

CONCURRENT = [  # three rounds: a reader meeting a compaction is a race, not a certainty
    Probe(
        f"concurrent: eight simulate runs into one folder at once (seeds 0-7), round {n}",
        [_r(*OURS, f"seed={i}", "results_dir=R/cw") for i in range(8)],
        concurrent=True,
        timeout_s=400,
        inspect="R/cw",
    )
    for n in (1, 2, 3)
]

KEYS = [
    Probe(
        f"key: simulate, then again with {arg} (same folder)",
        [_r(*OURS, "results_dir=R/k"), _r(*OURS, arg, "results_dir=R/k")],
        note="message: rows written by the second run",
    )
    for arg in (
        "link_sharing=pair",
        "compute_efficiency=0.25",
        "baseline_transport=nccl_rendezvous",
    )
] + [
    Probe(
        "key: mode=quality, then again on other links (devices)",
        [
            _r(*quality, "results_dir=R/qk")
            for quality in (
                [
                    "mode=quality",
                    "systems=[ours]",
                    "iters=16",
                    "snapshot_every=16",
                    "target_iters=8",
                    f"devices=[{devices}]",
                ]
                for devices in ("0,1,2,3", "0,8,16,24")
            )
        ],
        netns=True,
        timeout_s=400,
        inspect="R/qk",
    ),
]

EXTERNAL = [
    Probe(
        "external: a second run (no measured plan) into the folder of a first",
        [_ext("ext_ok", "R/xo"), _ext("ext_unmeasured", "R/xo")],
        inspect="R/xo",
        note="listing",
    ),
    Probe(
        "external: a failing run (real: 1e308) into the folder of a good one",
        [_ext("ext_ok", "R/xf"), _ext("ext_real_huge", "R/xf")],
        inspect="R/xf",
        note="listing",
    ),
    Probe(
        "external: one plan of a set, our MAPE beside Sailor's",
        [_ext("ext_ok", "R/xm")],
        inspect="R/xm",
        note="mape",
    ),
    Probe(
        "external: a plan name with '|' (the report's tables)",
        [_ext("ext_name_pipe", "R/xp")],
        inspect="R/xp",
        note="tables",
    ),
    Probe(
        "external: a plan name with a newline (the report's tables)",
        [_ext("ext_name_newline", "R/xn")],
        inspect="R/xn",
        note="tables",
    ),
    *[
        Probe(f"external: {what}", [_ext(folder)], timeout_s=timeout_s, not_before=skip)
        for what, folder, timeout_s, skip in (
            ("the training config names another model", "ext_model_renamed", 120, ""),
            ("llm_info.json one layer short", "ext_llm_short", 120, ""),
            ("a plan with real: 1e308", "ext_real_huge", 120, ""),
            (
                "a node of 40,000 GPUs",
                "ext_gpus_40000",
                120,
                "allocates until memory runs out (MemoryError) on this shared machine",
            ),
            ("profile times of 0", "ext_profile_zero", 120, ""),
            ("a bandwidth fit negative above 32 MB", "ext_fit_negative", 120, ""),
            ("an empty intra_node_bandwidths.json", "ext_intra_empty", 120, ""),
        )
    ],
    Probe(
        "external: a named pipe named like a plan",
        [_ext("ext_fifo")],
        special=f"fifo:R/ext_fifo/{PLAN}",
        timeout_s=60,
    ),
    Probe(
        "external: a plan linked to /dev/zero",
        [_ext("ext_zero")],
        special=f"zero:R/ext_zero/{PLAN}",
        timeout_s=60,
        not_before="reads /dev/zero until memory runs out (MemoryError) on this shared machine",
    ),
]

CSV_ONLY = [
    Probe(
        "runs.csv only: simulate twice (seeds 0, 1) into a folder with runs.csv but no "
        "runs.parquet",
        [_r(*OURS, f"seed={seed}", "results_dir=R/csv_only") for seed in (0, 1)],
        inspect="R/csv_only",
        note="listing",
    ),
    Probe(
        "runs.csv only: simulate, then mode=collect, in a folder with runs.csv but no runs.parquet",
        [_r(*OURS, "results_dir=R/csv_only"), _r("mode=collect", "results_dir=R/csv_only")],
        inspect="R/csv_only",
        note="listing",
    ),
]

BUDGETS = [
    Probe(
        "budget: scheduler_worth random_layouts=100000000",
        [_r("mode=scheduler_worth", "random_layouts=100000000", "results_dir=R/b")],
        timeout_s=60,
        not_before="holds 10^8 layouts: dies of memory after minutes on this shared machine",
    ),
    Probe(
        "budget: scheduler_worth trials=10^9 patience_trials=10^9 time_limit_s=1e300",
        [
            _r(
                *WORTH,
                "trials=1000000000",
                "patience_trials=1000000000",
                "time_limit_s=1e300",
                "results_dir=R/b",
            )
        ],
        timeout_s=60,
    ),
    Probe(
        "budget: simulate scheduler.trials=10^9 scheduler.time_limit_s=1e300",
        [
            _r(
                *OURS,
                "scheduler.trials=1000000000",
                "scheduler.time_limit_s=1e300",
                "results_dir=R/b",
            )
        ],
        timeout_s=60,
    ),
    Probe(
        "budget: simulate scheduler.patience_trials=10^9 scheduler.trials=10^9",
        [
            _r(
                *OURS,
                "scheduler.patience_trials=1000000000",
                "scheduler.trials=1000000000",
                "results_dir=R/b",
            )
        ],
        timeout_s=60,
    ),
    Probe(
        "budget: scheduler_worth sailor_dir=<a malformed fit>",
        [
            _r(
                *WORTH,
                "trials=20",
                "patience_trials=20",
                "sailor_dir=R/sailor_bad_fits",
                "results_dir=R/b",
            )
        ],
        timeout_s=300,
    ),
]

WANDB_OFFLINE = {"WANDB_MODE": "offline", "WANDB_SILENT": "true", "HOME": "R/home"}
PATHS_ENV = [
    Probe(
        "path/env: study=../escaped (climbs out of outputs/)",
        [_r(*DBG, "study=../escaped")],
        watch="escaped",
    ),
    Probe(
        "path/env: a bad value (pp=0): Hydra's run folder",
        [_r(*DBG, "pp=0", "results_dir=R/a")],
        cwd="R/adir",
        watch="R/adir/outputs",
    ),
    Probe(
        "path/env: wandb.dir read-only (inside results_dir)",
        [_r(*OURS, "logger=wandb", "wandb.dir=R/ro", "results_dir=R/")],
        env=WANDB_OFFLINE,
        mount="ro",
        timeout_s=180,
    ),
    Probe(
        "path/env: wandb.dir outside results_dir",
        [_r(*OURS, "logger=wandb", "wandb.dir=R/adir", "results_dir=R/w")],
        env=WANDB_OFFLINE,
        timeout_s=180,
    ),
    Probe(
        "path/env: offline wandb with HOME=R/home (files under HOME)",
        [_r(*OURS, "logger=wandb", "results_dir=R/w")],
        env=WANDB_OFFLINE,
        timeout_s=180,
        watch="R/home/.local/share/wandb",
    ),
    Probe(
        "path/env: wandb.mode=online, the server unreachable (loopback port 9)",
        [_r(*OURS, "logger=wandb", "wandb.mode=online", "results_dir=R/w")],
        env={
            "WANDB_MODE": None,
            "WANDB_BASE_URL": "http://127.0.0.1:9",
            "WANDB_API_KEY": "x" * 40,
            "WANDB_INIT_TIMEOUT": "5",
            "HOME": "R/home",
        },
        timeout_s=300,
        inspect="R/w",
    ),
    Probe(
        "path/env: wandb.project=a/b",
        [_r(*OURS, "logger=wandb", "wandb.project=a/b", "results_dir=R/w")],
        env=WANDB_OFFLINE,
        timeout_s=180,
        inspect="R/w",
    ),
    Probe(
        "path/env: stdout in ascii (PYTHONIOENCODING=ascii), case 5 (its table prints '–')",
        [_r("case=5", "layers=24", "batch=1024", "system=ours", "results_dir=R/w")],
        env={"PYTHONIOENCODING": "ascii"},
        timeout_s=180,
        inspect="R/w",
    ),
    Probe(
        "path/env: DTFM_LOG_LEVEL=BOGUS",
        [_r(*DBG, "results_dir=R/a")],
        env={"DTFM_LOG_LEVEL": "BOGUS"},
    ),
]

HAND_EDITED = [
    _table(f"hand-edited: {what}", "report", f"R/{folder}")
    for what, folder in (
        ("a study with iter_time_s=-5", "edited_negative"),
        ("a study with iter_time_s=inf", "edited_inf"),
        ("a study with a row of system ours_v2", "edited_system"),
        ("a study whose old-store rows/old.json holds a list", "legacy_list"),
        ("a study whose old-store rows/old.json is broken JSON", "legacy_broken"),
    )
]

SECOND_PASS = [*CONCURRENT, *KEYS, *EXTERNAL, *CSV_ONLY, *BUDGETS, *PATHS_ENV, *HAND_EDITED]

HOSTILE = [*TOPOLOGY_FILES, *TC_SCRIPTS, *STORES, *PATHS, *NUMBERS, *SIGNALS, *SECOND_PASS]
