"""The results schema: what one row of :mod:`system.results` is.

**Schema.** :data:`COLUMNS` fixes one name and one type per concept (``final_loss``, not
``loss_last``; ``predicted_iter_time_s``, not ``sim_iter_time_s``; ``recompute``, not
``checkpointing``); :data:`RENAMED` maps the old spellings, so rows written by older code and the
parquet files of schema version 1 read back under the new names. Adding a column is one line in
:data:`COLUMNS`. A field not in the schema is still stored (a float when every value is a number,
else JSON text) and logged once, so a new field never breaks a run.

**Identity.** ``setting_id`` hashes the settings that identify a run (``key`` of
:func:`make_row`); ``run_id`` hashes them with ``model_version``, a fingerprint of the performance
model's source (:func:`model_version`). A rerun with unchanged code finds its ``run_id`` and adds
nothing; after a model change it adds rows that supersede the old ones in every report, while the
old ones stay in the file. A key whose ``case`` names a topology file also holds the file's content
digest (``case_sha256``, :func:`system.cases.case_digest`), in ``run_id`` and not in
``setting_id``: an edited file gets new rows that supersede the old content's.

**Complete keys.** ``key`` is listed by each mode, so it could miss a setting; ``run_id`` also
holds ``config_key``, a digest of the mode's complete typed config (every field not declared
result-neutral, and the content of every input file it names; :func:`repro.keys.config_key`). The
harness sets it around every mode's run (:func:`rows_of_config`), so a rerun that changes any
setting makes new run ids instead of being skipped as stored. Rows made outside a mode's run
(tests, benchmarks) have none.

``model_version`` hashes the parsed syntax tree with docstrings removed (:mod:`ast`), so comments,
docstrings and formatting do not make a new version and no one has to remember to bump a
constant. No pandas at module level (the functions that build tables load it).
"""

from __future__ import annotations

import ast
import contextlib
import datetime as _dt
import functools
import hashlib
import json
import logging
import math
import os
import subprocess
from collections.abc import Iterator, Mapping
from contextvars import ContextVar
from pathlib import Path

log = logging.getLogger("system.results")

__all__ = [
    "SCHEMA_VERSION",
    "COLUMNS",
    "CORE_COLUMNS",
    "RENAMED",
    "STATUSES",
    "MODEL_SOURCES",
    "BASELINE_SYSTEMS",
    "SIMULATED_SYSTEMS",
    "TRAINED_SYSTEMS",
    "model_version",
    "run_id_for",
    "file_digest",
    "git_state",
    "make_row",
    "make_rows",
    "rows_of_config",
    "current_config_key",
]

SCHEMA_VERSION = 2
ROOT = Path(__file__).resolve().parents[1]

