"""The variance claim is decided by measured runs only (simulated repeats are seeds/layouts)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from repro.report.claims import _claim_variance
from repro.report.variance import measured_rows


def _rows(mode: str, noise: float) -> pd.DataFrame:
    rng = np.random.default_rng(0)
    out = []
    for system in ("ours", "megatron"):
        for r in range(3):
            out.append(
                {
                    "mode": mode,
                    "case": "5",
                    "system": system,
                    "num_layers": 4,
                    "global_batch_size": 16,
                    "tp": 1,
                    "pp": 2,
                    "dp": 2,
                    "micro_batch_size": 1,
                    "zero": None,
                    "repeat": r,
                    "status": "ok",
                    "iter_time_s": 2.0 * (1 + noise * rng.standard_normal()),
                }
            )
    return pd.DataFrame(out)


def test_simulated_repeats_never_decide_the_variance_claim():
    for noise in (0.0, 0.01, 0.3):
        res, why = _claim_variance(_rows("simulate", noise))
        assert res is None and "no measured runs" in why


def test_measured_repeats_decide_it():
    (_, _, verdict), _ = _claim_variance(_rows("emulate", 0.005))
    assert verdict == "PASS"
    (_, _, verdict), _ = _claim_variance(_rows("train", 0.3))
    assert verdict == "FAIL"


def test_mixed_rows_use_only_the_measured_ones():
    rows = pd.concat([_rows("simulate", 0.3), _rows("emulate", 0.005)])
    assert set(measured_rows(rows)["mode"]) == {"emulate"}
    (_, _, verdict), _ = _claim_variance(rows)
    assert verdict == "PASS"


@pytest.mark.slow
def test_simulated_repeats_are_named_for_what_they_are(tmp_path):
    from repro.run import run as simulate
    from tests.unit.test_simulate_mode import _cfg

    simulate(_cfg(tmp_path, "system=all", "repeats=2"))
    rows = pd.read_csv(tmp_path / "runs.csv")
    kinds = rows.groupby("system")["repeat_kind"].unique().map(set).to_dict()
    assert kinds["ours_random"] == {"random layout"}
    assert kinds["ours"] == kinds["megatron"] == kinds["deepspeed"] == {"deterministic copy"}
