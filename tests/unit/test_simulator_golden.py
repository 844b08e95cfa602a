"""Golden per-case simulator values (fixed layouts, so the scheduler's progress cannot move them).

Regenerate after an intended model change with ``UPDATE_GOLDEN=1 python -m pytest
tests/unit/test_simulator_golden.py`` and say why in the commit message.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from baselines.deepspeed.perf import grid_search_deepspeed
from baselines.megatron.perf import grid_search_megatron
from system.assignment import Assignment, identity_assignment
from system.cases import get_case
from system.simulator import simulate_ours
from system.workload import MODELS, Workload

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "simulator_cases.json"
SETTINGS = [(24, 1024), (40, 4096)]


def _values() -> dict:
    out = {}
    per_host_chain = Assignment(
        np.arange(64).reshape(8, 8).T.copy()
    )  # replica r on devices 8r..8r+7
    for case in ("1", "2", "3", "4", "5"):
        cluster = get_case(case)
        for layers, batch in SETTINGS:
            w = Workload(model=MODELS["gpt3_xl"].with_layers(layers), global_batch_size=batch)
            meg, ds = grid_search_megatron(cluster, w).best, grid_search_deepspeed(cluster, w).best
            out[f"case{case}_L{layers}_B{batch}"] = {
                "ours_identity_iter_time_s": simulate_ours(
                    cluster, identity_assignment(8, 8), w
                ).iter_time_s,
                "ours_chain_iter_time_s": simulate_ours(cluster, per_host_chain, w).iter_time_s,
                "megatron_iter_time_s": meg.iter_time_s,
                "megatron_config": meg.label(),
                "deepspeed_iter_time_s": ds.iter_time_s,
                "deepspeed_config": ds.label(),
            }
    return out


def test_golden_per_case_values():
    got = _values()
    if os.environ.get("UPDATE_GOLDEN"):
        GOLDEN.parent.mkdir(parents=True, exist_ok=True)
        GOLDEN.write_text(json.dumps(got, indent=1, sort_keys=True) + "\n")
    if not GOLDEN.exists():
        pytest.skip(f"no golden file {GOLDEN.name}; run with UPDATE_GOLDEN=1 to create it")
    want = json.loads(GOLDEN.read_text())
    assert sorted(got) == sorted(want)
    for k, vals in want.items():
        for name, v in vals.items():
            if isinstance(v, str):
                assert got[k][name] == v, (k, name)
            else:
                assert got[k][name] == pytest.approx(v, rel=1e-9), (k, name)
