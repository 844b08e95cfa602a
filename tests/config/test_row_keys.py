"""A row's key covers its mode's complete config (repro/keys.py): every field of every mode
that stores rows, varied one at a time, changes the key, or is declared result-neutral or named
by each row in one place."""

from __future__ import annotations

import copy
import dataclasses
from enum import Enum

import pytest

from repro.config import MODES, as_dict, validate
from repro.keys import RESULT_NEUTRAL, ROW_NAMED, config_key, config_key_of
from system.schema import COLUMNS, make_row, rows_of_config

ROW_MODES = sorted(n for n, s in MODES.items() if s.rows)


def _defaults(cls) -> dict:
    """A mode's config as plain data, every field at its default (no checks run)."""
    out = {}
    for f in dataclasses.fields(cls):
        v = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        if dataclasses.is_dataclass(v):
            v = as_dict(v)
        elif isinstance(v, list):
            v = [str(x) if isinstance(x, Enum) else x for x in v]
        elif isinstance(v, Enum):
            v = str(v)
        out[f.name] = v
    return out


def _leaves(d: dict, prefix: tuple = ()):
    for k, v in d.items():
        if isinstance(v, dict):
            yield from _leaves(v, (*prefix, k))
        else:
            yield (*prefix, k), v


def _varied(v):
    """Another value of the same kind."""
    if isinstance(v, bool):
        return not v
    if isinstance(v, int):
        return v + 1
    if isinstance(v, float):
        return v * 2 + 1
    if isinstance(v, str):
        return v + "_other"
    if isinstance(v, list):
        return v + v[:1] if v else [1]
    assert v is None, v
    return 1


def _declared(mode: str, path: tuple) -> bool:
    dotted = ".".join(path)
    return (
        path[0] in RESULT_NEUTRAL
        or dotted in RESULT_NEUTRAL
        or (len(path) == 1 and path[0] in ROW_NAMED.get(mode, {}))
    )


@pytest.mark.parametrize("mode", ROW_MODES)
def test_every_field_changes_the_key_or_is_declared(mode):
    plain = _defaults(MODES[mode].schema)
    base = config_key_of(plain)
    leaves = list(_leaves(plain))
    assert len(leaves) > 10
    for path, value in leaves:
        other = copy.deepcopy(plain)
        node = other
        for k in path[:-1]:
            node = node[k]
        node[path[-1]] = _varied(value)
        changed = config_key_of(other) != base
        assert changed != _declared(mode, path), (
            f"mode={mode} {'.'.join(path)}: key {'un' if not changed else ''}changed"
        )


def test_declarations_name_real_fields_and_say_why():
    fields = {".".join(p) for s in MODES.values() for p, _ in _leaves(_defaults(s.schema))} | {
        p[0] for s in MODES.values() for p, _ in _leaves(_defaults(s.schema))
    }
    for name, why in RESULT_NEUTRAL.items():
        assert name in fields and len(why) > 20, name
    for mode, named in ROW_NAMED.items():
        own = {f.name for f in dataclasses.fields(MODES[mode].schema)}
        for field, column in named.items():
            assert field in own and column in COLUMNS, (mode, field, column)


def _quality(**over):
    return validate({"mode": "quality", "results_dir": "results/adhoc/quality", **over})


@pytest.mark.parametrize(
    "other",
    [{"devices": [0, 8, 16, 24]}, {"case_variant": "dtfm_code"}, {"backend": "netem"}],
    ids=lambda o: next(iter(o)),
)
def test_quality_rows_on_other_links_are_new_rows_of_the_same_setting(other):
    """The links of mode=quality were missing from its rows' key: a rerun on other links was
    skipped as stored. Now its rows have new run ids and supersede the old ones."""
    key = {"mode": "quality", "case": "5", "system": "ours", "seed": 0}
    a, b = _quality(), _quality(**other)
    with rows_of_config(config_key(a)):
        row_a = make_row(key)
    with rows_of_config(config_key(b)):
        row_b = make_row(key)
    assert row_a["run_id"] != row_b["run_id"]
    assert row_a["setting_id"] == row_b["setting_id"]
    assert row_b["config_key"] == config_key(b)


def test_the_key_holds_the_content_of_input_files(tmp_path):
    f = tmp_path / "assignment.json"
    f.write_text('{"stages": [[0], [1]]}')
    plain = _defaults(MODES["train"].schema)
    plain["runtime"]["assignment"] = str(f)
    before = config_key_of(plain)
    f.write_text('{"stages": [[1], [0]]}')
    assert config_key_of(plain) != before


@pytest.mark.slow
def test_simulate_skips_a_subset_and_reruns_a_changed_setting(tmp_path):
    """Rows named by their own key (batch) are found again by a run of a subset; a changed
    field (link sharing) makes new rows."""
    from repro.run import run

    common = {"mode": "simulate", "case": "debug", "layers": 2, "results_dir": str(tmp_path)}
    first = run({**common, "batch": 8, "system": "megatron"})
    assert first["new_rows"] == first["rows"] > 0
    again = run({**common, "batch": 8, "system": "megatron", "tables": "wide"})
    assert again["new_rows"] == 0  # tables= is result-neutral
    other = run({**common, "batch": 8, "system": "megatron", "link_sharing": "pair"})
    assert other["new_rows"] == other["rows"]