# ---- schema ------------------------------------------------------------------------------------
# kind: "str" | "int" | "float" | "bool" | "json" (a list or dict, stored as JSON text)
_IDENTITY = {
    "run_id": "str",
    "setting_id": "str",
    "model_version": "str",
    # digest of the complete typed config of the mode's run that made the row (repro/keys.py)
    "config_key": "str",
    "study": "str",
    "timestamp_utc": "str",
    "git_sha": "str",
    "git_dirty": "bool",
    "schema_version": "int",
    "status": "str",
    "error": "str",
}
_SETTING = {
    "mode": "str",
    "system": "str",
    "case": "str",
    "case_variant": "str",
    # SHA-256 (16 hex) of the topology file a file case was read from (system.cases.case_digest)
    "case_sha256": "str",
    "model": "str",
    "num_devices": "int",
    "devices": "json",
    "num_layers": "int",
    "hidden_size": "int",
    "seq_length": "int",
    "vocab_size": "int",
    "global_batch_size": "int",
    "micro_batch_size": "int",
    "tp": "int",
    "pp": "int",
    "dp": "int",
    "zero": "int",
    "seed": "int",
    "repeat": "int",
    "iters": "int",
    "warmup_iters": "int",
    "device": "str",
    "layout": "json",
    "layout_seed": "json",
    "stages": "json",
    "dp_mode": "str",
    "recompute": "recompute",  # activation recomputation: full | selective | none
    "grid": "bool",
    "start": "str",
    "variant": "str",
    "config": "str",
    "is_best": "bool",
    "scheduler": "str",
    "scheduler_budget": "str",
    # the search's other settings, recorded when not at their default
    "scheduler_patience_trials": "int",
    "scheduler_greedy_seeds": "bool",
    "scheduler_objective": "str",
    "world_size": "int",
    # baselines' rank map (baselines/placement.py): launch | topology (ours: scheduled | random)
    "placement": "str",
    # what a simulated repeat is: "deterministic copy" or "random layout" (ours_random)
    "repeat_kind": "str",
    "rank_map": "json",
    "placement_how": "str",
    # sensitivity knobs of the performance model (link_sharing: in every simulated row)
    "compute_efficiency": "float",
    "link_sharing": "str",  # how concurrent flows share links (system/simulator/sharing.py)
    # the DP gradient collective that ran: ring | tree | two_level/… | tree+allgather
    # (baselines; ring+tree where a call's groups differ), sharded_ps (ours)
    "dp_collective": "str",
    # what the row asked for (baselines): auto (NCCL's tuner) | ring | tree | two_level |
    # fastest (the fastest under the link model: a user's NCCL_ALGO after measuring)
    "dp_collective_request": "str",
    # NCCL's tuner pick under auto, algorithm/protocol (e.g. ring/Simple; distinct picks of a
    # call's groups joined by +)
    "dp_nccl_choice": "str",
    "schedule": "str",  # pipeline schedule: gpipe | 1f1b
    "runtime_supported": "bool",  # ours: a configuration our runtime implements today
    # ours_search: the configurations searched, runnable (what system/runtime runs) | all
    "ours_configs": "str",
    # baselines: Megatron's virtual pipeline stages per device (interleaved 1F1B when > 1), its
    # distributed optimizer and the overlap of its gradient reduce-scatter with backward and of
    # its parameter all-gather with the next forward; DeepSpeed ZeRO's overlap_comm
    "virtual_stages": "int",
    "distributed_optimizer": "bool",
    "overlap_grad_reduce": "bool",
    "overlap_param_gather": "bool",
    "overlap_comm": "bool",
    "baseline_transport": "str",
    # the baselines' grids with their framework features (virtual stages, overlap) or without
    "baseline_features": "bool",
}
_MEASURED = {
    "iter_time_s": "float",
    "iter_times_s": "json",
    "pflops": "float",
    "tflops": "float",
    "tflops_per_device": "float",
    "tokens_per_s": "float",
    "mfu": "float",
    "memory_gib": "float",
    "compute_time_s": "float",
    "comm_time_s": "float",
    "comm_wait_time_s": "float",
    "dp_time_s": "float",
    "micro_batches": "int",
    "losses": "json",
    "loss_first": "float",
    "final_loss": "float",
    "wall_s": "float",
    "predicted_iter_time_s": "float",
    "sim_error": "float",
    "search_time_s": "float",
    "best_cost_s": "float",
    "search_trials": "int",
}
_SIMULATOR = {  # the simulator's breakdown (SimResult.breakdown, prefixed sim_)
    "sim_pipeline_s": "float",
    "sim_dp_sync_s": "float",
    "sim_dp_span_max_s": "float",
    "sim_optimizer_s": "float",
    "sim_rounds": "int",
    "sim_micro_batches": "int",
    "sim_micro_steps": "int",
    "sim_virtual_stages": "int",  # model chunks per stage the replay ran
    "sim_param_gather_wait_s": "float",  # overlapped parameter all-gather: first forward's wait
    "sim_grad_buckets": "int",  # gradient buckets reduced (overlap: bucketed reduce-scatter)
    "sim_fwd_s": "float",
    "sim_bwd_s": "float",
    "sim_pp_link_max_s": "float",
    "sim_fwd_slot_max_s": "float",
    "sim_tp_allreduce_s": "float",
    "sim_grad_norm_s": "float",
    "sim_zero1_gather_s": "float",
    "sim_zero3_comm_per_step_s": "float",
    "sim_variant": "str",
    "sim_dp_s": "float",
    "sim_dp_span_s": "float",
    "sim_grad_norm_algo": "str",
    "sim_tied_embedding_s": "float",
    "sim_flag_allreduce_s": "float",  # ours: the finite-gradient flag's all-reduce (loss scaling)
    "sim_flag_allreduce_algo": "str",
}
_EMULATION = {
    "emu_bandwidth_scale": "float",
    "emu_delay_scale": "float",
    "emu_max_rate_gbps": "float",
    "emu_num_devices": "int",
    "emu_frame_overhead": "float",
    "emu_egress_cap_gbps": "float",  # per-device egress cap of the emulation (scaled), if any
    "emu_backend": "str",
    "emu_tcp_congestion_control": "str",
    "measured_dp_s": "float",
    "measured_wait_s": "float",
    "measured_compute_s": "float",
    "compute_fwd_s": "json",
    "compute_bwd_s": "json",
    "compute_opt_s": "json",
    "compute_share": "float",
    "verify_ok": "bool",
    "verify_max_rtt_err": "float",
    "verify_max_bw_err": "float",
    "verify_max_tcp_err": "float",
    "verify_file": "str",
    "verify_pairs": "json",
    "delayer_stats": "json",
    "delayer_mean_late_ms": "float",
    "delayer_max_late_ms": "float",
    "scaled_bandwidth_gbps": "json",
    "scaled_delay_ms": "json",
    "iter_time_after_first_s": "float",
    "load_avg_1m_start": "float",  # the machine's 1-minute load average when the run started
    "load_avg_1m_end": "float",  # ... and when it ended (2 shared cores: the cause of spreads)
}
_QUALITY = {  # mode=quality: time to a target loss (repro/studies/quality/)
    "lr": "float",
    "train_sequences": "int",
    "target_iters": "int",
    "window": "int",
    "snapshot_every": "int",
    "compression": "str",  # system.compression.Compression.label()
    "elapsed_s": "json",  # training wall clock at the end of each iteration
    "pipe_bytes": "json",  # per iteration: bytes all ranks sent to other stages (counted)
    "dp_bytes": "json",  # ... in data-parallel exchanges (counted)
    "predicted_pipe_bytes": "json",  # the simulator's counts of the same
    "predicted_dp_bytes": "json",
    "heldout_steps": "json",  # iterations of the snapshots evaluated
    "heldout_losses": "json",  # their loss on the corpus's held-out text
    "corpus_package": "str",
    "corpus_version": "str",
    "corpus_wheel_sha256": "str",
    "corpus_text_sha256": "str",
    "corpus_tokens": "int",
    "corpus_vocab_size": "int",
    # mode=quality_curves (repro/studies/quality_curves): runs trained in one process
    "phase": "str",  # tune (validation split) or score (test split)
    "eval_split": "str",
    "eval_every": "int",
    "eval_sequences": "int",
    "hparams": "str",  # the method's setting, JSON (quality_curves/methods.py: hparams_text)
    "spec_sha256": "str",  # digest of the whole RunSpec trained
    "seq_length": "int",
    "iters": "int",
    "train_loss": "json",  # mean training loss per iteration
    "eval_iters": "json",  # iterations done at each held-out evaluation
    "eval_loss": "json",  # held-out loss there
    "dp_bytes_total": "int",  # bytes every replica's exchanges sent over the run
    # mode=quality_links's end-to-end check (repro/studies/quality_curves/links.py)
    "check_target_loss": "float",
    "check_iters_to_target": "int",
    "check_predicted_s": "float",  # iterations to target x the run's median s/iteration
    "check_measured_s": "float",  # the emulated run's clock when it reached the target
}
COLUMNS: dict[str, str] = {
    **_IDENTITY,
    **_SETTING,
    **_MEASURED,
    **_SIMULATOR,
    **_EMULATION,
    **_QUALITY,
}
# Columns every table has, in this order (others follow in first-seen order).
CORE_COLUMNS = (
    "run_id",
    "setting_id",
    "model_version",
    "study",
    "timestamp_utc",
    "git_sha",
    "git_dirty",
    "schema_version",
    "status",
    "mode",
    "system",
    "case",
    "num_devices",
    "num_layers",
    "global_batch_size",
    "micro_batch_size",
    "tp",
    "pp",
    "dp",
    "iter_time_s",
    "pflops",
)
# Old spelling -> the schema's (read and write both translate).
RENAMED = {
    "loss_last": "final_loss",
    "sim_iter_time_s": "predicted_iter_time_s",
    "checkpointing": "recompute",
}
# skipped: a topology-placement point whose rank map is launch order (the launch row stands)
STATUSES = ("ok", "error", "timeout", "oom", "invalid", "skipped")
# Values of the ``system`` column, spelled once: the two baselines (launched by baselines/), our
# system, and ours with uniformly random layouts (the paper's "random" bars; simulated only).
BASELINE_SYSTEMS = ("megatron", "deepspeed")
TRAINED_SYSTEMS = ("ours", *BASELINE_SYSTEMS)
# ours: the paper's fixed configuration; ours_search: ours' configuration search (is_best marks
# the best this design reaches, system/config_search.py)
SIMULATED_SYSTEMS = ("ours", "ours_search", "ours_random", *BASELINE_SYSTEMS)

