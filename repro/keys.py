"""A row's key derived from its mode's complete typed config, not listed by hand.

:func:`config_key` digests a mode's config (:func:`repro.config.as_dict`): every field of the
mode's dataclass and of its groups, except the few declared here, in :data:`RESULT_NEUTRAL`
(each with why it cannot change a stored number) and :data:`ROW_NAMED` (each with the row column
that names its value in every row), together with the content of every input file the config
names. :func:`repro.sweep.run_job` runs every mode under it (:func:`system.schema.rows_of_config`),
so every row's ``run_id`` covers the whole config: a field added to a mode is in the key from its
first line, and a rerun that changes any setting makes new rows instead of "stored; skipped".
``tests/config/test_row_keys.py`` varies every field of every mode that stores rows, one at a
time, and checks that the key changes or that the field is declared here.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from repro.config import as_dict
from system.schema import file_digest, rows_of_config, run_id_for

__all__ = [
    "RESULT_NEUTRAL",
    "ROW_NAMED",
    "config_key",
    "config_key_of",
    "key_fields",
    "input_digests",
    "rows_of",
]

# Fields (a top-level key, a group, or "group.field") that never change a number a row holds.
RESULT_NEUTRAL: dict[str, str] = {
    "study": "names the study folder; a row's numbers do not depend on it",
    "results_dir": "where rows are stored, not what they hold (the same study moved or named "
    "by an absolute path must find its rows)",
    "logger": "mirrors rows to wandb after they are made",
    "wandb": "mirrors rows to wandb after they are made",
    "workflow": "what a sweep does around its jobs (skip, report, claims' tolerance and table)",
    "limits": "what this machine may run: a run past a limit is refused, never changed",
    "tables": "the console's table layout (mode=simulate)",
    "metrics_out": "a copy of the run's metrics written elsewhere (an output file)",
    "trace": "a Chrome trace of the run (an output file)",
    "log_dir": "where the run's rank logs are kept (an output folder)",
}

# Per mode: fields that choose which rows a run makes, each row's key naming its own value (the
# column given). A run over a subset makes the same rows as the whole (``systems=[ours]`` after
# every system: ours' row is stored, skipped), so these stay out of the config key.
ROW_NAMED: dict[str, dict[str, str]] = {
    "simulate": {
        "case": "case",
        "layers": "num_layers",
        "batch": "global_batch_size",
        "system": "system",
        "baseline_placements": "placement",
        "repeats": "repeat",
    },
    "emulate": {"layouts": "layout", "random_layouts": "layout_seed"},
    "quality": {"systems": "system"},
}


def key_fields(mode: str, config: dict) -> dict:
    """``config`` (plain data, :func:`repro.config.as_dict`) less the fields declared
    result-neutral and the ones each row names (:data:`ROW_NAMED` of ``mode``)."""
    out = {k: v for k, v in config.items() if k not in RESULT_NEUTRAL}
    for k in ROW_NAMED.get(mode, {}):
        out.pop(k, None)
    for name in RESULT_NEUTRAL:
        group, _, field = name.partition(".")
        if field and isinstance(out.get(group), dict):
            out[group] = {k: v for k, v in out[group].items() if k != field}
    return out


def input_digests(config: dict, prefix: str = "") -> dict[str, str]:
    """{key: content digest} of every text value of ``config`` that names an existing file."""
    out = {}
    for k, v in config.items():
        key = f"{prefix}{k}"
        values = v if isinstance(v, list) else [v]
        if isinstance(v, dict):
            out.update(input_digests(v, f"{key}."))
            continue
        for i, item in enumerate(values):
            digest = file_digest(item) if isinstance(item, str) else None
            if digest is not None:
                out[key if len(values) == 1 else f"{key}[{i}]"] = digest
    return out


def config_key(cfg) -> str:
    """16-hex digest of the mode's complete config (:func:`key_fields`) and the content of every
    input file it names (:func:`input_digests`)."""
    return config_key_of(as_dict(cfg))


def config_key_of(plain: dict) -> str:
    """:func:`config_key` of a config as plain data (:func:`repro.config.as_dict`)."""
    fields = key_fields(str(plain.get("mode", "")), plain)
    return run_id_for({"config": fields, "input_sha256": input_digests(fields)})


@contextlib.contextmanager
def rows_of(cfg) -> Iterator[str]:
    """Run a mode's work under its config key: every row made inside carries it."""
    key = config_key(cfg)
    with rows_of_config(key):
        yield key
