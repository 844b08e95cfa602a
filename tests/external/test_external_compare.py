"""Sailor's simulator's errors are set beside ours on the same plans only: its published MAPE
where the scored plans are those it was published over, else its per-plan predictions on the
scored plans, else nothing."""

from __future__ import annotations

import shutil

import pandas as pd
import pytest

from repro.run import run
from repro.studies.external.score import SAILOR_SIMULATOR_S, sailor_on_same_plans
from tests.external.test_sailor_importers import SHARED, shipped


def _scored(set_name: str, per_plan: dict[str, tuple[float, float | None]]) -> pd.DataFrame:
    return pd.DataFrame(
        [
            {
                "plan": f"{set_name}/N/plan_config_{stem}.json",
                "set": set_name,
                "real_s": real,
                "sailor_simulator_s": sailor,
            }
            for stem, (real, sailor) in per_plan.items()
        ]
    )


def test_sailor_is_compared_on_the_same_plans_only():
    opt = "clariden/OPT-350"
    # two plans: Sailor's own per-plan numbers on them (README: 0.0736 -> 0.0830 and
    # 2.281 -> 2.641), not its 8.9% over all fifteen
    two = _scored(opt, {"N1_D1_M4_G1": (0.0736, 0.0830), "N1_D1_M4_G32": (2.281, 2.641)})
    mape, worst = sailor_on_same_plans(opt, two)
    assert mape == pytest.approx(100 * (0.0094 / 0.0736 + 0.360 / 2.281) / 2)
    assert worst == pytest.approx(100 * 0.360 / 2.281)
    # every plan its MAPE was published over: the published numbers
    every = {s: (1.0, v) for s, v in SAILOR_SIMULATOR_S[opt].items()}
    assert sailor_on_same_plans(opt, _scored(opt, every)) == (8.9, 16.1)
    # one scored plan it published nothing for, or none at all: no comparison
    partial = _scored(opt, {"N1_D1_M4_G1": (0.07, 0.08), "X": (1.0, None)})
    assert sailor_on_same_plans(opt, partial) == (None, None)
    assert sailor_on_same_plans("mit", _scored("mit", {"N2_D1": (1.0, None)})) == (None, None)


@pytest.mark.slow
@shipped
def test_the_report_on_two_plans_sets_sailor_on_those_two(tmp_path):
    d = tmp_path / "data"
    d.mkdir()
    for f in SHARED.glob("*.json"):
        shutil.copyfile(f, d / f.name)
    for stem in ("N1_D1_M4_G1", "N1_D1_M4_G32"):
        rel = f"clariden/OPT-350/N1/plan_config_{stem}.json"
        (d / "plans" / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(SHARED / "plans" / rel, d / "plans" / rel)
    out = tmp_path / "out"
    run({"mode": "external", "plans": str(d / "plans"), "results_dir": str(out)})
    err = pd.read_csv(out / "errors.csv")
    sailor = float(err["sailor_signed_error_pct"].abs().mean())
    row = next(
        ln for ln in (out / "REPORT.md").read_text().splitlines() if "| clariden/OPT-350 |" in ln
    )
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[6] == f"{sailor:.1f}%" and cells[6] != "8.9%", row