# The performance model: whatever can change a simulated number (globs relative to the repo).
MODEL_SOURCES = (
    "system/cluster.py",
    "system/cases.py",
    "system/assignment.py",
    "system/gpus.py",
    "system/workload.py",
    "system/compiled.py",
    "system/data/*.csv",
    "system/cost/*.py",
    "system/scheduler/*.py",
    "system/config_search.py",
    "system/simulator/**/*.py",
    "baselines/space.py",
    "baselines/placement.py",
    "baselines/*/perf.py",
    "baselines/*/schedule.py",
    "baselines/worker.py",
)


# ---- identity ----------------------------------------------------------------------------------
# Key fields that version a setting rather than name it: in ``run_id``, not in ``setting_id``, so
# a row computed from an edited topology file supersedes the old file's row of the same setting
# (as a row of a new model version does).
VERSION_KEYS = ("case_sha256",)


def _source_digest(path: Path) -> bytes:
    """A file's content as the model sees it: Python without comments/docstrings, else bytes."""
    raw = path.read_bytes()
    if path.suffix != ".py":
        return raw
    tree = ast.parse(raw)
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (
            isinstance(body, list)
            and body
            and isinstance(body[0], ast.Expr)
            and isinstance(body[0].value, ast.Constant)
            and isinstance(body[0].value.value, str)
        ):
            node.body = body[1:] or [ast.Pass()]
    return ast.dump(tree, annotate_fields=False).encode()


