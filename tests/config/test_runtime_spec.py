"""A mode's config maps to our runtime's RunSpec in one place (:func:`repro.config.shared.
runtime_spec`): every key the config shares with the spec, as it is, and what the mode decides
itself on top."""

from __future__ import annotations

from repro.config import validate
from repro.config.shared import SPEC_KEYS, runtime_spec


def test_the_spec_takes_the_configs_keys_and_the_modes_own_fields_win():
    cfg = validate(
        {
            "mode": "bench_runtime",
            "layers": 6,
            "hidden_size": 64,
            "seq_length": 32,
            "pp": 3,
            "iters": 4,
            "seed": 7,
        }
    )
    spec = runtime_spec(cfg, global_batch_size=12, probe_links=True, iters=9)
    assert (spec.model, spec.layers, spec.hidden_size, spec.seq_length) == ("debug", 6, 64, 32)
    assert (spec.pp, spec.dp, spec.seed) == (3, 1, 7)
    assert spec.iters == 9 and spec.global_batch_size == 12 and spec.probe_links
    assert spec.vocab_size is None  # a key the config lacks keeps the spec's default


def test_every_shared_key_is_a_field_of_the_spec():
    import dataclasses

    from system.runtime.spec import RunSpec

    fields = {f.name for f in dataclasses.fields(RunSpec)}
    assert set(SPEC_KEYS) <= fields, set(SPEC_KEYS) - fields
