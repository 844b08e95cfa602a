"""mode=bench_plan_sailor: Sailor's trace points planned by this tree beside a commit, the same
plan required of both, the table written with its command."""

from __future__ import annotations

import re

import pytest

from repro.config import ConfigError, validate
from tests.external.test_sailor_importers import SHARED, shipped


@pytest.mark.slow  # two trees plan one trace point, each after its warm-up
@shipped
def test_one_point_beside_this_commit(tmp_path):
    from repro.checks.bench.plan_sailor import run

    cfg = validate(
        {
            "mode": "bench_plan_sailor",
            "base": "HEAD",
            "rounds": 1,
            "points": ["geo_OPT-350_p0"],
            "profiles": str(SHARED),
            "results_dir": str(tmp_path),
        }
    )
    times = run(cfg)
    assert len(times) == 2 and all(t > 0 for t in times.values())
    text = (tmp_path / "plan_sailor.md").read_text()
    assert "mode=bench_plan_sailor base=HEAD rounds=1 points=[geo_OPT-350_p0]" in text
    cell = r" +[\d.]+ +[\d.]+ +[\d.]+x \|"  # the two trees' medians and their ratio
    # the search alone, then loading and search together, then the simulations
    assert re.search(rf"geo_OPT-350_p0 \|{cell}{cell} \d+ -> \d+", text), text
    assert "chose the same plan at every point in every round" in text


@pytest.mark.parametrize(
    "base, says",
    [("--output=x", "expected a commit"), ("no-such-branch-here", "not a commit")],
)
def test_a_base_that_is_no_commit_is_one_line(tmp_path, base, says):
    with pytest.raises(ConfigError, match=f"base={re.escape(repr(base))}: {says}"):
        validate({"mode": "bench_plan_sailor", "base": base, "results_dir": str(tmp_path)})