@functools.cache
def model_version(root: str | None = None) -> str:
    """12-hex fingerprint of :data:`MODEL_SOURCES` under ``root`` (default: this checkout)."""
    base = Path(root) if root else ROOT
    files = sorted({p for pattern in MODEL_SOURCES for p in base.glob(pattern) if p.is_file()})
    h = hashlib.sha256()
    for p in files:
        h.update(p.relative_to(base).as_posix().encode() + b"\0" + _source_digest(p) + b"\0")
    return h.hexdigest()[:12]


def file_digest(path: str | Path) -> str | None:
    """16-hex SHA-256 of the content of the file ``path`` names, None when it names no readable
    file (a case name, a folder): what a key holds for an input file, so that editing the file
    changes the key."""
    try:
        p = Path(path)
        if not p.is_file():
            return None
        return hashlib.sha256(p.read_bytes()).hexdigest()[:16]
    except (OSError, ValueError):  # ValueError: a name with a NUL byte
        return None


# json.dumps(..., sort_keys=True, default=str) made once: a sweep hashes two keys per row
_KEY_JSON = json.JSONEncoder(sort_keys=True, default=str)


def run_id_for(key: Mapping) -> str:
    """Stable 16-hex id of a mapping (order-insensitive; values as JSON)."""
    return _id_of(_KEY_JSON.encode(dict(key)))


def _id_of(text: str) -> str:
    """:func:`run_id_for` of the mapping whose JSON text is ``text``."""
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def git_state(root: str | Path | None = None) -> tuple[str, bool]:
    """(short HEAD sha, whether tracked files differ from it); ("unknown", False) outside git.

    Read-only: ``GIT_OPTIONAL_LOCKS=0`` keeps ``git status`` from taking ``.git/index.lock`` to
    refresh the index, so a run never blocks (or fails) a ``git commit`` or another run.
    """
    try:
        run = functools.partial(
            subprocess.run,
            cwd=root or ROOT,
            capture_output=True,
            text=True,
            timeout=5,
            env={**os.environ, "GIT_OPTIONAL_LOCKS": "0"},
        )
        sha = run(["git", "rev-parse", "--short", "HEAD"]).stdout.strip()
        dirty = bool(run(["git", "status", "--porcelain", "--untracked-files=no"]).stdout.strip())
        return sha or "unknown", dirty
    except (OSError, subprocess.SubprocessError):
        return "unknown", False


_GIT: tuple[str, bool] | None = None
# The config_key of the mode's run in progress (rows_of_config), folded into every row's run_id.
_CONFIG_KEY: ContextVar[str | None] = ContextVar("row_config_key", default=None)


