"""mode=bench_sweep: a sweep timed per job, its split adding up, the table written with its
command."""

from __future__ import annotations

import re

import pytest

from repro.config import validate


@pytest.mark.slow  # a whole sweep (sweep=smoke, 10 jobs)
def test_the_table_splits_each_job_and_names_its_command(tmp_path):
    from repro.checks.bench.sweep import run

    cfg = validate(
        {
            "mode": "bench_sweep",
            "sweep_name": "smoke",
            "launchers": ["serial"],
            "results_dir": str(tmp_path),
        }
    )
    walls = run(cfg)
    assert list(walls) == ["this tree serial"] and walls["this tree serial"] > 0
    text = (tmp_path / "sweep_smoke.md").read_text()
    assert "python repro/run.py mode=bench_sweep sweep_name=smoke launchers=[serial]" in text
    row = re.search(
        r"this tree +serial +(\d+) +([\d.]+) \| +([\d.]+) +([\d.]+) +([\d.]+) +([\d.]+)", text
    )
    assert row is not None, text
    jobs, wall, *split = (float(x) for x in row.groups())
    assert jobs == 10 and sum(split) == pytest.approx(wall / jobs, abs=0.02)


def test_two_trees_agree_within_floating_point_order_only():
    from repro.checks.bench.sweep import agreement

    a = [1.0, 2.0, 138.49711809590224]
    assert agreement(a, [1.0, 2.0, 138.49711809590224 * (1 + 3e-14)]).startswith("the same")
    assert agreement(a, [1.0, 2.0, 138.6]).startswith("other iteration times")
    assert agreement(a, a[:2]).startswith("other iteration times (3 rows against 2)")
