"""mode=compare_baselines' tables from hand-made rows (no simulator, no processes)."""

from __future__ import annotations

import pandas as pd

from repro.report import baselines as cb
from system.results import PARTS, make_row, write_rows

SETTING = {
    "case": "5",
    "devices": "[0, 8, 24, 40]",
    "global_batch_size": 8,
    "hidden_size": 256,
    "seq_length": 64,
    "vocab_size": 128,
    "emu_bandwidth_scale": 0.1,
    "emu_delay_scale": 1.0,
}


def _row(placement, pp, dp, t, status="ok", rank_map=None, sim=None):
    return {
        **SETTING,
        "system": "megatron",
        "placement": placement,
        "status": status,
        "tp": 1,
        "pp": pp,
        "dp": dp,
        "micro_batch_size": 2,
        "zero": float("nan"),
        "iter_time_s": t,
        "predicted_iter_time_s": sim,
        "sim_now_s": sim,
        "rank_map": rank_map,
        "placement_how": "test",
        "load_avg_1m_start": 1.5,
        "load_avg_1m_end": 2.0,
    }


def _tables():
    base = pd.DataFrame(
        [
            _row("launch", 2, 2, 4.0, sim=3.6),
            _row("launch", 4, 1, 3.0, sim=2.7),
            _row("topology", 2, 2, 2.0, rank_map="[2, 1, 0, 3]", sim=2.2),
            # its map is launch order: not rerun, the launch row (3.0 s) stands for it
            _row("topology", 4, 1, None, status="skipped", rank_map="[0, 1, 2, 3]"),
        ]
    )
    ours = pd.DataFrame(
        [
            {
                **SETTING,
                "system": "ours",
                "status": "ok",
                "pp": 2,
                "dp": 2,
                "iter_time_s": 1.0,
                "predicted_iter_time_s": 0.9,
            }
        ]
    )
    return cb.emulated_table(base, ours), cb.placement_table(base)


def test_best_point_per_protocol_and_ratio_to_ours():
    table, _ = _tables()
    lines = {ln.split(" | ")[4]: ln for ln in table.splitlines() if "(best)" in ln}
    launch, topo = lines["launch"].split(" | "), lines["topology"].split(" | ")
    assert launch[5] == "tp1 pp4 dp1 mb2" and launch[7] == "3.00" and launch[11] == "3.00"
    assert topo[5] == "tp1 pp2 dp2 mb2" and topo[6] == "[2,1,0,3]" and topo[11] == "2.00"
    assert topo[12] == "1/0/1/0" and topo[13] == "1.50 → 2.00 |"


def test_skipped_point_falls_back_to_its_launch_row():
    base = pd.DataFrame(
        [
            _row("launch", 4, 1, 3.0, sim=2.7),
            _row("topology", 2, 2, 5.0, rank_map="[2, 1, 0, 3]", sim=4.0),
            _row("topology", 4, 1, None, status="skipped", rank_map="[0, 1, 2, 3]"),
        ]
    )
    best = cb._protocol_rows(base, "topology")
    assert sorted(best.iter_time_s) == [3.0, 5.0]


def test_placement_table_pairs_each_topology_point_with_its_launch_run():
    _, table = _tables()
    rows = [ln.split(" | ") for ln in table.splitlines()[2:]]
    assert len(rows) == 1
    r = rows[0]
    assert r[2] == "tp1 pp2 dp2 mb2" and (r[4], r[5], r[6]) == ("4.000", "2.000", "2.00")
    assert r[10] == "1.10"  # sim now / measured of the topology run


def test_rows_of_a_sweep_that_never_compacted_are_read(tmp_path):
    """A sweep killed before its end leaves its rows in parts/ only (no runs.parquet, no
    runs.csv): the report reads them through the store."""
    base, ours = tmp_path / "baselines" / "emulated", tmp_path / "emulation"
    rows = [_row("launch", 2, 2, 4.0, sim=3.6), _row("launch", 4, 1, 3.0, sim=2.7)]
    for r in rows:
        r.pop("sim_now_s")
        key = {k: r.pop(k) for k in (*SETTING, "system", "placement", "tp", "pp", "dp")}
        write_rows(base, [make_row({**key, "mode": "emulate"}, **r)], collect_after=False)
    ours_row = {**SETTING, "mode": "emulate", "system": "ours", "pp": 2, "dp": 2}
    write_rows(
        ours, [make_row(ours_row, iter_time_s=1.0, predicted_iter_time_s=0.9)], collect_after=False
    )
    for d in (base, ours):
        assert (d / PARTS).is_dir() and not list(d.glob("runs.*"))
    got, got_ours = cb._rows(base), cb._rows(ours)
    assert sorted(got.iter_time_s) == [3.0, 4.0] and len(got_ours) == 1
    assert set(got.placement) == {"launch"} and set(got.devices) == {"[0, 8, 24, 40]"}
    got["sim_now_s"] = got.predicted_iter_time_s
    best = [
        ln.split(" | ") for ln in cb.emulated_table(got, got_ours).splitlines() if "(best)" in ln
    ]
    assert len(best) == 1 and best[0][5] == "tp1 pp4 dp1 mb2" and best[0][11] == "3.00"