@contextlib.contextmanager
def rows_of_config(config_key: str | None) -> Iterator[None]:
    """While inside, :func:`make_row` puts ``config_key`` (the digest of the running mode's
    complete config, :func:`repro.keys.config_key`) into every row and its ``run_id``."""
    token = _CONFIG_KEY.set(config_key)
    try:
        yield
    finally:
        _CONFIG_KEY.reset(token)


def current_config_key() -> str | None:
    """The config key rows are made under now (None outside a mode's run)."""
    return _CONFIG_KEY.get()


def _rename(fields: Mapping) -> dict:
    if RENAMED.keys().isdisjoint(fields):  # the common case: every name is the schema's
        return dict(fields)
    out = {}
    for k, v in fields.items():
        new = RENAMED.get(k, k)
        if new in out and k != new:  # both spellings given: the schema's wins
            continue
        out[new] = v
    return out


def make_row(key: Mapping, **values) -> dict:
    """A row: identity columns + ``key`` (the settings that identify it) + measured ``values``.

    ``case`` is always text (``"5"``, ``"debug"``, ``"local"``); a topology file's ``case``
    adds its content digest to the key (``case_sha256``); old field names are renamed.
    """
    row, setting, run = _row_and_keys(key, values)
    return _identified(row, _KEY_JSON.encode(setting), run and _KEY_JSON.encode(run))


def make_rows(key: Mapping, name: str, options, **values) -> list[dict]:
    """``[make_row({**key, name: x}, **values) for x in options]``, the same rows, with the
    key's text made once: the rows' keys differ in ``name`` alone (a result's repeats), so
    their JSON texts are one text with that value's spot filled in."""
    name = RENAMED.get(name, name)
    if name in ("case", "case_sha256", "run_id"):
        raise ValueError(f"make_rows: rows cannot differ in {name!r} alone")
    token = f"\x00{name} of make_rows\x00"  # a value no key holds: its spot in the texts
    row, setting, run = _row_and_keys({**key, name: token}, values)
    spot = _KEY_JSON.encode(token)
    setting_text = _KEY_JSON.encode(setting)
    run_text = run and _KEY_JSON.encode(run)
    if setting_text.count(spot) != 1 or (run_text is not None and run_text.count(spot) != 1):
        return [make_row({**key, name: x}, **values) for x in options]  # the token elsewhere
    out = []
    for x in options:
        filled = _KEY_JSON.encode(x)
        one = dict(row)
        one[name] = x
        out.append(
            _identified(
                one, setting_text.replace(spot, filled), run_text and run_text.replace(spot, filled)
            )
        )
    return out


def _row_and_keys(key: Mapping, values: Mapping) -> tuple[dict, dict, dict | None]:
    """(the row less its ids and time, what ``setting_id`` hashes, what ``run_id`` hashes or
    None where ``values`` give the run id)."""
    global _GIT
    if _GIT is None:
        _GIT = git_state()
    key = _rename(key)
    if "case" in key and key["case"] is not None:
        key["case"] = str(key["case"])
        if "case_sha256" not in key:
            from system.cases import case_digest

            digest = case_digest(key["case"])
            if digest is not None:
                key["case_sha256"] = digest
    row = dict.fromkeys(CORE_COLUMNS)
    row.update(key)
    row.update(_rename(values))
    mv = model_version()
    setting = key
    if not key.keys().isdisjoint(VERSION_KEYS):
        setting = {k: v for k, v in key.items() if k not in VERSION_KEYS}
    row["model_version"] = mv
    versions = {"model_version": mv}
    config = _CONFIG_KEY.get()
    if config is not None:
        row["config_key"] = versions["config_key"] = config
    run = None if values.get("run_id") else {**key, **versions}
    if run is not None:
        row["run_id"] = None
    row["git_sha"], row["git_dirty"] = _GIT
    row["schema_version"] = SCHEMA_VERSION
    if row.get("status") is None:
        row["status"] = "ok"
    return row, setting, run


def _identified(row: dict, setting_text: str, run_text: str | None) -> dict:
    """``row`` with its ids (:func:`run_id_for` of the keys' JSON texts) and its time."""
    row["setting_id"] = _id_of(setting_text)
    if run_text is not None:
        row["run_id"] = _id_of(run_text)
    row["timestamp_utc"] = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="microseconds")
    return row


