"""The "what moves the headline" table of the sensitivity study, on a hand-made table."""

import pandas as pd
import pytest

from repro.studies.sensitivity.run import HEADLINE, HEADLINE_CHOICES, VARIANTS, headline_table


def _table(scale: dict[str, float]) -> pd.DataFrame:
    rows = []
    for v in VARIANTS:
        for k, ours in enumerate((10.0, 20.0, 40.0)):  # three settings
            s = scale.get(v.name, 1.0)
            rows.append(
                {
                    "variant": v.name,
                    "ours": ours,
                    "ours_best": ours / 2,
                    "megatron_topology": ours * s * (1 + k),  # ratios 1, 2, 3 times s
                    "deepspeed_topology": ours * 4,
                }
            )
    return pd.DataFrame(rows)


def test_each_choice_gives_the_median_and_range_over_settings():
    table = headline_table(_table({"collective fastest": 0.5}))
    assert len(table) == len(HEADLINE_CHOICES)
    assert list(table.columns[2:]) == list(HEADLINE)
    default = table.iloc[0]
    assert default["ours / fair Megatron"] == "2.00× (1.00–3.00)"
    assert default["ours best / fair Megatron best"] == "4.00× (2.00–6.00)"
    assert default["ours / fair DeepSpeed"] == "4.00× (4.00–4.00)"
    fastest = table[table["value"].str.startswith("fastest")].iloc[0]
    assert fastest["ours / fair Megatron"] == "1.00× (0.50–1.50)"


def test_every_choice_names_a_variant_of_the_study():
    names = {v.name for v in VARIANTS}
    assert {variant for *_, variant in HEADLINE_CHOICES} <= names


def test_a_missing_variant_is_one_clear_error():
    table = _table({})
    with pytest.raises(ValueError, match="no rows of variant 'collective ring'"):
        headline_table(table[table["variant"] != "collective ring"])
