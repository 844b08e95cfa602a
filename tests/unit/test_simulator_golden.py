"""Golden per-case simulator values (fixed layouts, so the scheduler's progress cannot move them).

Regenerate after an intended model change with ``UPDATE_GOLDEN=1 python -m pytest -n 0 -m ''
tests/unit/test_simulator_golden.py`` (``-m ''``: the larger setting is in the slow tier) and say
why in the commit message.
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
from system.simulator.sharing import with_link_sharing
from system.workload import MODELS, Workload

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "simulator_cases.json"
# (layers, global batch): each setting's ten grid searches take about a second, so the fast tier
# checks the first and the slow tier (CI) the second
SETTINGS = [(24, 1024), pytest.param(40, 4096, marks=pytest.mark.slow)]
CASE_NAMES = ("1", "2", "3", "4", "5")


def _key(case: str, layers: int, batch: int) -> str:
    return f"case{case}_L{layers}_B{batch}"


def _values(layers: int, batch: int) -> dict:
    """Golden entries of one setting for each case."""
    w = Workload(model=MODELS["gpt3_xl"].with_layers(layers), global_batch_size=batch)
    per_host_chain = Assignment(
        np.arange(64).reshape(8, 8).T.copy()
    )  # replica r on devices 8r..8r+7
    out = {}
    for case in CASE_NAMES:
        # every device pair its own pipe (link sharing ``pair``): the model these values are of
        cluster = with_link_sharing(get_case(case), "pair")
        meg, ds = grid_search_megatron(cluster, w).best, grid_search_deepspeed(cluster, w).best
        out[_key(case, layers, batch)] = {
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


@pytest.mark.parametrize("layers,batch", SETTINGS)
def test_golden_per_case_values(layers, batch):
    got = _values(layers, batch)
    if os.environ.get("UPDATE_GOLDEN"):  # replace this setting's entries, keep the others
        old = json.loads(GOLDEN.read_text()) if GOLDEN.exists() else {}
        GOLDEN.parent.mkdir(parents=True, exist_ok=True)
        GOLDEN.write_text(json.dumps({**old, **got}, indent=1, sort_keys=True) + "\n")
    if not GOLDEN.exists():
        pytest.skip(f"no golden file {GOLDEN.name}; run with UPDATE_GOLDEN=1 to create it")
    golden = json.loads(GOLDEN.read_text())
    want = {k: golden[k] for k in (_key(c, layers, batch) for c in CASE_NAMES) if k in golden}
    assert sorted(got) == sorted(want)
    for k, vals in want.items():
        for name, v in vals.items():
            if isinstance(v, str):
                assert got[k][name] == v, (k, name)
            else:
                assert got[k][name] == pytest.approx(v, rel=1e-9), (k, name)