# ---- typing ------------------------------------------------------------------------------------
def _scalar(v):
    """numpy scalars/arrays to Python; NaN stays a float."""
    if hasattr(v, "item") and getattr(v, "ndim", 1) == 0:
        return v.item()
    if hasattr(v, "tolist"):
        return v.tolist()
    return v


def _is_missing(v) -> bool:
    if v is None:
        return True
    try:
        import pandas as pd

        return v is pd.NA or v is pd.NaT
    except ImportError:  # pragma: no cover
        return False


RECOMPUTE = ("full", "selective", "none")


# (kind, Python type) whose values are stored as they are: the common case, checked first
_AS_IS = {("float", float), ("str", str), ("json", str), ("int", int), ("bool", bool)}
# per kind, the types of a column whose every value is stored as it is (None: missing)
_STORED_AS_IS = {
    kind: frozenset({type(None), *(t for k, t in _AS_IS if k == kind)})
    for kind in ("float", "str", "json", "int", "bool", "recompute")
}


def _coerce(column: str, kind: str, v):
    """``v`` as the column's kind, or ValueError naming the column and value."""
    if v is None or (kind, type(v)) in _AS_IS:
        return v
    v = _scalar(v)
    if _is_missing(v) or (kind != "float" and isinstance(v, float) and math.isnan(v)):
        return None
    if kind == "recompute":  # a train run's on/off flag (and schema-1 booleans) is full or none
        if isinstance(v, bool) or (isinstance(v, int) and v in (0, 1)):
            return "full" if v else "none"
        if v in RECOMPUTE:
            return v
        raise ValueError(f"results column {column!r} holds one of {RECOMPUTE}, got {v!r}")
    bad = ValueError(
        f"results column {column!r} holds {kind} values, got {v!r} ({type(v).__name__})"
    )
    if kind == "json":
        if isinstance(v, str):
            return v
        return json.dumps(v, default=str)
    if isinstance(v, (list, dict, tuple)):
        raise bad
    if kind == "str":
        return str(v)
    if kind == "bool":
        if isinstance(v, bool):
            return v
        if isinstance(v, int) and v in (0, 1):
            return bool(v)
        raise bad
    if kind == "int":
        if isinstance(v, bool):
            raise bad
        if isinstance(v, int):
            return v
        if isinstance(v, float) and math.isfinite(v) and v.is_integer():
            return int(v)
        if isinstance(v, float) and math.isnan(v):
            return None
        raise bad
    if kind == "float":
        if isinstance(v, bool):
            raise bad
        if isinstance(v, (int, float)):
            return float(v)
        if isinstance(v, str):
            try:
                return float(v)
            except ValueError:
                raise bad from None
        raise bad
    raise AssertionError(kind)


_DTYPES = {
    "recompute": "string",
    "str": "string",
    "int": "Int64",
    "float": "Float64",
    "bool": "boolean",
    "json": "string",
}
_WARNED: set[str] = set()


def _kind_of_extra(values: list) -> str:
    vals = [_scalar(v) for v in values if not _is_missing(v)]
    if vals and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in vals):
        return "float"
    if vals and all(isinstance(v, bool) for v in vals):
        return "bool"
    if all(isinstance(v, str) for v in vals):
        return "str"
    return "json"


def _frame(records: list[dict]):
    """A DataFrame with one dtype per column (the schema's, or inferred once for extras)."""
    import pandas as pd

    names: dict[str, None] = dict.fromkeys(CORE_COLUMNS)
    for r in records:
        names.update(dict.fromkeys(r))
    columns = {c: [None] * len(records) for c in names}  # None where a record lacks the column
    for i, r in enumerate(records):
        for c, v in r.items():
            columns[c][i] = v
    data = {}
    for c, values in columns.items():
        kind = COLUMNS.get(c)
        if kind is None:
            kind = _kind_of_extra(values)
            if c not in _WARNED:
                _WARNED.add(c)
                log.warning(
                    "results column %r is not in the schema (system/schema.py COLUMNS): "
                    "stored as %s",
                    c,
                    kind,
                )
        if not set(map(type, values)) <= _STORED_AS_IS[kind]:  # else _coerce returns each as is
            values = [_coerce(c, kind, v) for v in values]
        data[c] = pd.array(values, dtype=_DTYPES[kind])
    return pd.DataFrame(data, index=pd.RangeIndex(len(records)))
