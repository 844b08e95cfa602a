"""The scheduler-vs-heuristics study on one small setting (repro/studies/scheduler_worth/run.py)."""

from __future__ import annotations

import pandas as pd
import pytest

from repro.studies.scheduler_worth.run import HEURISTIC_LAYOUTS, Setting, compare, settings, why
from system.cases import get_case


def test_one_setting_compares_the_search_with_every_heuristic():
    s = Setting("debug", "paper", get_case("debug"), 4, 16, 2, 4)
    row = compare(
        s,
        budget={"trials": 4, "time_limit_s": 5.0},
        seed=0,
        sharing=("tc_class", "pair"),
        random_layouts=3,
    )
    heuristics = {h: row[f"{h}_s"] for h in HEURISTIC_LAYOUTS}
    assert row["best_heuristic"] == min(heuristics, key=heuristics.get)
    assert row["ratio"] == pytest.approx(min(heuristics.values()) / row["search_s"])
    assert row["ratio_pair"] > 0
    text = why(pd.Series(row))
    assert row["best_heuristic"] in text and "pipeline" in text


def test_settings_cover_the_study_without_sailor_data():
    names = [s.name for s in settings(None, spot_seeds=(0,))]
    assert names[:5] == [f"case {k}" for k in "12345"]
    assert sum("-16" in n or "-32" in n for n in names) == 3 and "mixed fleet" in names
    spot = next(s for s in settings(None, spot_seeds=(1,)) if s.kind == "spot")
    assert spot.cluster.num_devices == spot.pp * spot.dp == 48
